"""The calls of one optimizer step of the client fit (:class:`fedlightning.fit.ClientFitter`),
made once per fit: plain torch (:func:`lean_steps`, the common case) or Fabric's per-step wrappers
(:func:`fabric_steps`, for a precision with a gradient scaler). Both are the same arithmetic, bit
for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from lightning.fabric import Fabric
from torch import Tensor

from fedlightning.compute import Compute
from fedlightning.placement import move


@dataclass(frozen=True)
class StepCalls:
    """The calls of one optimizer step of :meth:`fedlightning.fit.ClientFitter._optimize`: the two ways to run it
    are the same arithmetic (``tests/test_fit.py`` checks it bitwise)."""

    zero_grad: Callable[[], None]
    #: entered around every ``training_step`` (re-entered: a context manager object made once per
    #: fit, as a decorator re-enters it)
    forward_context: AbstractContextManager
    to_device: Callable[[Any], Any]
    backward: Callable[[Tensor], None]
    clip: Callable[[], Any] | None
    optimizer_step: Callable[[], Any]


Clip = tuple[float | None, str]


def lean_steps(optimizer: torch.optim.Optimizer, compute: Compute, clip: Clip) -> StepCalls:
    """Plain torch per step: the precision's autocast (the run's Fabric's ``autocast()``, made
    once per fit), ``loss.backward()``, torch's clipping over the optimizer's parameters in
    Fabric's order, ``optimizer.step()``; a batch already on the device (the data module keeps
    client data there) is not moved again. For precisions without a gradient scaler, Fabric's
    per-step wrappers add nothing else (its precision plugin's backward and step call these)."""
    device = compute.device
    value, algorithm = clip
    params = [p for group in optimizer.param_groups for p in group["params"]]
    clipper = None
    if value is not None and algorithm == "value":
        clipper = partial(torch.nn.utils.clip_grad_value_, params, clip_value=value)
    elif value is not None:
        clipper = partial(
            torch.nn.utils.clip_grad_norm_, params, max_norm=value, error_if_nonfinite=False
        )
    return StepCalls(
        zero_grad=optimizer.zero_grad,
        forward_context=compute.autocast(),
        to_device=lambda batch: batch if _on_device(batch, device) else move(batch, device),
        backward=Tensor.backward,
        clip=clipper,
        optimizer_step=optimizer.step,
    )


def fabric_steps(
    optimizer: torch.optim.Optimizer, fabric: Fabric, model: torch.nn.Module, clip: Clip
) -> StepCalls:
    """Fabric's wrappers per step: its optimizer (a ``16-mixed`` scaler's ``step`` and
    ``update``), ``fabric.backward`` (the scaled loss), ``fabric.clip_gradients`` (unscaled
    first), ``fabric.to_device`` and ``fabric.autocast``."""
    wrapped = fabric.setup_optimizers(optimizer)
    value, algorithm = clip
    clipper = None
    if value is not None and algorithm == "value":
        clipper = partial(fabric.clip_gradients, model, wrapped, clip_val=value)
    elif value is not None:
        clipper = partial(
            fabric.clip_gradients, model, wrapped, max_norm=value, error_if_nonfinite=False
        )
    return StepCalls(
        zero_grad=wrapped.zero_grad,
        forward_context=fabric.autocast(),
        to_device=fabric.to_device,
        backward=fabric.backward,
        clip=clipper,
        optimizer_step=wrapped.step,
    )


def _on_device(batch: Any, device: torch.device) -> bool:
    """Whether ``batch`` is a tuple or list whose tensors are all on ``device`` already."""
    return isinstance(batch, tuple | list) and all(
        t.device == device for t in batch if isinstance(t, Tensor)
    )
