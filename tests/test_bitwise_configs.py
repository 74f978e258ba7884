"""No behaviour change from a refactor of the loop: short runs of shipped configs give the same
``global.pt``, byte for byte, and the same metrics as recorded (issue 35 item 5).

The hashes were recorded on this project's CPU with one intra-op thread (tests/conftest.py) before
the round body became round components; a change to the loop, the components, the aggregators or
the fit that moves one bit of a trained model or of a logged number fails here. The metrics are
pinned as (column, value) pairs without the wall-time columns (``*_s``), so the communication
meter, the targets, the privacy report and the adversary's count are pinned with the model. A
deliberate change of the numbers (a new algorithm default, another torch) re-records them:
``python tests/test_bitwise_configs.py`` prints the table below.
"""

from __future__ import annotations

import csv
import hashlib
import sys
from pathlib import Path

import pytest

from fedlightning.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHORT = ["--loop.rounds", "2", "--loop.plots", "false", "--loop.progress_bar", "false"]
#: the backend named, not measured (``auto`` chooses by timing; the cohort rounds differently)
SEQUENTIAL = ["--loop.backend", "fedlightning.backends.SequentialBackend"]
COHORT = ["--loop.backend", "fedlightning.backends.CohortBackend"]

#: case -> (config, extra options, sha256 of global.pt, sha256 of the metrics without times)
CASES: dict[str, tuple[str, list[str], str, str]] = {
    "quickstart_target": (
        "quickstart", [*SEQUENTIAL, "--loop.target_acc", "0.1"],
        "67bc084778b780747809a6034052e8b31f3fc7874402ca1b7f19000c8587a218",
        "2d86d6e4a781f9dc2101d54636772258707d0b3b9e9396b10da46f18531e39ee",
    ),
    "fedprox": (
        "fedprox", SEQUENTIAL,
        "501dba0db43a740ba3021c8b4bda2d6d406a6874bd494704951a7e50d60505f7",
        "f655e79783247d0b0c5c083b68bfa1d2a606c9fce3f17931897c66781759630c",
    ),
    "scaffold": (
        "scaffold", SEQUENTIAL,
        "53b0397facdf71eb16b74aa3d372555057b6cca81f9bf8c92c4be772c59af5c4",
        "a231072eab07aec3bf9a33a3c81a0c04f802f91ee77f5872732261e98caa0111",
    ),
    "fedcross": (
        "fedcross", SEQUENTIAL,
        "75a406445cd4ddda81135bf8885b3fe9222400505a1cfc8747eefb02de0c8611",
        "77c794bc26daaaae80e84dd27f91b53916b09e917cc189ed6270b9b58ebb9683",
    ),
    "byzantine": (
        "byzantine", SEQUENTIAL,
        "d3bc62af210c11518d6eca8e203baad4315089cb248502dfd0878e2631430c0b",
        "8de2032304d100fe06f6eb967e3f6f13dd798f5a1ec488615c9ccb06df153fc2",
    ),
    "dp_fedavg": (
        "dp_fedavg", COHORT,
        "e4bc726e14fdf45a2f5eeb4663ea23e925b62108d50ae038d9c50ca06e1b5f18",
        "4a877d7aa8dd6d11c66753c51a1fa918d44300cf6053971358e69e7f62dbcd8b",
    ),
    "heteroavg_resnet": (
        "heteroavg_resnet", SEQUENTIAL,
        "6241f14f1e6ddaa717f6040a92027311d2aab2de25a02cfd8d9c316dc8bc673c",
        "501eb678f8e12f7e786621eb3539a4b0292efd2f37bb40a71af6cfb169a720a5",
    ),
}  # fmt: skip
#: the cases over a few CPU-seconds each (the ResNets): run by `make test-all`
SLOW = {"heteroavg_resnet"}


def _run(case: str, run_dir: Path) -> tuple[str, str]:
    """Run ``case``; the sha256 of its ``global.pt`` and of its metrics without wall times."""
    config, extra, _, _ = CASES[case]
    sys.argv = ["fedlightning"]
    main(["fit", "--config", str(CONFIGS / f"{config}.yaml"), "--loop.run_dir", str(run_dir),
          *SHORT, *extra])  # fmt: skip
    model = hashlib.sha256((run_dir / "global.pt").read_bytes()).hexdigest()
    with open(run_dir / "metrics.csv") as handle:
        rows = [
            sorted((k, v) for k, v in row.items() if not k.endswith("_s"))
            for row in csv.DictReader(handle)
        ]
    return model, hashlib.sha256(repr(rows).encode()).hexdigest()


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES]
)
def test_short_run_is_bitwise_as_recorded(case, tmp_path):
    model, metrics = _run(case, tmp_path / case)
    assert model == CASES[case][2], f"{case}: global.pt changed"
    assert metrics == CASES[case][3], f"{case}: the logged metrics changed"


if __name__ == "__main__":  # re-record: prints each case's hashes
    import tempfile

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        for name in CASES:
            print(name, *_run(name, Path(folder) / name))
