"""``experiments/time_effects.py`` (issue 41 item 6): the straggler trace recomputed by hand, and
the ``--quick`` run's tables, with properties that fail if the experiment were wired wrong: with
no straggler, FedAvg dropping stragglers is FedAvg without a system model, row for row; at 50%,
the deadline drops uploads that partial work keeps; a synchronous round lasts its slowest client's
Pareto duration, and a deadline bounds it."""

import csv
import math
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.fixture
def time_effects(monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    for name in ("time_effects", "time_runs"):
        sys.modules.pop(name, None)
    import time_effects

    return time_effects


def test_stragglers_get_the_budget_of_their_epochs_and_miss_the_deadline_in_full(time_effects):
    import time_runs

    sizes = [45, 48, 55, 103, 120, 221, 440, 800, 61, 58]
    epochs, batch, deadline = 20, 10, 1.0
    speeds, done = time_runs.straggler_speeds(sizes, 0.5, epochs, batch, deadline, seed=3)
    assert len(done) == 5 and all(1 <= x <= epochs - 1 for x in done.values())
    for k, (n, v) in enumerate(zip(sizes, speeds, strict=True)):
        full_time = n * epochs / v
        if k in done:  # the step budget floor(T v / B) is x_k epochs' worth of samples
            assert math.floor(deadline * v / batch) == math.floor(done[k] * n / batch)
            assert full_time > deadline  # without partial work: late, dropped
        else:
            assert full_time == pytest.approx(deadline / 2)
    assert time_runs.straggler_speeds(sizes, 0.0, epochs, batch, deadline, seed=3)[1] == {}


def rows(path: Path) -> list[dict[str, str]]:
    with open(path / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_quick_run_writes_both_tables_and_its_runs_keep_their_promises(time_effects, tmp_path):
    text = time_effects.main(["--quick", "--out", str(tmp_path)])
    assert (tmp_path / "table.md").read_text() == text
    assert (tmp_path / "stragglers.png").stat().st_size > 0
    assert (tmp_path / "fedbuff.png").stat().st_size > 0
    lines = text.splitlines()
    a = lines.index("### (a) synthetic(1,1), 2 rounds, 2 local epochs")
    assert lines[a + 2].startswith("| method | stragglers | test_acc last |")
    table_a = [line.split(" | ") for line in lines[a + 4 : a + 13]]
    assert [(r[0], r[1]) for r in table_a] == [
        ("| FedAvg (drops stragglers)", "0%"), ("| FedProx mu=1", "0%"),
        ("| FedAvg (no system model)", "0%"), ("| FedAvg (drops stragglers)", "50%"),
        ("| FedProx mu=0", "50%"), ("| FedProx mu=1", "50%"),
        ("| FedAvg (drops stragglers)", "90%"), ("| FedProx mu=0", "90%"),
        ("| FedProx mu=1", "90%"),
    ]  # fmt: skip
    assert table_a[0][2:] == table_a[2][2:]  # the two FedAvg at 0%: the same numbers
    assert text.rstrip().splitlines()[-1].startswith("SMOKE TEST")

    # with no straggler the deadline drops nothing: FedAvg with and without the clock, row for row
    dropping, plain = (
        rows(tmp_path / "a2x2-FedAvg-None-False-0%"),
        rows(tmp_path / "a2x2-FedAvg-None-True-0%"),
    )
    assert [r["test_acc"] for r in dropping] == [r["test_acc"] for r in plain]
    assert {r["clients_late"] for r in dropping} == {"0"}
    # at 50% the deadline drops uploads; partial work sends them (as partial fits) instead
    assert sum(int(r["clients_late"]) for r in rows(tmp_path / "a2x2-FedAvg-None-False-50%")) > 0
    partial = rows(tmp_path / "a2x2-FedProx-1.0-False-50%")
    assert {r["clients_late"] for r in partial} == {"0"}
    assert sum(int(r["clients_partial"]) for r in partial) > 0

    b = next(i for i, line in enumerate(lines) if line.startswith("### (b)"))
    assert lines[b + 2].startswith("| method | virtual s to test_acc 90% (per seed) |")
    assert [line.split(" | ")[0] for line in lines[b + 4 : b + 8]] == [
        "| FedBuff (K=5, 10 in flight)", "| FedAsync (10 in flight)",
        "| FedAvg (waits for all)", "| FedAvg (deadline 2 s)",
    ]  # fmt: skip
    # each synchronous round lasts one client's Pareto duration (its slowest); a deadline caps it
    import time_runs

    durations = time_runs.pareto_durations(20, 1.0, 1.5, seed=0)
    for name, cap in (("b20-FedAvg-False-0", math.inf), ("b20-FedAvg-True-0", 2.0)):
        times = [0.0] + [float(r["virtual_time"]) for r in rows(tmp_path / name)]
        for step in (t1 - t0 for t0, t1 in zip(times, times[1:], strict=False)):
            assert step <= cap + 1e-6
            assert step == pytest.approx(cap) or min(abs(step - d) for d in durations) < 1e-6
