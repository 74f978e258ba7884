"""APFL (Deng, Kamani, Mahdavi, arXiv:2003.13461, Algorithm 1 with the adaptive alpha of section
3.1) recomputed by hand from the paper's equations on hand-made tensors: two local steps of the
global copy w, the local model v and the mixing weight alpha by the analytic softmax gradient
(alpha's projection onto [0, 1] reached in the second step); the deployed model alpha v + (1 -
alpha) w; a run's clients deploying their own mixtures; the cohort's one-line refusal."""

import pytest
import torch
from torch import nn

from fedlightning import FederatedLoop
from fedlightning.backends import CohortBackend
from fedlightning.clients import APFL
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload
from hand_maths import T, ce_grad, pathological, t


def _client(**kwargs):
    # in float64 throughout (alpha too): the hand computation's precision
    return APFL(network=nn.Linear(3, 2), num_classes=2, momentum=0.0, **kwargs).double()


def _step(client, optimizer, batch):
    def closure():
        optimizer.zero_grad()
        loss = client.local_loss(batch)
        loss.backward()
        return loss

    client.optimizer_step(0, 0, optimizer, closure)


def test_two_local_steps_by_hand_with_alpha_projected():
    lr, alpha_lr, alpha = 0.1, 2.0, 0.6
    w = (t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3), t(0.05, -0.05))
    v = (t(-0.9, 1.3, 0.1, 0.8, -1.2, -0.1).reshape(2, 3), t(0.4, -0.3))
    batches = [(t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0).reshape(2, 3), torch.tensor([1, 0])),
               (t(0.5, 0.5, -1.0, 2.0, 0.0, 1.0).reshape(2, 3), torch.tensor([0, 0]))]  # fmt: skip
    client = _client(alpha=0.3, alpha_lr=alpha_lr, lr=lr)
    payload = Payload({"weight": w[0], "bias": w[1]})
    client.begin_client(0, payload, {"local": {"weight": v[0], "bias": v[1]}, "alpha": alpha})
    optimizer = client.configure_optimizers()
    alphas = []
    for x, y in batches:
        _step(client, optimizer, (x, y))
        mixed = tuple(alpha * a + (1 - alpha) * b for a, b in zip(v, w, strict=True))
        gw, gb = ce_grad(*w, x, y)
        hw, hb = ce_grad(*mixed, x, y)  # grad f(v_bar)
        # alpha's gradient <v - w, grad f(v_bar)> at the step's start
        g_alpha = float(((v[0] - w[0]) * hw).sum() + ((v[1] - w[1]) * hb).sum())
        w = (w[0] - lr * gw, w[1] - lr * gb)
        v = (v[0] - lr * alpha * hw, v[1] - lr * alpha * hb)
        alpha = min(1.0, max(0.0, alpha - alpha_lr * g_alpha))
        alphas.append(alpha)
    assert alphas == [1.0, 0.0]  # projected onto [0, 1] at both ends
    assert client.alpha.item() == alpha
    weights, _, state = client.end_client(num_steps=2)
    torch.testing.assert_close(weights["weight"], w[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(state["local"]["weight"], v[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(state["local"]["bias"], v[1], rtol=0, atol=1e-15)
    deployed = {"weight": t(1.0, 0.0, 0.0, 0.0, 1.0, 0.0).reshape(2, 3), "bias": t(0.0, 1.0)}
    mixed = client.personal_state(0, state, deployed)
    a = state["alpha"]
    torch.testing.assert_close(
        mixed["weight"], a * state["local"]["weight"] + (1 - a) * deployed["weight"]
    )


def test_the_first_step_of_alpha_before_projection():
    """One step, alpha inside [0, 1]: alpha - eta_alpha <v - w, grad f(v_bar)> exactly."""
    w = (t(0.1, 0.2, -0.3, 0.4, 0.0, 0.5).reshape(2, 3), t(0.05, -0.05))
    v = (t(0.2, 0.1, -0.1, 0.3, 0.1, 0.4).reshape(2, 3), t(0.0, 0.0))
    x, y = t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0).reshape(2, 3), torch.tensor([1, 0])
    client = _client(alpha=0.5, alpha_lr=0.5, lr=0.1)
    client.begin_client(0, Payload({"weight": w[0], "bias": w[1]}),
                        {"local": {"weight": v[0], "bias": v[1]}, "alpha": 0.5})  # fmt: skip
    _step(client, client.configure_optimizers(), (x, y))
    mixed = tuple(0.5 * a + 0.5 * b for a, b in zip(v, w, strict=True))
    hw, hb = ce_grad(*mixed, x, y)
    expected = 0.5 - 0.5 * float(((v[0] - w[0]) * hw).sum() + ((v[1] - w[1]) * hb).sum())
    assert 0 < expected < 1
    assert client.alpha.item() == pytest.approx(expected, rel=0, abs=1e-15)


def test_fixed_alpha_stays_and_a_first_participation_deploys_the_global_model():
    client = _client(alpha=0.25, adaptive=False)
    w = {"weight": torch.ones(2, 3, dtype=T), "bias": torch.zeros(2, dtype=T)}
    assert client.personal_state(0, {}, w) is w
    client.begin_client(0, Payload(w), {})
    x, y = t(1.0, -2.0, 0.5, 0.0, 1.0, 3.0).reshape(2, 3), torch.tensor([1, 0])
    _step(client, client.configure_optimizers(), (x, y))
    assert client.alpha.item() == 0.25


def test_each_client_deploys_its_own_mixture(tmp_path):
    torch.manual_seed(0)
    loop = FederatedLoop(rounds=2, clients_per_round=6, run_dir=str(tmp_path), progress_bar=False,
                         plots=False)  # fmt: skip
    objective = APFL(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)
    loop.fit(objective, datamodule=pathological())
    saved = torch.load(tmp_path / "personal.pt", weights_only=True)["clients"]
    server = loop.aggregator.global_state()
    for cid in range(6):
        state = loop.store.get(cid)
        a = state["alpha"]
        expected = a * state["local"]["head.weight"] + (1 - a) * server["head.weight"]
        torch.testing.assert_close(saved[cid]["state_dict"]["head.weight"], expected)
    assert len({loop.store.get(c)["alpha"] for c in range(6)}) > 1  # adapted per client


def test_the_cohort_and_bad_options_are_refused_in_one_line(tmp_path):
    loop = FederatedLoop(rounds=1, clients_per_round=2, run_dir=str(tmp_path), progress_bar=False,
                         plots=False, backend=CohortBackend())  # fmt: skip
    objective = APFL(network="mlp", num_classes=3, in_channels=6, image_size=1)
    with pytest.raises(ConfigurationError, match="APFL overrides optimizer_step") as error:
        loop.fit(objective, datamodule=pathological())
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigurationError, match=r"model.alpha=1.5 .*\[0, 1\]"):
        APFL(alpha=1.5, network="mlp")
    with pytest.raises(ConfigurationError, match=r"^model.networks=\['mlp', 'cnn'\]: APFL"):
        APFL(networks=["mlp", "cnn"])
