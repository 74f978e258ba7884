"""The ``# Checked:`` line of every shipped config: what it states, how a config's default run is
measured, and the one command that re-measures the lines and rewrites them::

    python tests/checked_headers.py                  # every config, two at a time, nice 10
    python tests/checked_headers.py fedavg inco_baselines/fednova_within_groups --jobs 1

A header states ``METRIC VALUE ± TOLERANCE``: VALUE is the default run's last logged METRIC (the
last round's ``metrics.csv`` row; CoFED: ``summary.json``) to 4 decimals under the stated
settings, which are the test suite's: the pinned CPU kernel family of ``tests/pinned_kernels.py``
and one torch thread (``--loop.num_threads 1``, ``OMP_NUM_THREADS=1``). Under them the run gives
the same bits on every x86-64 machine with AVX2, so ``tests/test_config_accuracy.py`` checks VALUE
to 4 decimals. TOLERANCE is how far another CPU (its own kernels: AVX-512, MKL's Intel branch)
or another thread count may move it: max(0.02, twice the sample standard deviation of the run's
last five evaluations), rounded up to a hundredth (at most 0.1), since rounding differences move
the last round within the run's own round-to-round swing (measured in docs/algorithms.md section
6.7). Recording prints each config's old and new figure and its CPU seconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from pinned_kernels import pin

PENDING = "to be re-measured"
ROOT = Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(ROOT.glob("*.yaml")) + sorted((ROOT / "inco_baselines").glob("*.yaml"))
CHECKED = re.compile(
    rf"^# Checked: (?P<metric>\S+) (?:(?P<value>\d+\.\d+) ± (?P<tol>\d+\.\d+)|{PENDING})"
    r"(?P<how>.*)$",
    re.M,
)
#: the settings every figure is measured under, as each header states them
SETTINGS = "pinned kernels, one thread; ± on other CPUs"
#: a run's rounds of round-to-round swing the tolerance spans, and its bounds
SWING_ROWS, MIN_TOLERANCE, MAX_TOLERANCE = 5, 0.02, 0.1


@dataclass(frozen=True)
class Claim:
    """What a config's header states: ``metric`` after the run is ``value`` (4 decimals under
    the stated settings), within ``tolerance`` elsewhere; ``value is None``: to be re-measured
    (``note`` says why)."""

    metric: str
    value: float | None
    tolerance: float
    note: str

    @classmethod
    def of(cls, config: Path) -> Claim:
        found = list(CHECKED.finditer(config.read_text()))
        assert len(found) == 1, f"{config.name}: not one '# Checked: METRIC VALUE ...' line"
        match = found[0]
        value, tol, how = match["value"], match["tol"], match["how"]
        return cls(
            metric=match["metric"],
            value=None if value is None else float(value),
            tolerance=float(tol or 0),
            note=how.strip(" :,"),
        )

    def exact(self, measured: float) -> bool:
        """The figure to 4 decimals (the stated settings)."""
        return f"{measured:.4f}" == f"{self.value:.4f}"

    def holds(self, measured: float) -> bool:
        """Within the tolerance (another CPU)."""
        return abs(measured - self.value) <= self.tolerance + 5e-5  # the printed 4th decimal


def label(config: Path) -> str:
    return str(config.relative_to(ROOT).with_suffix(""))


def is_cofed(config: Path) -> bool:
    return config.name.startswith("cofed")


def command(config: Path, run_dir: Path) -> list[str]:
    """``fedlightning fit`` (``cofed`` for CoFED's configs) at the config's defaults on one
    thread, without progress bar and plots."""
    if is_cofed(config):
        return ["cofed", "--config", str(config), "--run_dir", str(run_dir),
                "--progress_bar", "false"]  # fmt: skip
    return ["fit", "--config", str(config), "--loop.run_dir", str(run_dir),
            "--loop.progress_bar", "false", "--loop.plots", "false",
            "--loop.num_threads", "1"]  # fmt: skip


def timed(config: Path, run_dir: Path, niceness: int = 0) -> tuple[int, str, float]:
    """:func:`command` in a process of its own (one thread; at ``niceness`` or the caller's, if
    higher: ``nice -n 10 python tests/checked_headers.py`` runs them at 10, not 20): its exit
    status, stderr and CPU seconds (user + system, its own, from ``os.wait4``)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fedlightning.cli", *command(config, run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=(lambda: os.nice(max(0, niceness - os.nice(0)))) if niceness else None,
    )  # fmt: skip
    err = process.stderr.read() if process.stderr else ""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, err, usage.ru_utime + usage.ru_stime


def evaluations(config: Path, run_dir: Path, metric: str) -> list[float]:
    """``metric`` of every evaluated round, the last after the config's last round (CoFED: its
    one value in summary.json)."""
    if is_cofed(config):
        return [float(json.loads((run_dir / "summary.json").read_text())[metric])]
    with open(run_dir / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    rounds = yaml.safe_load((run_dir / "config.yaml").read_text())["loop"]["rounds"]
    last = rows[-1]
    assert int(last["round"]) == rounds and last[metric] != "", f"no {metric} after round {rounds}"
    return [float(row[metric]) for row in rows if row.get(metric)]


def tolerance(values: list[float], stated: float) -> float:
    """max(0.02, twice the sample std of the last five values), up to a hundredth, at most 0.1;
    ``stated`` where there is no swing to measure (CoFED's one value)."""
    if len(values) < SWING_ROWS:
        return stated
    swing = 2 * statistics.stdev(values[-SWING_ROWS:])
    return min(MAX_TOLERANCE, max(MIN_TOLERANCE, math.ceil(round(swing * 100, 6)) / 100))


def rewrite(config: Path, metric: str, value: float, tol: float) -> None:
    """Replace ``config``'s ``# Checked:`` line by the measured figure and the settings."""
    line = f"# Checked: {metric} {value:.4f} ± {tol:.2f} {stated(config)}"
    config.write_text(CHECKED.sub(line.replace("\\", "\\\\"), config.read_text(), count=1))


def stated(config: Path) -> str:
    """What a header says after its figure: the round it is logged after (CoFED: none) and the
    settings (:attr:`Claim.note` reads it back)."""
    if is_cofed(config):
        return f"({SETTINGS})"
    return f"after round {yaml.safe_load(config.read_text())['loop']['rounds']} ({SETTINGS})"


def record(configs: list[Path], jobs: int, scratch: Path) -> list[str]:
    """Run ``configs`` ``jobs`` at a time (nice 10) under the stated settings, rewrite each
    header and return the table of old and new figures."""
    pin()  # the children inherit the pinned kernel family

    def one(config: Path) -> str:
        claim, run_dir = Claim.of(config), scratch / label(config).replace("/", "_")
        status, err, seconds = timed(config, run_dir, niceness=10)
        if status != 0:
            line = f"{label(config)}: exited {status}: {err.strip().splitlines()[-1:]}"
        else:
            values = evaluations(config, run_dir, claim.metric)
            tol = tolerance(values, claim.tolerance)
            rewrite(config, claim.metric, values[-1], tol)
            old = "pending" if claim.value is None else f"{claim.value:.4f} ± {claim.tolerance:.2f}"
            moved = "" if claim.value is not None and claim.exact(values[-1]) else "  (changed)"
            line = (
                f"{label(config)}: {claim.metric} {old} -> {values[-1]:.4f} ± {tol:.2f} "
                f"in {seconds:.0f} CPU-s{moved}"
            )
        print(line, flush=True)
        return line

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, configs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Re-measure the configs' '# Checked:' lines under the pinned kernels on one "
        "thread and rewrite them."
    )
    parser.add_argument("configs", nargs="*", help="labels (fedavg, inco_baselines/...): all")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--scratch", default=None, help="where the runs go (default: a temp dir)")
    args = parser.parse_args(argv)
    chosen = [ROOT / f"{name}.yaml" for name in args.configs] or CONFIGS
    missing = [str(c) for c in chosen if not c.is_file()]
    if missing:
        parser.error(f"no such config: {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="checked-") as tmp:
        record(chosen, args.jobs, Path(args.scratch or tmp))


if __name__ == "__main__":
    main()
