"""``loop.backend: RayBackend`` on a local Ray instance: the same bits as the sequential backend.

Ray is installed by ``make install`` (the ``ray`` extra); starting it and its two worker
processes takes about half a minute, shared by the tests of this module.
"""

import os

import pytest
import torch

from conftest import run_cli
from fedlightning.backends import RayBackend
from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.server import Scaffold
from objective_helpers import SYNTHETIC, synthetic_run

ray = pytest.importorskip("ray")

# its actors (and Ray's start-up unless a module before started the shared instance); `make test-all`
# runs it
pytestmark = pytest.mark.slow


def test_cli_ray_run_writes_the_same_global_model_as_sequential(local_ray, tmp_path):
    """``fedlightning fit --loop.backend RayBackend`` and the sequential default: byte-equal global.pt
    (conftest runs torch with 1 thread, as each actor does with ``num_cpus_per_client: 1``)."""
    common = ("--loop.rounds", "3", "--loop.plots", "false")
    sequential = run_cli(tmp_path / "sequential", *common)
    remote = run_cli(
        tmp_path / "ray", *common, "--loop.backend", "RayBackend", "--loop.backend.num_workers", "2"
    )
    assert (tmp_path / "ray" / "global.pt").read_bytes() == (
        tmp_path / "sequential" / "global.pt"
    ).read_bytes()
    assert [r["test_acc"] for r in remote] == [r["test_acc"] for r in sequential]
    assert float(remote[-1]["test_acc"]) > 0.5  # well above chance (0.1) after 3 rounds


def test_ray_backend_keeps_client_state_like_sequential(local_ray, tmp_path):
    """SCAFFOLD's per-client control variates travel to the actors and back unchanged."""
    results = {}
    for backend in ("sequential", "ray"):
        torch.manual_seed(0)
        loop = synthetic_run(
            ScaffoldClient(**SYNTHETIC), Scaffold(), rounds=3, tmp_path=tmp_path / backend, plots=False,
            backend=RayBackend(num_workers=2) if backend == "ray" else None,
        )  # fmt: skip
        results[backend] = (loop.aggregator.state_dict(), loop.store.state_dict())
    (seq_agg, seq_store), (ray_agg, ray_store) = results["sequential"], results["ray"]
    for key, value in seq_agg["weights"].items():
        assert torch.equal(value, ray_agg["weights"][key]), key
    assert seq_store["states"].keys() == ray_store["states"].keys()
    assert any("c_i" in state for state in seq_store["states"].values())
    for cid, state in seq_store["states"].items():
        for key, value in state.get("c_i", {}).items():
            assert torch.equal(value, ray_store["states"][cid]["c_i"][key])


def test_ray_failures_leave_the_client_out(local_ray, tmp_path):
    class Flaky(ClientModule):
        def training_step(self, batch, batch_idx):
            if self.client_id == 0:
                raise RuntimeError("simulated client crash")
            return super().training_step(batch, batch_idx)

    loop = synthetic_run(
        Flaky(**SYNTHETIC),
        rounds=2,
        tmp_path=tmp_path,
        plots=False,
        backend=RayBackend(num_workers=2),
    )
    assert sum(row["clients_failed"] for row in loop.history) >= 1


def test_a_dead_actor_fails_its_client_and_the_run_goes_on(local_ray, tmp_path):
    """A client whose fit kills the actor's process (as an out-of-memory kill would) is left out;
    the actor is restarted and the other clients and rounds train."""

    class Killer(ClientModule):
        def training_step(self, batch, batch_idx):
            if self.client_id == 0:
                os._exit(1)
            return super().training_step(batch, batch_idx)

    loop = synthetic_run(
        Killer(**SYNTHETIC),
        rounds=3,
        tmp_path=tmp_path,
        plots=False,
        backend=RayBackend(num_workers=2),
    )
    assert [row["round"] for row in loop.history] == [1, 2, 3]
    assert sum(row["clients_failed"] for row in loop.history) >= 1
    assert loop.history[-1]["test_acc"] > 0.5


def test_actors_compute_under_the_runs_deterministic_mode(local_ray, tmp_path):
    """``loop.deterministic`` reaches the actors (issue 31 item 1): each fit there runs with
    deterministic algorithms and cuBLAS's workspace variable, and an op without a deterministic
    implementation ends the run with the one-line refusal, not a client failure."""
    from fedlightning.errors import ConfigurationError
    from fedlightning.server import FedAvg

    class Reports(ClientModule):
        def client_metrics(self):
            from fedlightning.torch_settings import ComputeSettings

            settings = ComputeSettings.current()  # the actor's own, during its fit
            return {
                **super().client_metrics(),
                "deterministic": float(settings.deterministic),
                "cudnn_deterministic": float(settings.cudnn_deterministic),
                "cublas": float(settings.cublas_workspace_config == ":4096:8"),
                "pid": float(os.getpid()),
            }

    class Recording(FedAvg):
        seen = []

        def aggregate(self, round_index, uploads):
            self.seen.extend(u.metrics for u in uploads)
            super().aggregate(round_index, uploads)

    class Unpools(ClientModule):
        def local_loss(self, batch):
            index = torch.tensor([[[0, 1]]])
            pooled = torch.nn.functional.max_unpool1d(torch.ones(1, 1, 2), index, 2)
            return super().local_loss(batch) + 0 * pooled.sum()

    aggregator = Recording()
    synthetic_run(
        Reports(**SYNTHETIC), aggregator, rounds=1, tmp_path=tmp_path / "reports", plots=False,
        backend=RayBackend(num_workers=2),
    )  # fmt: skip
    assert {m["pid"] for m in aggregator.seen} - {float(os.getpid())}  # fitted in the actors
    for metrics in aggregator.seen:
        assert metrics["deterministic"] == metrics["cudnn_deterministic"] == metrics["cublas"] == 1
    refusal = "max_unpooling2d_forward_out has no deterministic"
    with pytest.raises(ConfigurationError, match=refusal):
        synthetic_run(
            Unpools(**SYNTHETIC), rounds=1, tmp_path=tmp_path / "refused", plots=False,
            backend=RayBackend(num_workers=2),
        )  # fmt: skip
