"""FedDyn (Acar et al., ICLR 2021, arXiv:2111.04263, Algorithm 1) recomputed by hand from the
paper's equations on hand-made tensors: the server's h and model over two rounds with partial
participation and clients owning different keys; the client's gradient (the dynamic regulariser's
terms, by the analytic softmax gradient) and its gradient state over two rounds. The full loop
against a plain-torch implementation: tests/test_independent_loops.py."""

import pytest
import torch
from torch import nn

from fedlightning.clients import FedDynClient
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, Upload
from fedlightning.server import FedDyn
from fedlightning.server.base import ClientKeys

T = torch.float64


def _t(*values):
    return torch.tensor(values, dtype=T)


def test_server_two_rounds_by_hand_with_partial_participation_and_owners():
    """3 clients: 0 owns w only, 1 and 2 own w and deep. h_p moves by -alpha/N_p times the sum of
    the participants' updates (N_w = 3, N_deep = 2); theta_p = mean_p - h_p / alpha."""
    alpha = 0.5
    server = {"w": _t(1.0, 2.0), "deep": _t(4.0), "bn.running_mean": _t(0.0)}
    keys = [ClientKeys("small", frozenset({"w", "bn.running_mean"})),
            ClientKeys("big", frozenset(server)), ClientKeys("big", frozenset(server))]  # fmt: skip
    agg = FedDyn(alpha=alpha)
    agg.setup(server, 3, client_keys=keys)
    r0 = [Upload(0, {"w": _t(0.0, 3.0), "bn.running_mean": _t(1.0)}, 5, 1),
          Upload(1, {"w": _t(2.0, 5.0), "deep": _t(2.0), "bn.running_mean": _t(3.0)}, 9, 1)]  # fmt: skip
    agg.aggregate(0, r0)
    # h_w = 0 - (0.5/3) ((0-1 + 2-1), (3-2 + 5-2)) = -(1/6) (0, 4); mean_w = (1, 4)
    h_w = [0.0, -4 / 6]
    w1 = [1.0 - h_w[0] / alpha, 4.0 - h_w[1] / alpha]
    h_deep = -(alpha / 2) * (2.0 - 4.0)  # one of the two owners uploaded
    deep1 = 2.0 - h_deep / alpha
    out = agg.global_state()
    assert out["w"].tolist() == pytest.approx(w1, abs=1e-15)
    assert out["deep"].item() == pytest.approx(deep1, abs=1e-15)
    assert agg.h["w"].tolist() == pytest.approx(h_w, abs=1e-15)
    assert agg.h["deep"].item() == pytest.approx(h_deep, abs=1e-15)
    assert out["bn.running_mean"].item() == 2.0  # a buffer: the uniform mean
    r1 = [Upload(2, {"w": _t(3.0, 1.0), "deep": _t(5.0), "bn.running_mean": _t(6.0)}, 1, 1)]
    agg.aggregate(1, r1)
    h_w2 = [h_w[0] - alpha / 3 * (3.0 - w1[0]), h_w[1] - alpha / 3 * (1.0 - w1[1])]
    h_deep2 = h_deep - alpha / 2 * (5.0 - deep1)
    out = agg.global_state()
    assert out["w"].tolist() == pytest.approx(
        [3.0 - h_w2[0] / alpha, 1.0 - h_w2[1] / alpha], abs=1e-14
    )
    assert out["deep"].item() == pytest.approx(5.0 - h_deep2 / alpha, abs=1e-14)
    assert agg.h["w"].tolist() == pytest.approx(h_w2, abs=1e-15)


def test_server_sends_alpha_with_the_model():
    agg = FedDyn(alpha=0.03)
    agg.setup({"w": torch.zeros(2)}, 4)
    payloads = agg.configure_round(0, [1, 3])
    assert payloads[1].extras == {"alpha": 0.03} and torch.equal(
        payloads[3].weights["w"], torch.zeros(2)
    )


def _client(alpha, theta_t, grad_state):
    client = FedDynClient(network=nn.Linear(3, 2).double(), num_classes=2)
    client.begin_client(
        0, Payload({"weight": theta_t[0], "bias": theta_t[1]}, extras={"alpha": alpha}),
        {"grad": grad_state} if grad_state is not None else {},
    )  # fmt: skip
    return client


def test_client_gradient_and_gradient_state_by_hand():
    """The local loss CE - <g, theta> + (alpha/2) ||theta - theta_t||^2: its gradient by the
    analytic softmax gradient; then g <- g - alpha (theta_k - theta_t), over two rounds."""
    alpha = 0.2
    x, y = _t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0).reshape(2, 3), torch.tensor([1, 0])
    theta_t = (_t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3), _t(0.05, -0.05))
    client = _client(alpha, theta_t, None)  # first participation: g = 0
    with torch.no_grad():  # move away from theta_t so the proximal term pulls
        client.network.weight.copy_(_t(0.3, 0.1, -0.2, 0.2, 0.1, 0.4).reshape(2, 3))
        client.network.bias.copy_(_t(0.0, 0.1))
    loss = client.local_loss((x, y))
    loss.backward()
    weight, bias = client.network.weight.detach(), client.network.bias.detach()
    probs = torch.softmax(x @ weight.T + bias, dim=1)
    residual = (probs - torch.eye(2, dtype=T)[y]) / len(y)  # d CE / d logits
    grad_w = residual.T @ x + alpha * (weight - theta_t[0])
    grad_b = residual.sum(0) + alpha * (bias - theta_t[1])
    torch.testing.assert_close(client.network.weight.grad, grad_w, rtol=0, atol=1e-14)
    torch.testing.assert_close(client.network.bias.grad, grad_b, rtol=0, atol=1e-14)
    _, _, state = client.end_client(num_steps=1)
    g1 = {"weight": -alpha * (weight - theta_t[0]), "bias": -alpha * (bias - theta_t[1])}
    for name, value in g1.items():
        torch.testing.assert_close(state["grad"][name], value, rtol=0, atol=1e-15)
    # round 2: the linear term -<g, theta> subtracts g from the gradient, and g keeps moving
    theta_2 = (weight + 0.1, bias - 0.2)
    client = _client(alpha, theta_2, state["grad"])
    with torch.no_grad():
        client.network.weight.copy_(weight)
        client.network.bias.copy_(bias)
    client.local_loss((x, y)).backward()
    torch.testing.assert_close(
        client.network.weight.grad, residual.T @ x - g1["weight"] + alpha * (weight - theta_2[0]),
        rtol=0, atol=1e-14,
    )  # fmt: skip
    _, _, state2 = client.end_client(num_steps=1)
    torch.testing.assert_close(state2["grad"]["bias"], g1["bias"] - alpha * (bias - theta_2[1]),
                               rtol=0, atol=1e-15)  # fmt: skip


def test_train_loss_is_the_cross_entropy_alone():
    client = _client(0.2, (torch.zeros(2, 3, dtype=T), torch.zeros(2, dtype=T)), None)
    x, y = torch.ones(4, 3, dtype=T), torch.tensor([0, 1, 0, 1])
    _, tracked = client.batch_metrics.step(client.local_loss, (x, y))
    assert tracked["train_loss"] == pytest.approx(float(torch.log(torch.tensor(2.0))))


def test_bad_alpha_is_refused_in_one_line():
    with pytest.raises(ConfigurationError, match=r"loop.aggregator.init_args.alpha=0.0 .*> 0"):
        FedDyn(alpha=0.0)


def test_client_level_dp_refuses_feddyn_naming_why():
    privacy = pytest.importorskip("fedlightning.privacy")
    pytest.importorskip("opacus")
    with pytest.raises(
        ConfigurationError, match="FedDyn cannot: its server update scales h's step"
    ):
        privacy.ClientLevelDP(inner=FedDyn(), noise_multiplier=1.0)
