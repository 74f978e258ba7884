"""The scaling table of ``benchmarks/cohort.py``: round time of the sequential and cohort loops
against clients per round (the FedCross paper's CNN setup), inside the budget.

Rows run from the fewest clients up; each path's cost per client per round in the last row it ran
predicts its next row (plus the data set's preparation for that many clients), and a path whose
prediction does not fit the budget left is skipped with the prediction printed. The speed-up is
measured in one run, per row; ``round/floor`` is the cohort's round time over the compute floor
(section 9.2 of docs/algorithms.md); the GPU memory peak per configuration on CUDA.
"""

from __future__ import annotations

import argparse
import json

import torch
from rich.table import Table

from budget import Budget
from cohort_work import round_flops, run_loop
from devices import clock, device_name
from fedlightning.backends import CohortBackend, SequentialBackend

PATHS = {"sequential": SequentialBackend, "cohort": CohortBackend}


def _timed(args, backend, per_round, width) -> tuple[float, float, float | None]:
    """``(s/round, the whole run's seconds, GPU peak MiB)`` of one run."""
    if args.accelerator == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = clock(args.accelerator)
    seconds = run_loop(args, "fedcross", backend, per_round, width)[0]
    total = clock(args.accelerator) - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if args.accelerator == "cuda" else None
    return seconds, total, peak


def scaling_table(args, rate: float, console, budget: Budget) -> None:
    table = Table(
        title=f"fedcross CNN: round time vs clients per round ({device_name(args.accelerator)}, "
        f"{args.precision}); {args.samples} samples/client, batch {args.batch}, {args.epochs} "
        f"epochs, {args.rounds} rounds (the first dropped)",
        caption="a path left out did not fit the budget: its predicted run time is shown",
    )
    for column in ("clients/round", "width", "sequential s", "cohort s", "cohort speed-up",
                   "cohort round/floor", "peak GPU MiB seq/coh"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=True)
    per_client: dict[str, float] = {}  # a path's run seconds per client, from its last row
    rows = []
    for width in args.scale_widths:
        for per_round in args.scale_clients:
            local = argparse.Namespace(**{**vars(args), "clients": max(args.clients, per_round)})
            cells, peaks, seconds = {}, {}, {}
            for name, backend in PATHS.items():
                predicted = per_client.get(name, 0.0) * per_round
                if not budget.allows(predicted):
                    cells[name] = f"skipped (~{predicted:.0f} s)"
                    continue
                seconds[name], total, peaks[name] = _timed(local, backend(), per_round, width)
                per_client[name] = total / per_round
                cells[name] = f"{seconds[name]:.3f}"
            floor = round_flops(local, "fedcross", width, per_round) / rate
            rows.append({"clients": per_round, "width": width, "floor_s": floor, **seconds})
            ratio = (
                f"{seconds['sequential'] / seconds['cohort']:.1f}x" if len(seconds) == 2 else "-"
            )
            table.add_row(
                str(per_round), str(width), cells["sequential"], cells["cohort"], ratio,
                f"{seconds['cohort'] / floor:.1f}" if "cohort" in seconds else "-",
                "/".join(f"{peaks[n]:.0f}" if peaks.get(n) else "-" for n in PATHS),
            )  # fmt: skip
    console.print(table)
    print("SUMMARY " + json.dumps({"scaling": rows, "precision": args.precision}), flush=True)
