"""Every shipped configuration learns: each config under ``configs/`` (``configs/experiments/``
need data sets on disk) runs at its defaults, on one torch thread as the whole suite does
(conftest.py), and ends at the accuracy its header's ``# Checked:`` line states::

    # Checked: test_acc 0.9611 ± 0.04 (...)            the last round's logged value
    # Checked: group_mean_acc to be re-measured (...)    no figure yet: skipped, saying why

A tolerance is max(0.02, twice the standard deviation of the run's last five evaluations), rounded
up to a hundredth: the run is deterministic on one machine, and the tolerance allows for another
machine's rounding, which moves the last round within the run's own round-to-round swing.

Every logged accuracy is the saved models scored in eval mode (docs/algorithms.md section 6.1;
tests/test_rescore.py re-scores every config's models independently, on both backends). CoFED configs run through ``fedlightning cofed`` and check summary.json.
Each test prints its value and CPU time (``pytest -s``): the headers' CPU times come from here.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fedlightning.cli import main

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


def run_fit(config: Path, run_dir: Path, metric: str) -> float:
    """``fedlightning fit`` at the config's defaults; ``metric`` logged after the last round."""
    sys.argv = ["fedlightning"]
    main(["fit", "--config", str(config), "--loop.run_dir", str(run_dir),
          "--loop.progress_bar", "false", "--loop.plots", "false"])  # fmt: skip
    with open(run_dir / "metrics.csv") as handle:
        last = list(csv.DictReader(handle))[-1]
    rounds = yaml.safe_load((run_dir / "config.yaml").read_text())["loop"]["rounds"]
    assert int(last["round"]) == rounds and last[metric] != "", f"no {metric} after round {rounds}"
    return float(last[metric])


def run_cofed(config: Path, run_dir: Path, metric: str) -> float:
    """``fedlightning cofed`` at the config's defaults; ``metric`` of its summary.json."""
    sys.argv = ["fedlightning"]
    main(["cofed", "--config", str(config), "--run_dir", str(run_dir),
          "--progress_bar", "false"])  # fmt: skip
    return float(json.loads((run_dir / "summary.json").read_text())[metric])


def test_every_config_states_one_claim():
    for config in CONFIGS:
        claim = Claim.of(config)
        if claim.value is not None:
            assert 0 < claim.value <= 1, config.name
            assert 0.02 <= claim.tolerance <= 0.1, config.name


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[_label(c) for c in CONFIGS])
def test_config_reaches_its_stated_accuracy(config, tmp_path):
    claim = Claim.of(config)
    if claim.value is None:
        pytest.skip(f"{claim.metric} {PENDING}: {claim.note}")
    started = time.process_time()
    if config.name.startswith("cofed"):
        measured = run_cofed(config, tmp_path, claim.metric)
    else:
        measured = run_fit(config, tmp_path, claim.metric)
    seconds = time.process_time() - started
    print(f"{_label(config)}: {claim.metric} {measured:.4f} in {seconds:.0f} CPU-s")
    assert claim.holds(measured), (
        f"{claim.metric} {measured:.4f}, header: {claim.value} ± {claim.tolerance}"
    )
