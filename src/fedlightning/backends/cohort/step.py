"""One local step of every client of a cohort, on the stacked tensors (docs/algorithms.md section
9.2).

``vmap(grad_and_value(loss))`` of the objective's own ``local_loss`` (called through
:class:`~fedlightning.backends.cohort.state.ContextLoss` on each client's slice) gives every
client's gradient, updated buffers (BatchNorm) and tracked values; then the ``16-mixed`` unscale,
the clipping, the optimizer (:class:`~fedlightning.backends.cohort.optim.StackedOptimizer`) and
the sums of the tracked values, all on the stacked tensors.

- :meth:`CohortStep.full`, the common case (every client has a batch, all of one size): the
  stacked tensors are the vmapped inputs themselves and are updated in place, with no gather, no
  scatter, no host synchronisation and no Python loop over parameters beyond the optimizer's
  multi-tensor calls; its inputs and outputs live at fixed addresses, so it can be captured and
  replayed (:mod:`fedlightning.backends.cohort.capture`), and it compiles with
  ``torch.compile(fullgraph=True)`` (tests/test_cohort_step.py);
- :meth:`CohortStep.partial`, any other step: the active clients grouped by batch size, each group
  gathered, vmapped and scattered back; the others keep their parameters and optimizer state.

:meth:`CohortStep.context` is entered around the steps: the precision's autocast (without its
weight-cast cache, which a captured graph cannot keep) and scaled-dot-product attention on its
``math`` kernel, which vmap batches (the fused kernels have no batching rule for their backward
and vmap would loop over the clients one by one: timm's ViTs).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from fedlightning.backends.cohort.metrics import StackedMetrics
from fedlightning.backends.cohort.optim import StackedOptimizer, StackedScaler, clip_gradients
from fedlightning.backends.cohort.state import ContextLoss

Batch = tuple[Tensor, Tensor]


@dataclass
class Stacks:
    """A cohort's stacked tensors, keyed for ``functional_call`` on its :class:`ContextLoss`:
    ``trainable`` (the optimizer's parameters), ``fixed`` (the other parameters), ``buffers``,
    the context modules' tensors (``modules``) and the other context tensors (``tensors``)."""

    trainable: dict[str, Tensor]
    fixed: dict[str, Tensor]
    buffers: dict[str, Tensor]
    modules: dict[str, Tensor]
    tensors: dict[str, Tensor]

    def parts(self, index: Tensor | None = None) -> list[dict[str, Tensor]]:
        """The five parts in ``vmap``'s order, the clients ``index`` only (``None``: all)."""
        parts = [self.trainable, self.fixed, self.buffers, self.modules, self.tensors]
        if index is None:
            return parts
        return [{n: x[index] for n, x in part.items()} for part in parts]


class CohortStep:
    """One optimizer step of a cohort's clients (module docstring).

    Args:
        wrapper: the objective's ``local_loss`` over a client's context.
        stacks: the cohort's stacked tensors, updated in place.
        optimizer: the stacked optimizer of the ``trainable`` tensors.
        scaler: the ``16-mixed`` per-client gradient scaler (``None``: no scaling).
        clip: ``(value, algorithm)`` of the run's gradient clipping (value ``None``: none).
        autocast: the dtype forward passes autocast to (``None``: none) on ``device``.
    """

    def __init__(
        self, wrapper: ContextLoss, stacks: Stacks, optimizer: StackedOptimizer,
        scaler: StackedScaler | None, clip: tuple[float | None, str],
        autocast: torch.dtype | None, device: torch.device,
    ) -> None:  # fmt: skip
        self.wrapper, self.stacks, self.optimizer = wrapper, stacks, optimizer
        self.scaler, self.clip = scaler, clip
        self.autocast, self.device = autocast, device
        num_clients = len(next(iter(stacks.trainable.values())))
        self.metrics = StackedMetrics(num_clients)
        loss = self._scaled_loss if scaler is not None else self._loss
        self._grad = vmap(grad_and_value(loss, has_aux=True), randomness="different")

    def _loss(self, p, f, b, m, t, batch):
        """One client's loss, ``(tracked values, updated buffers)`` as auxiliary outputs."""
        b = {k: v.clone() for k, v in b.items()}  # updated in place by BatchNorm, returned
        value, tracked = functional_call(self.wrapper, {**p, **f, **b, **m}, (batch, t))
        return value, (tracked, b)

    def _scaled_loss(self, p, f, b, m, t, batch, scale):
        value, aux = self._loss(p, f, b, m, t, batch)
        return value * scale, aux

    def context(self) -> ExitStack:
        """What the steps run inside (module docstring)."""
        stack = ExitStack()
        if self.autocast is not None:
            stack.enter_context(
                torch.autocast(self.device.type, dtype=self.autocast, cache_enabled=False)
            )
        stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return stack

    def _gradients(self, parts: list[dict[str, Tensor]], batch: Batch, index: Tensor | None):
        """``(gradients, tracked values, new buffers)`` of the clients ``index`` (``None``: all),
        their gradients unscaled and clipped, with which of them are finite (``16-mixed``)."""
        scale = () if self.scaler is None else (self.scaler.scale if index is None else
                                                self.scaler.scale[index],)  # fmt: skip
        grads, (_, (tracked, buffers)) = self._grad(*parts, batch, *scale)
        finite = None
        if self.scaler is not None:
            grads, finite = self.scaler.unscale(grads, index)
        value, algorithm = self.clip
        if value is not None:
            grads = clip_gradients(grads, value, algorithm)
        return grads, tracked, buffers, finite

    def full(self, batch: Batch) -> None:
        """Every client's step on its batch of ``batch`` (``[C, B, ...]``), in place."""
        stacks = self.stacks
        grads, tracked, buffers, finite = self._gradients(stacks.parts(), batch, None)
        if buffers:
            torch._foreach_copy_(list(stacks.buffers.values()), list(buffers.values()))
        self.metrics.add(tracked)
        self.optimizer.step(stacks.trainable, grads, finite)
        if self.scaler is not None:
            self.scaler.update(finite, None)

    def partial(self, groups: list[tuple[Tensor, Batch]], active: Tensor) -> None:
        """The step of the clients in ``groups`` (``(index, batches)`` per batch size); the
        others (``active`` false) keep their parameters and optimizer state."""
        stacks = self.stacks
        grads = {n: torch.zeros_like(p) for n, p in stacks.trainable.items()}
        finite = torch.ones_like(active)
        for index, batch in groups:
            g, tracked, buffers, ok = self._gradients(stacks.parts(index), batch, index)
            if ok is not None:
                finite[index] = ok
            for name in grads:
                grads[name][index] = g[name]
            for name, value in buffers.items():
                stacks.buffers[name][index] = value
            self.metrics.add(tracked, index)
        self.optimizer.step(stacks.trainable, grads, active & finite)
        if self.scaler is not None:
            self.scaler.update(finite, active)
