"""What ``configure_optimizers`` returned, read in any of Lightning's documented forms, and the
LR schedulers stepped as Lightning steps them: shared by the client fit (:mod:`fedlightning.fit`)
and the cohort backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedlightning.errors import ConfigurationError


@dataclass
class SchedulerConfig:
    """One LR scheduler as Lightning's ``lr_scheduler_config`` describes it."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None


def split_optimizers(
    returned: Any, name: str = "configure_optimizers"
) -> tuple[torch.optim.Optimizer, list[SchedulerConfig]]:
    """The optimizer and LR schedulers from what ``configure_optimizers`` returned, in any of
    Lightning's documented forms: an optimizer; a list/tuple of one optimizer; two lists
    ``([optimizer], [scheduler or config])``; a dict ``{"optimizer": ..., "lr_scheduler":
    scheduler or {"scheduler": ..., "interval": "epoch"|"step", "frequency": n, "monitor": ...}}``.

    Automatic optimization trains with one optimizer (Lightning's rule too): several are refused.
    """
    optimizers: list[Any]
    schedulers: list[Any] = []
    if isinstance(returned, torch.optim.Optimizer):
        optimizers = [returned]
    elif isinstance(returned, Mapping):
        optimizers = [returned.get("optimizer")]
        if returned.get("lr_scheduler") is not None:
            schedulers = [returned["lr_scheduler"]]
    elif (
        isinstance(returned, Sequence)
        and len(returned) == 2
        and all(isinstance(part, Sequence) for part in returned)
    ):
        optimizers, schedulers = list(returned[0]), list(returned[1])
    elif isinstance(returned, Sequence) and not isinstance(returned, str | bytes):
        optimizers = list(returned)
    else:
        raise ConfigurationError(
            f"{name}() returned {type(returned).__name__}: return an optimizer, a list of one, "
            "([optimizer], [scheduler]) or {'optimizer': ..., 'lr_scheduler': ...}"
        )
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        raise ConfigurationError(
            f"{name}() must give exactly one torch optimizer for automatic optimization, got "
            f"{[type(o).__name__ for o in optimizers]}: use manual optimization for several"
        )
    configs = []
    for entry in schedulers:
        config = SchedulerConfig(**entry) if isinstance(entry, Mapping) else SchedulerConfig(entry)
        if config.interval not in ("epoch", "step") or config.frequency < 1:
            raise ConfigurationError(
                f"lr_scheduler interval={config.interval!r}, frequency={config.frequency!r}: "
                "expected interval 'epoch' or 'step' and an integer frequency >= 1"
            )
        if config.monitor not in (None, "train_loss"):
            raise ConfigurationError(
                f"lr_scheduler monitor={config.monitor!r}: a client fit provides 'train_loss' only"
            )
        configs.append(config)
    return optimizers[0], configs


def step_schedulers(
    schedulers: Sequence[SchedulerConfig], interval: str, count: int, mean_loss: Any
) -> None:
    """Step the ``interval`` schedulers whose ``frequency`` divides ``count`` (the batch index
    within the epoch plus one, or the epochs done); a monitored one with ``mean_loss``."""
    for config in schedulers:
        if config.interval == interval and count % config.frequency == 0:
            if config.monitor is None:
                config.scheduler.step()
            else:
                config.scheduler.step(float(mean_loss))
