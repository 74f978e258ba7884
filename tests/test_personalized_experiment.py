"""experiments/personalized.py (issue 39 item 4) end to end at its smallest size: its runs are
the shipped configs through ``fit``, its table cells are the runs' logged numbers, and a
run shorter than the table's says it is a smoke test; a rerun skips the runs it has."""

import csv
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.mark.slow  # two one-round fits through the CLI: about half a minute
def test_the_table_is_the_runs_numbers(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    sys.modules.pop("personalized", None)
    import personalized

    argv = ["--rounds", "1", "--seeds", "0", "--datasets", "digits", "--splits", "pathological",
            "--methods", "FedAvg-FT", "Ditto", "--out", str(tmp_path)]  # fmt: skip
    text = personalized.main(argv)
    with open(tmp_path / "runs.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["method"] for r in rows] == ["FedAvg-FT", "Ditto"]
    for row in rows:
        cells = f"| {row['method']} | {100 * float(row['personal_acc']):.2f} | "
        assert cells + f"{100 * float(row['test_acc']):.2f} |" in text
    assert "SMOKE TEST: 1 of the table's 30 rounds." in text
    assert (tmp_path / "personal_acc.png").stat().st_size > 0
    assert (tmp_path / "table.md").read_text().strip() == text.strip()
    # a rerun into the same folder runs nothing and prints the same table
    again = personalized.main(argv)
    assert "0 run(s) now" in again
    assert again.split("s\n", 1)[1] == text.split("s\n", 1)[1]


def test_a_failed_run_stops_the_table_and_a_signal_stops_the_process(monkeypatch, tmp_path):
    """A run the CLI fails (exit 1) or refuses (exit 2) becomes an error the table stops on, in a
    pool's worker too (a worker's SystemExit would leave the pool waiting for its result); a
    signal's exit (143: SIGTERM) is not caught: the process ends with it."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    sys.modules.pop("personalized", None)
    import personalized

    cell = ("FedBN", "mnist5k", "dirichlet", 2, 30, str(tmp_path))
    for code in (1, 2, 143):

        def exits(*args, code=code):
            raise SystemExit(code)

        monkeypatch.setattr(personalized, "fit", exits)
        if code == 143:
            with pytest.raises(SystemExit) as stopped:
                personalized._run(cell)
            assert stopped.value.code == 143
        else:
            with pytest.raises(
                RuntimeError, match=f"FedBN on mnist5k dirichlet seed 2: exit {code}"
            ):
                personalized._run(cell)
