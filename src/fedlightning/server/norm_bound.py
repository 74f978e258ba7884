"""The norm-bounding preset: Sun, Kairouz, Suresh, McMahan, "Can You Really Backdoor Federated
Learning?", arXiv:1911.07963, 2019 (section 4, "norm thresholding of updates").
docs/algorithms.md section 8.5."""

from __future__ import annotations

from typing import Literal

from fedlightning.errors import require
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.statistics import Mean
from fedlightning.server.statistics.base import preset_statistic


class NormBound(FedAvg):
    """FedAvg of the client updates clipped to an L2 norm bound:
    ``w <- w + sum_i q_i u_i / max(1, ||u_i|| / max_norm)``, ``u_i = w_i - w`` (one flat norm over
    the client's floating entries), ``q_i`` as FedAvg's ``weighting``. A preset: the same as
    ``FedAvg(weighting=weighting, statistic=statistics.Mean(clip_norm=max_norm))`` (and as
    ``FedAvg(clip_norm=max_norm)``), under its paper's name, with the paper's breakdown check: the
    bound caps each client's influence, but an honest majority is still needed. Owner-aware
    (docs/algorithms.md section 2.3). The paper's "weak differential privacy" (Gaussian noise
    added to the sum) is the client-level DP of the owner-aware mean, not repeated here.

    Args:
        max_norm: M > 0, the largest L2 norm of a client update.
        weighting: ``samples`` (by n_i) or ``uniform``.
    """

    def __init__(
        self, max_norm: float = 1.0, weighting: Literal["samples", "uniform"] = "samples"
    ) -> None:
        require(max_norm > 0, "loop.aggregator.init_args.max_norm", max_norm, "a number > 0")
        super().__init__(weighting, statistic=preset_statistic(Mean(clip_norm=max_norm), self))
