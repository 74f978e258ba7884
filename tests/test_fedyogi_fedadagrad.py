"""FedYogi and FedAdagrad (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
arXiv:2003.00295, Algorithm 2) recomputed by hand from the paper's equations on hand-made tensors:
two rounds (the state m, v), owners of different key sets, Yogi's sign at a tie, the initial v,
composition with a server statistic, and the options refused in one line."""

import math

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload
from fedlightning.server import FedAdagrad, FedYogi
from fedlightning.server.base import ClientKeys
from fedlightning.server.statistics import Median

T = torch.float64


def _server():
    return {"w": torch.tensor([1.0, 2.0], dtype=T), "bn.running_mean": torch.tensor([0.0], dtype=T),
            "n": torch.tensor(0), "deep": torch.tensor([1.0], dtype=T)}  # fmt: skip


KEYS = [ClientKeys("small", frozenset({"w", "bn.running_mean", "n"})),
        ClientKeys("big", frozenset(_server()))]  # fmt: skip


def _round0():  # mean w (0.5, 3); deep 3 (big only); statistic 2
    small = {"w": torch.tensor([0.0, 3.0], dtype=T), "bn.running_mean": torch.tensor([1.0], dtype=T),
             "n": torch.tensor(5)}  # fmt: skip
    big = {"w": torch.tensor([1.0, 3.0], dtype=T), "bn.running_mean": torch.tensor([3.0], dtype=T),
           "n": torch.tensor(7), "deep": torch.tensor([3.0], dtype=T)}  # fmt: skip
    return [Upload(0, small, 1, 1), Upload(1, big, 1, 1)]


def _round1():  # the small group only: mean w (0.25, 2); nobody owns deep
    small = {"w": torch.tensor([0.25, 2.0], dtype=T), "bn.running_mean": torch.tensor([4.0], dtype=T),
             "n": torch.tensor(9)}  # fmt: skip
    return [Upload(0, small, 1, 1)]


def _yogi_v(v, d2, beta2):
    """The paper's v_t = v_{t-1} - (1 - beta2) Delta^2 sign(v_{t-1} - Delta^2), element by element
    in plain Python floats."""
    return [vi - (1 - beta2) * di * (0.0 if vi == di else math.copysign(1.0, vi - di))
            for vi, di in zip(v, d2, strict=True)]  # fmt: skip


def _step(w, m, v, delta, eta, b1, tau, rule):
    m = [b1 * mi + (1 - b1) * di for mi, di in zip(m, delta, strict=True)]
    v = rule(v, [d * d for d in delta])
    w = [wi + eta * mi / (math.sqrt(vi) + tau) for wi, mi, vi in zip(w, m, v, strict=True)]
    return w, m, v


@pytest.mark.parametrize("kind", ["yogi", "adagrad"])
def test_two_rounds_by_hand_with_owners(kind):
    eta, b1, b2, tau = 0.1, 0.5, 0.75, 0.5
    if kind == "yogi":
        agg = FedYogi(server_lr=eta, beta1=b1, beta2=b2, tau=tau, weighting="uniform")
        rule = lambda v, d2: _yogi_v(v, d2, b2)  # noqa: E731
    else:
        agg = FedAdagrad(server_lr=eta, beta1=b1, tau=tau, weighting="uniform")
        rule = lambda v, d2: [vi + di for vi, di in zip(v, d2, strict=True)]  # noqa: E731
    agg.setup(_server(), 2, client_keys=KEYS)
    agg.aggregate(0, _round0())
    w0, m0, v0 = [1.0, 2.0], [0.0, 0.0], [tau**2, tau**2]  # Algorithm 2: m = 0, v = tau^2
    w1, m1, v1 = _step(w0, m0, v0, [0.5 - 1.0, 3.0 - 2.0], eta, b1, tau, rule)
    deep1, _, v_deep = _step([1.0], [0.0], [tau**2], [3.0 - 1.0], eta, b1, tau, rule)
    out = agg.global_state()
    assert out["w"].tolist() == pytest.approx(w1, abs=1e-15)
    assert out["deep"].tolist() == pytest.approx(deep1, abs=1e-15)
    assert out["bn.running_mean"].item() == 2.0 and out["n"].item() == 5  # buffers: the mean
    agg.aggregate(1, _round1())
    w2, m2, v2 = _step(w1, m1, v1, [0.25 - w1[0], 2.0 - w1[1]], eta, b1, tau, rule)
    out = agg.global_state()
    assert out["w"].tolist() == pytest.approx(w2, abs=1e-15)
    assert agg.m["w"].tolist() == pytest.approx(m2, abs=1e-15)
    assert agg.v["w"].tolist() == pytest.approx(v2, abs=1e-15)
    assert out["deep"].tolist() == pytest.approx(deep1, abs=1e-15)  # unowned: no step
    assert agg.v["deep"].tolist() == pytest.approx(v_deep, abs=1e-15)  # nor a v update
    assert out["bn.running_mean"].item() == 4.0 and out["n"].item() == 9


def test_yogi_leaves_v_where_it_equals_delta_squared_and_moves_it_towards_it():
    """sign(0) = 0; otherwise v moves towards Delta^2 by (1 - beta2) Delta^2."""
    initial = {"w": torch.tensor([0.0, 0.0, 0.0], dtype=T)}
    agg = FedYogi(server_lr=1.0, beta1=0.0, beta2=0.5, tau=0.5, initial_v=1.0)
    agg.setup(initial, 1)
    agg.aggregate(0, [Upload(0, {"w": torch.tensor([1.0, 2.0, 0.5], dtype=T)}, 1, 1)])
    # Delta^2 = (1, 4, 0.25): v = 1 stays, rises by 2, falls by 0.125
    assert agg.v["w"].tolist() == [1.0, 3.0, 0.875]
    assert agg.global_state()["w"].tolist() == pytest.approx(
        [1 / 1.5, 2 / (math.sqrt(3.0) + 0.5), 0.5 / (math.sqrt(0.875) + 0.5)], abs=1e-15
    )


def test_initial_v_defaults_to_tau_squared():
    initial = {"w": torch.zeros(3)}
    for agg in (FedYogi(tau=0.01), FedAdagrad(tau=0.01)):
        agg.setup(initial, 1)
        assert torch.equal(agg.v["w"], torch.full((3,), 0.01**2))
        assert torch.equal(agg.m["w"], torch.zeros(3))
    agg = FedAdagrad(initial_v=0.1)
    agg.setup(initial, 1)
    assert torch.equal(agg.v["w"], torch.full((3,), 0.1))


@pytest.mark.parametrize("cls", [FedYogi, FedAdagrad])
def test_the_step_runs_on_the_statistic(cls):
    """With an injected Median, Delta is the coordinate-wise median minus w (composition as
    FedAdam's, docs/algorithms.md 2.8)."""
    initial = {"w": torch.zeros(4, dtype=T)}
    gen = torch.Generator().manual_seed(3)
    uploads = [Upload(i, {"w": torch.randn(4, generator=gen, dtype=T)}, 1 + i, 1) for i in range(3)]
    median = torch.stack([u.weights["w"] for u in uploads]).median(dim=0).values
    agg = cls(server_lr=0.3, tau=0.1, statistic=Median())
    agg.setup(initial, 3)
    agg.aggregate(0, uploads)
    beta1 = agg.beta1
    m = (1 - beta1) * median
    v = 0.01 + median.square() if cls is FedAdagrad else None
    if cls is FedYogi:
        v = 0.01 - (1 - agg.beta2) * median.square() * (0.01 - median.square()).sign()
    expected = 0.3 * m / (v.sqrt() + 0.1)
    torch.testing.assert_close(agg.global_state()["w"], expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FedYogi(server_lr=0.0), r"loop.aggregator.init_args.server_lr=0.0 .*> 0"),
        (lambda: FedYogi(beta1=1.0), r"beta1=1.0 .*\[0, 1\)"),
        (lambda: FedYogi(beta2=1.5), r"beta2=1.5 .*\[0, 1\)"),
        (lambda: FedYogi(tau=-1.0), r"tau=-1.0 .*> 0"),
        (lambda: FedYogi(initial_v=-0.1), r"initial_v=-0.1 .*>= 0"),
        (lambda: FedAdagrad(server_lr=-1.0), r"server_lr=-1.0 .*> 0"),
        (lambda: FedAdagrad(tau=0.0), r"tau=0.0 .*> 0"),
        (lambda: FedAdagrad(weighting="sizes"), r"weighting"),
    ],
)
def test_bad_options_are_refused_in_one_line(make, message):
    with pytest.raises(ConfigurationError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("cls", [FedYogi, FedAdagrad])
def test_the_step_runs_on_the_client_level_dp_release(cls):
    """Under ClientLevelDP the server step reads only the noised mean (here with the noise set to
    zero, as tests/test_client_dp.py checks the estimator): a step from that mean."""
    privacy = pytest.importorskip("fedlightning.privacy")
    pytest.importorskip("opacus")
    pytest.importorskip("dp_accounting")
    initial = {"w": torch.zeros(3)}
    aggregator = privacy.ClientLevelDP(inner=cls(weighting="uniform"), noise_multiplier=1.0,
                                       clip_norm=100.0)  # fmt: skip
    aggregator.plan("poisson", 0.5, rounds=10, min_clients=1)
    aggregator.setup(initial, 4)
    aggregator.statistic.update_noise = 0.0
    aggregator.aggregate(0, [Upload(0, {"w": torch.tensor([2.0, 0.0, 0.0])}, 10, 1)])
    # the release is w + S / (q N) = (1, 0, 0): the optimizer's step from that mean
    reference = cls(weighting="uniform")
    reference.setup(initial, 4)
    reference.aggregate(0, [Upload(0, {"w": torch.tensor([1.0, 0.0, 0.0])}, 10, 1)])
    assert torch.equal(aggregator.global_state()["w"], reference.global_state()["w"])
    assert aggregator.global_state()["w"][0] > 0
