"""The statistic injected changed no number (issue 35 item 2; docs/algorithms.md section 2.8):
``global.pt`` of short runs of the shipped configs, through the CLI as a user runs them, is byte
for byte the file the code before the change wrote (sha256 recorded from that code on the CPU, with
``--loop.rounds 2 --loop.plots false``). The cheap ones run by default, the rest are ``slow``.

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

ROOT = Path(__file__).parents[1]
BYZANTINE = ["--config", "configs/byzantine.yaml"]
AGGREGATOR = "--loop.aggregator"
#: the path the hashes were recorded on (the CPU's only path of ``auto`` then)
SEQUENTIAL = ["--loop.backend", "fedlightning.backends.SequentialBackend"]
#: name -> (CLI arguments, sha256 of global.pt before the statistic was injected)
RUNS = {
    "krum": (BYZANTINE,
             "23bf4e80a5015b7ba7b0543974cfbc8dffe372518d49a391fc54750cb61f9a94"),
    "multi_krum": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.MultiKrum"],
                   "89de583f7399d64da50fc1a1c3a725f1465145af83de66bf2104860a16c708ac"),
    "median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg",
                "--loop.aggregator.init_args.aggregation", "median"],
               "368760e141cf63e2f1e8a0dbfedb12d795f862e3fb35ffd2a43db0ba22a179a9"),
    "centered_clipping": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.CenteredClipping"],
                          "1f6ffe86e910bb2745302afa0639c7f13cd50aca4fe77afb5a4686321c9d3618"),
    "trimmed_mean": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg",
                      "--loop.aggregator.init_args.aggregation", "trimmed_mean",
                      "--loop.aggregator.init_args.trim_beta", "0.2"],
                     "413d070fca6d473ed73f2c24d610cd6ec150016b55a272ebd97ec274901a2521"),
    "geometric_median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.GeometricMedian"],
                         "b1234f800920320af57509552029ee70bdadbded1355643592d736d4db1566eb"),
    "norm_bound": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.NormBound"],
                   "f88a7416e457f175e0c94538fe5076496f153949115d20b486da50c0c7908afc"),
    "mean": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAvg"],
             "c8e0f011ac91900d7272b94e5a921d8742d26f623b4dc1de6ee2a3b44149ee75"),
    "fedadam_median": ([*BYZANTINE, AGGREGATOR, "fedlightning.server.FedAdam",
                        "--loop.aggregator.init_args.aggregation", "median"],
                       "d4f9e6e35bc38ed4c3e7633984d0914cd27ff716fea9794991803ba376aedf10"),
    "dp_fedavg": (["--config", "configs/dp_fedavg.yaml"],
                  "e4bc726e14fdf45a2f5eeb4663ea23e925b62108d50ae038d9c50ca06e1b5f18"),
    "fedavg": (["--config", "configs/fedavg.yaml"],
               "3de29b9d8fe6799920d5af9dedbd8a8392ca1e705a475e484098dcdec0077685"),
}  # fmt: skip
DEFAULT = ("krum", "median", "centered_clipping")


def global_hash(tmp_path: Path, args: list[str]) -> str:
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
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
