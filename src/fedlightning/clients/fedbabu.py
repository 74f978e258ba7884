"""FedBABU: J. Oh, S. Kim, S.-Y. Yun, "FedBABU: Towards Enhanced Representation for Federated
Image Classification", ICLR 2022, arXiv:2106.06042 (section 4, Algorithm 1)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from fedlightning.clients.partial import PartialSharing, module_keys
from fedlightning.errors import require


class FedBABU(PartialSharing):
    """Body trained and averaged, head frozen at its random initialisation (docs/algorithms.md
    section 10.7): each client minimises ``CE(f(x), y)`` over the body only (the head is not in
    the optimizer), uploads the body (averaged by ``FedAvg``), and its head is the initial one
    every round. The personalization step is at evaluation: a client deploys the global model
    (averaged body, initial head) fine-tuned on its own data, body and head, for
    ``fine_tune_epochs`` epochs (the loop's ``loop.personal`` fine-tuning, whose default this
    sets when ``loop.personal`` is null).

    Args:
        head: the frozen layers, as submodule names of the network (default: the registered
            models' classifier, ``head``).
        fine_tune_epochs: the personalization's epochs tau_f (the paper: 5), >= 1.
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    keeps_local: ClassVar[bool] = False

    def __init__(
        self, head: list[str] | None = None, fine_tune_epochs: int = 5, **kwargs: Any
    ) -> None:
        require(
            type(fine_tune_epochs) is int and fine_tune_epochs >= 1,
            "model.init_args.fine_tune_epochs", fine_tune_epochs, "an integer >= 1",
        )  # fmt: skip
        self.head_layers = list(head or ["head"])
        self.fine_tune_epochs = fine_tune_epochs
        super().__init__(**kwargs)

    def kept_keys(self, network: nn.Module) -> Iterable[str]:
        return module_keys(network, self.head_layers, "model.init_args.head")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The configured optimizer over the body: the head is never stepped."""
        body = [p for n, p in self.network.named_parameters() if n not in self.kept]
        return self.make_optimizer(body)

    def personal_defaults(self) -> dict[str, Any]:
        """The paper's personalization: fine-tune the whole model ``fine_tune_epochs`` epochs."""
        return {"fine_tune_epochs": self.fine_tune_epochs}
