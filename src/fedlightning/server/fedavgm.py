"""FedAvgM: Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", arXiv:1909.06335, 2019 (server momentum); as the SGD-with-momentum server
optimizer of Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295
(Algorithm 1). docs/algorithms.md section 2.5."""

from __future__ import annotations

from typing import Any

from fedlightning.errors import require
from fedlightning.protocol import StateDict
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.round import ServerRound
from fedlightning.server.summation import wide


class FedAvgM(FedAvg):
    """FedAvg with server momentum (docs/algorithms.md section 2.5): with ``mean`` the round's
    combination (the owner-aware mean by default, or the injected statistic; see
    :class:`FedAvg`), the pseudo-gradient ``d = w - mean``,
    ``v <- beta v + d`` and ``w <- w - server_lr v`` (``v`` starts at zero). On a constant
    pseudo-gradient the step tends to ``server_lr / (1 - beta)`` times ``d``: 10x at the default
    ``beta = 0.9`` with ``server_lr = 1``.

    Written on the :meth:`server_update` hook: the step applies to the trainable parameters some
    client owned this round; BatchNorm running statistics and integer buffers take the mean,
    unowned keys (and their ``v``) stay unchanged. Evaluated as
    ``mean + (1 - server_lr) d - server_lr beta v_old`` (the same number), so
    ``server_lr=1, server_momentum=0`` is FedAvg bit for bit. State: ``momentum`` (``v``).

    Args:
        server_lr: the server learning rate (> 0).
        server_momentum: beta, in [0, 1).
        weighting, aggregation, trim_beta, clip_norm, within_groups, statistic: as
            :class:`FedAvg` (the step runs on what the statistic combines: a robust or private
            statistic composes with this optimizer).
    """

    def __init__(
        self,
        server_lr: float = 1.0,
        server_momentum: float = 0.9,
        **fedavg_options: Any,
    ) -> None:
        super().__init__(**fedavg_options)  # weighting, statistic...: FedAvg's (the CLI shows them)
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
        self.add_state("momentum", "parameters")

    def server_update(self, server_round: ServerRound) -> StateDict:
        out, momentum = {}, {}
        lr, beta = self.server_lr, self.server_momentum
        for key in server_round.parameter_keys:
            mean, v = wide(server_round.mean[key]), wide(self.momentum[key])
            d = wide(self.weights[key]) - mean
            out[key] = (mean + (1 - lr) * d - lr * beta * v).to(server_round.mean[key].dtype)
            momentum[key] = (beta * v + d).to(self.momentum[key].dtype)
        self.momentum = {**self.momentum, **momentum}
        return out
