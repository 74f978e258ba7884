"""CoFED (Cao et al., arXiv:2202.08603) offline on digits: relative accuracy, IID vs non-IID.

The paper's Figure 2 / Table shape on the bundled digits: ``configs/cofed.yaml`` (10 participants,
random CNNs, three recipes, 2-3 of 5 digit groups each, alpha = margin = 0.3) run through
``fedlightning cofed`` with ``distribution`` iid and noniid and 3 seeds. A seed fixes the tasks,
architectures, initialisations and every fit. Relative accuracy = CoFED accuracy / local accuracy
of a participant on all test images of its groups; per run we take the mean over participants,
and per setting report the mean and range of those run means over seeds (and the spread over all
participants of all seeds).

    python experiments/cofed.py                  # 6 runs, about 5 min on a 2-core CPU, 1 thread
    python experiments/cofed.py --seeds 1        # a quick look: one seed, each cell its value
    python experiments/cofed.py --alpha 0.5 --out runs/experiments/cofed_alpha0.5   # sensitivity

Writes ``results.csv`` (one row per participant and run) and ``table.md`` under ``--out``
(default ``runs/experiments/cofed``); each run's own report lies in ``--out/<setting>_seed<k>/``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from fedlightning.cli import main as fedlightning

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cofed.yaml"
SETTINGS = ("iid", "noniid")


def run(setting: str, seed: int, out: Path, extra: list[str]) -> tuple[dict, list[dict[str, str]]]:
    run_dir = out / f"{setting}_seed{seed}"
    sys.argv = ["fedlightning"]
    fedlightning(
        [
            "cofed", "--config", str(CONFIG), "--run_dir", str(run_dir), "--seed", str(seed),
            "--progress_bar", "false", "--tasks.init_args.distribution", setting, *extra,
        ]
    )  # fmt: skip
    with open(run_dir / "participants.csv") as handle:
        rows = list(csv.DictReader(handle))
    return json.loads((run_dir / "summary.json").read_text()), rows


def header(seeds: int) -> list[str]:
    """The table's header for ``seeds`` seeds: one seed measures no spread, so its relative
    accuracy is the value alone, not a range from it to itself."""
    spread = " (range over seeds)" if seeds > 1 else ""
    return [
        f"| setting | seeds | mean local acc | mean CoFED acc | mean relative acc{spread} "
        "| participants improved | relative acc, all participants (min-max) | pseudo-label acc |",
        "|---|---|---|---|---|---|---|---|",
    ]


def table_row(setting: str, summaries: list[dict], participants: list[dict[str, str]]) -> str:
    """One setting's row from its runs' ``summary.json`` (one per seed) and all their
    participants' rows."""
    means = [s["mean_relative_acc"] for s in summaries]
    relative = [float(r["relative_acc"]) for r in participants]
    improved = sum(v > 1 for v in relative)
    relative_cell = f"{statistics.mean(means):.3f}"
    if len(means) > 1:
        relative_cell += f" ({min(means):.3f}-{max(means):.3f})"
    return (
        f"| {setting} | {len(summaries)} | {statistics.mean(s['mean_local_acc'] for s in summaries):.3f} "
        f"| {statistics.mean(s['mean_cofed_acc'] for s in summaries):.3f} | {relative_cell} "
        f"| {improved}/{len(relative)} | {min(relative):.3f}-{max(relative):.3f} "
        f"| {statistics.mean(s['pseudo_label_acc'] for s in summaries):.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/cofed"))
    parser.add_argument("--alpha", type=float, help="override the config's vote threshold (0.3)")
    args = parser.parse_args()
    extra = [] if args.alpha is None else ["--alpha", str(args.alpha)]
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: list[dict] = []
    lines = header(args.seeds)
    for setting in SETTINGS:
        summaries, participants = [], []
        for seed in range(args.seeds):
            summary, rows = run(setting, seed, args.out, extra)
            summaries.append(summary)
            participants += rows
            results += [{"setting": setting, "seed": seed, **row} for row in rows]
        lines.append(table_row(setting, summaries, participants))
    with open(args.out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    table = "\n".join(lines)
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    print(
        f"\n{len(SETTINGS) * args.seeds} runs in {time.perf_counter() - started:.0f} s; results in {args.out}"
    )


if __name__ == "__main__":
    main()
