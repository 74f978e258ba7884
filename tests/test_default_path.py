"""The default path of a run is a function of its config and the machine's kind (issue 38 item 2,
issue 43 item 1; docs/algorithms.md section 9.3): one intra-op thread per client fit whatever
threads the process has (``OMP_NUM_THREADS``, the machine's cores), and ``auto``'s rule rather
than a timing, so the same config gives the same ``global.pt`` bytes on a machine with any number
of cores and under any load. The control: with ``num_threads: null`` (the process's threads) the
bytes do differ between 1 and 3 threads, so the equality is not vacuous."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedlightning import ClientModule, FedAvg, FederatedDataModule, FederatedLoop

ROOT = Path(__file__).parents[1]


def _fit(run_dir: Path, process_threads: int, **loop_kwargs) -> bytes:
    """One short round of the quickstart's CNN on the digits, in a process of
    ``process_threads`` torch threads; the bytes of ``global.pt``."""
    torch.set_num_threads(process_threads)
    torch.manual_seed(0)
    try:
        loop = FederatedLoop(
            rounds=1, clients_per_round=1, local_steps=2, val_clients=1, aggregator=FedAvg(),
            run_dir=str(run_dir), progress_bar=False, plots=False, **loop_kwargs,
        )  # fmt: skip
        data = FederatedDataModule(dataset="digits", num_clients=4, partition="iid", batch_size=32)
        loop.fit(ClientModule(network="cnn", lr=0.05, momentum=0.5), datamodule=data)
    finally:
        torch.set_num_threads(1)  # the suite's (conftest)
    return (run_dir / "global.pt").read_bytes()


def test_the_default_threads_give_the_same_bits_whatever_threads_the_process_has(tmp_path):
    one = _fit(tmp_path / "one", 1)
    assert _fit(tmp_path / "three", 3) == one
    assert _fit(tmp_path / "null", 3, num_threads=None) != one  # the process's 3 threads


def _cli(run_dir: Path, omp: str | None, busy_loops: int) -> tuple[bytes, str]:
    """``fedlightning fit`` of the quickstart (2 rounds) with ``OMP_NUM_THREADS`` as given (None:
    unset: torch's one thread per core) beside ``busy_loops`` processes that keep a core busy."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy_loops)
    ]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fedlightning.cli", "fit", "--config", "configs/quickstart.yaml",
             "--loop.rounds", "2", "--loop.run_dir", str(run_dir), "--loop.plots", "false",
             "--loop.progress_bar", "false"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
    finally:
        for process in loops:
            process.kill()
            process.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    return (run_dir / "global.pt").read_bytes(), done.stderr


@pytest.mark.slow  # two fresh processes, one beside two busy loops
def test_the_quickstart_writes_the_same_bytes_under_load_and_with_any_omp_threads(tmp_path):
    quiet, quiet_err = _cli(tmp_path / "quiet", None, 0)
    loaded, loaded_err = _cli(tmp_path / "loaded", "3", 2)
    assert loaded == quiet
    for err in (quiet_err, loaded_err):
        assert (
            "backend: auto chose SequentialBackend (the rule of docs/algorithms.md section 9.3 for the CPU)"
            in err
        )
        assert "path: sequential fits in rounds 1-2 on cpu, 1 intra-op thread (" in err
