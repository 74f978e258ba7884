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
from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import Payload, StateDict


class HeadThenBody(LambdaLR):
    """The learning rates of FedRep's two phases, per epoch ``e`` of a fit: parameter group 0
    (the head) at its rate for ``e < head_epochs`` and 0 after; group 1 (the body) the reverse.
    A group at rate 0 does not move (SGD and Adam steps scale by the rate). When the body's phase
    begins its optimizer state (momentum, Adam moments, gathered while its rate was 0) is
    dropped, so it steps as a layer that was frozen until then."""

    def __init__(self, optimizer: torch.optim.Optimizer, head_epochs: int) -> None:
        self.head_epochs = head_epochs
        super().__init__(optimizer, [self._head, self._body])

    def _head(self, epoch: int) -> float:
        return 1.0 if epoch < self.head_epochs else 0.0

    def _body(self, epoch: int) -> float:
        return 0.0 if epoch < self.head_epochs else 1.0

    def step(self, epoch: int | None = None) -> None:  # type: ignore[override]
        super().step()
        if self.last_epoch == self.head_epochs:
            for param in self.optimizer.param_groups[1]["params"]:
                self.optimizer.state.pop(param, None)

    @property
    def body_trained(self) -> bool:
        """Whether the fit reached the body's phase (it stepped an epoch past the head's)."""
        return self.last_epoch > self.head_epochs


class FedRep(PartialSharing):
    """Shared representation, local head, trained in turn (docs/algorithms.md section 10.6):
    each client minimises ``CE(f(x), y)``, first over its head alone for ``head_epochs`` passes
    over its data, then over the body alone for the rest of the fit (``loop.local_epochs`` passes
    in all: the paper's 10 + 1 is ``head_epochs: 10`` with ``local_epochs: 11``); it uploads the
    body (averaged by ``FedAvg``) and keeps its head. It deploys the averaged body with its own
    head (:class:`~fedlightning.clients.partial.PartialSharing`). The phases are the epochs of
    the fit's one optimizer (:class:`HeadThenBody`), so the cohort backend, which steps no
    schedulers, refuses FedRep; a fit that ends before the body's phase is refused.

    Args:
        head: the head's layers, as submodule names of the network (default: the registered
            models' classifier, ``head``).
        head_epochs: the head's passes tau_h (the paper: 10), >= 1.
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def __init__(self, head: list[str] | None = None, head_epochs: int = 10, **kwargs: Any) -> None:
        require(
            type(head_epochs) is int and head_epochs >= 1,
            "model.init_args.head_epochs", head_epochs, "an integer >= 1",
        )  # fmt: skip
        self.head_layers = list(head or ["head"])
        self.head_epochs = head_epochs
        super().__init__(**kwargs)
        self._phases: HeadThenBody | None = None

    def kept_keys(self, network: nn.Module) -> Iterable[str]:
        return module_keys(network, self.head_layers, "model.init_args.head")

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        self._phases = None  # this fit's, from configure_optimizers

    def configure_optimizers(self) -> dict[str, Any]:
        """One optimizer, the head its first parameter group and the body its second, and the
        epoch schedule of the two phases."""
        named = list(self.network.named_parameters())
        optimizer = self.make_optimizer([p for n, p in named if n in self.kept])
        optimizer.add_param_group({"params": [p for n, p in named if n not in self.kept]})
        self._phases = HeadThenBody(optimizer, self.head_epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self._phases,
                                                         "interval": "epoch"}}  # fmt: skip

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        if self._phases is not None and num_steps and not self._phases.body_trained:
            raise ConfigurationError(
                f"FedRep trains the head for head_epochs={self.head_epochs} passes, then the "
                f"body, and this fit ended after {self._phases.last_epoch} passes: set "
                f"loop.local_epochs > {self.head_epochs} (the paper: head_epochs + 1)"
            )
        self._phases = None
        return super().end_client(num_steps)
