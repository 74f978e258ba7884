"""The personalized objectives of issue 39 item 2 (Ditto, APFL, Per-FedAvg, pFedMe, FedRoD,
FedALA) give the same bits on Ray as on the sequential backend: the global model, every client's
kept state (personal models, heads, mixing weights) and every logged number, personal_acc
included (docs/algorithms.md sections 10.9-10.14)."""

import pytest
import torch

from fedlightning import FederatedDataModule, FederatedLoop
from fedlightning.backends import RayBackend, SequentialBackend
from fedlightning.clients import APFL, Ditto, FedALA, FedRoD, PerFedAvg, PFedMe

MLP = dict(network="mlp", network_kwargs={"hidden": [16]}, num_classes=3, in_channels=6,
           image_size=1, lr=0.1)  # fmt: skip


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.slow  # Ray's start-up and actors: about a minute per objective
@pytest.mark.parametrize("cls", [Ditto, APFL, PerFedAvg, PFedMe, FedRoD, FedALA],
                         ids=lambda c: c.__name__)  # fmt: skip
def test_the_same_bits_on_ray(local_ray, tmp_path, cls):
    runs = []
    for backend in (SequentialBackend(), RayBackend(num_workers=2)):
        torch.manual_seed(0)
        data = FederatedDataModule(
            dataset="synthetic", num_samples=300, num_test=60, num_classes=3, sample_shape=(6,),
            num_clients=6, partition="pathological", classes_per_client=2,
            client_test_fraction=0.25, batch_size=8, seed=0,
        )  # fmt: skip
        loop = FederatedLoop(rounds=3, clients_per_round=4, backend=backend, progress_bar=False,
                             plots=False, run_dir=str(tmp_path / type(backend).__name__))  # fmt: skip
        loop.fit(cls(**MLP), datamodule=data)
        runs.append(loop)
    sequential, ray = runs
    assert _same(sequential.aggregator.global_state(), ray.aggregator.global_state())
    assert _same(sequential.store.state_dict(), ray.store.state_dict())
    assert "personal_acc" in sequential.history[-1]
    assert sequential.history[-1] == {**ray.history[-1], "round_time_s":
                                      sequential.history[-1]["round_time_s"]}  # fmt: skip
