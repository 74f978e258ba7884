"""FedYogi and FedAdagrad: Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan,
"Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295 (Algorithm 2, without bias
correction as the paper writes it), and the step all three adaptive server optimizers share
(:func:`adaptive_step`, FedAdam's too). docs/algorithms.md section 2.5.3."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from fedlightning.errors import require
from fedlightning.protocol import StateDict
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.round import ServerRound
from fedlightning.server.summation import wide

#: the second-moment rule ``v_t = rule(v_{t-1}, Delta_t^2)``, on wide tensors
SecondMoment = Callable[[Tensor, Tensor], Tensor]
_OPTION = "loop.aggregator.init_args."


def adaptive_step(
    weights: StateDict,
    server_round: ServerRound,
    moments: tuple[StateDict, StateDict],
    settings: tuple[float, float, float],
    second_moment: SecondMoment,
) -> tuple[StateDict, StateDict, StateDict]:
    """One step of Algorithm 2 on the parameters the round's uploads own: with
    ``Delta = mean - w``, ``m <- beta1 m + (1 - beta1) Delta``, ``v <- second_moment(v, Delta^2)``
    and ``w <- w + lr m / (sqrt(v) + tau)`` (``settings = (lr, beta1, tau)``, ``moments = (m,
    v)``), in float64 (:func:`~fedlightning.server.summation.wide`) and cast back to each entry's
    dtype. Returns the new weights and the new values of m and v for those keys (the others keep
    theirs)."""
    (m_old, v_old), (lr, beta1, tau) = moments, settings
    out, m, v = {}, {}, {}
    for key in server_round.parameter_keys:
        w = wide(weights[key])
        delta = wide(server_round.mean[key]) - w
        m_new = beta1 * wide(m_old[key]) + (1 - beta1) * delta
        v_new = second_moment(wide(v_old[key]), delta.square())
        step = lr * m_new / (v_new.sqrt() + tau)
        out[key] = (w + step).to(server_round.mean[key].dtype)
        m[key], v[key] = m_new.to(m_old[key].dtype), v_new.to(v_old[key].dtype)
    return out, m, v


def _check(server_lr: float, beta1: float, tau: float, initial_v: float | None) -> None:
    require(server_lr > 0, _OPTION + "server_lr", server_lr, "a number > 0")
    require(0 <= beta1 < 1, _OPTION + "beta1", beta1, "a number in [0, 1)")
    require(tau > 0, _OPTION + "tau", tau, "a number > 0")
    if initial_v is not None:
        require(initial_v >= 0, _OPTION + "initial_v", initial_v, "null (tau^2) or a number >= 0")


class AdaptiveStep:
    """The server update of FedAdam, FedYogi and FedAdagrad (a mixin before
    :class:`~fedlightning.server.fedavg.FedAvg`): :func:`adaptive_step` on the declared ``m`` and
    ``v`` with the options ``server_lr``, ``beta1``, ``tau`` and the class's
    :meth:`second_moment`."""

    server_lr: float
    beta1: float
    tau: float
    weights: StateDict
    m: StateDict
    v: StateDict

    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        """``v_t`` from ``v_{t-1}`` and ``Delta_t^2`` (element-wise)."""
        raise NotImplementedError

    def server_update(self, server_round: ServerRound) -> StateDict:
        settings = (self.server_lr, self.beta1, self.tau)
        out, m, v = adaptive_step(
            self.weights, server_round, (self.m, self.v), settings, self.second_moment
        )
        self.m, self.v = {**self.m, **m}, {**self.v, **v}
        return out


class _AdaptiveServer(AdaptiveStep, FedAvg):
    """What FedYogi and FedAdagrad share: the options ``server_lr``, ``beta1``, ``tau`` and
    ``initial_v`` (FedAdagrad's defaults), the declared states ``m`` (zeros) and ``v``
    (``initial_v``, by default ``tau^2``: Algorithm 2's ``v_{-1} >= tau^2``)."""

    def __init__(
        self,
        server_lr: float = 1e-2,
        beta1: float = 0.0,
        tau: float = 1e-3,
        initial_v: float | None = None,
        **fedavg_options: Any,
    ) -> None:
        super().__init__(**fedavg_options)  # weighting, statistic...: FedAvg's (the CLI shows them)
        _check(server_lr, beta1, tau, initial_v)
        self.server_lr, self.beta1, self.tau, self.initial_v = server_lr, beta1, tau, initial_v
        self.m: StateDict = {}
        self.v: StateDict = {}
        self.add_state("m", "parameters")
        self.add_state("v", "parameters", fill=tau**2 if initial_v is None else initial_v)


class FedYogi(_AdaptiveServer):
    """FedAvg with a Yogi server step (docs/algorithms.md section 2.5.3): with ``mean`` the
    round's combination (the owner-aware mean, or the injected statistic: a robust or private
    statistic composes), ``Delta = mean - w``, ``m <- beta1 m + (1 - beta1) Delta``,
    ``v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)`` and ``w <- w + server_lr m / (sqrt(v) +
    tau)``; ``sign(0) = 0`` (``torch.sign``: v unchanged where ``v = Delta^2``). ``v`` moves
    towards ``Delta^2`` by at most ``(1 - beta2) Delta^2`` a round, so it stays >= 0. ``m``
    starts at 0, ``v`` at ``initial_v`` (null: ``tau^2``, the paper's ``v_{-1} >= tau^2``).
    Written on the :meth:`server_update` hook, as FedAdam: trainable parameters some client owned
    this round take the step, buffers the mean, unowned keys (and their m, v) stay.

    Args:
        server_lr: eta (> 0).
        beta1: the first-moment decay, in [0, 1).
        beta2: Yogi's second-moment rate, in [0, 1).
        tau: the adaptivity (> 0).
        initial_v: ``v``'s start (>= 0); null: ``tau^2``.
        weighting, aggregation, trim_beta, clip_norm, within_groups, statistic: as
            :class:`FedAvg`.
    """

    def __init__(
        self,
        server_lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        initial_v: float | None = None,
        **fedavg_options: Any,
    ) -> None:
        super().__init__(
            server_lr=server_lr, beta1=beta1, tau=tau, initial_v=initial_v, **fedavg_options
        )
        require(0 <= beta2 < 1, _OPTION + "beta2", beta2, "a number in [0, 1)")
        self.beta2 = beta2

    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        return v - (1 - self.beta2) * delta_sq * (v - delta_sq).sign()


class FedAdagrad(_AdaptiveServer):
    """FedAvg with an Adagrad server step (docs/algorithms.md section 2.5.3): ``Delta = mean -
    w``, ``m <- beta1 m + (1 - beta1) Delta``, ``v <- v + Delta^2`` and ``w <- w + server_lr m /
    (sqrt(v) + tau)``. ``beta1 = 0`` (the default: the authors' experiments ran Keras' Adagrad,
    which keeps no first moment) steps on ``Delta`` itself; Algorithm 2 allows ``beta1 > 0``.
    ``v`` only grows, so the step shrinks as rounds accumulate. State, hook and composition as
    :class:`FedYogi`.

    Args:
        server_lr: eta (> 0).
        beta1: the first-moment decay, in [0, 1) (0: none).
        tau: the adaptivity (> 0).
        initial_v: ``v``'s start (>= 0); null: ``tau^2``.
        weighting, aggregation, trim_beta, clip_norm, within_groups, statistic: as
            :class:`FedAvg`.
    """

    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        return v + delta_sq
