"""SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, arXiv:1910.06378 (Algorithm 1, control variate option II)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from fedlightning.clients.base import ClientModule
from fedlightning.clients.sgd_steps import fednova_a, sgd_rule
from fedlightning.compute import NO_SKIP_PRECISIONS
from fedlightning.errors import ConfigurationError
from fedlightning.placement import move
from fedlightning.protocol import Payload, StateDict

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule


def scaffold_control_update(
    c_i: StateDict,
    c: StateDict,
    x: StateDict,
    y: StateDict,
    num_steps: int,
    lr: float,
    momentum: float = 0.0,
    nesterov: bool = False,
) -> tuple[StateDict, StateDict]:
    """Option II with the client's effective number of steps (docs/algorithms.md 1.4):
    ``c_i+ = c_i - c + (x - y) / (a lr)`` and ``delta_c = c_i+ - c_i``, per key of ``c_i``,
    computed in float64 and cast to ``c_i``'s dtype.

    ``x`` is the model the client started from, ``y`` the trained one after ``K = num_steps``
    optimizer steps of SGD with step size ``lr`` and momentum ``momentum`` (heavy-ball, or
    Nesterov's); ``a = fednova_a(K, momentum, nesterov)`` is the total weight those steps give a
    constant gradient (``a = K`` without momentum: the paper's ``(x - y) / (K lr)``). ``x - y``
    is then ``lr`` times a weighted sum of the corrected gradients ``g_t + c - c_i`` whose weights
    sum to ``a``, so ``c_i+`` is a weighted mean of the gradients ``g_t`` alone: the old ``c_i``
    and ``c`` cancel exactly, whatever the momentum. A client that took no step keeps ``c_i``
    (``delta_c = 0``).
    """
    a = fednova_a(num_steps, momentum, nesterov)
    c_plus: StateDict = {}
    delta: StateDict = {}
    for key, ci in c_i.items():
        ci64 = ci.double()
        if num_steps > 0:
            new = ci64 - c[key].double() + (x[key].double() - y[key].double()) / (a * lr)
        else:
            new = ci64
        c_plus[key] = new.to(ci.dtype)
        delta[key] = (new - ci64).to(ci.dtype)
    return c_plus, delta


#: what needs the SGD settings, for the refusals of :func:`sgd_rule`
_WHY = "SCAFFOLD's option II divides the client's movement by a_i lr, defined for plain SGD steps"


class ScaffoldClient(ClientModule):
    """Local SGD with drift correction (docs/algorithms.md 1.4): the local objective is
    ``CE(f(x), y) + sum_p <c_p - c_{i,p}, w_p>``, so every SGD step sees the corrected gradient
    ``g(y) + c - c_i`` (Algorithm 1, line 10); after the fit, ``c_i`` is renewed by option II with
    the client's effective number of steps, ``c_i+ = c_i - c + (x - y) / (a_i lr)``
    (:func:`scaffold_control_update`), and ``delta_c = c_i+ - c_i`` is uploaded.

    ``a_i`` is the total weight the fit's ``K_i`` optimizer steps give a constant gradient: ``K_i``
    for plain SGD (the paper's option II), FedNova's factor with SGD momentum, its Nesterov form
    with ``nesterov=True`` (:func:`~fedlightning.clients.sgd_steps.fednova_a`). Momentum carries
    the corrected gradient into the later steps, so the client moves ``a_i lr`` per unit of
    gradient, not ``K_i lr``: dividing by ``a_i`` keeps ``c_i+`` a weighted mean of the gradients
    the client saw, while dividing by ``K_i`` would keep ``1 - a_i / K_i`` times the old
    ``c_i - c`` in ``c_i+`` every round (-5.95 at momentum 0.9 with 28 steps: divergence). The
    local movement ``lr a_i`` is also what SCAFFOLD's stable step size limits: with momentum rho
    an lr about ``1 - rho`` times one stable without momentum moves as far. With weight
    decay ``wd``, ``c_i`` estimates the gradient of the L2-regularised loss ``CE + wd/2 ||w||^2``
    that SGD descends. ``lr``, momentum and Nesterov are read from the optimizer
    ``configure_optimizers`` builds (:func:`~fedlightning.clients.sgd_steps.sgd_rule`); what
    ``a_i lr`` cannot describe is refused before training: an optimizer other than
    ``torch.optim.SGD`` (Adam's step is not ``lr`` times a gradient), an LR scheduler,
    ``dampening``, parameter groups with different ``lr``/momentum.

    ``c`` comes in the payload (extra ``"c"``), ``c_i`` lives in the ClientStore (zeros before a
    client's first participation); both are shaped like the trainable parameters. The correction is
    a linear term of the loss (its gradient is exactly ``c - c_i``), so the objective is one
    function of the parameters and the batch, and every backend trains it with no SCAFFOLD-specific
    step. The tracked ``train_loss`` is the cross-entropy alone (the linear term is unbounded and
    says nothing about the fit).

    Precisions that can skip optimizer steps (``16-mixed`` with its gradient scaler) are refused:
    a skipped step would still be counted in ``K_i``.
    Pair with :class:`fedlightning.server.Scaffold` (or InCo around it): ``required_aggregator``,
    checked at start-up (docs/algorithms.md section 2.6, "Pairing").

    Args:
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    required_aggregator: ClassVar[frozenset[str]] = frozenset({"Scaffold"})
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

    def prepare_clients(self, datamodule: FederatedDataModule) -> None:
        """Refuse, before any fit, an optimizer whose steps option II's ``a_i lr`` cannot
        describe (:func:`~fedlightning.clients.sgd_steps.sgd_rule`)."""
        super().prepare_clients(datamodule)
        sgd_rule(self, _WHY)

    def local_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        data_loss = super().local_loss(batch)
        self.track("train_loss", data_loss)  # the data loss, not the unbounded linear term
        linear = [(self._correction[n] * p).sum() for n, p in self.trainable()]
        return data_loss + torch.stack(linear).sum()

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        names = [n for n, _ in self.trainable()]
        # on the trained weights' device: the payload may come from elsewhere (the wire's CPU)
        c, x = move((self.payload.extras["c"], self.payload.weights), self.device)
        c_i = move(state.get("c_i"), self.device) or {n: torch.zeros_like(c[n]) for n in names}
        rule = sgd_rule(self, _WHY)  # the settings the fit stepped with
        c_plus, delta_c = scaffold_control_update(
            c_i, c, x, weights, num_steps, rule.lr, rule.momentum, rule.nesterov
        )
        self._correction = {}
        return weights, {**extras, "delta_c": delta_c}, {**state, "c_i": c_plus}
