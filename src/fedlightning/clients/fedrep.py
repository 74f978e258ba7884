"""FedRep: L. Collins, H. Hassani, A. Mokhtari, S. Shakkottai, "Exploiting Shared
Representations for Personalized Federated Learning", ICML 2021, arXiv:2102.07078 (section 3,
Algorithm 1)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from fedlightning.clients.partial import PartialSharing, module_keys
from fedlightning.errors import require


class HeadThenBody(LambdaLR):
    """The learning rates of FedRep's two phases, per optimizer step ``s`` of a fit: parameter
    group 0 (the head) at its rate for ``s < head_steps`` and 0 after; group 1 (the body) the
    reverse. A group at rate 0 does not move (SGD and Adam steps scale by the rate). When the
    body's phase begins, its optimizer state (momentum, Adam moments, gathered while its rate was
    0) is dropped, so it steps as a layer frozen until then does."""

    def __init__(self, optimizer: torch.optim.Optimizer, head_steps: int) -> None:
        self.head_steps = head_steps
        super().__init__(optimizer, [self._head, self._body])

    def _head(self, step: int) -> float:
        return 1.0 if step < self.head_steps else 0.0

    def _body(self, step: int) -> float:
        return 0.0 if step < self.head_steps else 1.0

    def step(self, epoch: int | None = None) -> None:  # type: ignore[override]
        super().step()
        if self.last_epoch == self.head_steps:  # the body's first step comes next
            for param in self.optimizer.param_groups[1]["params"]:
                self.optimizer.state.pop(param, None)


def head_steps(planned: int, head_epochs: int, body_epochs: int) -> int:
    """The head's share of a fit of ``planned`` steps: ``floor(planned * tau_h / (tau_h +
    tau))``, so a fit of ``tau_h + tau`` epochs gives the head exactly its ``tau_h`` epochs, and
    the body always at least one step.

    >>> head_steps(11 * 7, 10, 1), head_steps(2, 10, 1), head_steps(1, 10, 1)
    (70, 1, 0)
    """
    return planned * head_epochs // (head_epochs + body_epochs)


class FedRep(PartialSharing):
    """Shared representation, local head, trained in turn (docs/algorithms.md section 10.6):
    each client minimises ``CE(f(x), y)`` first over its head alone (the body fixed), then over
    the body alone (the head fixed); it uploads the body (averaged by ``FedAvg``) and keeps its
    head, and deploys the averaged body with its own head (:class:`~fedlightning.clients.partial.
    PartialSharing`). The paper's tau_h head epochs then tau body epochs are a fit of
    ``loop.local_epochs = head_epochs + body_epochs`` (11); a fit of another length is split in
    the same proportion (:func:`head_steps`). The phases are rates of the fit's one optimizer,
    stepped per optimizer step (:class:`HeadThenBody`), so the cohort backend, which steps no
    schedules, refuses FedRep.

    Args:
        head: the head's layers, as submodule names of the network (default: the registered
            models' classifier, ``head``).
        head_epochs: tau_h, the head's epochs (the paper: 10), >= 1.
        body_epochs: tau, the body's epochs (the paper: 1), >= 1.
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def __init__(
        self, head: list[str] | None = None, head_epochs: int = 10, body_epochs: int = 1,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        for name, value in (("head_epochs", head_epochs), ("body_epochs", body_epochs)):
            require(type(value) is int and value >= 1, f"model.init_args.{name}", value,
                    "an integer >= 1")  # fmt: skip
        self.head_layers = list(head or ["head"])
        self.head_epochs, self.body_epochs = head_epochs, body_epochs
        super().__init__(**kwargs)

    def kept_keys(self, network: nn.Module) -> Iterable[str]:
        return module_keys(network, self.head_layers, "model.init_args.head")

    def configure_optimizers(self) -> dict[str, Any]:
        """One optimizer, the head its first parameter group and the body its second, with the
        per-step schedule of the two phases over the fit's planned steps."""
        named = list(self.network.named_parameters())
        optimizer = self.make_optimizer([p for n, p in named if n in self.kept])
        optimizer.add_param_group({"params": [p for n, p in named if n not in self.kept]})
        steps = head_steps(self.planned_steps or 0, self.head_epochs, self.body_epochs)
        schedule = HeadThenBody(optimizer, steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule,
                                                         "interval": "step"}}  # fmt: skip
