"""The statistic injected changed no number (issue 35 item 2; docs/algorithms.md section 2.8):
``global.pt`` of short runs of the shipped configs, through the CLI as a user runs them, is byte
for byte the file the code before the change wrote (sha256 recorded from that code on the CPU, with
``--loop.rounds 2 --loop.plots false``), re-recorded under the suite's pinned CPU kernel family
(tests/pinned_kernels.py) so that they hold on AVX2 and AVX-512 machines alike, and again at the
default of one intra-op thread per client fit (issue 38 item 2: before, the CLI ran torch's one
thread per core, so these hashes held only on machines of the recording one's core count): ``python
tests/test_statistic_bitwise.py`` prints them. The runs leave ``OMP_NUM_THREADS`` unset, so they
check that the default holds whatever threads the process has. The cheap ones run by default, the
rest are ``slow``.

The backend is named: these hashes pin the sequential path, which ``auto`` takes on the CPU by
its rule today (docs/algorithms.md section 9.3), whatever that rule becomes."""

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
             "6a9b111050880fd03c30e796aa106d11f827eb5737026b34ae13ddbbeab6c690"),
    "multi_krum": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.MultiKrum"],
                   "34b568d12774944975968217265e9ae50c5013e776276bc9f13baa2078925efa"),
    "median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg",
                "--loop.aggregator.init_args.aggregation", "median"],
               "37b421fdaedfb0c6597fe83c42df8a937a85c19587256f47e630cc085b89eae9"),
    "centered_clipping": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.CenteredClipping"],
                          "950f7a0dc229d17fdf637586002438ac3e2e645e29be75af851a0e8768691dfb"),
    "trimmed_mean": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg",
                      "--loop.aggregator.init_args.aggregation", "trimmed_mean",
                      "--loop.aggregator.init_args.trim_beta", "0.2"],
                     "20150f506d33ba54ff5574aa1328a13d1c2830d935fddbc761ff2e95027895cb"),
    "geometric_median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.GeometricMedian"],
                         "f5cc7e45d9a49a070d59dd5c70be885a51183601c7eaf7cbf652f8946ab2e475"),
    "norm_bound": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.NormBound"],
                   "60f81f13ae9eca6c31df0e78532ac037b4b4e30d61229d33a360ff911590a037"),
    "mean": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg"],
             "7c54e3ebb1d7ca098f74985c3b74389ca045b89db2c4e53cff869c5043593373"),
    "fedadam_median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAdam",
                        "--loop.aggregator.init_args.aggregation", "median"],
                       "1a3ff14e6da171c799c6bb8824a74789d4b07c1005394e85236fa62a5b79aaa5"),
    "dp_fedavg": (["--config", "configs/dp_fedavg.yaml"],
                  "e8cb9ce7239505569fd7bc0a19126f22de8fc1770579e6100d3ceaf65b4c8b20"),
    "fedavg": (["--config", "configs/fedavg.yaml"],
               "e927ada2437446925eaf7814665d51279bde92c96e8397c4f430287703c5ed3b"),
}  # fmt: skip
DEFAULT = ("krum", "median", "centered_clipping")


def global_hash(tmp_path: Path, args: list[str]) -> str:
    run_dir = tmp_path / "run"
    env = {**os.environ, **KERNELS, "PYTHONPATH": str(ROOT / "src")}
    env.pop("OMP_NUM_THREADS", None)  # torch's one thread per core: the default overrides it
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
