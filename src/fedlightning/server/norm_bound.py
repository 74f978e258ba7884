"""Norm bounding: Sun, Kairouz, Suresh, McMahan, "Can You Really Backdoor Federated Learning?",
arXiv:1911.07963, 2019 (section 4, "norm thresholding of updates"). docs/algorithms.md section
8.5."""

from __future__ import annotations

from typing import Literal

from fedlightning.errors import require
from fedlightning.server.robust import RobustAggregator


class NormBound(RobustAggregator):
    """FedAvg of the client updates clipped to an L2 norm bound:
    ``w <- w + sum_i q_i u_i / max(1, ||u_i|| / max_norm)``, ``u_i = w_i - w`` (one flat norm over
    the client's floating entries), ``q_i`` as FedAvg's ``weighting``. It is
    ``FedAvg(clip_norm=max_norm)`` under its paper's name, with the paper's breakdown check: the
    bound caps each client's influence (a scaled or model-replacement update cannot exceed it),
    but an honest majority is still needed. Owner-aware: each client's norm is over its own keys
    and each key is averaged over its owners, so heterogeneous clients are served
    (docs/algorithms.md section 2.3). The paper's "weak differential privacy" (Gaussian noise
    added to the sum) is the client-level DP of the owner-aware mean, not repeated here.

    Args:
        max_norm: M > 0, the largest L2 norm of a client update.
        weighting: ``samples`` (by n_i) or ``uniform``.
    """

    owner_aware = True

    def __init__(
        self, max_norm: float = 1.0, weighting: Literal["samples", "uniform"] = "samples"
    ) -> None:
        require(max_norm > 0, "loop.aggregator.init_args.max_norm", max_norm, "a number > 0")
        super().__init__(weighting=weighting, clip_norm=max_norm)
