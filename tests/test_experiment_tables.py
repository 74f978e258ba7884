"""The experiment scripts' tables say what they are: one seed prints each cell's value (never
``± 0.00``, a spread one seed cannot measure), and a run with fewer rounds than the table's says
in its output that it is a smoke test (``experiments/tables.py``)."""

import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    for name in ("tables", "objectives", "hetero", "cofed"):
        sys.modules.pop(name, None)


def test_cells_spread_only_over_several_seeds(scripts):
    from tables import mean_std, over_seeds, smoke_test_line

    assert mean_std([0.5]) == "50.00" and mean_std([0.5], decimals=1) == "50.0"
    assert mean_std([0.5, 0.7]) == "60.00 ± 14.14"  # the sample std: 0.1 * sqrt(2)
    assert over_seeds([3]) == "seed 3 only (each cell its value; one seed measures no spread)"
    assert over_seeds([0, 1, 2]) == "mean ± std over seeds 0, 1, 2"
    assert smoke_test_line(30, 30) is None and smoke_test_line(40, 30) is None
    assert smoke_test_line(3, 30).startswith("SMOKE TEST: 3 of the table's 30 rounds.")


def test_cofed_one_seed_is_a_value_not_a_range(scripts):
    import cofed

    summary = {"mean_local_acc": 0.5, "mean_cofed_acc": 0.6, "mean_relative_acc": 1.2,
               "pseudo_label_acc": 0.7}  # fmt: skip
    participants = [{"relative_acc": "1.1"}, {"relative_acc": "0.9"}]
    one = cofed.table_row("iid", [summary], participants)
    assert one == "| iid | 1 | 0.500 | 0.600 | 1.200 | 1/2 | 0.900-1.100 | 0.700 |"
    assert "range over seeds" not in cofed.header(1)[0]
    other = {**summary, "mean_relative_acc": 1.4}
    two = cofed.table_row("iid", [summary, other], participants * 2)
    assert "| 1.300 (1.200-1.400) |" in two and "range over seeds" in cofed.header(2)[0]


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_objectives_quick_look_has_no_spread_and_calls_a_short_run_a_smoke_test(scripts):
    import objectives

    text = objectives.main(["--rounds", "1", "--seeds", "0", "--methods", "FedAvg", "FedProx",
                            "--num-clients", "4", "--clients-per-round", "2"])  # fmt: skip
    rows = _table(text)[1:]
    assert [r.split(" | ")[0] for r in rows] == ["| FedAvg", "| FedProx"]
    assert "±" not in "\n".join(rows) and "seed 0 only" in text
    assert text.rstrip().splitlines()[-1].startswith("SMOKE TEST: 1 of the table's 30 rounds.")


def test_hetero_quick_look_has_no_spread_and_calls_a_short_run_a_smoke_test(scripts, tmp_path):
    import hetero

    text = hetero.main(["--rounds", "1", "--seeds", "0", "--methods", "HeteroAvg",
                        "--num-clients", "5", "--clients-per-round", "2", "--width", "2",
                        "--out", str(tmp_path)])  # fmt: skip
    (row,) = _table(text)[1:]
    assert row.startswith("| HeteroAvg | ") and "±" not in row
    assert all(0 <= float(c) <= 100 for c in row.strip("|").split("|")[1:-1])
    assert "SMOKE TEST: 1 of the table's 20 rounds." in text
    assert (tmp_path / "table.md").read_text() == text
