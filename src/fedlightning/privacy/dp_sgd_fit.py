"""One client's DP-SGD fit (docs/algorithms.md section 7.2): Poisson batches by Opacus's sampler,
per-sample gradients of the objective's own ``local_loss`` by ``torch.func``, clipping and noise by
Opacus's ``DPOptimizer``, the privacy composed by the client's own accountant.

Per-sample gradients: ``vmap(grad(l))`` over the batch, where ``l(w, x_j)`` is ``local_loss`` on
the batch that holds sample j alone, called through ``functional_call``. So every term of the
objective is differentiated per sample, also those that do not flow through a layer's activations
(FedProx's proximal term, SCAFFOLD's linear correction), which Opacus's ``GradSampleModule``
hooks would miss. A term that does not depend on the data (those two) is the same in every
per-sample gradient and is clipped with it: the release stays DP whatever the terms are (each
clipped gradient is a function of one sample and of state the client was sent or released
before), and the term's pull is scaled by the sample's clipping factor like the data's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedlightning.errors import ConfigurationError
from fedlightning.privacy.accountant import PrivacyAccountant
from fedlightning.privacy.dp_sgd import DPSGD, EPSILON_METRIC, STATE_KEY, fit_plan
from fedlightning.protocol import FitConfig, FitResult
from fedlightning.seeding import derive_seed

#: ``step_schedulers(interval, count, mean_loss)``: the fit's LR schedulers stepped by Lightning's
#: rules (:func:`fedlightning.fit.split_optimizers`' configs)
StepSchedulers = Callable[[str, int, Any], None]


class _LocalLoss(nn.Module):
    """``forward(batch) = (local_loss(batch), tracked values)`` of the objective, so that
    ``functional_call`` can swap its parameters."""

    def __init__(self, objective: nn.Module) -> None:
        super().__init__()
        self.objective = objective

    def forward(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, dict[str, Tensor]]:
        objective = self.objective
        return objective.batch_metrics.step(objective.local_loss, batch)


class PerSampleGradients:
    """The gradient of ``model.local_loss`` at each sample of a batch, alone, with respect to the
    parameters ``named`` (module docstring); the batch's tracked metrics (their means over the
    samples: ``train_loss`` is the batch's mean loss) are added to the model's batch metrics.

    Args:
        model: the client objective (a ``ClientModule``).
        named: ``(name, parameter)`` of the trained parameters, names as ``model`` gives them.
    """

    def __init__(self, model: nn.Module, named: list[tuple[str, nn.Parameter]]) -> None:
        self.model = model
        self.named = named
        wrapper = _LocalLoss(model)

        def loss(trainable: dict[str, Tensor], sample: tuple[Tensor, ...]) -> Any:
            batch = tuple(t.unsqueeze(0) for t in sample)
            return functional_call(wrapper, trainable, (batch,))

        self._step = vmap(
            grad_and_value(loss, has_aux=True), in_dims=(None, 0), randomness="different"
        )

    def __call__(self, batch: tuple[Tensor, ...]) -> tuple[list[Tensor], Tensor | None]:
        """``([(batch size, *shape) per parameter], the batch's mean train_loss)``; an empty
        batch has empty gradients and no loss."""
        if len(batch[0]) == 0:
            return [p.new_zeros((0, *p.shape)) for _, p in self.named], None
        trainable = {f"objective.{n}": p.detach() for n, p in self.named}
        grads, (_, tracked) = self._step(trainable, batch)
        means = {name: values.detach().mean() for name, values in tracked.items()}
        for name, mean in means.items():
            self.model.batch_metrics.add(name, mean)
        return [grads[f"objective.{n}"] for n, _ in self.named], means["train_loss"]


class DPSGDFit:
    """One client's DP-SGD fit (module docstring; :class:`~fedlightning.privacy.DPSGD`).

    Args:
        config: the run's fit config (``dp_sgd`` set; ``local_epochs`` or ``local_steps``).
        batches: the client's training batches (``x``, ``y``, ``batch_size``, ``len``: one epoch).
        seed: the fit's seed (from ``(seed, round, client)``): the Poisson batches and the noise
            derive from it.
        device: where the fit runs.
    """

    def __init__(self, config: FitConfig, batches: Any, seed: int, device: torch.device) -> None:
        self.options = DPSGD(**config.dp_sgd)  # type: ignore[arg-type]
        if not all(hasattr(batches, a) for a in ("x", "y", "__len__")):
            raise ConfigurationError(
                f"loop.dp_sgd samples each client's batches itself and needs its data as tensors "
                f"(x, y), got {type(batches).__name__}"
            )
        self.x, self.y = batches.x, batches.y
        self.steps_per_epoch = max(len(batches), 1)
        self.sample_rate, self.total_steps = fit_plan(self.steps_per_epoch, config)
        self.seed = seed
        self.device = device

    def run(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, step_schedulers: StepSchedulers
    ) -> int:
        """Train ``model`` with ``optimizer`` wrapped in Opacus's ``DPOptimizer``; the number of
        optimizer steps taken (empty Poisson batches step on noise alone, as in Opacus)."""
        from opacus.optimizers import DPOptimizer
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler

        options, n = self.options, len(self.y)
        batch_generator = torch.Generator().manual_seed(derive_seed(self.seed, "dp-sgd-batches"))
        noise = torch.Generator(device=self.device)
        noise.manual_seed(derive_seed(self.seed, "dp-sgd-noise"))
        sampler = UniformWithReplacementSampler(
            num_samples=n, sample_rate=self.sample_rate, generator=batch_generator,
            steps=self.total_steps,
        )  # fmt: skip
        private = DPOptimizer(
            optimizer, noise_multiplier=options.noise_multiplier,
            max_grad_norm=options.max_grad_norm, expected_batch_size=n * self.sample_rate,
            loss_reduction="mean", generator=noise,
        )  # fmt: skip
        named = trained_parameters(model, optimizer)
        gradients = PerSampleGradients(model, named)
        model.train()
        epoch, losses = 0, []  # the epoch's batch losses (read only by a monitored scheduler)
        try:
            for step, indices in enumerate(sampler, start=1):
                private.zero_grad()
                index = torch.tensor(indices, dtype=torch.long)
                batch = tuple(t[index.to(t.device)].to(self.device) for t in (self.x, self.y))
                grads, loss = gradients(batch)
                for (_, p), g in zip(named, grads, strict=True):
                    p.grad_sample = g
                private.step()
                losses += [] if loss is None else [loss]
                mean_loss = sum(losses) / len(losses) if losses else float("nan")
                in_epoch = (step - 1) % self.steps_per_epoch + 1
                step_schedulers("step", in_epoch, mean_loss)
                if in_epoch == self.steps_per_epoch:
                    epoch, losses = epoch + 1, []
                    step_schedulers("epoch", epoch, mean_loss)
        finally:
            for _, p in named:  # leave the parameters as Opacus found them
                for attribute in ("grad_sample", "summed_grad"):
                    if hasattr(p, attribute):
                        delattr(p, attribute)
        return self.total_steps

    def account(self, result: FitResult, state: dict[str, Any]) -> FitResult:
        """``result`` with the client's accountant (from its state before the fit, ``state``)
        advanced by this fit's steps in its new state, and its epsilon at ``delta`` in the
        upload's metrics (``dp_sgd_epsilon``)."""
        options = self.options
        accountant = PrivacyAccountant.from_state(state.get(STATE_KEY), options.accountant)
        accountant.step(options.noise_multiplier, self.sample_rate, self.total_steps)
        result.state = {**result.state, STATE_KEY: accountant.state_dict()}
        result.upload.metrics[EPSILON_METRIC] = accountant.epsilon(options.delta)
        return result


def trained_parameters(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every parameter ``optimizer`` steps, named as in ``model``."""
    names = {id(p): n for n, p in model.named_parameters()}
    named = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ConfigurationError(
                    "loop.dp_sgd needs the optimizer to step the model's own parameters: "
                    "configure_optimizers returned one that is not a parameter of the objective"
                )
            named.append((names[id(p)], p))
    return named
