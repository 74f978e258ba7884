"""The default path of a run on the CPU, chosen by measurement (docs/algorithms.md section 9.3):
one torch intra-op thread per client fit (``loop.num_threads: 1``), and ``loop.backend: auto``'s
rule for the CPU (sequential fits). Both tables run the shipped configs as a user runs them
(``fedlightning fit --config configs/NAME.yaml``, in this process, plots off), shortened to
``--rounds`` rounds; options this script does not know are passed to every run (e.g.
``--loop.clients_per_round 2``).

threads: each config at one thread and at ``--many`` threads (default: one per core, torch's own
default), alternately (one, many, one, many, ...), first on the machine as it is, then beside
``--load`` busy-loop processes (``python -c 'while True: pass'``; default: one per core). ``s/round``
is the mean of a run's ``round_time_s`` (the wall time of its rounds: fits, aggregation,
evaluation), ``CPU-s`` the process's CPU time over the whole fit (every thread's, spinning
included); each prints the median (range) over ``--repeats``, and ``ratio`` the median (range) of
the per-pair ratios many/one, so that a load change hits both runs of a pair alike. ``bits``
compares ``global.pt``: one thread on the machine as it is against one thread under load (the
same bits whatever the load), and many threads against one (the thread count splits reductions
differently, so the bits differ where a model's reductions are split).

backend: each config on ``SequentialBackend`` and ``CohortBackend`` at one thread, alternately, on
the machine as it is; ``ratio`` is cohort/sequential (below 1: the cohort is faster). A config the
cohort cannot train says why.

    python benchmarks/defaults.py                                   # the default configs, 2 rounds
    python benchmarks/defaults.py --configs quickstart fedavg --repeats 3
    python benchmarks/defaults.py --tables backend --configs quickstart fml moon
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fedlightning.cli import main as fedlightning
from startup import spread

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("quickstart", "fedavg", "scaffold", "fedcross", "heteroavg_resnet")
SEQUENTIAL = "fedlightning.backends.SequentialBackend"
COHORT = "fedlightning.backends.CohortBackend"


class Refused(Exception):
    """A run the CLI refused (its message)."""


@dataclass(frozen=True)
class Run:
    """One timed fit: mean seconds per round, CPU seconds of the fit, sha256 of ``global.pt``."""

    round_s: float
    cpu_s: float
    digest: str


def fit(config: str, run_dir: Path, rounds: int, options: list[str]) -> Run:
    """``fedlightning fit --config configs/<config>.yaml`` for ``rounds`` rounds in ``run_dir``,
    its console output kept out of the tables."""
    args = ["fit", "--config", str(ROOT / "configs" / f"{config}.yaml"), "--loop.run_dir",
            str(run_dir), "--loop.rounds", str(rounds), "--loop.plots", "false",
            "--loop.progress_bar", "false", "--loop.overwrite", "true", *options]  # fmt: skip
    sys.argv = ["fedlightning"]
    started, err = time.process_time(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            fedlightning(args)
    except SystemExit as stop:
        if stop.code != 2:  # an interrupt (130, 143) or a failed run: the benchmark stops
            raise
        lines = err.getvalue().strip().splitlines()  # the CLI's one-line refusal
        raise Refused(lines[-1] if lines else f"exit status {stop.code}") from None
    cpu = time.process_time() - started
    with open(run_dir / "metrics.csv") as handle:
        times = [float(row["round_time_s"]) for row in csv.DictReader(handle)]
    digest = hashlib.sha256((run_dir / "global.pt").read_bytes()).hexdigest()
    return Run(statistics.mean(times), cpu, digest)


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes that keep one core each busy, for the length of the block."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in loops:
            process.kill()
            process.wait()


def pairs(config: str, tmp: Path, a: list[str], b: list[str], args) -> list[tuple[Run, Run]]:
    """``--repeats`` alternating runs of ``config`` with options ``a``, then ``b``."""
    return [
        (
            fit(config, tmp / f"{config}-a", args.rounds, [*a, *args.extra]),
            fit(config, tmp / f"{config}-b", args.rounds, [*b, *args.extra]),
        )
        for _ in range(args.repeats)
    ]


def load_average() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def threads_table(tmp: Path, args) -> Table:
    """The threads table (module docstring)."""
    one, many = ["--loop.num_threads", "1"], ["--loop.num_threads", str(args.many)]
    measured = {}
    for condition, load in (("as it is", 0), (f"+{args.load} busy loops", args.load)):
        with busy_loops(load):
            measured[condition] = {c: pairs(c, tmp, one, many, args) for c in args.configs}
        measured[condition]["load"] = load_average()
    table = Table(
        title=f"threads: 1 against {args.many} (torch's default here: one per core) per client "
        f"fit, {args.rounds} round(s), {args.repeats} interleaved pair(s), median (range)",
        caption="bits: global.pt at one thread, as it is against under load; at "
        f"{args.many} threads against one",
    )
    for column in ("config", "machine", "load avg", "s/round 1", f"s/round {args.many}", "ratio",
                   "CPU-s 1", f"CPU-s {args.many}", "ratio ", "bits"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=column != "bits")
    idle, loaded = measured.values()
    for condition, runs in measured.items():
        for config in args.configs:
            found = runs[config]
            one_thread = {a.digest for a, _ in [*idle[config], *loaded[config]]}
            same_threads = all(a.digest == b.digest for a, b in found)
            bits = (f"1 thread, load: {'same' if len(one_thread) == 1 else 'DIFFER'}; "
                    f"{args.many} vs 1: {'same' if same_threads else 'differ'}")  # fmt: skip
            table.add_row(
                config, condition, runs["load"],
                spread([a.round_s for a, _ in found]), spread([b.round_s for _, b in found]),
                spread([b.round_s / a.round_s for a, b in found]),
                spread([a.cpu_s for a, _ in found], 1), spread([b.cpu_s for _, b in found], 1),
                spread([b.cpu_s / a.cpu_s for a, b in found]), bits,
            )  # fmt: skip
    return table


def backend_table(tmp: Path, args) -> Table:
    """The backend table (module docstring)."""
    table = Table(
        title=f"backend at one thread per fit: cohort against sequential, {args.rounds} round(s),"
        f" {args.repeats} interleaved pair(s), median (range); load avg {load_average()}"
    )
    for column in ("config", "sequential s/round", "cohort s/round", "ratio cohort/sequential"):
        table.add_column(column, justify="right")
    one = ["--loop.num_threads", "1"]
    for config in args.configs:
        try:
            found = pairs(config, tmp, [*one, "--loop.backend", SEQUENTIAL],
                          [*one, "--loop.backend", COHORT], args)  # fmt: skip
        except Refused as refusal:
            table.add_row(config, "-", "-", f"cohort refused: {str(refusal)[:80]}")
            continue
        table.add_row(
            config, spread([a.round_s for a, _ in found]), spread([b.round_s for _, b in found]),
            spread([b.round_s / a.round_s for a, b in found]),
        )  # fmt: skip
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), help="names under configs/")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per run")
    parser.add_argument("--repeats", type=int, default=1, help="timed pairs per config")
    parser.add_argument("--warmup", type=int, default=1, help="untimed one-round runs first")
    parser.add_argument("--many", type=int, default=os.cpu_count(), help="the other thread count")
    parser.add_argument("--load", type=int, default=os.cpu_count(), help="busy-loop processes")
    parser.add_argument("--tables", nargs="+", default=["threads", "backend"],
                        choices=["threads", "backend"])  # fmt: skip
    args, args.extra = parser.parse_known_args(argv)
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.warmup):  # first calls, lazy imports: charged to no table
            fit(args.configs[0], Path(folder) / "warmup", 1, args.extra)
        if "threads" in args.tables:
            console.print(threads_table(Path(folder), args))
        if "backend" in args.tables:
            console.print(backend_table(Path(folder), args))


if __name__ == "__main__":
    main()
