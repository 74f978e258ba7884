"""FedAdam: Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295
(Algorithm 2, the Adam server optimizer, without bias correction as the paper writes it).
docs/algorithms.md section 2.1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from fedlightning.errors import require
from fedlightning.protocol import StateDict
from fedlightning.server.base import ClientKeys
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.functional import clone_state, parameter_keys
from fedlightning.server.summation import wide


class FedAdam(FedAvg):
    """FedAvg with an Adam server step: with ``averaged`` the FedAvg mean (owner-aware, see
    :class:`FedAvg`), ``Delta = averaged - w``, ``m <- beta1 m + (1 - beta1) Delta``,
    ``v <- beta2 v + (1 - beta2) Delta^2`` and ``w <- w + server_lr m / (sqrt(v) + tau)``.
    ``m`` starts at 0 and ``v`` at ``tau^2`` (the paper's ``v_{-1} >= tau^2``).

    The step applies to the floating parameters some client owned this round; BatchNorm running
    statistics and integer buffers take the averaged value, unowned keys (and their m, v) stay
    unchanged.

    Args:
        server_lr: eta, the server learning rate (> 0).
        beta1: the first-moment decay, in [0, 1).
        beta2: the second-moment decay, in [0, 1).
        tau: the adaptivity (> 0).
        weighting, aggregation, trim_beta, clip_norm, within_groups: as :class:`FedAvg`.
    """

    def __init__(
        self,
        server_lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        weighting: Literal["samples", "uniform"] = "samples",
        aggregation: Literal["mean", "median", "trimmed_mean"] = "mean",
        trim_beta: float = 0.1,
        clip_norm: float | None = None,
        within_groups: bool = False,
    ) -> None:
        super().__init__(weighting, aggregation, trim_beta, clip_norm, within_groups)
        option = "loop.aggregator.init_args."
        require(server_lr > 0, option + "server_lr", server_lr, "a number > 0")
        require(0 <= beta1 < 1, option + "beta1", beta1, "a number in [0, 1)")
        require(0 <= beta2 < 1, option + "beta2", beta2, "a number in [0, 1)")
        require(tau > 0, option + "tau", tau, "a number > 0")
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau
        self.m: StateDict = {}
        self.v: StateDict = {}

    def setup(
        self,
        initial: StateDict,
        num_clients: int,
        seed: int = 0,
        client_keys: Sequence[ClientKeys] | None = None,
    ) -> None:
        super().setup(initial, num_clients, seed, client_keys)
        keys = parameter_keys(self.weights)
        self.m = {k: torch.zeros_like(self.weights[k]) for k in keys}
        self.v = {k: torch.full_like(self.weights[k], self.tau**2) for k in keys}

    def server_step(self, round_index: int, averaged: StateDict) -> StateDict:
        out, m, v = dict(averaged), dict(self.m), dict(self.v)
        for key in parameter_keys(averaged):
            w = wide(self.weights[key])
            delta = wide(averaged[key]) - w
            m_new = self.beta1 * wide(m[key]) + (1 - self.beta1) * delta
            v_new = self.beta2 * wide(v[key]) + (1 - self.beta2) * delta.square()
            step = self.server_lr * m_new / (v_new.sqrt() + self.tau)
            out[key] = (w + step).to(averaged[key].dtype)
            m[key], v[key] = m_new.to(m[key].dtype), v_new.to(v[key].dtype)
        self.m, self.v = m, v
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.m, self.v = clone_state(state["m"]), clone_state(state["v"])
