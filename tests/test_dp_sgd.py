"""DP-SGD clients (docs/algorithms.md section 7.2): per-sample gradients of any objective's
``local_loss`` equal per-sample autograd, the step is Opacus's clip-sum-noise over a Poisson batch
divided by the expected batch size, each client's accountant composes its steps over rounds, and
what per-sample gradients cannot train is refused."""

from __future__ import annotations

from functools import partial

import pytest
import torch

pytest.importorskip("opacus")
pytest.importorskip("dp_accounting")
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from fedlightning.clients import ClientModule, FedProx, ScaffoldClient
from fedlightning.data.loader import TensorBatches
from fedlightning.errors import ConfigurationError
from fedlightning.fit import ClientFitter
from fedlightning.privacy import DPSGD
from fedlightning.privacy.dp_sgd import EPSILON_METRIC, STATE_KEY, check_dp_sgd
from fedlightning.privacy.dp_sgd_fit import DPSGDFit, PerSampleGradients, trained_parameters
from fedlightning.protocol import ClientJob, FitConfig, Payload
from fedlightning.seeding import derive_seed
from privacy_reference import pld_epsilon


def batch(n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def begin(model: ClientModule, shift: float = 0.3) -> None:
    """Start a client's round from weights other than the model's (so that FedProx's proximal
    term and SCAFFOLD's correction have a gradient)."""
    weights = {k: v + shift for k, v in model.network.state_dict().items()}
    extras = {}
    if isinstance(model, ScaffoldClient):
        extras["c"] = {n: torch.full_like(p, 0.05) for n, p in model.network.named_parameters()}
    model.begin_client(0, Payload(weights, extras), {})
    with torch.no_grad():  # move away from the anchor
        for p in model.parameters():
            p.add_(0.1)


OBJECTIVES = [
    lambda: ClientModule(network="mlp", network_kwargs={"hidden": [5]}),
    lambda: FedProx(mu=0.7, network="mlp", network_kwargs={"hidden": [5]}),
    lambda: ScaffoldClient(network="mlp", network_kwargs={"hidden": [5]}),
]


@pytest.mark.parametrize("make", OBJECTIVES, ids=["plain", "fedprox", "scaffold"])
def test_per_sample_gradients_equal_per_sample_autograd(make):
    torch.manual_seed(0)
    model = make()
    begin(model)
    x, y = batch()
    optimizer = model.configure_optimizers()
    named = trained_parameters(model, optimizer)
    grads, loss = PerSampleGradients(model, named)((x, y))
    losses = []
    for j in range(len(y)):
        model.zero_grad()
        value = model.local_loss((x[j : j + 1], y[j : j + 1]))
        value.backward()
        losses.append(value.detach())
        for (name, p), g in zip(named, grads, strict=True):
            assert torch.allclose(g[j], p.grad, atol=1e-6), (name, j)
    if isinstance(model, ScaffoldClient):  # it reports the data loss (docs/algorithms.md 1.4)
        with torch.no_grad():
            losses = [
                ClientModule.local_loss(model, (x[j : j + 1], y[j : j + 1])) for j in range(len(y))
            ]
    assert torch.allclose(loss, torch.stack(losses).mean())
    if isinstance(model, FedProx | ScaffoldClient):  # the data-free term is in every gradient
        plain = ClientModule.local_loss
        model.zero_grad()
        plain(model, (x[:1], y[:1])).backward()
        assert not torch.allclose(grads[0][0], named[0][1].grad, atol=1e-4)


def test_a_step_is_opacus_clip_sum_noise_over_the_poisson_batch():
    """One DP-SGD step by hand: the Poisson batch Opacus's sampler draws from the fit's seed,
    each per-sample gradient clipped to C, summed, noised from the fit's noise seed, divided by
    the expected batch size q n, then an SGD step."""
    torch.manual_seed(0)
    model = ClientModule(network="mlp", network_kwargs={"hidden": [5]}, lr=0.5)
    begin(model, 0.0)
    x, y = batch(20, seed=1)
    batches = TensorBatches(x, y, batch_size=5)  # q = 1 / 4
    config = FitConfig(
        local_steps=1, dp_sgd=DPSGD(noise_multiplier=0.8, max_grad_norm=0.05).settings()
    )
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    fit = DPSGDFit(config, batches, seed=11, device=torch.device("cpu"))
    steps = fit.run(model, model.configure_optimizers(), lambda *_: None)
    assert steps == 1 and fit.sample_rate == 0.25
    sampler = UniformWithReplacementSampler(
        num_samples=20, sample_rate=0.25, steps=1,
        generator=torch.Generator().manual_seed(derive_seed(11, "dp-sgd-batches")),
    )  # fmt: skip
    (indices,) = list(sampler)
    reference = ClientModule(network="mlp", network_kwargs={"hidden": [5]})
    reference.load_state_dict({k: v for k, v in model.state_dict().items()})
    with torch.no_grad():
        for n, p in reference.named_parameters():
            p.copy_(start[n])
    named = trained_parameters(reference, reference.configure_optimizers())
    per_sample = [[] for _ in named]
    for j in indices:
        reference.zero_grad()
        reference.local_loss((x[j : j + 1], y[j : j + 1])).backward()
        for i, (_, p) in enumerate(named):
            per_sample[i].append(p.grad.clone())
    norms = torch.stack(
        [sum(g[k].square().sum() for g in per_sample) for k in range(len(indices))]
    ).sqrt()
    factors = (0.05 / (norms + 1e-6)).clamp(max=1.0)  # Opacus's clipping factor
    noise = torch.Generator().manual_seed(derive_seed(11, "dp-sgd-noise"))
    for i, (name, p) in enumerate(named):
        summed = sum(f * g for f, g in zip(factors, per_sample[i], strict=True))
        noised = summed + torch.normal(0, 0.8 * 0.05, p.shape, generator=noise)
        expected = start[name] - 0.5 * noised / (20 * 0.25)
        assert torch.allclose(dict(model.named_parameters())[name], expected, atol=1e-6), name
    assert {n for n, p in model.named_parameters() if hasattr(p, "grad_sample")} == set()


def test_each_client_composes_its_steps_over_rounds():
    from fedlightning.data import FederatedDataModule

    dm = FederatedDataModule(dataset="digits", num_clients=4, partition="iid", batch_size=32)
    dm.setup("fit")
    config = FitConfig(
        local_epochs=2, accelerator="cpu", dp_sgd=DPSGD(noise_multiplier=1.1).settings()
    )
    fitter = ClientFitter(config)
    model = ClientModule(network="mlp", network_kwargs={"hidden": [8]})
    weights = {k: v.clone() for k, v in model.network.state_dict().items()}
    state: dict = {}
    n = dm.client_num_samples(2)
    steps_per_epoch = -(-n // 32)
    for r in range(2):
        result = fitter.fit(model, dm, ClientJob(r, 2, Payload(weights), state))
        state = result.state
        assert result.upload.num_steps == 2 * steps_per_epoch
    plan = [(1.1, 1 / steps_per_epoch, 4 * steps_per_epoch)]
    assert state[STATE_KEY] == {"mechanism": "pld", "history": [list(plan[0])]}
    # the default accountant's epsilon: dp-accounting's PLD called directly on the same steps
    assert result.upload.metrics[EPSILON_METRIC] == pld_epsilon(plan, 1e-5)
    assert result.upload.metrics["train_loss"] > 0


def _config(**changes) -> FitConfig:
    return FitConfig(**{"dp_sgd": DPSGD().settings(), **changes})


@pytest.mark.parametrize(
    ("model", "config", "reason", "message"),
    [
        (lambda: ClientModule(network="resnet14", network_kwargs={"width": 4, "stem": "small"}),
         _config(), None, r"layer 'network\..*bn.*' \(BatchNorm2d\) normalises each sample by its batch.*GroupNorm"),
        (lambda: ClientModule(network="mlp"), _config(precision="bf16-mixed"), None,
         r"loop.precision='bf16-mixed' is not allowed with loop.dp_sgd: expected '32-true'"),
        (lambda: ClientModule(network="mlp"), _config(gradient_clip_val=1.0), None,
         r"loop.gradient_clip_val=1.0 is not allowed with loop.dp_sgd"),
        (lambda: ClientModule(network="mlp"), _config(), "it uses manual optimization",
         r"this run needs one \(it uses manual optimization\)"),
        (lambda: ClientModule(network="mlp"), _config(fit_with="trainer"), None,
         r"loop.fit_with='trainer'"),
    ],
    ids=["batchnorm", "precision", "clipping", "manual", "trainer"],
)  # fmt: skip
def test_what_per_sample_gradients_cannot_train_is_refused(model, config, reason, message):
    with pytest.raises(ConfigurationError, match=message):
        check_dp_sgd(model(), config, reason)


def test_schedulers_step_as_in_the_plain_fit():
    """An epoch-interval scheduler steps once per epoch of Poisson steps."""
    model = ClientModule(network="mlp", network_kwargs={"hidden": [5]})
    optimizer = model.configure_optimizers()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    from fedlightning.optim_config import SchedulerConfig, step_schedulers

    x, y = batch(20)
    config = FitConfig(local_epochs=3, dp_sgd=DPSGD().settings())
    fit = DPSGDFit(config, TensorBatches(x, y, batch_size=5), seed=0, device=torch.device("cpu"))
    steps = fit.run(model, optimizer, partial(step_schedulers, [SchedulerConfig(scheduler)]))
    assert steps == 12 and optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**3)


def test_label_flipping_reaches_the_dp_sgd_fit():
    """A LabelFlip client's DP-SGD fit samples its Poisson batches from the flipped labels."""
    from fedlightning.attacks.labels import training_batches
    from fedlightning.data import FederatedDataModule

    dm = FederatedDataModule(dataset="digits", num_clients=4, partition="iid", batch_size=32)
    dm.setup("fit")
    config = FitConfig(dp_sgd=DPSGD().settings(), label_flip_clients=(1,))
    honest = DPSGDFit(config, training_batches(dm, 0, 0, config), 0, torch.device("cpu"))
    flipped = DPSGDFit(config, training_batches(dm, 1, 0, config), 0, torch.device("cpu"))
    plain = dm.client_train_dataloader(1, 0)
    assert torch.equal(honest.y, dm.client_train_dataloader(0, 0).y)
    assert torch.equal(flipped.x, plain.x)
    assert torch.equal(flipped.y, 9 - plain.y)
