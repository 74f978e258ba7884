"""The measurement ``loop.backend: auto`` chooses by (docs/algorithms.md section 9.3).

:func:`measure` times a few training steps of the run's network on the run's device, precision
and batch shape, both ways:

- *sequential*: one client's step as the lean fit runs it (``zero_grad``, the forward pass under
  the precision's autocast, cross-entropy, ``backward``, the objective's optimizer), times the
  clients of a cohort;
- *cohort*: one step of all of them at once, with the cohort backend's own machinery
  (:class:`~fedlightning.backends.cohort_step.CohortStep` driven by
  :class:`~fedlightning.backends.cohort_capture.FullSteps`, so a CUDA graph is captured and
  replayed as in a run), on stacked copies of the network.

Both run on copies (the run's model, optimizer and RNG state are untouched: the probe saves and
restores the global RNG). The first steps are warm-up (lazy initialisation, the graph's capture);
the fastest of the timed ones counts (the least disturbed by other work on the machine). Only the network's forward and backward and the optimizer are
timed, which is what a client step costs on both paths; an objective's extra terms (FedProx's
proximal term, SCAFFOLD's correction) cost the same elementwise work on both. A cohort that runs
out of device memory is measured on half the clients and scaled up (it would run in chunks:
:mod:`fedlightning.backends.cohort_memory`).
"""

from __future__ import annotations

import copy
import inspect
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedlightning.backends.cohort_capture import WARMUP, FullSteps
from fedlightning.backends.cohort_optim import StackedOptimizer
from fedlightning.backends.cohort_plan import RoundPlan
from fedlightning.backends.cohort_step import CohortStep, Stacks
from fedlightning.optim_config import split_optimizers

#: timed steps after the warm-up ones (on a CUDA device the cohort's warm-up includes the capture)
TIMED_STEPS = 3


@dataclass(frozen=True)
class Timing:
    """Seconds per local step of ``clients`` clients: one after another, and as one cohort."""

    clients: int
    sequential: float
    cohort: float


class NetworkLoss(nn.Module):
    """A client step's loss for the probe: cross-entropy of the network, nothing tracked."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, batch: tuple[Tensor, Tensor], context: dict) -> tuple[Tensor, dict]:
        x, y = batch
        return nn.functional.cross_entropy(self.network(x).float(), y), {}


def _optimizer(model: nn.Module, network: nn.Module) -> torch.optim.Optimizer:
    """The objective's optimizer class and first group's settings over ``network``'s params."""
    optimizer = split_optimizers(model.configure_optimizers())[0]
    accepted = inspect.signature(type(optimizer)).parameters
    group = optimizer.param_groups[0]
    settings = {k: v for k, v in group.items() if k in accepted and k != "params"}
    return type(optimizer)(network.parameters(), **settings)


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _fastest_step(run, steps: int, device: torch.device) -> float:
    """The fewest seconds of the last :data:`TIMED_STEPS` of ``steps`` calls ``run(k)``."""
    times = []
    for k in range(steps):
        start = _clock(device)
        run(k)
        times.append(_clock(device) - start)
    return min(times[-TIMED_STEPS:])


def _sequential(model, batch, autocast, device) -> float:
    network = copy.deepcopy(model.network).to(device).train()
    optimizer = _optimizer(model, network)
    x, y = batch

    def step(_: int) -> None:
        optimizer.zero_grad()
        with autocast():
            loss = nn.functional.cross_entropy(network(x).float(), y)
        loss.backward()
        optimizer.step()

    return _fastest_step(step, TIMED_STEPS + 1, device)


class _OneBatch:
    """A loader of one batch a pass (the probe's batch for every client and step)."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def batch_rows(self) -> list[Tensor]:
        return [torch.arange(len(self.y))]


def _cohort(model, batch, clients, autocast_dtype, device, capture: bool) -> float:
    wrapper = NetworkLoss(copy.deepcopy(model.network).to(device).train())
    optimizer = _optimizer(model, wrapper.network)

    def stacked(tensors):
        return {f"network.{n}": t.detach().expand(clients, *t.shape).clone() for n, t in tensors}

    params, buffers = (
        stacked(wrapper.network.named_parameters()),
        stacked(wrapper.network.named_buffers()),
    )
    names = {id(p): f"network.{n}" for n, p in wrapper.network.named_parameters()}
    optim = StackedOptimizer.stack([optimizer] * clients, [names] * clients, params)
    step = CohortStep(wrapper, Stacks(params, {}, buffers, {}, {}), optim, None, (None, "norm"),
                      autocast_dtype, device)  # fmt: skip
    steps = TIMED_STEPS + (WARMUP + 1 if device.type == "cuda" else 1)
    plan = RoundPlan.build([_OneBatch(*batch)] * clients, steps, None, device)
    full = FullSteps(step, plan, capture, set())
    with step.context():
        return _fastest_step(lambda k: full(len(batch[1]), k), steps, device)


def measure(
    model: nn.Module, batch: tuple[Tensor, Tensor], clients: int, compute, capture: bool = True
) -> Timing:
    """Seconds per step of ``clients`` clients of ``model``'s network on ``batch`` (already on
    ``compute.device``), sequential and as one cohort (module docstring)."""
    device = compute.device
    dtype = compute.autocast_dtype
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else nullcontext
    rng = (
        torch.random.get_rng_state(),
        (torch.cuda.get_rng_state(device) if device.type == "cuda" else None),
    )
    try:
        sequential = _sequential(model, batch, autocast, device)
        size = clients
        while True:
            try:
                cohort = _cohort(model, batch, size, dtype, device, capture) * clients / size
                break
            except torch.cuda.OutOfMemoryError:
                if size == 1:
                    raise
                size //= 2
                torch.cuda.empty_cache()
    finally:
        torch.random.set_rng_state(rng[0])
        if rng[1] is not None:
            torch.cuda.set_rng_state(rng[1], device)
    return Timing(clients, sequential * clients, cohort)
