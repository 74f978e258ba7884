"""LG-FedAvg: P. P. Liang, T. Liu, L. Ziyin, N. B. Allen, R. P. Auerbach, D. Brent, R.
Salakhutdinov, L.-P. Morency, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", arXiv:2001.01523 (2020) (section 3, Algorithm 1)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from fedlightning.clients.partial import PartialSharing, module_keys


class LGFedAvg(PartialSharing):
    """Local representations, global head (docs/algorithms.md section 10.5): each client trains
    the whole network on ``CE(f(x), y)``, uploads the global layers (``head``, averaged by
    ``FedAvg``) and keeps every other layer, its representation, in its state; it deploys its own
    representation with the averaged head (:class:`~fedlightning.clients.partial.
    PartialSharing`). FedPer's mirror image.

    Args:
        head: the global layers, as submodule names of the network (default: the registered
            models' classifier, ``head``; the authors' code shares the last ``num_layers_keep``
            layers: 2 for their CIFAR CNN, 3 for their MNIST MLP).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def __init__(self, head: list[str] | None = None, **kwargs: Any) -> None:
        self.head_layers = list(head or ["head"])
        super().__init__(**kwargs)

    def kept_keys(self, network: nn.Module) -> Iterable[str]:
        shared = module_keys(network, self.head_layers, "model.init_args.head")
        return frozenset(network.state_dict()) - shared
