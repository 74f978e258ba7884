"""Geometric median (RFA): Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated
Learning", IEEE Transactions on Signal Processing 70, 2022, arXiv:1912.13445 (Algorithms 2 and 3,
the smoothed Weiszfeld algorithm). docs/algorithms.md section 8.3."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from fedlightning.errors import require
from fedlightning.protocol import StateDict, Upload
from fedlightning.server.functional import clamp_running_var, weighted_average
from fedlightning.server.robust import RobustAggregator
from fedlightning.server.robust_maths import flat_floats, weiszfeld


class GeometricMedian(RobustAggregator):
    """RFA: the new model is the weighted geometric median of the uploads,
    ``argmin_z sum_i alpha_i ||z - w_i||`` with ``alpha_i ∝ n_i`` (``weighting="samples"``, the
    paper's) or uniform, estimated by the smoothed Weiszfeld algorithm
    (:func:`~fedlightning.server.robust_maths.weiszfeld`): from the weighted mean,
    ``beta_i ∝ alpha_i / max(smoothing, ||z - w_i||)``, ``z <- sum_i beta_i w_i``, until the
    objective changes by at most ``tol`` relative or after ``max_iter`` iterations. Each upload is
    one point (its floating entries); the result is the convex combination ``sum_i beta_i w_i`` of
    every entry, BatchNorm statistics included. Heterogeneous clients are refused. The iterations
    of the last round are reported as ``weiszfeld_iterations``.

    Args:
        weighting: ``samples`` (alpha_i ∝ n_i) or ``uniform``.
        smoothing: nu > 0, the smallest distance a weight divides by.
        max_iter: the most Weiszfeld iterations (>= 1).
        tol: stop once ``|g(z_t) - g(z_{t+1})| <= tol * g(z_{t+1})`` (>= 0).
    """

    #: the last round's Weiszfeld iterations, for :meth:`round_metrics` only
    transient_attributes = frozenset({"_iterations"})

    def __init__(
        self,
        weighting: Literal["samples", "uniform"] = "samples",
        smoothing: float = 1e-6,
        max_iter: int = 100,
        tol: float = 1e-6,
    ) -> None:
        prefix = "loop.aggregator.init_args"
        require(smoothing > 0, f"{prefix}.smoothing", smoothing, "a number > 0")
        require(max_iter >= 1, f"{prefix}.max_iter", max_iter, "an integer >= 1")
        require(tol >= 0, f"{prefix}.tol", tol, "a number >= 0")
        super().__init__(weighting=weighting)
        self.smoothing = smoothing
        self.max_iter = max_iter
        self.tol = tol
        self._iterations = 0

    def average(self, uploads: Sequence[Upload]) -> StateDict:
        states = [u.weights for u in uploads]
        points = flat_floats(states)
        alphas = torch.tensor(self.client_weights(uploads), dtype=points.dtype)
        beta, self._iterations = weiszfeld(
            points, alphas.to(points.device), self.smoothing, self.max_iter, self.tol
        )
        return clamp_running_var(weighted_average(states, beta.tolist()))

    def round_metrics(self) -> dict[str, float]:
        return {"weiszfeld_iterations": float(self._iterations)}
