"""``loop.backend: ray`` on a local Ray instance: the same bits as the sequential backend."""

import pytest
import torch

from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.server import FedAvg, Scaffold
from objective_helpers import SYNTHETIC, synthetic_run

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # starting Ray and its worker processes takes tens of seconds


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize(
    ("make", "aggregator"),
    [
        (lambda: ClientModule(**SYNTHETIC, momentum=0.9), FedAvg),
        (lambda: ScaffoldClient(**SYNTHETIC), Scaffold),
    ],
    ids=["fedavg", "scaffold-with-client-state"],
)
def test_ray_backend_equals_sequential(local_ray, make, aggregator, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in each actor (num_cpus_per_client=1)
    try:
        results = {}
        for backend in ("sequential", "ray"):
            torch.manual_seed(0)
            loop = synthetic_run(
                make(), aggregator(), rounds=3, tmp_path=tmp_path / backend, plots=False, backend=backend,
                num_workers=2,
            )  # fmt: skip
            results[backend] = (loop.aggregator.state_dict(), loop.store.state_dict())
    finally:
        torch.set_num_threads(threads)
    (seq_agg, seq_store), (ray_agg, ray_store) = results["sequential"], results["ray"]
    for key, value in seq_agg["weights"].items():
        assert torch.equal(value, ray_agg["weights"][key]), key
    assert seq_store["states"].keys() == ray_store["states"].keys()
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
        Flaky(**SYNTHETIC), rounds=2, tmp_path=tmp_path, plots=False, backend="ray", num_workers=2
    )
    assert sum(row["clients_failed"] for row in loop.history) >= 1
