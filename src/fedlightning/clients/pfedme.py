"""pFedMe: Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS
2020, arXiv:2006.08848 (section 3, Algorithm 1)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.clients.groups import refuse_groups
from fedlightning.errors import require
from fedlightning.protocol import Payload, StateDict


class PFedMe(ClientModule):
    """pFedMe (docs/algorithms.md section 10.12): each client's personalized model ``theta``
    solves the Moreau envelope's inner problem ``min_theta f_i(theta) + (lambda/2) ||theta -
    w||^2`` around its local copy ``w`` of the global model. Per local step on the batch
    ``(x, y)``::

        K times:  theta <- theta - personal_lr (grad f(theta; x, y) + lambda (theta - w))
        then:     w <- w - eta lambda (w - theta)          (the objective's optimizer, lr = eta)

    ``theta`` starts each round at the received ``w^t`` and carries over from step to step; the
    local ``w`` is uploaded, and the server's ``w <- (1 - beta) w + beta mean_i w_i`` is FedAvg
    (beta = 1) or ``FedAvgM(server_lr=beta, server_momentum=0)``. The client deploys its last
    ``theta`` (kept in its state, ``personal``).

    The K inner steps differentiate inside the step (``torch.autograd.grad``) and update
    ``theta`` in place, so the training step runs on a Lightning Trainer and the cohort backend
    refuses pFedMe in one line. The loss handed to the optimizer is ``(lambda/2) ||w -
    theta||^2`` with ``theta`` detached (its gradient is ``lambda (w - theta)``); ``train_loss``
    is ``f(theta; x, y)`` at the last inner step. Only ``theta`` sees the data: the upload's
    buffers (BatchNorm statistics) are ``theta``'s.

    Args:
        lam: lambda (> 0), the Moreau envelope's regularisation (the paper's MNIST runs: 15).
        inner_steps: K (>= 1), the inner solver's steps (the paper: 5).
        personal_lr: the inner solver's step size (> 0; the paper's MNIST runs: 0.09).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments; ``lr`` is eta (the
            paper's MNIST runs: 0.005).
    """

    personalized: ClassVar[bool] = True

    def __init__(
        self, lam: float = 15.0, inner_steps: int = 5, personal_lr: float = 0.09, **kwargs: Any
    ) -> None:
        require(lam > 0, "model.lam", lam, "a number > 0")
        require(type(inner_steps) is int and inner_steps >= 1, "model.inner_steps", inner_steps,
                "an integer >= 1")  # fmt: skip
        require(personal_lr > 0, "model.personal_lr", personal_lr, "a number > 0")
        refuse_groups(kwargs.get("networks"), "pFedMe", "keeps a copy of the one network it "
                      "shares as its personalized model, and client groups of several "
                      "architectures have none")  # fmt: skip
        super().__init__(**kwargs)
        self.lam, self.inner_steps, self.personal_lr = lam, inner_steps, personal_lr
        #: the personalized model theta (out of the optimizer: the inner solver steps it)
        self.personal = copy.deepcopy(self.network).requires_grad_(False)

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        self.personal.load_state_dict(payload.weights)
        self.personal.train()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.network.parameters())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The base's step (on a Trainer: see the class docstring)."""
        return super().training_step(batch, batch_idx)

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        named = [(n, p) for n, p in self.network.named_parameters() if p.requires_grad]
        w = [p.detach() for _, p in named]
        theta = dict(self.personal.named_parameters())
        thetas = [theta[n] for n, _ in named]
        for _ in range(self.inner_steps):
            with torch.enable_grad():
                for t in thetas:
                    t.requires_grad_(True)
                loss = F.cross_entropy(self.personal(x), y)
                grads = torch.autograd.grad(loss, thetas)
                for t in thetas:
                    t.requires_grad_(False)
            with torch.no_grad():
                for t, g, anchor in zip(thetas, grads, w, strict=True):
                    t.sub_(self.personal_lr * (g + self.lam * (t - anchor)))
        self.track("train_loss", loss.detach())
        terms = [(p - t.detach()).pow(2).sum() for (_, p), t in zip(named, thetas, strict=True)]
        return 0.5 * self.lam * torch.stack(terms).sum()

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        """Upload ``w`` with ``theta``'s buffers (BatchNorm statistics: only ``theta`` sees the
        data); ``theta`` joins the client's state."""
        weights, extras, state = super().end_client(num_steps)
        own = self.personal.state_dict()
        trainable = {n for n, p in self.network.named_parameters() if p.requires_grad}
        weights = {k: v if k in trainable else own[k].detach().clone() for k, v in weights.items()}
        personal = {k: v.detach().to("cpu", copy=True) for k, v in own.items()}
        return weights, extras, {**state, "personal": personal}

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict:
        """The client's last ``theta``; before its first fit, the global model."""
        return state.get("personal", deployed)
