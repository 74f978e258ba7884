"""APFL: Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv:2003.13461
(2020) (section 3, Algorithm 1, the adaptive mixing weight of section 3.1)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedlightning.clients.base import ClientModule
from fedlightning.clients.groups import refuse_groups
from fedlightning.errors import require
from fedlightning.protocol import Payload, StateDict


def mixed_state(
    alpha: float, local: StateDict, shared: StateDict, parameters: frozenset[str]
) -> StateDict:
    """The personalized model: ``v_bar = alpha v + (1 - alpha) w`` for the trainable
    ``parameters``, the local model's own buffers (BatchNorm's statistics, which ``v_bar``'s
    forward passes update in training)."""
    return {k: alpha * v + (1 - alpha) * shared[k] if k in parameters else v
            for k, v in local.items()}  # fmt: skip


class APFL(ClientModule):
    """Adaptive personalized FL (docs/algorithms.md section 10.10): each client keeps a local
    model ``v`` and a mixing weight ``alpha``; its personalized model is ``v_bar = alpha v +
    (1 - alpha) w``. Per local step on the batch ``(x, y)``, with ``w`` the client's copy of the
    global model (received this round)::

        w     <- w - eta grad f(w)                       (uploaded, averaged)
        v     <- v - eta grad_v f(v_bar) = v - eta alpha grad f(v_bar)
        alpha <- clip(alpha - eta_alpha <v - w, grad f(v_bar)>, 0, 1)   (adaptive)

    One backward of ``CE(f_w(x), y) + CE(f_{v_bar}(x), y)``, with ``w`` detached inside
    ``v_bar``, gives ``w`` its own gradient, ``v`` and ``alpha`` theirs; the optimizer steps ``w``
    and ``v``, and :meth:`optimizer_step` then steps ``alpha`` by plain projected gradient
    descent (so the fits run on a Lightning Trainer, and the cohort backend refuses APFL in one
    line). ``v`` (its BatchNorm statistics are ``v_bar``'s) and ``alpha`` stay in the client's
    state; the client deploys ``v_bar`` with the global model it would download
    (personalized evaluation, section 10.1).

    Args:
        alpha: the initial mixing weight, in [0, 1] (the paper's experiments: 0.25, 0.5, 0.75).
        adaptive: update alpha by gradient descent (section 3.1); ``False`` keeps it fixed.
        alpha_lr: alpha's step size eta_alpha (null: the objective's ``lr``, as Algorithm 1).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    personalized: ClassVar[bool] = True

    def __init__(
        self, alpha: float = 0.5, adaptive: bool = True, alpha_lr: float | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        require(0 <= alpha <= 1, "model.alpha", alpha, "a number in [0, 1]")
        require(alpha_lr is None or alpha_lr > 0, "model.alpha_lr", alpha_lr, "null or > 0")
        refuse_groups(kwargs.get("networks"), "APFL", "mixes the local and the global model "
                      "parameter by parameter, defined for one architecture")  # fmt: skip
        super().__init__(**kwargs)
        self.initial_alpha, self.adaptive = alpha, adaptive
        self.alpha_lr = self.lr if alpha_lr is None else alpha_lr
        #: the client's local model v
        self.personal = copy.deepcopy(self.network)
        #: the client's mixing weight (loaded from its state each round; stepped by optimizer_step)
        self.alpha = nn.Parameter(torch.tensor(float(alpha)), requires_grad=adaptive)

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        self.personal.load_state_dict(state.get("local", payload.weights))
        self.personal.train()
        with torch.no_grad():
            self.alpha.fill_(state.get("alpha", self.initial_alpha))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer([*self.network.parameters(), *self.personal.parameters()])

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        loss_global = F.cross_entropy(self(x), y)
        shared = {n: p.detach() for n, p in self.network.named_parameters()}
        mixed = {
            n: self.alpha * p + (1 - self.alpha) * shared[n]
            for n, p in self.personal.named_parameters()
        }
        buffers = dict(self.personal.named_buffers())
        loss_personal = F.cross_entropy(functional_call(self.personal, {**mixed, **buffers}, x), y)
        self.track("train_loss", loss_global)
        self.track("personal_train_loss", loss_personal)
        return loss_global + loss_personal

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:  # fmt: skip
        """The optimizer's step of ``w`` and ``v``, then alpha's projected step from the same
        backward (its gradient ``<v - w, grad f(v_bar)>`` at the step's start)."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        grad = self.alpha.grad
        if self.adaptive and grad is not None:
            with torch.no_grad():
                self.alpha.copy_((self.alpha - self.alpha_lr * grad).clamp(0.0, 1.0))
        self.alpha.grad = None

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        local = {k: v.detach().to("cpu", copy=True) for k, v in self.personal.state_dict().items()}
        return weights, extras, {**state, "local": local, "alpha": float(self.alpha.detach())}

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict:
        """``v_bar = alpha v + (1 - alpha) w`` with ``w`` the deployable (before the client's
        first fit: the deployable itself)."""
        if "local" not in state:
            return deployed
        parameters = frozenset(n for n, p in self.network.named_parameters() if p.requires_grad)
        return mixed_state(state["alpha"], state["local"], deployed, parameters)
