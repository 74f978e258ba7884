"""The statistic injected changed no number (issue 35 item 2; docs/algorithms.md section 2.8):
``global.pt`` of short runs of the shipped configs, through the CLI as a user runs them, is byte
for byte the file the code before the change wrote (sha256 recorded from that code on the CPU, with
``--loop.rounds 2 --loop.plots false``), re-recorded under the suite's pinned CPU kernel family
(tests/pinned_kernels.py) so that they hold on AVX2 and AVX-512 machines alike: ``python
tests/test_statistic_bitwise.py`` prints them. The cheap ones run by default, the rest are ``slow``.

The backend is named, not measured: that code's ``auto`` ran the sequential path on the CPU,
today's times both paths and may take the cohort (which rounds differently, docs/algorithms.md
sections 9.2, 9.3), so an unnamed backend would make the hash depend on the machine's speed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pinned_kernels import KERNELS

ROOT = Path(__file__).parents[1]
BYZANTINE = ["--config", "configs/byzantine.yaml"]
AGGREGATOR = "--loop.aggregator"
#: the path the hashes were recorded on (the CPU's only path of ``auto`` then)
SEQUENTIAL = ["--loop.backend", "fedlightning.backends.SequentialBackend"]
#: the kernel settings the hashes below were recorded under (tests/test_pinned_kernels.py)
RECORDED_UNDER = {
    "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
}  # fmt: skip
#: name -> (CLI arguments, sha256 of global.pt before the statistic was injected)
RUNS = {
    "krum": (BYZANTINE,
             "45aaa1ebcc7b86f9dc53614d3c3eae0f46ecc00355d0841338b38a5ce2c893a4"),
    "multi_krum": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.MultiKrum"],
                   "552229be0b727beef4c214deb20050443c2b38039a29f77182adb85a1da696df"),
    "median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg",
                "--loop.aggregator.init_args.aggregation", "median"],
               "7fa831cd7bcf9871b8134ab53ece7c50056bcf11ffbb8982b6f506e3bd0c1621"),
    "centered_clipping": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.CenteredClipping"],
                          "d4334a4d32cffffb43134f654e89491fc5b6e814def04002da245334f6087f1e"),
    "trimmed_mean": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg",
                      "--loop.aggregator.init_args.aggregation", "trimmed_mean",
                      "--loop.aggregator.init_args.trim_beta", "0.2"],
                     "0e5a5f5cfc52398bafcf738b926ee0fb88229055e68a2c4bc0a927ae14857685"),
    "geometric_median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.GeometricMedian"],
                         "64262d14c9712eb8ff7808dabb2168a6339c13a73472be2a38112a4a0c5f8560"),
    "norm_bound": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.NormBound"],
                   "a88ac091706b886d7e647ef5cefcac8ee29076c0aa6d27eb4b1bfd8357fba4b7"),
    "mean": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg"],
             "4885e78b6ea3175933fe190a2c6c735ba604b6dfe698a32023e7365421f61c48"),
    "fedadam_median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAdam",
                        "--loop.aggregator.init_args.aggregation", "median"],
                       "d7d2df391e1eac4bc585752e0a08bdbd9b2b0028fae3f68cf829bf9933e9e89c"),
    "dp_fedavg": (["--config", "configs/dp_fedavg.yaml"],
                  "ebf3528d3800fe2c95f56a6f56772906cfaa05f01eeb83e7086dec23b5496d28"),
    "fedavg": (["--config", "configs/fedavg.yaml"],
               "4a3a142a9551d3eeccdf143e640019a71ba5572c8172f2990de8d92f41c958d4"),
}  # fmt: skip
DEFAULT = ("krum", "median", "centered_clipping")


def global_hash(tmp_path: Path, args: list[str]) -> str:
    run_dir = tmp_path / "run"
    env = {**os.environ, **KERNELS, "PYTHONPATH": str(ROOT / "src")}
    env.pop("OMP_NUM_THREADS", None)  # as the hashes were recorded: the CLI's own threads
    subprocess.run(
        [sys.executable, "-m", "fedlightning.cli", "fit", *args, *SEQUENTIAL, "--loop.rounds", "2",
         "--loop.plots", "false", "--loop.run_dir", str(run_dir)],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return hashlib.sha256((run_dir / "global.pt").read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "name",
    [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in RUNS],
)
def test_global_pt_is_bitwise_what_it_was_before_the_statistic_was_injected(tmp_path, name):
    args, expected = RUNS[name]
    assert global_hash(tmp_path, args) == expected


if __name__ == "__main__":  # re-record: prints each run's hash
    import tempfile

    assert KERNELS == RECORDED_UNDER, "update RECORDED_UNDER with the hashes"
    for name, (args, _) in RUNS.items():
        with tempfile.TemporaryDirectory() as folder:
            print(name, global_hash(Path(folder), args))
