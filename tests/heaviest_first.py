"""Longest tests first, for a distributed run: ``--heaviest-first`` orders the collected tests by
the durations recorded in ``tests/durations.json`` (setup + call + teardown, longest first; a test
with no record counts as the median), so that ``pytest -n N --dist loadgroup`` hands each idle
worker the longest test still waiting. That is the longest-processing-time-first rule: the run
ends on short tests instead of one worker finishing a long test while the others sit idle. CI's
slow stage uses it (``.ci/run``). ``loadgroup``, not ``load``: its scheduler gives a worker one
test (a unit) when it finishes one, where ``load`` queues several behind a long one. (Its
``xdist_group`` marks do not group under pytest 9.2, which no longer reads the node id xdist
rewrites; work that several tests share is done once per session instead, as
tests/test_cross_resume.py does.)

``--record-durations`` writes this run's durations into that file, keeping the records of the
tests it did not run: ``pytest -m slow -n auto --maxprocesses 4 --dist loadgroup
--heaviest-first --record-durations`` refreshes the slow stage's.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("heaviest-first")
    group.addoption("--heaviest-first", action="store_true",
                    help=f"order the tests by their recorded durations ({DURATIONS.name}), "
                         "longest first")  # fmt: skip
    group.addoption(
        "--record-durations",
        action="store_true",
        help=f"write this run's test durations into {DURATIONS.name}",
    )


def recorded(path: Path = DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def order(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Sort ``items`` in place, longest recorded first (stable: ties keep collection order)."""
    unknown = statistics.median(durations.values()) if durations else 0.0
    items.sort(key=lambda item: -durations.get(item.nodeid, unknown))


class Recorder:
    """Sums each test's phase durations as the reports arrive (on xdist's controller, from
    every worker) and merges them into the file when the session ends."""

    def __init__(self, path: Path = DURATIONS) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.seconds:
            return  # an xdist worker: the controller records every worker's reports
        merged = {**recorded(self.path), **{k: round(v, 1) for k, v in self.seconds.items()}}
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def configure(config: pytest.Config) -> None:
    if config.getoption("record_durations"):
        config.pluginmanager.register(Recorder(), "heaviest-first-recorder")


def modify(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("heaviest_first"):
        order(items, recorded())
