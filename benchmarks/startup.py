"""Start-up cost: the quickstart through ``fedlightning fit`` against the same work written by hand
(``benchmarks/handwritten_quickstart.py``: PyTorch and scikit-learn only), measured in the same run.

Each side runs as a fresh process (``--repeats`` times, alternating, the median kept). ``whole s``
is the process's wall time (interpreter start, imports, data, set-up, rounds, writing results);
``rounds s`` the time inside the rounds (fedlightning: the sum of ``round_time_s`` in
``metrics.csv``, which covers each round's fits, aggregation, evaluation and checkpoint; by hand:
its own clock around the rounds); ``outside s`` = whole - rounds, the cost a user pays for the
front door. ``ratio`` divides fedlightning's by the hand-written loop's (issue 17's target for
``outside``: at most 1.5). Also prints the wall time of processes that only import
``fedlightning.cli`` and only ``torch, sklearn.datasets`` (the hand-written loop's imports): the
share of ``outside`` that is imports (``python -X importtime -c "import fedlightning.cli"`` breaks
it down by module).

    python benchmarks/startup.py                       # the quickstart (30 rounds), 3 repeats
    python benchmarks/startup.py --rounds 5 --repeats 1
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    whole = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return whole, done.stdout


def run_fedlightning(rounds: int, env: dict[str, str]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as run_dir:
        whole, _ = timed(
            [
                sys.executable, "-m", "fedlightning.cli", "fit", "-c", "configs/quickstart.yaml",
                "--loop.rounds", str(rounds), "--loop.run_dir", run_dir,
                "--loop.progress_bar", "false",
            ],
            env,
        )  # fmt: skip
        with open(Path(run_dir) / "metrics.csv") as handle:
            rounds_s = sum(float(row["round_time_s"]) for row in csv.DictReader(handle))
    return whole, rounds_s


def run_by_hand(rounds: int, env: dict[str, str]) -> tuple[float, float]:
    script = str(ROOT / "benchmarks" / "handwritten_quickstart.py")
    whole, out = timed([sys.executable, script, "--rounds", str(rounds)], env)
    return whole, json.loads(out.strip().splitlines()[-1])["rounds_s"]


def import_time(env: dict[str, str], modules: str) -> float:
    """Wall time of a fresh process that only imports ``modules``."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {modules}"], env=env, cwd=ROOT, check=True)
    return time.perf_counter() - start


def measure(rounds: int, repeats: int, threads: int) -> tuple[Table, list[str]]:
    """Run both sides ``repeats`` times (alternating); the table of medians and the import lines."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = (
        src + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else src
    )
    samples: dict[str, list[tuple[float, float]]] = {"fedlightning fit": [], "hand-written": []}
    imports: dict[str, list[float]] = {"fedlightning.cli": [], "torch, sklearn.datasets": []}
    for _ in range(repeats):
        samples["fedlightning fit"].append(run_fedlightning(rounds, env))
        samples["hand-written"].append(run_by_hand(rounds, env))
        for modules, times in imports.items():
            times.append(import_time(env, modules))
    medians = {
        name: tuple(statistics.median(s[i] for s in runs) for i in (0, 1))
        for name, runs in samples.items()
    }
    table = Table(title=f"quickstart start-up ({rounds} rounds, median of {repeats})")
    for column in ("", "whole s", "rounds s", "outside s"):
        table.add_column(column, justify="right")
    for name, (whole, rounds_s) in medians.items():
        table.add_row(name, f"{whole:.2f}", f"{rounds_s:.2f}", f"{whole - rounds_s:.2f}")
    (fw, fr), (hw, hr) = medians["fedlightning fit"], medians["hand-written"]
    table.add_row("ratio", f"{fw / hw:.2f}", f"{fr / hr:.2f}", f"{(fw - fr) / (hw - hr):.2f}")
    lines = [
        f"a process that only imports {modules}: {statistics.median(times):.2f} s"
        for modules, times in imports.items()
    ]
    return table, lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="OMP/torch threads on both sides")
    args = parser.parse_args()
    table, lines = measure(args.rounds, args.repeats, args.threads)
    Console(width=100).print(table)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
