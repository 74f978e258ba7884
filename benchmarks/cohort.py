"""Vectorized cohorts against sequential fits, hand-written loops and Flower's simulation, inside a
wall-clock budget (docs/algorithms.md section 9.2).

Every table is measured in one run and prints ratios within that run (compare ratios, not seconds,
across runs). All paths train the same work (:mod:`cohort_work`). ``max |w - w_seq|`` is the
largest difference of each path's final model from the sequential loop's: 0 for the hand-written
per-client loop (the same arithmetic), a float rounding for the vmapped paths.

The paths run interleaved (sequential, cohort, by hand, vmap by hand, flower, sequential, ...):
the first ``--warmup`` cycles are dropped, then up to ``--repeats`` are timed, as many as the
budget allows (at least one). A path's ``s/round`` is, per run, the mean time of its rounds after
the first (the loop's through a Lightning ``Logger`` called at the end of every round, so its
checkpoint and logging count), printed as the median over the repeats with the range in
parentheses; the ratio columns are the median (range) of the per-repeat ratios, so a load change
hits the runs of one repeat alike.

  paths:   sequential  FederatedLoop + SequentialBackend (deterministic algorithms, the default)
           cohort      FederatedLoop + CohortBackend (idem; CUDA graphs on a GPU)
           by hand     a per-client PyTorch loop (SGD, FedAvg mean), no framework
           vmap by hand  all clients of a round in one torch.func vmap per step, written by hand
                       (the round's batches stacked on the device first, foreach SGD)
           ... det. off  ``--determinism``: the loop's paths with ``deterministic=False``, so the
                       ratio is determinism's cost (all paths run with cuBLAS's deterministic
                       workspace, set before CUDA starts)
           flower      Flower's run_simulation (``make bench-peers``; skipped with a note if absent)
  floor:   3 x forward FLOPs of a round's training (counted by torch's FlopCounterMode) over the
           device's peak matrix rate measured here (an 8192^3 product in the precision's dtype;
           fp32 without TF32), and each path's round time over it. cuDNN may run fp32
           convolutions in TF32 (torch's default), so fp32 rounds can come under that floor.
  scaling: round time of sequential and cohort against clients per round (benchmarks/
           cohort_scaling.py), each only where its predicted time fits the budget left.
  steps:   ``--tables steps``: the cohort's own cost per step against a vmapped step by hand on a
           tiny MLP and the quickstart CNN, with the aten ops each dispatches (benchmarks/
           cohort_steps.py).

After each table a ``SUMMARY {json}`` line gives its numbers to ``benchmarks/gpu_all.py``.

Workloads (``--workload``): ``quickstart`` (the quickstart's CNN, 1x8x8 inputs) and ``fedcross``
(the FedCross paper's CNN setup: the FedAvg CNN on synthetic CIFAR-shaped 3x32x32 data). Defaults
are the paper setup: 100 clients, 10 per round, 500 samples each, batch 50, 5 epochs, SGD lr 0.01,
momentum 0.5; ``--quick`` shrinks it for a CPU.

    python benchmarks/cohort.py --quick --threads 1        # CPU, reduced size
    python benchmarks/cohort.py --tables steps --threads 1  # the cohort's step against one by hand
    python benchmarks/cohort.py --accelerator cuda --workload fedcross --precision bf16-mixed \\
        --determinism --budget-s 120
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from budget import Budget
from cohort_scaling import scaling_table
from cohort_steps import steps_table
from cohort_work import AUTOCAST, ROOT, by_hand, flower, gap, round_flops, run_loop
from devices import clock, device_name
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.determinism import prepare_environment
from overhead import matmul_rate
from startup import spread


def _paths(args, workload):
    paths = {
        "sequential": lambda: run_loop(args, workload, SequentialBackend()),
        "cohort": lambda: run_loop(args, workload, CohortBackend()),
        "by hand": lambda: by_hand(args, workload, vectorized=False),
        "vmap by hand": lambda: by_hand(args, workload, vectorized=True),
    }
    if args.determinism:
        paths["sequential det. off"] = lambda: run_loop(
            args, workload, SequentialBackend(), deterministic=False
        )
        paths["cohort det. off"] = lambda: run_loop(
            args, workload, CohortBackend(), deterministic=False
        )
    note = "skipped (--no-flower)"
    if args.flower and not Path(args.peers_python).exists():
        note = "skipped: no Flower environment (make bench-peers)"
    elif args.flower:
        note = ""
        paths["flower"] = lambda: _flower_row(args, workload)
    return paths, note


def paths_table(args, workload, rate, console, budget: Budget) -> dict[str, float]:
    """The paths table; returns each path's median seconds per round."""
    floor = round_flops(args, workload) / rate
    paths, note = _paths(args, workload)
    runs: dict[str, list] = {name: [] for name in paths}
    cycles = warmups = 0
    while True:  # interleaved: every path once per cycle
        start = clock(args.accelerator)
        rows = {name: run() for name, run in paths.items()}
        last = clock(args.accelerator) - start
        cycles += 1
        if cycles <= args.warmup and budget.allows(last):  # dropped, if another cycle fits
            warmups += 1
            continue
        for name, row in rows.items():
            runs[name].append(row)
        if len(runs["sequential"]) >= args.repeats or not budget.allows(last):
            break
    table = Table(
        title=f"{workload}: {args.clients} clients, {args.per_round}/round, {args.samples} samples, "
        f"batch {args.batch}, {args.epochs} epochs, {args.rounds} rounds; {device_name(args.accelerator)}, "
        f"{args.precision}; interleaved, median (range) of {len(runs['sequential'])} after "
        f"{warmups} warm-up",
        caption=f"floor {floor * 1e3:.2f} ms/round ({floor * rate / 1e9:.2f} GFLOP at "
        f"{rate / 1e12:.3f} TFLOP/s measured){'; flower ' + note if note else ''}",
    )
    for column in ("path", "s/round", "vs sequential", "vs cohort", "vs vmap by hand",
                   "round/floor", "test_acc", "max |w - w_seq|"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=True)
    sequential = runs["sequential"]
    for name, rows in runs.items():
        seconds = [row[0] for row in rows]
        weights = rows[0][2]
        diff = "-" if weights is None else f"{gap(weights, sequential[0][2]):.1e}"
        table.add_row(
            name, spread(seconds, 3), _ratios(seconds, runs["sequential"]),
            _ratios(seconds, runs["cohort"]), _ratios(seconds, runs["vmap by hand"]),
            f"{statistics.median(seconds) / floor:.1f}", f"{rows[0][1]:.4f}", diff,
        )  # fmt: skip
    console.print(table)
    medians = {name: statistics.median(row[0] for row in rows) for name, rows in runs.items()}
    summary = {"workload": workload, "precision": args.precision, "floor_s": floor}
    print("SUMMARY " + json.dumps({**summary, "s_per_round": medians}), flush=True)
    return medians


def _ratios(seconds: list[float], others: list[tuple]) -> str:
    """``median (range)`` of the per-repeat ratios of ``seconds`` to another path's times."""
    return spread([a / b[0] for a, b in zip(seconds, others, strict=True)])


def _flower_row(args, workload):
    result, note = flower(args, workload)
    if result is None:
        raise SystemExit(f"flower {note}")
    return result["round_s"], result["test_acc"], None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--accelerator", choices=("cpu", "cuda"), default="cpu")
    add("--precision", choices=("32-true", "bf16-mixed", "16-mixed"), default="32-true")
    add(
        "--workload",
        nargs="+",
        choices=("quickstart", "fedcross"),
        default=["quickstart", "fedcross"],
    )
    for name, default in (("clients", 100), ("per-round", 10), ("samples", 500), ("batch", 50),
                          ("epochs", 5), ("rounds", 3), ("test", 1000)):  # fmt: skip
        add(f"--{name}", type=int, default=default)
    add("--repeats", type=int, default=3, help="timed cycles over the paths (at most)")
    add("--warmup", type=int, default=1, help="untimed cycles first")
    add("--lr", type=float, default=0.01)
    add("--momentum", type=float, default=0.5)
    add("--scale-clients", type=int, nargs="*", default=[10, 100, 1000])
    add("--scale-widths", type=int, nargs="*", default=[32])
    add("--tables", nargs="+", choices=("steps", "paths", "scaling"), default=["paths", "scaling"])
    add("--determinism", action="store_true", help="also the loop's paths with deterministic off")
    add("--budget-s", type=float, default=None, help="finish inside this many seconds")
    add("--no-flower", dest="flower", action="store_false")
    add("--peers-python", default=str(ROOT / ".venv-peers" / "bin" / "python"))
    add("--threads", type=int, default=None)
    add("--quick", action="store_true",
        help="CPU size: 20 clients, 4/round, 100 samples, 1 epoch, 3 rounds (the defaults these "
             "options take; given ones win)")  # fmt: skip
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(clients=20, per_round=4, samples=100, epochs=1, rounds=3, test=200,
                            scale_clients=[4, 8, 16], scale_widths=[16, 32])  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("fedlightning").setLevel(logging.ERROR)
    console = Console(width=150)
    budget = Budget(args.budget_s)
    prepare_environment(True)  # before CUDA starts: the loop's deterministic paths need it
    device = torch.device(args.accelerator)
    size = 8192 if device.type == "cuda" else 1024
    rate = matmul_rate(device, AUTOCAST.get(args.precision, torch.float32), size)
    tables = [t for t in ("steps", "paths", "scaling") if t in args.tables]
    if "steps" in tables:
        steps_table(args, console, budget.share(1.0 / len(tables)))
    if "paths" in tables:
        for i, workload in enumerate(args.workload):
            share = 1.0 / (len(args.workload) - i + (1 if "scaling" in tables else 0))
            paths_table(args, workload, rate, console, budget.share(share))
    if "scaling" in tables:
        scaling_table(args, rate, console, budget)


if __name__ == "__main__":
    sys.exit(main())
