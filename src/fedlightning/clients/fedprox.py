"""FedProx: Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020,
arXiv:1812.06127 (section 3, the proximal term)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload


def proximal_term(params: Iterable[tuple[str, Tensor]], anchor: dict[str, Tensor]) -> Tensor:
    """``sum_p ||w_p - anchor_p||^2`` over the named parameters ``params``.

    Its gradient with respect to ``w_p`` is ``2 (w_p - anchor_p)``, so ``(mu / 2)`` times it pulls
    every parameter back towards the anchor with force ``mu (w_p - anchor_p)``.
    """
    terms = [(p - anchor[name]).pow(2).sum() for name, p in params]
    return torch.stack(terms).sum() if terms else torch.zeros(())


class FedProx(ClientModule):
    """Cross-entropy plus a proximal term towards the dispatched model (docs/algorithms.md 1.2):
    ``loss = CE(f(x), y) + (mu / 2) * sum_p ||w_p - w_p^dispatched||^2``.

    The sum runs over the trainable parameters (buffers such as BatchNorm statistics are not
    pulled); the anchor is the payload's weights, fixed for the whole round. ``mu = 0`` is the
    plain FedAvg client. Pair with any aggregator that sends one model (FedAvg, HeteroAvg...).

    Args:
        mu: proximal weight (>= 0); the papers use 0.001-0.1.
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def __init__(self, mu: float = 0.01, **kwargs: Any) -> None:
        if not mu >= 0:
            raise ConfigurationError(f"FedProx mu must be >= 0, got {mu}")
        super().__init__(**kwargs)
        self.mu = mu
        self._anchor: dict[str, Tensor] = {}

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        # the anchor lives beside the parameters, on their device and dtype, for the whole round
        self._anchor = {
            name: payload.weights[name].to(device=p.device, dtype=p.dtype)
            for name, p in self.network.named_parameters()
            if p.requires_grad
        }

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        loss = super().local_loss(batch)
        if self.mu == 0:
            return loss
        trainable = ((n, p) for n, p in self.network.named_parameters() if p.requires_grad)
        return loss + 0.5 * self.mu * proximal_term(trainable, self._anchor)
