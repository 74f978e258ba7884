"""Ditto: Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, arXiv:2012.04221 (Algorithm 1)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.clients.fedprox import proximal_term
from fedlightning.clients.groups import refuse_groups
from fedlightning.errors import require
from fedlightning.protocol import Payload, StateDict


class Ditto(ClientModule):
    """Ditto (docs/algorithms.md section 10.9): each client trains the global model ``w`` as a
    FedAvg client does and, beside it, its personal model ``v`` on the regularised objective
    ``h(v; w^t) = F_k(v) + (lambda / 2) ||v - w^t||^2`` towards the global model ``w^t`` it
    received this round. Per local step on the batch ``(x, y)``::

        w <- w - eta grad F_k(w)
        v <- v - eta (grad F_k(v) + lambda (v - w^t))

    (one optimizer over both models: the loss ``CE(f_w(x), y) + CE(f_v(x), y) + (lambda/2)
    ||v - w^t||^2`` is a sum of two terms on disjoint parameters, so each model gets exactly its own
    gradient, and SGD's or Adam's per-parameter update is each model's own step). ``w`` is
    uploaded; ``v`` stays in the client's state (``personal``) and is what the client deploys
    (personalized evaluation, section 10.1). A client's ``v`` starts, at its first
    participation, from the ``w^t`` it receives. The sum runs over trainable parameters; ``v``'s
    BatchNorm statistics are its own. ``lambda = 0`` makes ``v`` plain local training.

    Pair with any aggregator that sends one model (the paper's global side is FedAvg; Ditto wraps
    any global method). Heterogeneous client groups are refused (Ditto's ``v`` is a
    copy of the one network the paper shares).

    Args:
        lam: lambda (>= 0), the pull of the personal model towards the global one; the paper
            tunes it over {0.01, 0.1, 1, 2}.
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    personalized: ClassVar[bool] = True

    def __init__(self, lam: float = 0.1, **kwargs: Any) -> None:
        require(lam >= 0, "model.lam", lam, "a number >= 0")
        refuse_groups(kwargs.get("networks"), "Ditto", "keeps a copy of the one network it "
                      "shares as its personal model, and client groups of several "
                      "architectures have none")  # fmt: skip
        super().__init__(**kwargs)
        self.lam = lam
        #: the client's personal model v (its parameters are a part of this module's)
        self.personal = copy.deepcopy(self.network)
        self._anchor: dict[str, Tensor] = {}

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        self.personal.load_state_dict(state.get("personal", payload.weights))
        self.personal.train()
        self._anchor = {  # w^t, fixed for the round
            name: payload.weights[name].to(device=p.device, dtype=p.dtype)
            for name, p in self.network.named_parameters()
            if p.requires_grad
        }

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        loss_global = F.cross_entropy(self(x), y)
        loss_personal = F.cross_entropy(self.personal(x), y)
        self.track("train_loss", loss_global)
        self.track("personal_train_loss", loss_personal)
        if self.lam == 0:
            return loss_global + loss_personal
        trainable = ((n, p) for n, p in self.personal.named_parameters() if p.requires_grad)
        return loss_global + loss_personal + 0.5 * self.lam * proximal_term(trainable, self._anchor)

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        personal = {
            k: v.detach().to("cpu", copy=True) for k, v in self.personal.state_dict().items()
        }
        return weights, extras, {**state, "personal": personal}

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict:
        """The client's ``v``; before its first fit, the global model (where its ``v`` starts)."""
        return state.get("personal", deployed)
