"""FedProx, MOON and FML: their formulas on hand-made tensors and their round hooks."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedlightning import FedAvg, Payload
from fedlightning.clients import FML, MOON, ClientModule, FedProx
from fedlightning.clients.fedprox import proximal_term
from fedlightning.clients.moon import moon_contrastive_loss
from fedlightning.clients.mutual import dml_losses
from fedlightning.errors import ConfigurationError
from objective_helpers import SYNTHETIC, synthetic_run


# -- FedProx --------------------------------------------------------------------------------------
def test_proximal_gradient_is_mu_times_the_distance_to_the_anchor():
    w = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    b = torch.tensor([0.25, -1.0], requires_grad=True)
    anchor = {"w": torch.tensor([[0.0, 1.0], [0.5, 2.0]]), "b": torch.tensor([1.0, -1.0])}
    mu = 0.3
    term = 0.5 * mu * proximal_term([("w", w), ("b", b)], anchor)
    # hand-computed: sum of squares 1 + 9 + 0 + 1 + 0.5625 + 0 = 11.5625
    assert term.item() == pytest.approx(0.5 * mu * 11.5625)
    term.backward()
    assert torch.allclose(w.grad, mu * torch.tensor([[1.0, -3.0], [0.0, 1.0]]))
    assert torch.allclose(b.grad, mu * torch.tensor([-0.75, 0.0]))


def test_fedprox_loss_adds_the_proximal_pull_to_cross_entropy():
    model = FedProx(mu=0.5, **SYNTHETIC)
    dispatched = {k: v.clone() for k, v in model.network.state_dict().items()}
    model.begin_client(0, Payload(dispatched), {})
    with torch.no_grad():
        for p in model.network.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, y = torch.randn(5, 6), torch.tensor([0, 1, 2, 0, 1])
    prox_grads = torch.autograd.grad(model.local_loss((x, y)), list(model.network.parameters()))
    ce_grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.network.parameters()))
    for (name, p), g, g_ce in zip(
        model.network.named_parameters(), prox_grads, ce_grads, strict=True
    ):
        assert torch.allclose(g - g_ce, 0.5 * (p - dispatched[name]), atol=1e-6)


def test_fedprox_mu_is_validated():
    with pytest.raises(ConfigurationError, match="mu must be >= 0, got -0.1"):
        FedProx(mu=-0.1, **SYNTHETIC)


# -- MOON -----------------------------------------------------------------------------------------
def test_moon_loss_is_the_closed_form():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    z_prev = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    tau = 0.5
    # cosines: sample 0 -> (1/sqrt 2, 0); sample 1 -> (1, -1/sqrt 2)
    expected = []
    for pos, neg in ((1 / math.sqrt(2), 0.0), (1.0, -1 / math.sqrt(2))):
        expected.append(
            -math.log(math.exp(pos / tau) / (math.exp(pos / tau) + math.exp(neg / tau)))
        )
    loss = moon_contrastive_loss(z, z_glob, z_prev, tau)
    assert loss.item() == pytest.approx(sum(expected) / 2, rel=1e-6)


def test_moon_attaches_a_projection_head_and_a_classifier_on_it():
    model = MOON(network="lenet5", num_classes=10, in_channels=1, image_size=8)
    net = model.network
    assert [type(m).__name__ for m in net.projection] == ["Linear", "ReLU", "Linear"]
    assert (net.projection[0].in_features, net.projection[0].out_features) == (84, 84)
    assert (net.projection[2].out_features, net.head.in_features, net.head.out_features) == (
        256,
        256,
        10,
    )
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(net(x), net.head(net.forward_features(x)))
    assert not any(
        k.startswith("backbone.head") for k in net.state_dict()
    )  # no dead classifier uploaded


def test_moon_first_participation_contrasts_with_the_dispatched_model_then_with_its_own():
    model = MOON(mu=1.0, tau=0.5, **SYNTHETIC)
    dispatched = {k: v.clone() for k, v in model.network.state_dict().items()}
    model.begin_client(2, Payload(dispatched), {})
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    # previous model == global model: l_con is log 2 exactly
    ce = F.cross_entropy(model(x), y)
    assert (model.local_loss((x, y)) - ce).item() == pytest.approx(math.log(2), abs=1e-6)
    weights, _, state = model.end_client(0)
    assert all(torch.equal(state["previous"][k], weights[k]) for k in weights)
    previous = {k: v + 0.5 for k, v in dispatched.items()}
    model.begin_client(2, Payload(dispatched), {"previous": previous})
    assert all(
        torch.equal(v, previous[k]) for k, v in model._frozen["previous"].state_dict().items()
    )


def test_moon_options_are_validated():
    with pytest.raises(ConfigurationError, match="tau must be > 0, got 0"):
        MOON(tau=0, **SYNTHETIC)
    with pytest.raises(ConfigurationError, match="mu must be >= 0"):
        MOON(mu=-1, **SYNTHETIC)


def test_moon_trains_in_the_loop_and_keeps_previous_models(tmp_path):
    loop = synthetic_run(MOON(**SYNTHETIC), FedAvg(), rounds=2, tmp_path=tmp_path)
    assert len(loop.store) >= 2
    assert all("previous" in loop.store.get(c) for c in range(4) if c in loop.store)


# -- FML ------------------------------------------------------------------------------------------
def test_dml_losses_follow_the_formula_with_partners_detached():
    out_meme = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 1.0]], requires_grad=True)
    out_local = torch.tensor([[0.0, 1.0, 0.0], [1.0, -1.0, 2.0]], requires_grad=True)
    y = torch.tensor([0, 2])
    alpha, beta = 0.3, 0.8
    loss_meme, loss_local = dml_losses(out_meme, out_local, y, alpha, beta)
    p_m, p_l = F.softmax(out_meme, 1), F.softmax(out_local, 1)
    kl_m_l = (p_m * (p_m.log() - p_l.log())).sum(1).mean()  # KL(p_meme || p_local)
    kl_l_m = (p_l * (p_l.log() - p_m.log())).sum(1).mean()
    assert loss_local.item() == pytest.approx(
        (alpha * F.cross_entropy(out_local, y) + (1 - alpha) * kl_m_l).item()
    )
    assert loss_meme.item() == pytest.approx(
        (beta * F.cross_entropy(out_meme, y) + (1 - beta) * kl_l_m).item()
    )
    assert torch.autograd.grad(loss_local, out_meme, allow_unused=True)[0] is None
    assert torch.autograd.grad(loss_meme, out_local, allow_unused=True)[0] is None
    assert torch.equal(
        dml_losses(out_meme, out_local, y, alpha, 1.0)[0], F.cross_entropy(out_meme, y)
    )


def test_fml_with_beta_1_is_exactly_uniform_fedavg_on_the_meme_side(tmp_path):
    reference = ClientModule(momentum=0.5, **SYNTHETIC)
    fml_model = FML(beta=1.0, alpha=0.5, momentum=0.5, **SYNTHETIC)
    fml_model.network.load_state_dict(reference.network.state_dict())
    plain = synthetic_run(reference, FedAvg("uniform"), tmp_path=tmp_path / "a")
    fml = synthetic_run(fml_model, FedAvg("uniform"), tmp_path=tmp_path / "b")
    a, b = plain.aggregator.global_state(), fml.aggregator.global_state()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fml_personal_models_and_optimizer_state_persist_and_never_upload(tmp_path):
    model = FML(
        personal_network="mlp",
        personal_network_kwargs={"hidden": [16, 16]},
        momentum=0.9,
        **SYNTHETIC,
    )
    loop = synthetic_run(model, FedAvg("uniform"), rounds=3, tmp_path=tmp_path)
    assert set(loop.aggregator.global_state()) == set(model.network.state_dict())
    state = next(loop.store.get(c) for c in range(4) if c in loop.store)
    assert state["personal"]["features.3.weight"].shape == (16, 16)  # the personal architecture
    # the personal parameter group's SGD state, one entry per personal parameter
    personal_params = list(model.personal.parameters())
    assert len(state["optimizer"]) == len(personal_params)
    assert all(
        s["momentum_buffer"].shape == p.shape
        for s, p in zip(state["optimizer"], personal_params, strict=True)
    )
    assert 0.0 <= loop.history[-1]["personal_acc"] <= 1.0


def test_fml_counts_one_step_per_batch(tmp_path):
    steps = []

    class Recording(FedAvg):
        def aggregate(self, round_index, uploads):
            steps.extend(u.num_steps for u in uploads)
            super().aggregate(round_index, uploads)

    synthetic_run(
        FML(**SYNTHETIC), Recording("uniform"), rounds=1, tmp_path=tmp_path, local_steps=3
    )
    assert steps == [3, 3]


def test_fml_options_and_precision_are_validated():
    with pytest.raises(ConfigurationError, match="beta must lie in \\[0, 1\\], got 1.5"):
        FML(beta=1.5, **SYNTHETIC)
    with pytest.raises(ConfigurationError, match="personal_network"):
        FML(network=torch.nn.Linear(6, 3), num_classes=3)
    # both models step through one optimizer under one gradient scaler: every precision works
    FML.check_precision("16-mixed")
    FML.check_precision("bf16-mixed")
    ClientModule.check_precision("16-mixed")  # the plain client accepts every precision
