"""Per-FedAvg: Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020, arXiv:2002.07948 (section 3,
Algorithm 1 with the first-order (FO) and Hessian-free (HF) approximations of section 3.1)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.errors import ConfigurationError, require

Variant = Literal["fo", "hf"]


class PerFedAvg(ClientModule):
    """Per-FedAvg (docs/algorithms.md section 10.11): the global model is trained for the loss
    after one local gradient step, ``F_i(w) = f_i(w - alpha grad f_i(w))``. Each optimizer step
    splits its batch into two halves ``D`` and ``D'``, then::

        w_tmp = w - alpha grad f(w; D)
        u     = grad f(w_tmp; D')
        FO:  d = u
        HF:  d = u - alpha (grad f(w + delta u; D) - grad f(w - delta u; D)) / (2 delta)
        w    <- w - beta d          (the objective's optimizer at lr = beta)

    the HF line approximating ``(I - alpha hessian f(w; D)) u`` by a central difference (the
    paper draws a third batch ``D''`` for the Hessian; here it is ``D``, so a batch of two
    samples is enough and no BatchNorm layer sees a part of one: docs section 10.11). The
    server averages the uploads (FedAvg). A client personalizes, at evaluation, by one step of
    SGD at rate alpha on its own data from the global model (``personal_defaults``: the loop's
    fine-tuning, section 10.1).

    The step differentiates inside itself (``torch.autograd.grad``) and moves the parameters to
    ``w_tmp`` and ``w +- delta u``; its training step therefore runs on a Lightning Trainer, and
    the cohort backend, which vectorizes ``local_loss``, refuses it in one line. Every forward
    pass runs in train mode (BatchNorm's statistics see each part, as the algorithm's passes do).

    Args:
        alpha: the inner (personalization) step size (> 0).
        variant: ``hf`` (Hessian-free) or ``fo`` (first-order).
        delta: HF's finite-difference radius (> 0).
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments; ``lr`` is beta.
    """

    personalized: ClassVar[bool] = True
    min_batch_samples: ClassVar[tuple[int, str]] = (
        2,
        "PerFedAvg splits each training batch into two halves D and D'",
    )

    def __init__(
        self, alpha: float = 0.01, variant: Variant = "hf", delta: float = 0.001, **kwargs: Any
    ) -> None:
        require(alpha > 0, "model.alpha", alpha, "a number > 0")
        require(variant in ("fo", "hf"), "model.variant", variant, "fo or hf")
        require(delta > 0, "model.delta", delta, "a number > 0")
        super().__init__(**kwargs)
        self.alpha, self.variant, self.delta = alpha, variant, delta

    def personal_defaults(self) -> dict[str, Any]:
        """One SGD step at rate alpha on the client's data (the paper's evaluation)."""
        return {"fine_tune_steps": 1, "fine_tune_lr": self.alpha}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The base's step (on a Trainer: see the class docstring)."""
        return super().training_step(batch, batch_idx)

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """``<w, d>`` with ``d`` detached (its gradient is the direction ``d``); tracks
        ``train_loss``, the meta-objective ``f(w_tmp; D')``."""
        x, y = batch
        need, why = self.min_batch_samples  # runs are refused at start-up; this guards direct calls
        if len(y) < need:
            raise ConfigurationError(
                f"{why}, and a batch has {len(y)} sample: set data.batch_size and "
                f"data.min_batch_size to {need} or more (a client's last batch of one sample then "
                "joins the one before it)"
            )
        (x1, x2), (y1, y2) = x.tensor_split(2), y.tensor_split(2)
        params = [p for p in self.network.parameters() if p.requires_grad]
        grad = self._gradient_at(params)
        w = [p.detach().clone() for p in params]
        inner = grad(None, x1, y1)
        with _moved(params, w, [-self.alpha * g for g in inner]):
            meta_loss, u = grad(True, x2, y2)
        direction = u
        if self.variant == "hf":
            with _moved(params, w, [self.delta * v for v in u]):
                plus = grad(None, x1, y1)
            with _moved(params, w, [-self.delta * v for v in u]):
                minus = grad(None, x1, y1)
            scale = self.alpha / (2 * self.delta)
            direction = [v - scale * (a - b) for v, a, b in zip(u, plus, minus, strict=True)]
        self.track("train_loss", meta_loss)
        return sum((p * d).sum() for p, d in zip(params, direction, strict=True))

    def _gradient_at(self, params: list[Tensor]) -> Callable[..., Any]:
        """``grad(with_loss, x, y)``: ``grad f(params; x, y)`` at the parameters' current values
        (detached), with the loss first when ``with_loss``."""

        def grad(with_loss: bool | None, x: Tensor, y: Tensor) -> Any:
            with torch.enable_grad():
                loss = F.cross_entropy(self(x), y)
                grads = [g.detach() for g in torch.autograd.grad(loss, params)]
            return (loss.detach(), grads) if with_loss else grads

        return grad


@contextmanager
def _moved(params: list[Tensor], origin: list[Tensor], offset: list[Tensor]):
    """The parameters at ``origin + offset`` inside the block, at ``origin`` after it."""
    with torch.no_grad():
        for p, o, d in zip(params, origin, offset, strict=True):
            p.copy_(o + d)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, o in zip(params, origin, strict=True):
                p.copy_(o)
