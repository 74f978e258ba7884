"""FedAdam: Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295
(Algorithm 2, the Adam server optimizer, without bias correction as the paper writes it).
docs/algorithms.md section 2.5."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedlightning.errors import require
from fedlightning.protocol import StateDict
from fedlightning.server.adaptive import AdaptiveStep
from fedlightning.server.fedavg import FedAvg


class FedAdam(AdaptiveStep, FedAvg):
    """FedAvg with an Adam server step (docs/algorithms.md section 2.5): with ``mean`` the round's
    combination (the owner-aware mean by default, or the injected statistic; see
    :class:`FedAvg`), ``Delta = mean - w``,
    ``m <- beta1 m + (1 - beta1) Delta``, ``v <- beta2 v + (1 - beta2) Delta^2`` and
    ``w <- w + server_lr m / (sqrt(v) + tau)``. ``m`` starts at 0 and ``v`` at ``tau^2`` (the
    paper's ``v_{-1} >= tau^2``).

    Written on the :meth:`server_update` hook: the step applies to the trainable parameters some
    client owned this round; BatchNorm running statistics and integer buffers take the mean,
    unowned keys (and their m, v) stay unchanged. State: ``m`` and ``v``.

    Args:
        server_lr: eta, the server learning rate (> 0).
        beta1: the first-moment decay, in [0, 1).
        beta2: the second-moment decay, in [0, 1).
        tau: the adaptivity (> 0).
        weighting, aggregation, trim_beta, clip_norm, within_groups, statistic: as
            :class:`FedAvg` (the step runs on what the statistic combines: a robust or private
            statistic composes with this optimizer).
    """

    def __init__(
        self,
        server_lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        **fedavg_options: Any,
    ) -> None:
        super().__init__(**fedavg_options)  # weighting, statistic...: FedAvg's (the CLI shows them)
        option = "loop.aggregator.init_args."
        require(server_lr > 0, option + "server_lr", server_lr, "a number > 0")
        require(0 <= beta1 < 1, option + "beta1", beta1, "a number in [0, 1)")
        require(0 <= beta2 < 1, option + "beta2", beta2, "a number in [0, 1)")
        require(tau > 0, option + "tau", tau, "a number > 0")
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau
        self.m: StateDict = {}
        self.v: StateDict = {}
        self.add_state("m", "parameters")
        self.add_state("v", "parameters", fill=tau**2)

    def second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        """Adam's ``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``."""
        return self.beta2 * v + (1 - self.beta2) * delta_sq
