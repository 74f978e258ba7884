"""SCAFFOLD with SGD momentum and Nesterov (docs/algorithms.md 1.4): option II divides by the
client's effective number of steps a_i, the factor matches torch.optim.SGD, what a_i cannot
describe is refused, the control variates stay bounded over rounds on a non-IID split."""

import math

import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.seed import seed_everything
from torch import nn

from fedlightning import FederatedDataModule, FederatedLoop, Payload, Upload
from fedlightning.clients import ClientModule, ScaffoldClient
from fedlightning.clients.scaffold import scaffold_control_update
from fedlightning.clients.sgd_steps import SGDRule, fednova_a, sgd_rule
from fedlightning.errors import ConfigurationError
from fedlightning.fit import ClientFitter
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.server import FedAvg, Scaffold
from objective_helpers import SYNTHETIC, synthetic_run
from test_scaffold import _OneClient
from user_clients import ScheduledClient


def _sgd_movement(steps: int, rho: float, nesterov: bool, lr: float = 0.1) -> float:
    """How far torch.optim.SGD moves a parameter in ``steps`` steps of gradient 1, over ``lr``."""
    p = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer = torch.optim.SGD([p], lr=lr, momentum=rho, nesterov=nesterov)
    for _ in range(steps):
        p.grad = torch.ones_like(p)
        optimizer.step()
    return -p.item() / lr


@pytest.mark.parametrize(
    ("rho", "nesterov"),
    [
        (0.0, False),
        (0.5, False),
        (0.9, False),
        (0.99, False),
        (0.5, True),
        (0.9, True),
        (0.99, True),
    ],
)  # torch's Nesterov needs momentum > 0
def test_effective_steps_are_how_far_torch_sgd_moves_on_a_constant_gradient(rho, nesterov):
    for steps in (0, 1, 2, 5, 28, 200):
        moved = _sgd_movement(steps, rho, nesterov)
        assert fednova_a(steps, rho, nesterov) == pytest.approx(moved, rel=1e-12, abs=1e-12)
    if nesterov:  # step t moves by (1 - rho^(t+1)) / (1 - rho): heavy-ball's steps 2..K+1
        assert fednova_a(7, rho, True) == pytest.approx(fednova_a(8, rho) - 1, rel=1e-12)


def _linear_fit(g, c, c_i, steps, lr, rho, nesterov):
    """torch SGD on the SCAFFOLD objective of a linear loss <g, y> + <c - c_i, y>: every step
    sees the constant corrected gradient g + c - c_i; returns the trained y."""
    y = nn.Parameter(torch.zeros_like(g))
    optimizer = torch.optim.SGD([y], lr=lr, momentum=rho, nesterov=nesterov)
    for _ in range(steps):
        optimizer.zero_grad()
        ((g + c - c_i) * y).sum().backward()
        optimizer.step()
    return y.detach()


@pytest.mark.parametrize(
    ("rho", "nesterov"), [(0.0, False), (0.5, False), (0.9, False), (0.9, True)]
)
def test_option_ii_recovers_a_constant_gradient_whatever_the_old_control_variates(rho, nesterov):
    gen = torch.Generator().manual_seed(1)
    g, c, c_i = (torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(3))
    steps, lr = 28, 0.05
    y = _linear_fit(g, 10 * c, 10 * c_i, steps, lr, rho, nesterov)  # large, stale variates
    x = {"w": torch.zeros_like(g)}
    c_plus, delta = scaffold_control_update(
        {"w": 10 * c_i}, {"w": 10 * c}, x, {"w": y}, steps, lr, rho, nesterov
    )
    # the old c_i and c cancel exactly: c_i+ is the client's gradient
    torch.testing.assert_close(c_plus["w"], g, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(delta["w"], g - 10 * c_i, rtol=1e-9, atol=1e-9)
    # dividing by K_i instead leaves (1 - a_i/K_i) of the error of the old c_i - c: a factor of
    # -0.93 (rho 0.5), -5.95 (rho 0.9), -6.26 (Nesterov 0.9) per round with 28 steps
    old = 10 * c_i - 10 * c + (x["w"] - y) / (steps * lr)
    factor = 1 - fednova_a(steps, rho, nesterov) / steps
    torch.testing.assert_close(old - g, factor * (10 * c_i - 10 * c - g), rtol=1e-9, atol=1e-9)
    assert factor == 0 if rho == 0 else factor < -0.9


class _NesterovScaffold(ScaffoldClient):
    def configure_optimizers(self):
        return torch.optim.SGD(
            self.parameters(), lr=self.lr, momentum=self.momentum, nesterov=True, weight_decay=0.01
        )


@pytest.mark.parametrize("nesterov", [False, True])
def test_a_fit_renews_c_i_to_the_momentum_weighted_mean_of_its_gradients(nesterov):
    """After a real fit with momentum (and weight decay), ``c_i+`` is the mean of the client's
    regularised mini-batch gradients ``g_t + wd y_t``, each weighted by how far SGD carried it
    (heavy-ball: ``(1 - rho^(K-t)) / (1 - rho)``, Nesterov: ``(1 - rho^(K-t+1)) / (1 - rho)``)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=gen), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    w0 = {"weight": torch.randn(2, 3, generator=gen), "bias": torch.randn(2, generator=gen)}
    c = {k: torch.randn(v.shape, generator=gen) for k, v in w0.items()}
    c_i = {k: torch.randn(v.shape, generator=gen) for k, v in w0.items()}
    lr, rho, wd, steps = 0.2, 0.9, 0.01, 6
    make = _NesterovScaffold if nesterov else ScaffoldClient
    module = make(network=nn.Linear(3, 2), num_classes=2, lr=lr, momentum=rho, weight_decay=wd)
    fitter = ClientFitter(FitConfig(local_steps=steps, accelerator="cpu"))
    job = ClientJob(0, 0, Payload(w0, extras={"c": c}), {"c_i": c_i})
    result = fitter.fit(module, _OneClient(x, y, 4), job)
    # by hand: the trajectory of SGD on the corrected gradient, recording each regularised g_t
    w, buffer, seen = {k: v.clone() for k, v in w0.items()}, {}, []
    for t in range(steps):
        xb, yb = x[4 * (t % 2) : 4 * (t % 2) + 4], y[4 * (t % 2) : 4 * (t % 2) + 4]
        params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        loss = F.cross_entropy(xb @ params["weight"].T + params["bias"], yb)
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
        seen.append({k: grads[k] + wd * w[k] for k in w})
        for k in w:
            d = seen[-1][k] + c[k] - c_i[k]
            buffer[k] = d if t == 0 else rho * buffer[k] + d
            w[k] = w[k] - lr * (d + rho * buffer[k] if nesterov else buffer[k])
    extra = 1 if nesterov else 0
    carried = [(1 - rho ** (steps - t + extra)) / (1 - rho) for t in range(steps)]
    assert sum(carried) == pytest.approx(fednova_a(steps, rho, nesterov), rel=1e-12)
    for k in w:
        torch.testing.assert_close(result.upload.weights[k], w[k], rtol=1e-5, atol=1e-6)
        mean = sum(wt * g[k] for wt, g in zip(carried, seen, strict=True)) / sum(carried)
        torch.testing.assert_close(result.state["c_i"][k], mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(
            result.upload.extras["delta_c"][k], mean - c_i[k], rtol=1e-4, atol=1e-5
        )


def test_train_loss_is_the_cross_entropy_without_the_linear_term():
    net = nn.Linear(2, 3, bias=False)
    w0 = torch.tensor([[0.5, -1.0], [0.0, 0.25], [1.0, 1.0]])
    x, y = torch.tensor([[1.0, 2.0], [-1.0, 0.5]]), torch.tensor([0, 2])
    c = {"weight": torch.full((3, 2), 100.0)}  # a linear term of 100 * sum(w) = 175
    module = ScaffoldClient(network=net, num_classes=3, lr=0.1)
    fitter = ClientFitter(FitConfig(local_steps=1, accelerator="cpu"))
    job = ClientJob(0, 0, Payload({"weight": w0}, extras={"c": c}), {})
    result = fitter.fit(module, _OneClient(x, y, 2), job)
    expected = F.cross_entropy(x @ w0.T, y).item()
    assert result.upload.metrics["train_loss"] == pytest.approx(expected, rel=1e-6)


class _Scheduled(ScaffoldClient):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)]


class _StepScheduled(ScheduledClient, ScaffoldClient):
    """SCAFFOLD with the user objective's dict-form step scheduler (tests/user_clients.py)."""


class _Dampened(ScaffoldClient):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, dampening=0.1)


class _Adam(ScaffoldClient):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class _TwoLearningRates(ScaffoldClient):
    def configure_optimizers(self):
        head, *body = list(self.network.parameters())[::-1]
        return torch.optim.SGD([{"params": body}, {"params": [head], "lr": self.lr / 10}], self.lr)


class _Partial(ScaffoldClient):
    def configure_optimizers(self):
        return torch.optim.SGD(list(self.network.parameters())[:1], lr=self.lr)


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (_Scheduled, r"_Scheduled.configure_optimizers\(\) gives the LR scheduler StepLR"),
        (_Dampened, r"SGD with dampening=0.1.*use dampening=0"),
        (_Adam, r"the optimizer Adam.*use torch.optim.SGD"),
        (_StepScheduled, r"gives the LR scheduler StepLR.*step size must stay fixed"),
        (_TwoLearningRates, r"parameter groups with different \(lr, momentum, nesterov\)"),
        (_Partial, r"an optimizer without the trainable parameters \['network"),
    ],
)
def test_what_a_i_cannot_describe_is_refused_before_any_training(cls, match, tmp_path):
    with pytest.raises(ConfigurationError, match=match):
        synthetic_run(cls(**SYNTHETIC), Scaffold(), tmp_path=tmp_path)
    assert not (tmp_path / "metrics.csv").exists() and not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize(
    "form",
    [
        lambda opt: opt,
        lambda opt: [opt],
        lambda opt: ([opt], []),
        lambda opt: {"optimizer": opt},
        lambda opt: {"optimizer": opt, "lr_scheduler": None},
    ],
)
def test_the_sgd_settings_are_read_from_every_form_configure_optimizers_returns(form):
    class Returned(ScaffoldClient):
        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.3, momentum=0.8, nesterov=True)
            return form(sgd)

    assert sgd_rule(Returned(**SYNTHETIC), "test") == SGDRule(0.3, 0.8, True)
    assert sgd_rule(ScaffoldClient(**SYNTHETIC, momentum=0.5), "test") == SGDRule(0.1, 0.5, False)


#: the mini-batch gradient norms :class:`_GradientNorms` saw: the test's record, kept off the
#: objective (data carried across clients on the module is refused, docs/algorithms.md section 1)
GRADIENT_NORMS: list[float] = []


class _GradientNorms(ScaffoldClient):
    """SCAFFOLD that also records each mini-batch gradient norm of its fits."""

    def local_loss(self, batch):
        x, y = batch
        params = [p for _, p in self.trainable()]
        grads = torch.autograd.grad(F.cross_entropy(self(x), y), params)
        GRADIENT_NORMS.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))
        return super().local_loss(batch)


class _NesterovGradientNorms(_GradientNorms):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, nesterov=True)


class _NesterovAvg(ClientModule):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, nesterov=True)


def _digits_run(model, aggregator, tmp_path):
    """10 rounds of 5 of 10 digits clients with Dirichlet(0.1) label skew, 1 local epoch."""
    dm = FederatedDataModule(
        dataset="digits", num_clients=10, partition="dirichlet", beta=0.1, batch_size=32, seed=0
    )
    loop = FederatedLoop(
        rounds=10, clients_per_round=5, local_epochs=1, aggregator=aggregator, seed=0,
        run_dir=str(tmp_path), progress_bar=False, plots=False,
    )  # fmt: skip
    loop.console.quiet = True
    loop.fit(model, datamodule=dm)
    return loop.history


@pytest.mark.parametrize("objective", [_GradientNorms, _NesterovGradientNorms])
def test_scaffold_with_momentum_0_9_stays_bounded_on_a_label_skewed_split(objective, tmp_path):
    """Momentum 0.9 (heavy-ball or Nesterov) on Dirichlet(0.1) digits. Each c_i is a weighted
    mean of its client's mini-batch gradients and c the mean of all c_i, so ||c|| can never exceed
    the largest mini-batch gradient norm seen (dividing by K_i instead multiplies the old c_i by
    1 - a_i/K_i every round, and ||c|| grows past it within a few rounds). The model must beat
    chance (10%) by far and lose at most 5 points to FedAvg with the same recipe and weighting."""
    recipe = dict(
        network="mlp", network_kwargs={"hidden": [32]}, num_classes=10, in_channels=1,
        image_size=8, lr=0.05, momentum=0.9,
    )  # fmt: skip
    seed_everything(0, verbose=False)
    GRADIENT_NORMS.clear()
    history = _digits_run(objective(**recipe), Scaffold(), tmp_path / "scaffold")
    seed_everything(0, verbose=False)
    plain = _NesterovAvg if objective is _NesterovGradientNorms else ClientModule
    fedavg = _digits_run(plain(**recipe), FedAvg(weighting="uniform"), tmp_path / "fedavg")
    norms = [row["c_norm"] for row in history]
    assert len(norms) == 10 and min(norms) > 0
    assert max(norms) <= max(GRADIENT_NORMS), (norms, max(GRADIENT_NORMS))
    assert history[-1]["test_acc"] >= 0.6
    assert history[-1]["test_acc"] >= fedavg[-1]["test_acc"] - 0.05


def test_scaffold_averages_client_models_uniformly_by_default():
    agg = Scaffold()
    assert agg.weighting == "uniform"
    agg.setup({"w": torch.zeros(2)}, num_clients=4)
    uploads = [
        (1, torch.tensor([1.0, 2.0]), 10),
        (3, torch.tensor([5.0, 6.0]), 30),
    ]
    agg.aggregate(0, [Upload(i, {"w": w}, n, 3, {"delta_c": {"w": w}}) for i, w, n in uploads])
    assert agg.global_state()["w"].tolist() == [3.0, 4.0]  # Algorithm 1: the plain mean
    assert agg.round_metrics()["c_norm"] == pytest.approx(math.hypot(6 / 4, 8 / 4))


def test_scaffold_run_logs_c_norm_every_round(tmp_path):
    loop = synthetic_run(
        ScaffoldClient(momentum=0.9, **SYNTHETIC), Scaffold(), rounds=3, tmp_path=tmp_path
    )
    c = loop.aggregator.c
    expected = math.sqrt(sum(float(v.double().pow(2).sum()) for v in c.values()))
    assert [r["round"] for r in loop.history] == [1, 2, 3]
    assert loop.history[-1]["c_norm"] == pytest.approx(expected, rel=1e-12)
