"""How far local SGD moves for one unit of gradient: the effective number of steps ``a_i``.

FedNova's normalising factor (docs/algorithms.md section 1.5) and SCAFFOLD's option II divisor
(section 1.4) are the same quantity: the total weight ``torch.optim.SGD`` gives a constant
gradient over the ``tau`` steps of a fit, so that ``x - y = a lr g`` when every step sees ``g``.
:func:`fednova_a` is that factor (heavy-ball or Nesterov momentum); :func:`sgd_rule` reads the
SGD settings it needs from the optimizer an objective actually trains with, and refuses, naming
them, the settings under which ``a lr`` is not the movement of a constant gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedlightning.errors import ConfigurationError
from fedlightning.optim_config import split_optimizers

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule


def fednova_a(tau: int, rho: float = 0.0, nesterov: bool = False) -> float:
    """The effective number of steps of ``tau`` SGD steps with momentum ``rho`` (torch's rule,
    dampening 0): the total weight the steps give a constant gradient,

    - heavy-ball: ``a = sum_{t=1..tau} (1 - rho^t) / (1 - rho) = (tau - rho (1 - rho^tau) /
      (1 - rho)) / (1 - rho)`` (FedNova's a_i, docs/algorithms.md 1.5);
    - Nesterov (``nesterov=True``): step t moves by ``g + rho b_t``, so
      ``a = sum_{t=1..tau} (1 - rho^(t+1)) / (1 - rho) = (tau - rho^2 (1 - rho^tau) / (1 - rho))
      / (1 - rho)`` (derivation: docs/algorithms.md 1.4);

    ``a = tau`` when ``rho = 0``.

    >>> fednova_a(10)  # plain SGD: a = tau
    10.0
    >>> fednova_a(2, 0.5)  # (1 - 0.5) / 0.5 + (1 - 0.25) / 0.5
    2.5
    >>> round(fednova_a(10, 0.9), 4)  # momentum weighs the early gradients more than once
    41.3811
    >>> fednova_a(1, 0.9)  # one step: momentum has nothing to carry yet
    1.0
    >>> round(fednova_a(1, 0.9, nesterov=True), 10)  # Nesterov's first step: g + rho g
    1.9
    """
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must lie in [0, 1), got {rho}")
    if rho == 0:
        return float(tau)
    # rho^1 (heavy-ball) or rho^2 (Nesterov) times the geometric tail the momentum never moves
    lead = rho * rho if nesterov else rho
    return (tau - lead * (1.0 - rho**tau) / (1.0 - rho)) / (1.0 - rho)


@dataclass(frozen=True)
class SGDRule:
    """The settings of a plain ``torch.optim.SGD`` fit that decide how far it moves:
    ``x - y = a lr g`` for a constant gradient ``g``, ``a = fednova_a(steps, momentum,
    nesterov)``."""

    lr: float
    momentum: float
    nesterov: bool


def sgd_rule(objective: ClientModule, why: str) -> SGDRule:
    """The SGD settings of the optimizer ``objective.configure_optimizers()`` builds (what every
    backend fits with), or a ConfigurationError naming what ``a lr`` cannot describe: another
    optimizer, an LR scheduler (the step size would change during the fit), parameter groups
    with different ``lr``/``momentum``/``nesterov``, ``dampening`` or ``maximize``, or a
    trainable parameter the optimizer does not step. ``why`` says what needs the rule (for the
    message). Weight decay is allowed: it is part of the gradient SGD feeds its momentum."""
    name = type(objective).__name__
    optimizer, schedulers = split_optimizers(
        objective.configure_optimizers(), f"{name}.configure_optimizers"
    )

    def refuse(what: str, fix: str) -> None:
        raise ConfigurationError(
            f"{name}.configure_optimizers() gives {what}, but {why} (docs/algorithms.md 1.4): {fix}"
        )

    if type(optimizer) is not torch.optim.SGD:
        refuse(f"the optimizer {type(optimizer).__name__}", "use torch.optim.SGD")
    if schedulers:
        names = ", ".join(type(s.scheduler).__name__ for s in schedulers)
        refuse(
            f"the LR scheduler {names}",
            "the step size must stay fixed during a client fit; drop the scheduler",
        )
    settings = set()
    for group in optimizer.param_groups:
        if group["dampening"] != 0:
            refuse(f"SGD with dampening={group['dampening']}", "use dampening=0 (torch's default)")
        if group["maximize"]:
            refuse("SGD with maximize=True", "minimise the loss (maximize=False)")
        settings.add((float(group["lr"]), float(group["momentum"]), bool(group["nesterov"])))
    if len(settings) != 1:
        refuse(
            f"parameter groups with different (lr, momentum, nesterov) {sorted(settings)}",
            "use one lr, momentum and nesterov for every parameter",
        )
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [
        n for n, p in objective.named_parameters() if p.requires_grad and id(p) not in stepped
    ]
    if missing:
        refuse(
            f"an optimizer without the trainable parameters {missing[:3]}",
            "optimise every trainable parameter or set requires_grad=False on the others",
        )
    lr, momentum, nesterov = settings.pop()
    return SGDRule(lr, momentum, nesterov)
