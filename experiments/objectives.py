"""Client objectives side by side: FedAvg, FedProx, MOON, SCAFFOLD, FedNova and FML on digits.

Setup: scikit-learn's bundled digits (offline), 20 clients with Dirichlet(0.1) label skew (10%
of each client's samples held out as its validation split), the FedAvg CNN, 10 clients per round,
2 local epochs of SGD (lr 0.05, momentum 0.5, batch 32), the same number of rounds for every
method, several seeds (the seed fixes the partition, the initial model and the client sampling,
so for one seed every method sees the same federation). Method settings: FedProx mu 0.01; MOON
mu 1, tau 0.5; SCAFFOLD option II with a_i, uniform model mean (SCAFFOLD-m0: momentum 0;
SCAFFOLD-lr/2: lr 0.025); FedNova with a_i for momentum 0.5; FML alpha = beta = 0.5, personal
model = the same CNN, memes averaged uniformly.

Columns (mean +- std over seeds, after the last round):
  test_acc      the global model on the global (balanced) test set
  val_acc       the global model on each client's own validation split, averaged over clients
  personal_acc  FML only: each client's personal model on its own validation split, averaged over
                every client that has one (compare with val_acc, not with test_acc)

    python experiments/objectives.py                        # the full table (about 10 min, 1 thread)
    python experiments/objectives.py --rounds 3 --seeds 0   # a smoke test (its output says so)

With fewer rounds than the table's 30 the output ends with a SMOKE TEST line: after 3 rounds most
methods still predict one class and print the same accuracy. One seed prints each cell's value
(no spread).
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from lightning.fabric.utilities.seed import seed_everything
from tables import mean_std, over_seeds, smoke_test_line

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.clients import FML, MOON, ClientModule, FedNovaClient, FedProx, ScaffoldClient
from fedlightning.server import FedAvg, FedNova, Scaffold

#: the table's rounds; fewer make a smoke test, and the output says so
TABLE_ROUNDS = 30

RECIPE = dict(
    network="cnn",
    num_classes=10,
    in_channels=1,
    image_size=8,
    optimizer="sgd",
    lr=0.05,
    momentum=0.5,
)

#: name -> (client objective factory, aggregator factory)
METHODS: dict[str, tuple[Callable[[], ClientModule], Callable[[], object]]] = {
    "FedAvg": (lambda: ClientModule(**RECIPE), lambda: FedAvg()),
    "FedProx": (lambda: FedProx(mu=0.01, **RECIPE), lambda: FedAvg()),
    "MOON": (lambda: MOON(mu=1.0, tau=0.5, **RECIPE), lambda: FedAvg()),
    "SCAFFOLD": (lambda: ScaffoldClient(**RECIPE), lambda: Scaffold()),
    # SCAFFOLD's local movement is lr * a_i (a_i = 2 K_i for long fits at momentum 0.5): with the
    # shared recipe a client's c_i can feed on itself late in training here and the run diverges,
    # as plain SGD does at lr 0.1 (docs/algorithms.md 1.4). The same algorithm without momentum,
    # and with momentum 0.5 at half the lr (the movement of momentum 0 at lr 0.05):
    "SCAFFOLD-m0": (lambda: ScaffoldClient(**{**RECIPE, "momentum": 0.0}), lambda: Scaffold()),
    "SCAFFOLD-lr/2": (lambda: ScaffoldClient(**{**RECIPE, "lr": 0.025}), lambda: Scaffold()),
    "FedNova": (lambda: FedNovaClient(**RECIPE), lambda: FedNova()),
    "FML": (lambda: FML(alpha=0.5, beta=0.5, **RECIPE), lambda: FedAvg(weighting="uniform")),
}


def run(method: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    make_client, make_aggregator = METHODS[method]
    seed_everything(seed, verbose=False)  # the initial model, as the CLI does with loop.seed
    model = make_client()
    dm = FederatedDataModule(
        dataset="digits",
        num_clients=args.num_clients,
        partition="dirichlet",
        beta=args.beta,
        batch_size=32,
        seed=seed,
    )
    loop = FederatedLoop(
        rounds=args.rounds,
        clients_per_round=args.clients_per_round,
        local_epochs=args.local_epochs,
        aggregator=make_aggregator(),
        seed=seed,
        eval_every=args.rounds,
        checkpoint_every=args.rounds,
        run_dir=str(workdir / f"{method}-{seed}"),
        progress_bar=False,
        num_threads=args.threads,
    )
    loop.console.quiet = True
    metrics = loop.fit(model, datamodule=dm)
    # a run whose last round diverged (non-finite, skipped) has no evaluation: NaN, not a crash
    result = {k: metrics.get(k, math.nan) for k in ("test_acc", "val_acc")}
    if method == "FML":  # every client's personal model, not only the last round's participants
        everyone = [c for c in range(dm.num_clients) if c in loop.store]
        personal = model.evaluate_clients(
            everyone, loop.store, dm.client_val_dataloader, torch.device("cpu")
        )
        result["personal_acc"] = personal["personal_acc"]
    return result


def main(argv: list[str] | None = None) -> str:
    """Run the table (or the smaller run ``argv`` asks for), print it and return its text."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=TABLE_ROUNDS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--num-clients", type=int, default=20)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--beta", type=float, default=0.1, help="Dirichlet concentration")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--csv", type=Path, default=None, help="also write every run's numbers here"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)

    rows: list[dict[str, object]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            for seed in args.seeds:
                t0 = time.perf_counter()
                result = run(method, seed, args, Path(tmp))
                rows.append(
                    {"method": method, "seed": seed, **result, "time_s": time.perf_counter() - t0}
                )
                print(
                    f"{method:9s} seed {seed}: "
                    + ", ".join(f"{k} {v:.4f}" for k, v in result.items()),
                    flush=True,
                )
    total = time.perf_counter() - started

    def cell(method: str, key: str) -> str:
        values = [float(r[key]) for r in rows if r["method"] == method and key in r]
        if not values:
            return "-"
        finite = [v for v in values if math.isfinite(v)]
        if len(finite) < len(values):
            return f"diverged ({len(values) - len(finite)} of {len(values)} seeds)"
        return mean_std(values)

    lines = [
        f"\ndigits, {args.num_clients} clients, Dirichlet({args.beta}), {args.rounds} rounds x "
        f"{args.clients_per_round} clients x {args.local_epochs} local epochs; accuracy in %, "
        f"{over_seeds(args.seeds)}; {total:.0f} s in all\n",
        "| method | test_acc | val_acc | personal_acc | s/run |",
        "|---|---|---|---|---|",
    ]
    for method in args.methods:
        seconds = statistics.mean(float(r["time_s"]) for r in rows if r["method"] == method)
        lines.append(
            f"| {method} | {cell(method, 'test_acc')} | {cell(method, 'val_acc')} | "
            f"{cell(method, 'personal_acc')} | {seconds:.0f} |"
        )
    smoke = smoke_test_line(args.rounds, TABLE_ROUNDS)
    text = "\n".join(lines + ([f"\n{smoke}"] if smoke else []))
    print(text)
    if args.csv:
        keys = ["method", "seed", "test_acc", "val_acc", "personal_acc", "time_s"]
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
    return text


if __name__ == "__main__":
    main()
