"""``experiments/robustness.py --setting karimireddy2022``: the Byzantine table of Karimireddy,
He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing" (ICLR 2022,
arXiv:2006.09365), their ``exp3``, next to the outputs they released (docs/algorithms.md section
8.6, "Karimireddy et al.'s setting").

Their setting (``epfml/byzantine-robust-noniid-optimizer``, ``exp3.py`` and ``utils.py``), here in
the library's units (an update is ``-lr`` times a gradient):

- MNIST sorted by label over 25 workers, 5 of them Byzantine; every worker every round, one SGD
  step of batch 32 at lr 0.01 a round (their iterations), 600 rounds; the server steps
  ``w - agg`` (their ``x - lr * agg``). Here: ``mnist5k`` (4,000 training images; the released
  runs used the 60,000 of MNIST), 25 label-sorted shards of 160 (``partition: shards``, one
  each). The malicious clients are those holding every fifth shard in label order (positions 2,
  7, 12, 17, 22), so that the honest clients hold data of every class, as their 20 good workers
  hold all of MNIST (their Byzantine workers read IID copies of it; every sample here belongs to
  one client).
- Worker momentum 0 and 0.9, in their code's torch form (``WorkerMomentum(form="torch")``:
  ``m <- beta m + g``).
- The rules, in update units: centered clipping with their ``tau = 10`` and 3 iterations, scaled
  as their code scales it (``tau / (1 - beta)``) and by lr: radius 0.1 without momentum, 1.0 with;
  RFA with T = 8 Weiszfeld iterations and their ``nu = 0.1`` (smoothing ``lr * nu``), uniform
  weights; Krum (f = 5, m = 1); the coordinate-wise median; each with and without bucketing
  (``s = 2``).
- The attacks: ALIE (``variant: honest``, the reference direction, z from n = 25, m = 5),
  inner-product manipulation (epsilon 0.1), label flipping, bit flipping, mimic (warmup 1).

Models: ``--model mlp`` (the default; one hidden layer of 32 on the images downsampled to 14x14,
a variant that runs the whole table at one seed on two CPU cores) or ``--model cnn`` (their
network, ``karimireddy_cnn``, at 28x28). A baseline row runs the mean without an attack. Each
cell is appended to ``results.csv`` as it finishes (with its wall and CPU seconds); a restart
skips the cells already there; ``--print-only`` tabulates them and runs nothing.
``--keep-runs`` keeps each cell's run directory under ``runs/`` of ``--out``: its
``config.yaml`` reruns that cell through the CLI, bit for bit (``fedlightning fit --config
.../config.yaml --loop.run_dir NEW``).

    python experiments/robustness.py --setting karimireddy2022 --seeds 0 --jobs 2
    python experiments/robustness.py --setting karimireddy2022 --model cnn --rules cclip krum \\
        --attacks alie --momenta 0.9 --seeds 0
"""

from __future__ import annotations

import argparse
import csv
import logging
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
from karimireddy2022_released import RELEASED
from lightning.fabric.utilities.seed import seed_everything
from robustness import append
from tables import mean_std, over_seeds, smoke_test_line

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.attacks import ALIE, Attack, BitFlip, InnerProductManipulation, LabelFlip, Mimic
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.clients import ClientModule, WorkerMomentum
from fedlightning.errors import RunStopped
from fedlightning.server import FedAvg
from fedlightning.server.statistics import (
    Bucketing,
    CenteredClip,
    GeometricMedian,
    Krum,
    Mean,
    Median,
)

ROUNDS, NUM_CLIENTS, LR, BATCH = 600, 25, 0.01, 32
#: positions, in label order, of the shards the malicious clients hold (every fifth)
MALICIOUS_SHARDS = (2, 7, 12, 17, 22)
MODELS = {
    "mlp": {"network": "mlp", "network_kwargs": {"hidden": [32]}, "resize": 14},
    "cnn": {"network": "karimireddy_cnn", "network_kwargs": {}, "resize": None},
}
RULES = {"cclip": "CClip", "rfa": "RFA", "krum": "Krum", "cm": "CM"}
ATTACKS = {"alie": "ALIE", "ipm": "IPM", "lf": "LF", "bf": "BF", "mimic": "mimic"}
NONE, MEAN = "none", "mean"
FIELDS = ["setting", "model", "momentum", "rule", "bucket", "attack", "seed", "test_acc",
          "status", "time_s", "cpu_s"]  # fmt: skip


def statistic(rule: str, momentum: float, bucket: int):
    """The rule in update units (see the module docstring), bucketed when ``bucket`` > 1."""
    scale = LR / (1 - momentum)  # their tau is in gradients, scaled by 1 / (1 - beta)
    inner = {
        "cclip": lambda: CenteredClip(radius=10.0 * scale, iterations=3),
        "rfa": lambda: GeometricMedian(smoothing=0.1 * LR, max_iter=8, tol=0.0),
        "krum": Krum,
        "cm": Median,
        MEAN: Mean,
    }[rule]()
    return Bucketing(inner, bucket_size=bucket) if bucket > 1 else inner


def attack(name: str, clients: list[int]) -> Attack:
    return {
        "alie": lambda: ALIE(clients=clients, variant="honest"),
        "ipm": lambda: InnerProductManipulation(clients=clients, epsilon=0.1),
        "lf": lambda: LabelFlip(clients=clients),
        "bf": lambda: BitFlip(clients=clients),
        "mimic": lambda: Mimic(clients=clients, warmup=1),
    }[name]()


def malicious_clients(dm: FederatedDataModule) -> list[int]:
    """The clients holding the shards at :data:`MALICIOUS_SHARDS` in label order."""
    dm.setup()
    mean_label = [
        float(dm.client_train_dataloader(c, 0).y.float().mean()) for c in range(NUM_CLIENTS)
    ]
    order = sorted(range(NUM_CLIENTS), key=lambda c: (mean_label[c], c))
    return sorted(order[p] for p in MALICIOUS_SHARDS)


def cells(args: argparse.Namespace) -> Iterator[tuple]:
    """(model, momentum, rule, bucket, attack, seed) of every run, the baselines first."""
    for seed in args.seeds:
        for momentum in args.momenta:
            yield args.model, momentum, MEAN, 0, NONE, seed
            for rule in args.rules:
                for bucket in args.buckets:
                    for name in args.attacks:
                        yield args.model, momentum, rule, bucket, name, seed


def setting(args: argparse.Namespace) -> str:
    return f"karimireddy2022 mnist5k N=25 R={args.rounds} lr={LR} B={BATCH} {args.backend}"


_DATA: dict[tuple[str, int], tuple[FederatedDataModule, list[int]]] = {}


def data(model_name: str, seed: int) -> tuple[FederatedDataModule, list[int]]:
    """The federation of ``seed`` at the model's image size and its malicious clients."""
    if (model_name, seed) not in _DATA:
        dm = FederatedDataModule(
            dataset="mnist5k", num_clients=NUM_CLIENTS, partition="shards", shards_per_client=1,
            val_fraction=0.0, batch_size=BATCH, seed=seed, resize=MODELS[model_name]["resize"],
        )  # fmt: skip
        _DATA[(model_name, seed)] = dm, malicious_clients(dm)
    return _DATA[(model_name, seed)]


def run_cell(
    cell: tuple, args: argparse.Namespace, run_dir: str | None = None
) -> dict[str, object]:
    """One run of the table; its run directory is ``run_dir`` if given, else a temporary one."""
    model_name, momentum, rule, bucket, attack_name, seed = cell
    options = MODELS[model_name]
    dm, malicious = data(model_name, seed)
    seed_everything(seed, verbose=False)
    network = dict(
        network=options["network"], network_kwargs=options["network_kwargs"],
        num_classes=dm.num_classes, in_channels=dm.in_channels, image_size=dm.image_size,
        optimizer="sgd", lr=LR,
    )  # fmt: skip
    objective = (
        WorkerMomentum(beta=momentum, form="torch", **network)
        if momentum
        else ClientModule(**network)
    )
    backend = CohortBackend() if args.backend == "cohort" else SequentialBackend()
    started, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() if run_dir is None else nullcontext(run_dir) as tmp:
        loop = FederatedLoop(
            rounds=args.rounds, clients_per_round=NUM_CLIENTS, local_steps=1,
            aggregator=FedAvg(weighting="uniform", statistic=statistic(rule, momentum, bucket)),
            attack=None if attack_name == NONE else attack(attack_name, malicious),
            backend=backend, seed=seed, eval_every=args.rounds, checkpoint_every=args.rounds,
            run_dir=tmp, progress_bar=False, plots=False,
        )  # fmt: skip
        loop.console.quiet = True
        status, accuracy = "ok", float("nan")
        try:
            accuracy = loop.fit(objective, datamodule=dm)["test_acc"]
        except RunStopped:  # non-finite server state in most rounds: its last finite model
            status = "failed"
            accuracy = loop.history[-1]["test_acc"] if loop.history else float("nan")
    return {
        "setting": setting(args), "model": model_name, "momentum": momentum, "rule": rule,
        "bucket": bucket, "attack": attack_name, "seed": seed, "test_acc": accuracy,
        "status": status, "time_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }  # fmt: skip


def _key(row: dict) -> tuple:
    return (str(row["model"]), float(row["momentum"]), str(row["rule"]), int(row["bucket"]),
            str(row["attack"]), int(row["seed"]))  # fmt: skip


def kept_run_dir(cell: tuple, args: argparse.Namespace) -> str | None:
    """``runs/MODEL_mMOMENTUM_RULE_bBUCKET_ATTACK_sSEED`` under ``--out`` with ``--keep-runs``,
    emptied first (a cell stopped half-way restarts from round 1)."""
    if not args.keep_runs:
        return None
    model_name, momentum, rule, bucket, attack_name, seed = cell
    path = args.out / "runs" / f"{model_name}_m{momentum}_{rule}_b{bucket}_{attack_name}_s{seed}"
    shutil.rmtree(path, ignore_errors=True)
    return str(path)


def _worker(job: tuple[list[tuple], argparse.Namespace, Path]) -> int:
    todo, args, path = job
    torch.set_num_threads(1)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    for cell in todo:
        row = run_cell(cell, args, kept_run_dir(cell, args))
        append(path, row, FIELDS)
        print(f"{cell}: test_acc {float(row['test_acc']):.4f} ({row['time_s']} s, "
              f"{row['cpu_s']} CPU-s)", flush=True)  # fmt: skip
    return len(todo)


def read(path: Path, args: argparse.Namespace) -> list[dict[str, str]]:
    """The rows of ``path`` run with this ``setting``."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return [r for r in csv.DictReader(handle) if r.get("setting") == setting(args)]


def tables(rows: list[dict[str, str]], args: argparse.Namespace) -> str:
    """Per momentum, a row per rule and bucketing, a column per attack: ``ours (released)``."""
    by_cell: dict[tuple, list[float]] = {}
    for row in rows:
        if int(row["seed"]) in args.seeds:
            by_cell.setdefault(_key(row)[:5], []).append(float(row["test_acc"]))
    out = []
    for momentum in args.momenta:
        base = by_cell.get((args.model, momentum, MEAN, 0, NONE), [])
        out += [f"\n{args.model}, worker momentum {momentum}: test accuracy (%), "
                f"{over_seeds(args.seeds)}; in brackets the released mean of 3 seeds; "
                f"no attack (mean): {mean_std(base) if base else '-'}\n",
                "| rule | " + " | ".join(ATTACKS[a] for a in args.attacks) + " |",
                "|---" * (1 + len(args.attacks)) + "|"]  # fmt: skip
        for rule in args.rules:
            for bucket in args.buckets:
                values = []
                for name in args.attacks:
                    ours = by_cell.get((args.model, momentum, rule, bucket, name), [])
                    text = mean_std(ours) if ours else "-"
                    released = RELEASED.get((momentum, rule, bucket, name))
                    values.append(f"{text} ({released:.1f})" if released is not None else text)
                label = RULES[rule] + (f" + bucketing s={bucket}" if bucket > 1 else "")
                out.append(f"| {label} | " + " | ".join(values) + " |")
    return "\n".join(out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setting", default="karimireddy2022", choices=["karimireddy2022"])
    parser.add_argument("--model", default="mlp", choices=list(MODELS))
    parser.add_argument("--momenta", nargs="+", type=float, default=[0.0, 0.9])
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    parser.add_argument("--buckets", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--backend", default="cohort", choices=["cohort", "sequential"])
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--print-only", action="store_true",
                        help="run nothing: tabulate the cells in results.csv ('-': not run)")  # fmt: skip
    parser.add_argument("--keep-runs", action="store_true",
                        help="keep each cell's run directory (its config.yaml reruns it)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/karimireddy2022"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.csv"
    done = {_key(r) for r in read(path, args)}
    todo = [] if args.print_only else [c for c in cells(args) if c not in done]
    started, cpu = time.perf_counter(), time.process_time()
    jobs = max(1, min(args.jobs, len(todo)))
    if jobs == 1:
        _worker((todo, args, path))
    else:  # cells of one seed on one worker, which loads that seed's data once
        shares = [sorted(todo[w::jobs], key=lambda c: c[-1]) for w in range(jobs)]
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            pool.map(_worker, [(share, args, path) for share in shares])
    rows = read(path, args)
    total_cpu = sum(float(r["cpu_s"]) for r in rows)
    text = (
        f"{setting(args)}; {len(todo)} run(s) now, {time.perf_counter() - started:.0f} s wall, "
        f"{time.process_time() - cpu:.0f} CPU-s in this process; {len(rows)} run(s) in the "
        f"file, {total_cpu / 60:.1f} CPU-min in their fits" + tables(rows, args)
    )
    smoke = smoke_test_line(args.rounds, ROUNDS)
    text += f"\n\n{smoke}" if smoke else ""
    print(text)
    (args.out / f"table_{args.model}.md").write_text(text + "\n")
    return text
