"""FedDyn's client: Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021, arXiv:2111.04263 (Algorithm 1, client side)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.clients.fedprox import proximal_term
from fedlightning.placement import move
from fedlightning.protocol import Payload, StateDict


def feddyn_gradient_update(
    grad: StateDict, trained: StateDict, anchor: StateDict, alpha: float
) -> StateDict:
    """``g_k <- g_k - alpha (theta_k - theta)`` per key of ``grad`` (the first-order condition of
    the local problem at its minimiser), in float64, cast to ``grad``'s dtypes."""
    return {
        n: (g.double() - alpha * (trained[n].double() - anchor[n].double())).to(g.dtype)
        for n, g in grad.items()
    }


class FedDynClient(ClientModule):
    """Local training on FedDyn's dynamically regularised objective (docs/algorithms.md 1.7):
    ``loss = CE(f(x), y) - sum_p <g_{k,p}, theta_p> + (alpha / 2) sum_p ||theta_p - theta^t_p||^2``
    over the trainable parameters, with ``theta^t`` the dispatched model and ``g_k`` the client's
    gradient state (zeros before its first participation). After the fit,
    ``g_k <- g_k - alpha (theta_k - theta^t)`` (:func:`feddyn_gradient_update`) is returned in the
    client's state (``"grad"``, kept by the ClientStore, checkpointed). ``alpha`` comes from the
    server with the model (payload extra ``"alpha"``, :class:`fedlightning.server.FedDyn`'s
    option), so client and server use one value. The tracked ``train_loss`` is the cross-entropy
    alone (the linear term is unbounded below). Both terms are functions of the parameters and the
    round context set in :meth:`begin_client`, so every backend trains it with nothing declared.

    Pair with :class:`fedlightning.server.FedDyn` (``required_aggregator``, checked at start-up).

    Args:
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    required_aggregator: ClassVar[frozenset[str]] = frozenset({"FedDyn"})
    required_payload_extras: ClassVar[frozenset[str]] = frozenset({"alpha"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._alpha = 0.0
        self._anchor: dict[str, Tensor] = {}
        self._grad: dict[str, Tensor] = {}

    def trainable(self) -> list[tuple[str, Tensor]]:
        return [(n, p) for n, p in self.network.named_parameters() if p.requires_grad]

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        self._alpha = float(payload.extras["alpha"])
        saved = move(state.get("grad", {}), self.device)  # the ClientStore keeps it on the CPU
        # theta^t and g_k are fixed for the round: on the parameters' device and dtype
        self._anchor = {n: payload.weights[n].to(p) for n, p in self.trainable()}
        self._grad = {
            n: saved[n].to(p) if n in saved else torch.zeros_like(p) for n, p in self.trainable()
        }

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        data_loss = super().local_loss(batch)
        self.track("train_loss", data_loss)  # the data loss, not the unbounded linear term
        params = self.trainable()
        linear = torch.stack([(self._grad[n] * p).sum() for n, p in params]).sum()
        return data_loss - linear + 0.5 * self._alpha * proximal_term(params, self._anchor)

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        grad = feddyn_gradient_update(self._grad, weights, self._anchor, self._alpha)
        return weights, extras, {**state, "grad": grad}
