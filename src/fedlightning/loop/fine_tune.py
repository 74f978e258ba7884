"""Fine-tuning a client's deployed model before personalized evaluation scores it
(``loop.personal.fine_tune_steps`` / ``fine_tune_epochs``; docs/algorithms.md section 10).

It trains the scoring path's own network (loaded with the client's deployed weights, reloaded at
its next use), never the objective's modules, so no fit's state is touched: per step ``zero_grad``,
``loss = CE(f(x), y)`` on the client's next training batch (under the run's autocast), backward,
the objective's optimizer step (its kind, momentum and weight decay; the learning rate of the
option or the objective's). The batches are the client's training batches shuffled from
``derive_seed(seed, "fine-tune", round, client)``, and any randomness of the network (dropout)
is drawn from a generator forked off and seeded with the same number, so fine-tuning neither
depends on nor moves the run's random stream, and repeats bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from itertools import islice

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def fine_tune_batches(
    batches: Iterable[tuple[Tensor, Tensor]], steps: int, epochs: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """``steps`` batches (new passes over ``batches`` as needed), or ``epochs`` passes."""
    if epochs:
        for _ in range(epochs):
            yield from batches
        return
    done = 0
    while done < steps:
        before = done
        for batch in islice(iter(batches), steps - done):
            done += 1
            yield batch
        if done == before:  # no batch at all
            return


def fine_tune(
    network: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    make_optimizer: Callable[[Iterable[Tensor]], torch.optim.Optimizer],
    autocast: Callable[[], AbstractContextManager],
    seed: int,
    lr: float | None = None,
) -> int:
    """Train ``network`` in place on ``batches`` (module docstring); returns the steps taken. The
    network ends in eval mode with gradients off, as the scoring path keeps it."""
    parameters = list(network.parameters())
    device = parameters[0].device
    dtype = parameters[0].dtype
    forked = [device] if device.type == "cuda" else []
    steps = 0
    with torch.random.fork_rng(devices=forked), torch.enable_grad():
        torch.manual_seed(seed)
        network.requires_grad_(True).train()
        optimizer = make_optimizer(parameters)
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        try:
            for x, y in batches:
                optimizer.zero_grad()
                with autocast():
                    logits = network(x.to(device, dtype))
                F.cross_entropy(logits.float(), y.to(device)).backward()
                optimizer.step()
                steps += 1
        finally:
            network.zero_grad(set_to_none=True)
            network.requires_grad_(False).eval()
    return steps
