from __future__ import annotations

from pinned_kernels import pin

pin()  # before torch loads: the CPU kernel family every pinned result was recorded with

import csv
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

import heaviest_first
from fedlightning.cli import main


def pytest_addoption(parser):
    heaviest_first.add_options(parser)


def pytest_configure(config):
    heaviest_first.configure(config)


def pytest_collection_modifyitems(config, items):
    heaviest_first.modify(config, items)


@pytest.fixture(autouse=True)
def _fedlightning_log_level():
    """The ``fedlightning`` logger's level as each test found it: the experiment scripts quiet it
    (``setLevel(ERROR)``) when a test runs their ``main`` in-process, which would hide the
    warnings a later test reads."""
    log = logging.getLogger("fedlightning")
    level = log.level
    yield
    log.setLevel(level)


# One intra-op thread: the tiny models here gain nothing from more, several test processes
# (notebook kernels, killed runs) share the cores, and torch 2.14.1's CPU kernels corrupted the heap
# in backward of the ResNet10..26 family with 2 threads on this machine (see the foundation note).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

CONF = Path(__file__).parent / "conf"


def overridden(args: list[str] | tuple[str, ...]) -> list[str]:
    """``args`` (a helper's defaults, then a case's own options: ``--option [value]`` words)
    with each option given once, at its last value and place; an option given twice with two
    values is refused, as users get it."""
    given: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        value = list(args[i + 1 : i + 2]) if i + 1 < len(args) else []
        if value and value[0].startswith("--"):
            value = []  # a flag
        given.pop(args[i], None)
        given[args[i]] = [args[i], *value]
        i += 1 + len(value)
    return [word for option in given.values() for word in option]


def run_cli(run_dir: Path, *args: str, config: str = "tiny.yaml") -> list[dict[str, str]]:
    """Run ``fedlightning fit`` in-process on a test config; return the rows of metrics.csv."""
    sys.argv = ["fedlightning"]  # LightningCLI warns when both sys.argv and args are given
    main(["fit", "--config", str(CONF / config), "--loop.run_dir", str(run_dir), *args])
    with open(run_dir / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def cli_fails(
    cli, capsys, run_dir: Path, *args: str, code: int = 1, config: str = "tiny.yaml"
) -> str:
    """Run ``fedlightning fit`` in-process (``cli``: :func:`run_cli`) expecting exit status
    ``code`` and no traceback on stderr; return stderr's last line."""
    with pytest.raises(SystemExit) as exit_info:
        cli(run_dir, *args, config=config)
    assert exit_info.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="module")
def local_ray():
    """The local Ray instance of 2 CPUs this test process shares between its Ray tests (skipped
    without Ray): started by the first module that asks, kept for the next ones (a start costs
    about 30 s on 2 cores), shut down at the session's end or by :func:`without_ray`. Its actors
    import the plug-ins of tests/user_clients.py as a user's installed module. A run's RayBackend
    joins it and leaves it running (it shuts down only a Ray instance it started)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).parent), saved])
        )
        try:  # the local cluster's processes inherit the environment of ray.init
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
    yield


@pytest.fixture
def without_ray():
    """No Ray connection in this process (the shared :func:`local_ray` shut down, the next module
    that asks starts another): for tests of how a run starts and stops a Ray instance itself."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()


def pytest_sessionfinish(session, exitstatus):
    """The shared Ray instance (:func:`local_ray`) ends with the test process's session."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
