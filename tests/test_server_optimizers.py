"""Server optimizers on the server_update hook (Reddi et al., "Adaptive Federated Optimization",
ICLR 2021, arXiv:2003.00295; FedAvgM: Hsu et al., arXiv:1909.06335), by hand on two rounds."""

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload
from fedlightning.server import FedAdam, FedAvg, FedAvgM
from fedlightning.server.base import ClientKeys

T = torch.float64


def _server():
    return {
        "w": torch.tensor([1.0, 2.0], dtype=T),
        "bn.running_mean": torch.tensor([0.0], dtype=T),
        "n": torch.tensor(0),
        "deep": torch.tensor([1.0], dtype=T),
    }


SMALL = frozenset({"w", "bn.running_mean", "n"})
KEYS = [ClientKeys("small", SMALL), ClientKeys("big", frozenset(_server()))]


def _round0():
    small = {
        "w": torch.tensor([0.0, 3.0], dtype=T),
        "bn.running_mean": torch.tensor([1.0], dtype=T),
        "n": torch.tensor(5),
    }
    big = {"w": torch.tensor([1.0, 3.0], dtype=T), "bn.running_mean": torch.tensor([3.0], dtype=T),
           "n": torch.tensor(7), "deep": torch.tensor([3.0], dtype=T)}  # fmt: skip
    return [Upload(0, small, 1, 1), Upload(1, big, 1, 1)]  # mean w (0.5, 3), statistic 2, deep 3


def _round1():  # only the small group: mean w (0.25, 2), statistic 4; nobody owns deep
    small = {"w": torch.tensor([0.25, 2.0], dtype=T), "bn.running_mean": torch.tensor([4.0], dtype=T), "n": torch.tensor(9)}  # fmt: skip
    return [Upload(0, small, 1, 1)]


def _run(agg, rounds=2):
    agg.setup(_server(), 2, client_keys=KEYS)
    for r, uploads in enumerate([_round0(), _round1()][:rounds]):
        agg.aggregate(r, uploads)
    return agg


def test_fedavgm_two_rounds_by_hand():
    lr, beta = 0.5, 0.9
    agg = _run(FedAvgM(server_lr=lr, server_momentum=beta, weighting="uniform"), rounds=1)
    w0 = torch.tensor([1.0, 2.0], dtype=T)
    v1 = w0 - torch.tensor([0.5, 3.0], dtype=T)  # d = w - mean, v = 0.9 * 0 + d
    w1 = w0 - lr * v1
    deep1 = 1.0 - lr * (1.0 - 3.0)
    out = agg.global_state()
    assert torch.allclose(out["w"], w1) and out["deep"].item() == pytest.approx(deep1)
    assert out["bn.running_mean"].item() == 2.0 and out["n"].item() == 5  # the averaged values
    agg.aggregate(1, _round1())
    v2 = beta * v1 + (w1 - torch.tensor([0.25, 2.0], dtype=T))
    w2 = w1 - lr * v2
    out = agg.global_state()
    assert torch.allclose(out["w"], w2) and torch.allclose(
        out["w"], torch.tensor([0.275, 2.7], dtype=T)
    )
    assert out["deep"].item() == pytest.approx(deep1)  # unowned this round: no momentum step
    assert agg.momentum["deep"].item() == pytest.approx(-2.0)
    assert out["bn.running_mean"].item() == 4.0 and out["n"].item() == 9


def test_fedadam_two_rounds_by_hand():
    eta, b1, b2, tau = 0.1, 0.5, 0.75, 0.5
    agg = _run(FedAdam(server_lr=eta, beta1=b1, beta2=b2, tau=tau, weighting="uniform"), rounds=1)
    w0, v0 = torch.tensor([1.0, 2.0], dtype=T), tau**2  # m starts at 0, v at tau^2
    delta = torch.tensor([0.5, 3.0], dtype=T) - w0  # (-0.5, 1)
    m1 = (1 - b1) * delta  # (-0.25, 0.5)
    v1 = b2 * v0 + (1 - b2) * delta**2  # (0.25, 0.4375)
    w1 = w0 + eta * m1 / (v1.sqrt() + tau)
    assert torch.allclose(w1, torch.tensor([0.975, 2 + 0.05 / (0.4375**0.5 + 0.5)], dtype=T))
    v_deep = b2 * v0 + (1 - b2) * 2.0**2  # deep: delta = 3 - 1, owned by big only
    deep1 = 1.0 + eta * (1 - b1) * 2.0 / (v_deep**0.5 + tau)
    out = agg.global_state()
    assert torch.allclose(out["w"], w1) and out["deep"].item() == pytest.approx(deep1)
    assert out["bn.running_mean"].item() == 2.0 and out["n"].item() == 5  # the averaged values
    agg.aggregate(1, _round1())
    delta = torch.tensor([0.25, 2.0], dtype=T) - w1
    m2 = b1 * m1 + (1 - b1) * delta
    v2 = b2 * v1 + (1 - b2) * delta**2
    w2 = w1 + eta * m2 / (v2.sqrt() + tau)
    out = agg.global_state()
    assert torch.allclose(out["w"], w2) and torch.allclose(agg.m["w"], m2)
    assert torch.allclose(agg.v["w"], v2)
    assert out["deep"].item() == pytest.approx(deep1)  # unowned this round: no Adam step
    assert agg.v["deep"].item() == pytest.approx(v_deep)
    assert out["bn.running_mean"].item() == 4.0 and out["n"].item() == 9


def _random_uploads(seed, n=3):
    gen = torch.Generator().manual_seed(seed)
    return [
        Upload(i, {"w": torch.randn(6, 5, generator=gen), "bn.running_var": torch.rand(5, generator=gen),
                   "n": torch.tensor(i)}, num_samples=3 + i, num_steps=1)
        for i in range(n)
    ]  # fmt: skip


def test_fedavgm_without_momentum_and_unit_lr_is_fedavg_bitwise():
    initial = {"w": torch.randn(6, 5), "bn.running_var": torch.ones(5), "n": torch.tensor(0)}
    avg, avgm = FedAvg(), FedAvgM(server_lr=1.0, server_momentum=0.0)
    for agg in (avg, avgm):
        agg.setup(initial, 3)
        for r in range(2):
            agg.aggregate(r, _random_uploads(r))
    assert all(torch.equal(avgm.global_state()[k], v) for k, v in avg.global_state().items())


@pytest.mark.parametrize(
    "make",
    [lambda: FedAvgM(server_lr=0.7, server_momentum=0.5), lambda: FedAdam(server_lr=0.05)],
    ids=["FedAvgM", "FedAdam"],
)
def test_optimizer_state_round_trips_and_continues_identically(make):
    initial = {"w": torch.zeros(6, 5), "bn.running_var": torch.ones(5), "n": torch.tensor(0)}
    agg = make()
    agg.setup(initial, 3)
    agg.aggregate(0, _random_uploads(0))
    clone = make()
    clone.setup(initial, 3)
    clone.load_state_dict(agg.state_dict())
    for a in (agg, clone):
        a.aggregate(1, _random_uploads(1))
    state, other = agg.state_dict(), clone.state_dict()
    assert state.keys() == other.keys() and len(state) > 2
    for name, value in state.items():
        if isinstance(value, dict):
            assert all(torch.equal(other[name][k], v) for k, v in value.items())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FedAvgM(server_lr=0.0), r"loop.aggregator.init_args.server_lr=0.0 .*> 0"),
        (lambda: FedAvgM(server_momentum=1.0), r"server_momentum=1.0 .*\[0, 1\)"),
        (lambda: FedAdam(server_lr=-1.0), r"server_lr=-1.0 .*> 0"),
        (lambda: FedAdam(beta1=1.0), r"beta1=1.0 .*\[0, 1\)"),
        (lambda: FedAdam(beta2=-0.1), r"beta2=-0.1 .*\[0, 1\)"),
        (lambda: FedAdam(tau=0.0), r"tau=0.0 .*> 0"),
        (lambda: FedAdam(weighting="sizes"), r"weighting"),
    ],
)
def test_options_are_validated(make, message):
    with pytest.raises(ConfigurationError, match=message):
        make()
