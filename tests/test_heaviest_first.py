"""The slow stage's ordering (tests/heaviest_first.py): longest recorded first, unknown tests at
the median, ties in collection order; the recorder sums a test's phases and keeps the records of
tests it did not see."""

from __future__ import annotations

import json
from types import SimpleNamespace

from heaviest_first import DURATIONS, Recorder, order, recorded


def test_items_run_longest_recorded_first_and_unknown_ones_at_the_median():
    items = [SimpleNamespace(nodeid=name) for name in ["a", "new1", "b", "c", "new2", "d"]]
    durations = {"a": 1.0, "b": 300.0, "c": 20.0, "d": 5.0}  # median 12.5
    order(items, durations)
    assert [item.nodeid for item in items] == ["b", "c", "new1", "new2", "d", "a"]


def test_the_recorder_sums_phases_and_merges_into_what_was_recorded(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"kept": 7.0, "t": 99.0}))
    recorder = Recorder(path)
    for phase_seconds in (0.25, 2.0, 0.04):  # setup, call, teardown
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid="t", duration=phase_seconds))
    worker = SimpleNamespace(config=SimpleNamespace(workerinput={}))
    recorder.pytest_sessionfinish(worker)
    assert json.loads(path.read_text()) == {"kept": 7.0, "t": 99.0}  # a worker writes nothing
    recorder.pytest_sessionfinish(SimpleNamespace(config=SimpleNamespace()))
    assert json.loads(path.read_text()) == {"kept": 7.0, "t": 2.3}


def test_the_shipped_record_names_collected_slow_tests():
    names = recorded(DURATIONS)
    assert len(names) > 100 and all(v >= 0 for v in names.values())
    assert any(name.startswith("tests/test_config_accuracy.py::") for name in names)
