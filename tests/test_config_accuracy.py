"""Every shipped configuration learns: each config under ``configs/`` (``configs/experiments/``
need data sets on disk) runs at its defaults, in a process of its own on one torch thread (two
such processes at a time: the CI machine's two cores), and ends at the accuracy its header's
``# Checked:`` line states::

    # Checked: test_acc 0.9611 ± 0.04 (...)            the last round's logged value
    # Checked: group_mean_acc to be re-measured (...)    no figure yet: skipped, saying why

A tolerance is max(0.02, twice the standard deviation of the run's last five evaluations), rounded
up to a hundredth: the run is deterministic on one machine, and the tolerance allows for another
machine's rounding, which moves the last round within the run's own round-to-round swing.

Every logged accuracy is the saved models scored in eval mode (docs/algorithms.md section 6.1;
tests/test_rescore.py re-scores every config's models independently, on both backends). CoFED
configs run through ``fedlightning cofed`` and check summary.json. Each test prints its value and
its process's CPU time (``pytest -s``): the headers' CPU times come from here.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

PENDING = "to be re-measured"
ROOT = Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(ROOT.glob("*.yaml")) + sorted((ROOT / "inco_baselines").glob("*.yaml"))
CHECKED = re.compile(
    rf"^# Checked: (?P<metric>\S+) (?:(?P<value>\d+\.\d+) ± (?P<tol>\d+\.\d+)|{PENDING})"
    r"(?P<how>.*)$",
    re.M,
)


@dataclass(frozen=True)
class Claim:
    """What a config's header states: ``metric`` after the run is ``value`` within
    ``tolerance``, as logged; ``value is None``: to be re-measured
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

    def holds(self, measured: float) -> bool:
        return abs(measured - self.value) <= self.tolerance


def _label(config: Path) -> str:
    return str(config.relative_to(ROOT).with_suffix(""))


def _command(config: Path, run_dir: Path) -> list[str]:
    """``fedlightning fit`` (``cofed`` for CoFED's configs) at the config's defaults, one thread."""
    if config.name.startswith("cofed"):
        return ["cofed", "--config", str(config), "--run_dir", str(run_dir),
                "--progress_bar", "false"]  # fmt: skip
    return ["fit", "--config", str(config), "--loop.run_dir", str(run_dir),
            "--loop.progress_bar", "false", "--loop.plots", "false"]  # fmt: skip


def _measured(config: Path, run_dir: Path, metric: str) -> float:
    """``metric`` after the run: the last row of metrics.csv after the config's last round, or
    CoFED's summary.json."""
    if config.name.startswith("cofed"):
        return float(json.loads((run_dir / "summary.json").read_text())[metric])
    with open(run_dir / "metrics.csv") as handle:
        last = list(csv.DictReader(handle))[-1]
    rounds = yaml.safe_load((run_dir / "config.yaml").read_text())["loop"]["rounds"]
    assert int(last["round"]) == rounds and last[metric] != "", f"no {metric} after round {rounds}"
    return float(last[metric])


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The selected configs' runs, two at a time (each on one thread: the machine's two cores),
    each started when the test before it starts: ``runs(config) -> (run_dir, status, stderr,
    CPU seconds)``."""
    selected = [
        item.callspec.params["config"] for item in request.session.items
        if item.originalname == "test_config_reaches_its_stated_accuracy"
        and Claim.of(item.callspec.params["config"]).value is not None
    ]  # fmt: skip
    root = tmp_path_factory.mktemp("configs")
    pool = ThreadPoolExecutor(max_workers=2)
    futures: dict[Path, Any] = {}

    def submit(config: Path) -> None:
        if config not in futures:
            run_dir = root / _label(config).replace("/", "_")
            futures[config] = (run_dir, pool.submit(_timed, config, run_dir))

    def get(config: Path) -> tuple[Path, int, str, float]:
        submit(config)
        index = selected.index(config) if config in selected else -1
        if 0 <= index < len(selected) - 1:
            submit(selected[index + 1])  # the next runs beside this one
        run_dir, future = futures[config]
        return (run_dir, *future.result())

    yield get
    pool.shutdown(wait=True, cancel_futures=True)


def _timed(config: Path, run_dir: Path) -> tuple[int, str, float]:
    """:func:`_command` in a process of its own: its exit status, stderr and CPU seconds (user +
    system, its own, from ``os.wait4``)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fedlightning.cli", *_command(config, run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    err = process.stderr.read() if process.stderr else ""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, err, usage.ru_utime + usage.ru_stime


def test_every_config_states_one_claim():
    for config in CONFIGS:
        claim = Claim.of(config)
        if claim.value is not None:
            assert 0 < claim.value <= 1, config.name
            assert 0.02 <= claim.tolerance <= 0.1, config.name


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[_label(c) for c in CONFIGS])
def test_config_reaches_its_stated_accuracy(config, runs):
    claim = Claim.of(config)
    if claim.value is None:
        pytest.skip(f"{claim.metric} {PENDING}: {claim.note}")
    run_dir, status, err, seconds = runs(config)
    assert status == 0, f"{' '.join(_command(config, run_dir))} exited {status}: {err[-2000:]}"
    measured = _measured(config, run_dir, claim.metric)
    print(f"{_label(config)}: {claim.metric} {measured:.4f} in {seconds:.0f} CPU-s")
    assert claim.holds(measured), (
        f"{claim.metric} {measured:.4f}, header: {claim.value} ± {claim.tolerance}"
    )
