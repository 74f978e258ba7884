"""``loop.deterministic`` (issue 31 item 1): deterministic algorithms applied for the run on every
backend and restored afterwards, cuBLAS's workspace variable set before anything of the run is
built (in a fresh process, as a user starts one), an op without a deterministic implementation
refused at its first use in one line naming it and the option, and the resume rule."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedlightning import FedAvg, FederatedDataModule, FederatedLoop
from fedlightning.backends import CohortBackend, SequentialBackend
from fedlightning.clients import ClientModule
from fedlightning.determinism import CUBLAS_VARIABLE, deterministic_compute
from fedlightning.errors import ConfigurationError
from objective_helpers import SYNTHETIC

ROOT = Path(__file__).parents[1]
CONF = Path(__file__).parent / "conf"


class Recording(FedAvg):
    """Keeps every upload's client metrics for the test to read (not server state: transient)."""

    transient_attributes = FedAvg.transient_attributes | {"metrics"}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.metrics = []

    def aggregate(self, round_index, uploads):
        self.metrics.extend(u.metrics for u in uploads)
        super().aggregate(round_index, uploads)


class ReportsSettings(ClientModule):
    """Reports, as client metrics, the settings its fit ran under."""

    def client_metrics(self):
        return {
            **super().client_metrics(),
            "deterministic": float(torch.are_deterministic_algorithms_enabled()),
            "warn_only": float(torch.is_deterministic_algorithms_warn_only_enabled()),
            "cudnn_deterministic": float(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": float(torch.backends.cudnn.benchmark),
            "cublas": float(os.environ.get(CUBLAS_VARIABLE) == ":4096:8"),
        }


class Unpools(ClientModule):
    """A local loss with an op that has no deterministic implementation on the CPU."""

    def local_loss(self, batch):
        loss = super().local_loss(batch)
        unpooled = torch.nn.functional.max_unpool1d(
            loss.reshape(1, 1, 1).expand(1, 1, 2), torch.tensor([[[0, 1]]]), 2
        )
        return loss + 0 * unpooled.sum()


def _fit(model, tmp_path, backend=None, **kwargs):
    dm = FederatedDataModule(
        dataset="synthetic", num_samples=120, num_test=30, num_classes=3, sample_shape=(6,),
        num_clients=3, partition="iid", batch_size=16,
    )  # fmt: skip
    loop = FederatedLoop(
        rounds=1, clients_per_round=2, aggregator=Recording(), run_dir=str(tmp_path),
        progress_bar=False, plots=False, backend=backend or SequentialBackend(), **kwargs,
    )  # fmt: skip
    loop.fit(model, datamodule=dm)
    return loop


@pytest.fixture
def process_settings(monkeypatch):
    """Non-default settings before the run (so that restoring them shows), put back after."""
    monkeypatch.delenv(CUBLAS_VARIABLE, raising=False)
    cudnn = torch.backends.cudnn
    saved = (cudnn.deterministic, cudnn.benchmark)
    torch.use_deterministic_algorithms(False)
    cudnn.deterministic, cudnn.benchmark = False, True
    yield
    torch.use_deterministic_algorithms(False)
    cudnn.deterministic, cudnn.benchmark = saved


@pytest.mark.parametrize("backend", [SequentialBackend, CohortBackend])
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (True, dict(deterministic=1, warn_only=0, cudnn_deterministic=1, cudnn_benchmark=0, cublas=1)),
        ("warn", dict(deterministic=1, warn_only=1, cudnn_deterministic=1, cudnn_benchmark=0, cublas=1)),
        (False, dict(deterministic=0, warn_only=0, cudnn_deterministic=0, cudnn_benchmark=1, cublas=0)),
    ],
)  # fmt: skip
def test_the_run_applies_the_mode_on_every_backend_and_restores_the_settings(
    backend, mode, expected, tmp_path, process_settings
):
    loop = _fit(ReportsSettings(**SYNTHETIC), tmp_path, backend(), deterministic=mode)
    for metrics in loop.aggregator.metrics:
        assert {k: metrics[k] for k in expected} == expected
    assert not torch.are_deterministic_algorithms_enabled()
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == (False, True)
    # set when the loop was built, for CUDA to read when it starts; never when off
    assert (os.environ.get(CUBLAS_VARIABLE) == ":4096:8") == (mode is not False)


def test_the_context_restores_everything_it_changed(process_settings):
    with deterministic_compute("warn"):
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ[CUBLAS_VARIABLE] == ":4096:8"
    assert not torch.are_deterministic_algorithms_enabled()
    assert CUBLAS_VARIABLE not in os.environ
    os.environ[CUBLAS_VARIABLE] = ":16:8"  # the user's own deterministic value is kept
    with deterministic_compute(True):
        assert os.environ[CUBLAS_VARIABLE] == ":16:8"
    assert os.environ[CUBLAS_VARIABLE] == ":16:8"


@pytest.mark.parametrize("backend", [SequentialBackend, CohortBackend])
def test_an_op_without_a_deterministic_implementation_is_refused_in_one_line(
    backend, tmp_path, process_settings
):
    with pytest.raises(ConfigurationError) as refused:
        _fit(Unpools(**SYNTHETIC), tmp_path / "true", backend())
    message = str(refused.value)
    assert "\n" not in message and "max_unpooling2d_forward_out has no deterministic" in message
    assert "--loop.deterministic warn" in message and "--loop.deterministic false" in message
    with pytest.warns(
        UserWarning, match="max_unpooling2d_forward_out does not have a deterministic"
    ):
        _fit(Unpools(**SYNTHETIC), tmp_path / "warn", backend(), deterministic="warn")
    _fit(Unpools(**SYNTHETIC), tmp_path / "false", backend(), deterministic=False)


def test_a_bad_value_is_refused_naming_the_option(tmp_path):
    with pytest.raises(ConfigurationError, match=r"loop.deterministic='sometimes'.*'warn'"):
        FederatedLoop(deterministic="sometimes")


SPY = """
import functools, json, os, sys
import lightning.fabric
from fedlightning.cli import main
from fedlightning.clients.base import ClientModule
from fedlightning.data.datamodule import FederatedDataModule
assert "{variable}" not in os.environ
seen = {{}}
def spy(cls, name):
    init = cls.__init__
    @functools.wraps(init)  # the signature jsonargparse reads
    def wrapped(self, *args, **kwargs):
        seen.setdefault(name, os.environ.get("{variable}"))
        init(self, *args, **kwargs)
    cls.__init__ = wrapped
for cls, name in ((ClientModule, "model"), (FederatedDataModule, "data"),
                  (lightning.fabric.Fabric, "fabric")):
    spy(cls, name)
main(sys.argv[1:])
print(json.dumps(seen))
"""


@pytest.mark.parametrize(("mode", "value"), [("true", ":4096:8"), ("false", None)])
def test_the_cublas_variable_is_set_before_the_run_builds_anything(mode, value, tmp_path):
    """A fresh ``fedlightning fit`` process: the variable is in the environment when the model,
    the data module and the run's Fabric (which starts CUDA on a GPU) are first built."""
    env = {k: v for k, v in os.environ.items() if k != CUBLAS_VARIABLE}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-c", SPY.format(variable=CUBLAS_VARIABLE), "fit", "--config",
         str(CONF / "tiny.yaml"), "--loop.rounds", "1", "--loop.run_dir", str(tmp_path),
         "--loop.plots", "false", "--loop.deterministic", mode],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"model": value, "data": value, "fabric": value}


def test_a_resume_may_switch_between_true_and_warn_but_not_to_false(cli, tmp_path):
    cli(tmp_path / "run", "--loop.rounds", "1")
    checkpoint = str(tmp_path / "run" / "last.ckpt")
    cli(tmp_path / "run", "--loop.rounds", "2", "--ckpt_path", checkpoint,
        "--loop.deterministic", "warn")  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        cli(tmp_path / "run", "--loop.rounds", "3", "--ckpt_path", checkpoint,
            "--loop.deterministic", "false")  # fmt: skip
    assert refused.value.code == 2


def test_a_checkpoint_from_before_the_option_resumes_as_false(tmp_path):
    from fedlightning.loop.identity import compare_identity

    stored = {"config": {"loop": {"rounds": 1}}, **{k: 0 for k in DERIVED_FIELDS}}
    current = {**stored, "config": {"loop": {"rounds": 1, "deterministic": False}}}
    compare_identity("old.ckpt", stored, current)  # ran as false: resumes
    current["config"]["loop"]["deterministic"] = True
    with pytest.raises(ConfigurationError, match="loop.deterministic is not set in the checkpoint"):
        compare_identity("old.ckpt", stored, current)


DERIVED_FIELDS = (
    "dataset", "num_clients", "seed", "partition_hash", "architecture", "client_state",
    "server_state", "backend_results", "library_version",
)  # fmt: skip
