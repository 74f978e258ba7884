"""The geometric median (RFA) as a statistic: Pillutla, Kakade, Harchaoui, "Robust Aggregation for
Federated Learning", IEEE Transactions on Signal Processing 70, 2022, arXiv:1912.13445 (Algorithms
2 and 3, the smoothed Weiszfeld algorithm). docs/algorithms.md section 8.3."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedlightning.errors import require
from fedlightning.protocol import StateDict
from fedlightning.server.functional import clamp_running_var, weighted_average
from fedlightning.server.robust_maths import flat_floats, weiszfeld
from fedlightning.server.statistics.base import Statistic, StatisticContext

STATISTIC = "loop.aggregator.init_args.statistic.init_args"


def check_weiszfeld_options(path: str, smoothing: float, max_iter: int, tol: float) -> None:
    """Refuse the Weiszfeld options in one line naming the option under ``path``."""
    require(smoothing > 0, f"{path}.smoothing", smoothing, "a number > 0")
    require(max_iter >= 1, f"{path}.max_iter", max_iter, "an integer >= 1")
    require(tol >= 0, f"{path}.tol", tol, "a number >= 0")


class GeometricMedian(Statistic):
    """The weighted geometric median ``argmin_z sum_i alpha_i ||z - w_i||`` with ``alpha_i``
    the aggregator's client weights (``n_i`` under ``weighting: samples``, the paper's; 1 under
    ``uniform``), estimated by the smoothed Weiszfeld algorithm
    (:func:`~fedlightning.server.robust_maths.weiszfeld`): from the weighted mean,
    ``beta_i ∝ alpha_i / max(smoothing, ||z - w_i||)``, ``z <- sum_i beta_i w_i``, until the
    objective changes by at most ``tol`` relative or after ``max_iter`` iterations. Each upload is
    one point (its floating entries); the result is ``sum_i beta_i w_i`` of every entry, BatchNorm
    statistics included. Needs clients that own the same keys and an honest majority. Outliers
    of any size (Inf/NaN uploads too) move the estimate no more than the honest uploads'
    spread allows (docs/algorithms.md section 8, "Outliers of any size"). The iterations of
    the last round are reported as ``weiszfeld_iterations``.

    Args:
        smoothing: nu > 0, the smallest distance a weight divides by.
        max_iter: the most Weiszfeld iterations (>= 1).
        tol: stop once ``|g(z_t) - g(z_{t+1})| <= tol * g(z_{t+1})`` (>= 0).
    """

    needs_honest_majority = True

    #: the last round's Weiszfeld iterations, for :meth:`round_metrics` only
    transient_attributes = frozenset({"_iterations"})

    def __init__(self, smoothing: float = 1e-6, max_iter: int = 100, tol: float = 1e-6) -> None:
        check_weiszfeld_options(STATISTIC, smoothing, max_iter, tol)
        self.smoothing = smoothing
        self.max_iter = max_iter
        self.tol = tol
        self._iterations = 0

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        points = flat_floats(uploads)
        alphas = torch.tensor(list(weights), dtype=points.dtype)
        beta, self._iterations = weiszfeld(
            points, alphas.to(points.device), self.smoothing, self.max_iter, self.tol
        )
        # an upload with Inf/NaN has coefficient 0 (fedlightning.server.weiszfeld): leave it out, as
        # 0 * Inf would be NaN
        kept = [(upload, b) for upload, b in zip(uploads, beta.tolist(), strict=True) if b > 0]
        return clamp_running_var(weighted_average([u for u, _ in kept], [b for _, b in kept]))

    def round_metrics(self) -> dict[str, float]:
        return {"weiszfeld_iterations": float(self._iterations)}
