"""FedNova: a_i with momentum, normalised averaging, and the reduction to FedAvg."""

import pytest
import torch

from fedlightning import FedAvg, Upload
from fedlightning.clients import ClientModule, FedNovaClient
from fedlightning.clients.fednova import fednova_a
from fedlightning.errors import ConfigurationError
from fedlightning.server import FedNova
from fedlightning.server.base import ClientKeys
from fedlightning.server.fednova import fednova_aggregate
from objective_helpers import SYNTHETIC, synthetic_run


def test_a_with_momentum_is_the_sum_of_the_momentum_weights():
    # rho = 0.5, tau = 3: momentum weights 1, 1.5, 1.75 -> a = 4.25
    assert fednova_a(3, 0.5) == pytest.approx(4.25)
    assert fednova_a(7, 0.0) == 7.0
    rho, tau = 0.9, 20
    assert fednova_a(tau, rho) == pytest.approx(
        sum((1 - rho**t) / (1 - rho) for t in range(1, tau + 1))
    )
    with pytest.raises(ValueError, match="rho"):
        fednova_a(3, 1.0)


def test_normalised_averaging_on_hand_made_numbers():
    x = {"w": torch.tensor([0.0, 0.0])}
    states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, -6.0])}]
    # p = (0.5, 0.5), a = (1, 3): d_1 = (-1, -2), d_2 = (-1, 2); tau_eff = 2
    # x - tau_eff * (p_1 d_1 + p_2 d_2) = -2 * (-1, 0) = (2, 0)
    out = fednova_aggregate(x, states, a=[1.0, 3.0], weights=[10.0, 10.0])
    assert torch.allclose(out["w"], torch.tensor([2.0, 0.0]))


def test_running_statistics_take_the_fedavg_mean_not_the_extrapolation():
    x = {"w": torch.tensor([1.0]), "bn.running_mean": torch.tensor([0.0])}
    x["bn.running_var"] = torch.tensor([1.0])
    states = [
        {"w": torch.tensor([0.0]), "bn.running_mean": torch.tensor([1.0]), "bn.running_var": torch.tensor([0.1])},
        {"w": torch.tensor([0.0]), "bn.running_mean": torch.tensor([3.0]), "bn.running_var": torch.tensor([0.3])},
    ]  # fmt: skip
    out = fednova_aggregate(x, states, a=[1.0, 10.0], weights=[1.0, 1.0])
    # w: tau_eff = 5.5, d = (1, 0.1): 1 - 5.5 * 0.55 = -2.025 (the global model's coefficient < 0)
    assert out["w"].item() == pytest.approx(-2.025)
    # the same extrapolation would give running_var 1 - 5.5 * (0.45 + 0.035) < 0: NaN in BatchNorm
    assert out["bn.running_var"].item() == pytest.approx(0.2)
    assert out["bn.running_mean"].item() == pytest.approx(2.0)


def _uploads(n_states=3, a=None):
    gen = torch.Generator().manual_seed(0)
    states = [
        {
            "w": torch.randn(50, 20, generator=gen),
            "b": torch.randn(20, generator=gen),
            "n": torch.tensor(i),
        }
        for i in range(n_states)
    ]
    a = a or [5.0] * n_states
    return [
        Upload(i, s, num_samples=7 + 13 * i, num_steps=5, extras={"a": a[i]})
        for i, s in enumerate(states)
    ]


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
@pytest.mark.parametrize("a", [5.0, 4.1])  # equal tau without momentum; an equal a with momentum
def test_equal_a_is_bitwise_fedavg(weighting, a):
    initial = {"w": torch.randn(50, 20), "b": torch.randn(20), "n": torch.tensor(0)}
    uploads = _uploads(a=[a] * 3)
    nova, avg = FedNova(weighting), FedAvg(weighting)
    for agg in (nova, avg):
        agg.setup(initial, num_clients=3)
        agg.aggregate(0, uploads)
    for key, value in avg.global_state().items():
        assert torch.equal(nova.global_state()[key], value)


def test_unequal_a_differs_from_fedavg_and_integer_buffers_come_from_the_first_client():
    initial = {"w": torch.zeros(50, 20), "b": torch.zeros(20), "n": torch.tensor(0)}
    nova = FedNova()
    nova.setup(initial, num_clients=3)
    nova.aggregate(0, _uploads(a=[2.0, 5.0, 9.0]))
    avg = FedAvg()
    avg.setup(initial, num_clients=3)
    avg.aggregate(0, _uploads())
    assert not torch.allclose(nova.global_state()["w"], avg.global_state()["w"])
    assert nova.global_state()["n"].item() == 0


def test_normalised_averaging_per_key_over_its_owners():
    server = {"shared": torch.tensor([0.0, 0.0]), "deep": torch.tensor([1.0])}
    keys = [ClientKeys("small", frozenset({"shared"})), ClientKeys("big", frozenset(server))]
    nova = FedNova(weighting="uniform")
    nova.setup(server, 2, client_keys=keys)
    small = {"shared": torch.tensor([1.0, 2.0])}
    big = {"shared": torch.tensor([3.0, -6.0]), "deep": torch.tensor([4.0])}
    nova.aggregate(0, [Upload(0, small, 1, 1, {"a": 1.0}), Upload(1, big, 1, 3, {"a": 3.0})])
    # shared: both own it, as test_normalised_averaging_on_hand_made_numbers: (2, 0)
    assert torch.allclose(nova.global_state()["shared"], torch.tensor([2.0, 0.0]))
    # deep: only big owns it: tau_eff = a = 3, x - 3 * (x - x_big) / 3 = x_big
    assert nova.global_state()["deep"].tolist() == [4.0]


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_one_group_is_todays_homogeneous_fednova_bitwise(weighting):
    initial = {"w": torch.zeros(50, 20), "b": torch.zeros(20), "n": torch.tensor(0)}
    uploads = _uploads(a=[2.0, 5.0, 9.0])
    expected = fednova_aggregate(
        initial, [u.weights for u in uploads], [2.0, 5.0, 9.0],
        [float(u.num_samples) if weighting == "samples" else 1.0 for u in uploads],
    )  # fmt: skip
    for client_keys in (None, [ClientKeys("all", frozenset(initial))] * 3):
        nova = FedNova(weighting)
        nova.setup(initial, 3, client_keys=client_keys)
        nova.aggregate(0, uploads)
        assert all(torch.equal(nova.global_state()[k], v) for k, v in expected.items())


def test_fednova_client_and_server_with_equal_steps_and_no_momentum_equal_fedavg(tmp_path):
    reference = ClientModule(**SYNTHETIC)
    nova_client = FedNovaClient(**SYNTHETIC)
    nova_client.network.load_state_dict(reference.network.state_dict())
    plain = synthetic_run(reference, FedAvg(), tmp_path=tmp_path / "a", local_steps=4)
    nova = synthetic_run(nova_client, FedNova(), tmp_path=tmp_path / "b", local_steps=4)
    a, b = plain.aggregator.global_state(), nova.aggregator.global_state()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fednova_client_reports_a_from_its_real_steps_and_momentum(tmp_path):
    seen = []

    class Recording(FedNova):
        def aggregate(self, round_index, uploads):
            seen.extend((u.num_steps, u.extras["a"]) for u in uploads)
            super().aggregate(round_index, uploads)

    synthetic_run(
        FedNovaClient(momentum=0.5, **SYNTHETIC),
        Recording(),
        rounds=1,
        tmp_path=tmp_path,
        local_steps=3,
    )
    assert seen == [(3, pytest.approx(4.25))] * 2


def test_fednova_client_refuses_adam():
    with pytest.raises(ConfigurationError, match="optimizer 'sgd'.*'adam'"):
        FedNovaClient(optimizer="adam", **SYNTHETIC)


def test_fednova_client_refuses_a_precision_that_skips_steps():
    # a step skipped by 16-mixed's gradient scaler is still counted in global_step (tau_i)
    with pytest.raises(ConfigurationError, match="16-mixed.*FedNovaClient"):
        FedNovaClient.check_precision("16-mixed")
    FedNovaClient.check_precision("bf16-mixed")
