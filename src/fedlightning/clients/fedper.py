"""FedPer: M. G. Arivazhagan, V. Aggarwal, A. K. Singh, S. Choudhary, "Federated Learning with
Personalization Layers", arXiv:1912.00818 (2019) (section 3, Algorithm 1)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from fedlightning.clients.partial import PartialSharing, module_keys


class FedPer(PartialSharing):
    """Base layers shared, personalization layers local (docs/algorithms.md section 10.4): each
    client trains the whole network on ``CE(f(x), y)``, uploads the base layers (averaged by
    ``FedAvg``) and keeps its personalization layers (``head``) in its state; it deploys the
    averaged base with its own head (:class:`~fedlightning.clients.partial.PartialSharing`).

    Args:
        head: the personalization layers, as submodule names of the network (default: the
            registered models' classifier, ``head``: the paper's K_P = 1).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def __init__(self, head: list[str] | None = None, **kwargs: Any) -> None:
        self.head_layers = list(head or ["head"])
        super().__init__(**kwargs)

    def kept_keys(self, network: nn.Module) -> Iterable[str]:
        return module_keys(network, self.head_layers, "model.init_args.head")
