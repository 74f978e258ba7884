"""``experiments/robustness.py`` on a tiny subset (digits, 2 rounds): one table per attack with a
row per aggregator and a column per fraction, a refused cell where the attack is beyond the
aggregator's breakdown point, every cell in the CSV as it finishes, and a restart that reruns
nothing."""

import csv
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def test_the_robustness_table_has_its_shape_and_restarts(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    sys.modules.pop("robustness", None)
    import robustness

    args = ["--dataset", "digits", "--rounds", "2", "--seeds", "0", "--attacks", "sign_flip",
            "label_flip", "--fractions", "0.2", "0.45", "--aggregators", "fedavg", "krum",
            "--out", str(tmp_path)]  # fmt: skip
    text = robustness.main(args)
    with open(tmp_path / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * (1 + 2 * 2)  # aggregators x (no attack + attacks x fractions)
    lines = text.splitlines()
    for title in ("sign flipping (s = 4)", "label flipping"):
        start = next(i for i, line in enumerate(lines) if line.startswith(title))
        header, rule, fedavg, krum = lines[start + 2 : start + 6]
        assert header == "| aggregator | no attack | 20% | 45% |" and rule == "|---|---|---|---|"
        assert fedavg.startswith("| FedAvg | ") and krum.startswith("| Krum | ")
        cells = [c.strip() for c in krum.strip("|").split("|")][1:]
        assert cells[2] == "refused"  # 9 malicious of 20: Krum needs n > 2f + 2
        assert all(0 <= float(c) <= 100 for c in cells[:2])  # one seed: the value alone
    assert (tmp_path / "table.md").read_text() == text + "\n"
    again = robustness.main(args)
    assert "0 run(s) now" in again and again.split("\n", 1)[1] == text.split("\n", 1)[1]


def test_the_many_aggregations_setting_runs_the_papers_method_and_says_a_short_run_is_a_smoke_test(
    tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    sys.modules.pop("robustness", None)
    import robustness

    args = ["--setting", "many_aggregations", "--rounds", "3", "--seeds", "0", "--attacks", "ipm",
            "alie_honest", "--aggregators", "fedavg", "cc_momentum", "--out", str(tmp_path)]  # fmt: skip
    parsed = robustness.parse(args)
    assert (parsed.local_steps, parsed.client_momentum, parsed.fractions) == (1, 0.0, [0.2])
    text = robustness.main(args)
    assert "steps=1" in text.splitlines()[0]  # the setting keys its rows
    for title in ("inner-product manipulation", "a little is enough, honest variant"):
        start = next(i for i, line in enumerate(text.splitlines()) if line.startswith(title))
        rows = text.splitlines()[start + 4 : start + 6]
        assert rows[0].startswith("| FedAvg | ")
        assert rows[1].startswith("| centered clipping + worker momentum | ")
    assert text.splitlines()[-1].startswith("SMOKE TEST: 3 of the many_aggregations table's 200")
    with open(tmp_path / "results.csv") as handle:
        assert all(r["status"] == "ok" for r in csv.DictReader(handle))
