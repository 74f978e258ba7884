"""Start-up returns a RunState the loop consumes; the run's compute (device, precision, autocast)
is resolved once, with one Lightning Fabric."""

from __future__ import annotations

import pytest
import torch
from lightning.fabric import Fabric

from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.compute import (
    COHORT_PRECISIONS,
    FABRIC_PRECISIONS,
    NO_SKIP_PRECISIONS,
    PRECISIONS,
    Compute,
)
from fedlightning.loop.run_state import RunState
from objective_helpers import SYNTHETIC


def _data() -> FederatedDataModule:
    return FederatedDataModule(
        dataset="synthetic", num_samples=240, num_test=60, num_classes=3, sample_shape=(6,),
        num_clients=4, partition="iid",
    )  # fmt: skip


def _loop(tmp_path, rounds: int, **kwargs) -> FederatedLoop:
    return FederatedLoop(
        rounds=rounds, clients_per_round=3, run_dir=str(tmp_path), progress_bar=False,
        plots=False, accelerator="cpu", **kwargs,
    )  # fmt: skip


def test_the_loop_declares_every_attribute_in_init_and_start_up_returns_the_run_state(tmp_path):
    """No start-up function adds or replaces loop attributes: the same attribute names before
    and after a fit and a resumed fit; what start-up resolved is one RunState."""
    loop = _loop(tmp_path, rounds=2)
    declared = set(vars(loop))
    components = {name: id(getattr(loop, name)) for name in ("aggregator", "backend", "store")}
    assert loop.run_state is None
    loop.fit(ClientModule(**SYNTHETIC, momentum=0.9), datamodule=_data())
    assert set(vars(loop)) == declared
    run = loop.run_state
    assert isinstance(run, RunState)
    assert (run.clients_per_round, run.first_round, run.checkpoint) == (3, 0, None)
    assert run.last_checkpoint == (2, str(tmp_path / "last.ckpt"))
    assert run.server.device == run.compute.device == torch.device("cpu")
    # the progress callback reached the backend through start: it counted the last round's fits
    assert loop.reporter._clients_done == 3

    resumed = _loop(tmp_path, rounds=3)
    resumed.fit(
        ClientModule(**SYNTHETIC, momentum=0.9), datamodule=_data(),
        ckpt_path=str(tmp_path / "last.ckpt"),
    )  # fmt: skip
    assert set(vars(resumed)) == declared
    run = resumed.run_state
    assert (run.first_round, run.resumes_in_place, run.checkpoint["round"]) == (2, True, 2)
    assert run.last_checkpoint == (3, str(tmp_path / "last.ckpt"))
    assert [row["round"] for row in resumed.history] == [1, 2, 3]
    assert {name: id(getattr(loop, name)) for name in components} == components


@pytest.mark.parametrize(
    ("precision", "backend"),
    [("32-true", None), ("16-mixed", None), ("64-true", None), ("bf16-mixed", "cohort")],
)
def test_a_run_builds_one_fabric(precision, backend, tmp_path, monkeypatch):
    """Device and precision are resolved once per run: the fits, the backend's choice, the
    evaluation and the server placement share one Fabric (16-mixed on a CPU runs bf16-mixed, which
    needs no fresh gradient scaler per fit)."""
    from fedlightning.backends import CohortBackend

    built = []
    init = Fabric.__init__

    def counting(self, *args, **kwargs):
        built.append(kwargs)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Fabric, "__init__", counting)
    kwargs = {"backend": CohortBackend()} if backend else {}
    loop = _loop(tmp_path, rounds=2, precision=precision, **kwargs)
    loop.fit(ClientModule(**SYNTHETIC), datamodule=_data())
    assert len(built) == 1, built
    assert loop.run_state.compute.fabric is not None


def test_compute_normalises_the_precision_as_lightning_runs_it():
    assert Compute.resolve("cpu", "32").precision == "32-true"
    fp16 = Compute.resolve("cpu", "16-mixed")  # fp16 AMP does not exist on a CPU
    assert (fp16.precision, fp16.autocast_dtype) == ("bf16-mixed", torch.bfloat16)
    assert fp16.fit_fabric() is fp16.fabric
    double = Compute.resolve("cpu", "64-true")
    assert (double.precision, double.autocast_dtype) == ("64-true", None)
    x = torch.ones(2, 2)
    for compute, dtype in ((double, torch.float32), (fp16, torch.bfloat16)):
        with compute.autocast():
            assert (x @ x).dtype == dtype  # the forward context evaluation and fits run under
    with pytest.raises(ValueError, match="unknown precision"):
        Compute.resolve("cpu", "8-true")


def test_one_table_states_which_path_runs_each_precision():
    assert PRECISIONS == ("32-true", "32", "bf16-mixed", "16-mixed", "64-true")
    assert FABRIC_PRECISIONS == COHORT_PRECISIONS == ("32-true", "32", "bf16-mixed", "16-mixed")
    assert NO_SKIP_PRECISIONS == {"32-true", "32", "bf16-mixed", "64-true"}


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="16-mixed with a gradient scaler needs CUDA"
)
def test_every_16_mixed_fit_gets_a_fresh_fabric_and_scaler():
    compute = Compute.resolve("cuda", "16-mixed")
    assert compute.precision == "16-mixed" and compute.device.type == "cuda"
    first, second = compute.fit_fabric(), compute.fit_fabric()
    assert first is not second and first is not compute.fabric
