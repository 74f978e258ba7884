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
