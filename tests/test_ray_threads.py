"""The Ray backend writes the same ``global.pt`` bytes as the sequential backend on CPU whatever
``OMP_NUM_THREADS`` the user has (issue 26 item 9): the actors compute with the driver's torch
settings (:class:`fedlightning.torch_settings.ComputeSettings`), not with Ray's one thread per
``num_cpus``. With ``OMP_NUM_THREADS`` unset, torch uses one thread per core in the driver, and a
reduction split over two threads adds in another order than over one (the quickstart's
``features.0.weight`` differed by 1.5e-8 after 3 rounds before the fix).

Real ``fedlightning fit`` processes, as a user starts them, with ``OMP_NUM_THREADS`` removed from
(or set in) their environment: the test suite itself runs with one thread (conftest)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # Ray's start-up in two processes a case: about a minute each

ROOT = Path(__file__).parents[1]
QUICKSTART = ("--config", "configs/quickstart.yaml", "--loop.rounds", "3")
BATCHNORM = (
    "--config", "configs/quickstart.yaml", "--loop.rounds", "2",
    "--model.init_args.network", "resnet14",
    "--model.init_args.network_kwargs", "{width: 4, stem: small}",
)  # fmt: skip
RAY = ("--loop.backend", "RayBackend", "--loop.backend.num_workers", "2")


def _fit(run_dir: Path, omp: str | None, *args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-m", "fedlightning.cli", "fit", *args, "--loop.run_dir", str(run_dir),
         "--loop.plots", "false", "--loop.progress_bar", "false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return (run_dir / "global.pt").read_bytes()


@pytest.mark.parametrize(
    ("config", "omp"),
    [(QUICKSTART, None), (BATCHNORM, None), (QUICKSTART, "3")],
    ids=["quickstart-omp-unset", "batchnorm-omp-unset", "quickstart-omp-3"],
)
def test_ray_writes_the_sequential_global_model_bytes(tmp_path, config, omp):
    sequential = _fit(tmp_path / "sequential", omp, *config)
    assert _fit(tmp_path / "ray", omp, *config, *RAY) == sequential
