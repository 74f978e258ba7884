"""No behaviour change from a refactor of the loop: short runs of shipped configs give the same
``global.pt``, byte for byte, and the same metrics as recorded (issue 35 item 5).

The hashes were recorded with one intra-op thread under the suite's pinned CPU kernel family
(tests/pinned_kernels.py: ATen's AVX2 kernels, MKL's cross-vendor branch), so they hold on AVX2 and
AVX-512 machines alike; a change to the loop, the components, the aggregators or
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

from pinned_kernels import KERNELS, comparable, pin

pin()  # as the recording below ran (a no-op under pytest: conftest pinned already)

from fedlightning.cli import main  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHORT = ["--loop.rounds", "2", "--loop.plots", "false", "--loop.progress_bar", "false"]
#: the backend named, not measured (``auto`` chooses by timing; the cohort rounds differently)
SEQUENTIAL = ["--loop.backend", "fedlightning.backends.SequentialBackend"]
COHORT = ["--loop.backend", "fedlightning.backends.CohortBackend"]

#: the kernel settings the hashes below were recorded under (tests/test_pinned_kernels.py)
RECORDED_UNDER = {
    "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
}  # fmt: skip
#: case -> (config, extra options, sha256 of global.pt, sha256 of the metrics without times)
CASES: dict[str, tuple[str, list[str], str, str]] = {
    "quickstart_target": (
        "quickstart", [*SEQUENTIAL, "--loop.target_acc", "0.1"],
        "6a57a733a0e61577756d7cb0b846383cfd0031fcd6e2e242087c388a2cc50f2f",
        "5423c2b3e7e5bdda784ef8a2e1777688d4cf419f73edc93b4c97ad433f3ce379",
    ),
    "fedprox": (
        "fedprox", SEQUENTIAL,
        "74746ff7b821ce05908bf118ef5039818812ee0e7549da31e7cf61e1edaf60da",
        "c21c03d469dd056c7bd0b8c8cae3ddf3132096f9654d9ed38d44b2bfd9ce070f",
    ),
    "scaffold": (
        "scaffold", SEQUENTIAL,
        "6f8c37169b3e8d58ee44f54cba5b99de1297068c90e0285bf9ad3f3ae9ed1d07",
        "c3260a9fd3d677963bb9487c9e0c2ad1e26d473a2c7fd22b847547d95328e3f5",
    ),
    "fedcross": (
        "fedcross", SEQUENTIAL,
        "45a96b8575f6d36653ac2370cfcec7f3b3790f49302bd863cd1e266096714b9a",
        "67ab15c4073ee5eceed1d1c7cce5f0019816d97011197cd99ccf63080bb09c06",
    ),
    "byzantine": (
        "byzantine", SEQUENTIAL,
        "6a9b111050880fd03c30e796aa106d11f827eb5737026b34ae13ddbbeab6c690",
        "fc11301f5c5dde5468b27953e3313573c1d7027ef3e48e2d5809968ef39a681b",
    ),
    "dp_fedavg": (
        "dp_fedavg", COHORT,
        "e8cb9ce7239505569fd7bc0a19126f22de8fc1770579e6100d3ceaf65b4c8b20",
        "f8c6838a8e6cef28660cfee9590fee608d0998041b33be62752a83861ef608f8",
    ),
    "heteroavg_resnet": (
        "heteroavg_resnet", SEQUENTIAL,
        "c2d1f371327166c9f75308d0b2470d5deeee0a6860a419aa328c13df88ba4a1e",
        "9c4bb9d8d2e58326b099e41071d7aa101dc16518bc60298388d0230133564cf2",
    ),
}  # fmt: skip
#: the cases over a few CPU-seconds each (the ResNets): run by `make test-all`
SLOW = {"heteroavg_resnet"}


def _run(case: str, run_dir: Path) -> tuple[str, str]:
    """Run ``case``; the sha256 of its ``global.pt`` and of its metrics without wall times (the
    accountant's columns at the digits :func:`pinned_kernels.comparable` keeps)."""
    config, extra, _, _ = CASES[case]
    sys.argv = ["fedlightning"]
    main(["fit", "--config", str(CONFIGS / f"{config}.yaml"), "--loop.run_dir", str(run_dir),
          *SHORT, *extra])  # fmt: skip
    model = hashlib.sha256((run_dir / "global.pt").read_bytes()).hexdigest()
    with open(run_dir / "metrics.csv") as handle:
        rows = [
            sorted((k, comparable(k, v)) for k, v in row.items() if not k.endswith("_s"))
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
    assert KERNELS == RECORDED_UNDER, "update RECORDED_UNDER with the hashes"
    with tempfile.TemporaryDirectory() as folder:
        for name in CASES:
            print(name, *_run(name, Path(folder) / name))
