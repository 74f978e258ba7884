"""The geometric median (RFA) preset: Pillutla, Kakade, Harchaoui, "Robust Aggregation for
Federated Learning", IEEE Transactions on Signal Processing 70, 2022, arXiv:1912.13445.
docs/algorithms.md section 8.3."""

from __future__ import annotations

from typing import Literal

from fedlightning.server.fedavg import FedAvg
from fedlightning.server.statistics import geomed
from fedlightning.server.statistics.base import PRESET_OPTIONS, preset_statistic


class GeometricMedian(FedAvg):
    """RFA: FedAvg whose statistic is the weighted geometric median of the uploads
    (:class:`fedlightning.server.statistics.GeometricMedian` has the rule), ``alpha_i ∝ n_i``
    (``weighting="samples"``, the paper's) or uniform. A preset: the same as
    ``FedAvg(weighting=weighting, statistic=statistics.GeometricMedian(smoothing, max_iter,
    tol))``. The iterations of the last round are reported as ``weiszfeld_iterations``.

    Args:
        weighting: ``samples`` (alpha_i ∝ n_i) or ``uniform``.
        smoothing: nu > 0, the smallest distance a weight divides by.
        max_iter: the most Weiszfeld iterations (>= 1).
        tol: stop once ``|g(z_t) - g(z_{t+1})| <= tol * g(z_{t+1})`` (>= 0).
    """

    def __init__(
        self,
        weighting: Literal["samples", "uniform"] = "samples",
        smoothing: float = 1e-6,
        max_iter: int = 100,
        tol: float = 1e-6,
    ) -> None:
        geomed.check_weiszfeld_options(PRESET_OPTIONS, smoothing, max_iter, tol)
        statistic = preset_statistic(geomed.GeometricMedian(smoothing, max_iter, tol), self)
        super().__init__(weighting, statistic=statistic)
