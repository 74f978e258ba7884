"""FedDyn, FedYogi, FedAdagrad, IFCA and CFL give the same bits on Ray as sequentially: the
server state (h, m and v, the cluster models and the assignment or membership) and the clients'
state (FedDyn's gradient state) after three rounds, on the tiny BatchNorm ResNet of the registry
contract (tests/test_registry_contract.py checks the cohort backend and resume for every one)."""

import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import RayBackend, SequentialBackend
from fedlightning.clients import ClientModule, FedDynClient, IFCAClient
from fedlightning.server import IFCA, ClusteredFL, FedAdagrad, FedDyn, FedYogi

NETWORK = dict(network="resnet14", network_kwargs={"width": 4, "stem": "small"}, num_classes=3,
               in_channels=1, image_size=8, lr=0.05, momentum=0.5)  # fmt: skip
CASES = {
    "FedDyn": (FedDynClient, lambda: FedDyn(alpha=0.1)),
    "FedYogi": (ClientModule, lambda: FedYogi(server_lr=0.05)),
    "FedAdagrad": (ClientModule, FedAdagrad),
    "IFCA": (IFCAClient, lambda: IFCA(num_clusters=2)),
    # eps chosen so that the single cluster splits in the second round
    "ClusteredFL": (ClientModule, lambda: ClusteredFL(eps1=1e3, eps2=1e-6, warmup_rounds=1)),
}


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.slow  # Ray's start-up and actors
@pytest.mark.parametrize("case", list(CASES))
def test_ray_gives_the_sequential_bits(case, local_ray, tmp_path):
    objective_cls, make = CASES[case]
    states = []
    for backend in (SequentialBackend(), RayBackend(num_workers=2)):
        torch.manual_seed(0)
        dm = FederatedDataModule(
            dataset="synthetic", num_samples=160, num_test=40, num_classes=3,
            sample_shape=(1, 8, 8), num_clients=4, partition="iid", batch_size=16, seed=0,
        )  # fmt: skip
        loop = FederatedLoop(rounds=3, clients_per_round=4, aggregator=make(), backend=backend,
                             run_dir=str(tmp_path / type(backend).__name__), progress_bar=False,
                             plots=False)  # fmt: skip
        loop.fit(objective_cls(**NETWORK), datamodule=dm)
        states.append((loop.aggregator.state_dict(), loop.store.state_dict(), loop.history))
    (server, clients, history), (ray_server, ray_clients, ray_history) = states
    assert _equal(server, ray_server) and _equal(clients, ray_clients)
    assert history[-1]["test_acc"] == ray_history[-1]["test_acc"]
    if case == "ClusteredFL":
        assert history[-1]["cfl_clusters"] >= 2  # the split happened on both backends
