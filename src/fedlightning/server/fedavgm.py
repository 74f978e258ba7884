"""FedAvgM: Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", arXiv:1909.06335, 2019 (server momentum); as the SGD-with-momentum server
optimizer of Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295
(Algorithm 1). docs/algorithms.md section 2.1."""

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


class FedAvgM(FedAvg):
    """FedAvg with server momentum: with ``averaged`` the FedAvg mean (owner-aware, see
    :class:`FedAvg`), the pseudo-gradient ``d = w - averaged``, ``v <- beta v + d`` and
    ``w <- w - server_lr v`` (``v`` starts at zero).

    The step applies to the floating parameters some client owned this round; BatchNorm running
    statistics and integer buffers take the averaged value, unowned keys (and their ``v``) stay
    unchanged. Evaluated as ``averaged + (1 - server_lr) d - server_lr beta v_old`` (the same
    number), so ``server_lr=1, server_momentum=0`` is FedAvg bit for bit.

    Args:
        server_lr: the server learning rate (> 0).
        server_momentum: beta, in [0, 1).
        weighting, aggregation, trim_beta, clip_norm, within_groups: as :class:`FedAvg`.
    """

    def __init__(
        self,
        server_lr: float = 1.0,
        server_momentum: float = 0.9,
        weighting: Literal["samples", "uniform"] = "samples",
        aggregation: Literal["mean", "median", "trimmed_mean"] = "mean",
        trim_beta: float = 0.1,
        clip_norm: float | None = None,
        within_groups: bool = False,
    ) -> None:
        super().__init__(weighting, aggregation, trim_beta, clip_norm, within_groups)
        require(server_lr > 0, "loop.aggregator.init_args.server_lr", server_lr, "a number > 0")
        require(
            0 <= server_momentum < 1,
            "loop.aggregator.init_args.server_momentum",
            server_momentum,
            "a number in [0, 1)",
        )
        self.server_lr = server_lr
        self.server_momentum = server_momentum
        self.momentum: StateDict = {}

    def setup(
        self,
        initial: StateDict,
        num_clients: int,
        seed: int = 0,
        client_keys: Sequence[ClientKeys] | None = None,
    ) -> None:
        super().setup(initial, num_clients, seed, client_keys)
        self.momentum = {k: torch.zeros_like(self.weights[k]) for k in parameter_keys(self.weights)}

    def server_step(self, round_index: int, averaged: StateDict) -> StateDict:
        out, momentum = dict(averaged), dict(self.momentum)
        lr, beta = self.server_lr, self.server_momentum
        for key in parameter_keys(averaged):
            mean, v = wide(averaged[key]), wide(self.momentum[key])
            d = wide(self.weights[key]) - mean
            out[key] = (mean + (1 - lr) * d - lr * beta * v).to(averaged[key].dtype)
            momentum[key] = (beta * v + d).to(self.momentum[key].dtype)
        self.momentum = momentum
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "momentum": self.momentum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.momentum = clone_state(state["momentum"])
