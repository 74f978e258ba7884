"""SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, arXiv:1910.06378 (Algorithm 1, control variate option II)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.compute import NO_SKIP_PRECISIONS
from fedlightning.errors import ConfigurationError
from fedlightning.placement import move
from fedlightning.protocol import Payload, StateDict


def scaffold_control_update(
    c_i: StateDict, c: StateDict, x: StateDict, y: StateDict, num_steps: int, lr: float
) -> tuple[StateDict, StateDict]:
    """Option II: ``c_i+ = c_i - c + (x - y) / (K lr)`` and ``delta_c = c_i+ - c_i``, per key of
    ``c_i``, computed in float64 and cast to ``c_i``'s dtype.

    ``x`` is the model the client started from, ``y`` the trained one, ``K = num_steps`` the
    optimizer steps actually taken. A client that took no step keeps ``c_i`` (``delta_c = 0``).
    """
    c_plus: StateDict = {}
    delta: StateDict = {}
    for key, ci in c_i.items():
        ci64 = ci.double()
        if num_steps > 0:
            new = ci64 - c[key].double() + (x[key].double() - y[key].double()) / (num_steps * lr)
        else:
            new = ci64
        c_plus[key] = new.to(ci.dtype)
        delta[key] = (new - ci64).to(ci.dtype)
    return c_plus, delta


class ScaffoldClient(ClientModule):
    """Local SGD with drift correction (docs/algorithms.md 1.4): the local objective is
    ``CE(f(x), y) + sum_p <c_p - c_{i,p}, w_p>``, so every SGD step is
    ``y <- y - lr (g(y) + c - c_i)`` (Algorithm 1, line 10); after the fit, ``c_i`` is renewed by
    option II (:func:`scaffold_control_update`) from the real number of optimizer steps ``K_i`` and
    ``lr``, and ``delta_c = c_i+ - c_i`` is uploaded.

    ``c`` comes in the payload (extra ``"c"``), ``c_i`` lives in the ClientStore (zeros before a
    client's first participation); both are shaped like the trainable parameters. The correction is
    a linear term of the loss (its gradient is exactly ``c - c_i``), so the objective is one
    function of the parameters and the batch, and every backend trains it with no SCAFFOLD-specific
    step. With SGD momentum rho the correction enters the momentum buffer like the gradient does
    (the paper's update, with momentum applied to the corrected gradient); ``(x - y) / (K_i lr)``
    is then the momentum-weighted mean corrected gradient, the approximation the reference
    implementations accept.

    Only SGD is allowed: an Adam step is not ``lr`` times a gradient, so ``(x - y) / (K_i lr)``
    would not estimate one. Precisions that can skip optimizer steps (``16-mixed`` with its
    gradient scaler) are refused: a skipped step would still be counted in ``K_i``.
    Pair with :class:`fedlightning.server.Scaffold`.

    Args:
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    required_payload_extras: ClassVar[frozenset[str]] = frozenset({"c"})
    upload_extras: ClassVar[frozenset[str]] = frozenset({"delta_c"})
    supported_precisions: ClassVar[frozenset[str]] = NO_SKIP_PRECISIONS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.optimizer_name != "sgd":
            raise ConfigurationError(
                f"{type(self).__name__} needs optimizer 'sgd' (option II assumes SGD steps), "
                f"got {self.optimizer_name!r}"
            )
        self._correction: dict[str, Tensor] = {}

    def trainable(self) -> list[tuple[str, Tensor]]:
        return [(n, p) for n, p in self.network.named_parameters() if p.requires_grad]

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        c = payload.extras["c"]
        c_i = move(state.get("c_i", {}), self.device)  # the ClientStore keeps it on the CPU
        # c - c_i is fixed for the round: computed once (float64, then the parameter's dtype)
        self._correction = {
            n: (c[n].to(p.device).double() - c_i[n].double() if n in c_i else c[n].double()).to(p)
            for n, p in self.trainable()
        }

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        linear = [(self._correction[n] * p).sum() for n, p in self.trainable()]
        return super().local_loss(batch) + torch.stack(linear).sum()

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        names = [n for n, _ in self.trainable()]
        # on the trained weights' device: the payload may come from elsewhere (the wire's CPU)
        c, x = move((self.payload.extras["c"], self.payload.weights), self.device)
        c_i = move(state.get("c_i"), self.device) or {n: torch.zeros_like(c[n]) for n in names}
        c_plus, delta_c = scaffold_control_update(c_i, c, x, weights, num_steps, self.lr)
        self._correction = {}
        return weights, {**extras, "delta_c": delta_c}, {**state, "c_i": c_plus}
