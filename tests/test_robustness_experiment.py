"""``experiments/robustness.py`` on a tiny subset (digits, 2 rounds): one table per attack with a
row per aggregator and a column per fraction, a refused cell where the attack is beyond the
aggregator's breakdown point, every cell in the CSV as it finishes, and a restart that reruns
nothing; the Karimireddy et al. setting on mnist5k for 2 rounds beside the released numbers."""

import csv
import re
import sys
from pathlib import Path

import pytest
import torch

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


def test_the_karimireddy2022_setting_runs_tiny_beside_the_released_numbers(tmp_path, monkeypatch):
    """Their exp3 on mnist5k, two rounds: the rules in update units (their tau = 10 and nu = 0.1
    times lr, tau over 1 - beta with torch-form momentum), the malicious clients holding every
    fifth label-sorted shard (the honest ones keep every class), one row per rule and bucketing
    with the released mean in brackets, a baseline without attack, and a restart that reruns
    nothing."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    for name in ("robustness", "karimireddy2022"):
        sys.modules.pop(name, None)
    import karimireddy2022
    import robustness

    clip = karimireddy2022.statistic("cclip", 0.9, 2)
    assert (clip.bucket_size, clip.inner.iterations, clip.inner.radius) == (
        2,
        3,
        pytest.approx(1.0),
    )
    assert karimireddy2022.statistic("cclip", 0.0, 0).radius == pytest.approx(0.1)
    rfa = karimireddy2022.statistic("rfa", 0.9, 0)
    assert (rfa.max_iter, rfa.tol, rfa.smoothing) == (8, 0.0, pytest.approx(0.001))
    args = ["--setting", "karimireddy2022", "--rounds", "2", "--seeds", "0", "--rules", "cclip",
            "krum", "--attacks", "alie", "mimic", "--momenta", "0.9", "--out", str(tmp_path)]  # fmt: skip
    text = robustness.main(args)
    dm, malicious = karimireddy2022._DATA[("mlp", 0)]
    assert len(malicious) == 5
    honest = torch.cat(
        [dm.client_train_dataloader(c, 0).y for c in range(25) if c not in malicious]
    )
    assert set(honest.tolist()) == set(range(10))
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mlp, worker momentum 0.9"))
    assert "no attack (mean): " in lines[start]
    assert lines[start + 2 : start + 4] == ["| rule | ALIE | mimic |", "|---|---|---|"]
    rows = lines[start + 4 : start + 8]
    assert [r.split(" | ")[0] for r in rows] == [
        "| CClip", "| CClip + bucketing s=2", "| Krum", "| Krum + bucketing s=2",
    ]  # fmt: skip
    # one seed: its value, then the released mean of three (CClip 98.2 and 97.9 at momentum 0.9)
    assert re.fullmatch(r"\| CClip \| \d+\.\d\d \(98\.2\) \| \d+\.\d\d \(97\.9\) \|", rows[0])
    assert re.fullmatch(r"\| Krum \+ bucketing s=2 \| \d+\.\d\d \(10\.2\) \| .*", rows[3])
    assert lines[-1].startswith("SMOKE TEST: 2 of the table's 600 rounds")
    with open(tmp_path / "results.csv") as handle:
        written = list(csv.DictReader(handle))
    assert len(written) == 1 + 2 * 2 * 2 and all(r["status"] == "ok" for r in written)
    assert "0 run(s) now" in robustness.main(args)
    printed = robustness.main([*args, "--print-only", "--rules", "rfa", "--seeds", "1"])
    assert "0 run(s) now" in printed and "| RFA | - (11.4) | - (86.4) |" in printed


def test_a_karimireddy2022_cell_kept_reruns_through_the_cli_bit_for_bit(tmp_path, monkeypatch):
    """``--keep-runs``: a cell's run directory holds the ``config.yaml`` of its run (bucketed
    centered clipping, torch-form worker momentum, the mimic attack on the label-sorted malicious
    clients), and ``fedlightning fit --config`` on it gives the same global model bit for bit, so
    the table is what the CLI computes."""
    from fedlightning.cli import main

    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    for name in ("robustness", "karimireddy2022"):
        sys.modules.pop(name, None)
    import robustness

    robustness.main(["--setting", "karimireddy2022", "--rounds", "2", "--seeds", "0", "--momenta",
                     "0.9", "--rules", "cclip", "--buckets", "2", "--attacks", "mimic",
                     "--keep-runs", "--out", str(tmp_path)])  # fmt: skip
    kept = tmp_path / "runs" / "mlp_m0.9_cclip_b2_mimic_s0"
    config = (kept / "config.yaml").read_text()
    assert "fedlightning.attacks.Mimic" in config and "form: torch" in config
    assert (tmp_path / "runs" / "mlp_m0.9_mean_b0_none_s0" / "global.pt").exists()
    monkeypatch.setattr(sys, "argv", ["fedlightning"])
    main(["fit", "--config", str(kept / "config.yaml"), "--loop.run_dir", str(tmp_path / "cli")])
    ours = torch.load(kept / "global.pt")
    theirs = torch.load(tmp_path / "cli" / "global.pt")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
