"""The smoothed Weiszfeld iteration of the weighted geometric median (Pillutla, Kakade, Harchaoui,
"Robust Aggregation for Federated Learning", IEEE TSP 2022, arXiv:1912.13445, Algorithm 3),
robust to outliers of any size (docs/algorithms.md section 8, "Outliers of any size", and 8.3).

The authors' iteration and stopping rule, unchanged wherever every point lies within ``FAR * m``
of the estimate (``m`` the median distance from it to the points, unweighted: the honest uploads'
scale under the honest majority the breakdown check requires). Far outliers are what they were
not written for:

- Their distances dominate the objective ``g(z) = sum_i alpha_i ||z - x_i||`` and barely change
  while ``z`` moves among the honest points, so "``g`` changed by at most ``tol * g``" held while
  the estimate was still ``~tol * g`` away from the median (2 of 10 Gaussian outliers at sigma
  1e10: it stopped after 9 of 100 iterations, ~1e4 honest spreads away; test losses of
  1e6-1e10). With far points the change is measured against ``tol`` times the objective of the
  near points, and computed from the step
  (``d_t - d_{t+1} = (z_{t+1} - z_t) . (2 x - z_t - z_{t+1}) / (d_t + d_{t+1})``): the difference
  of two objectives of size 1e38 has lost it.
- They drag the weighted mean, the authors' start, ``~alpha_f * size`` away, and each iteration
  only shrinks that distance by a constant factor (up to ``alpha_f / (1 - alpha_f)`` for
  outliers along one direction): ~230 iterations for 4 of 10 at 1e38. Once a point lies farther
  than ``FAR * m`` (after a few iterations at most: the honest points' distances shrink, the
  outliers' do not), the iteration goes on from the coordinate-wise median instead, once (the
  same fixed point, a few iterations away; it is computed only then).
- A non-finite point (an upload of Inf/NaN, e.g. Gaussian noise beyond float32's 3.4e38) is
  infinitely far: its Weiszfeld weight ``alpha_i / ||z - x_i||`` is 0, so it is left out.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: a point farther than FAR times the median distance is "far" (an outlier whose size
#: the authors' stopping rule and start point were not written for); ordinary rounds, attacked
#: ones included (sign flipping, Gaussian noise of sigma 1), stay well within it
FAR = 1e3


def weiszfeld(
    points: Tensor, alphas: Tensor, smoothing: float, max_iter: int, tol: float
) -> tuple[Tensor, int]:
    """The smoothed Weiszfeld estimate of the weighted geometric median
    ``argmin_z sum_i alpha_i ||z - x_i||`` of the rows of ``points``, as the coefficients
    ``beta`` (summing to 1; 0 for a non-finite row) of ``z = sum_i beta_i x_i``, and the number
    of iterations done.

    ``alpha`` is normalised to sum 1; ``z_0 = sum_i alpha_i x_i`` (once far points show, the
    iteration goes on from the coordinate-wise median: module docstring); each iteration
    ``beta_i ∝ alpha_i / max(smoothing, ||z - x_i||)``, ``z <- sum_i beta_i x_i``. It stops after
    ``max_iter`` iterations, or once the objective ``g(z) = sum_i alpha_i ||z - x_i||`` changes by
    at most ``tol * g(z)`` (the stopping rule of the authors' code), ``g`` over the points within
    ``FAR`` times the median distance when some are farther.

    >>> beta, _ = weiszfeld(torch.tensor([[0.0], [1.0], [2.0], [3.0], [100.0]]).double(),
    ...                     torch.ones(5).double(), 1e-8, 1000, 1e-12)
    >>> round(float(beta @ torch.tensor([0.0, 1.0, 2.0, 3.0, 100.0]).double()), 6)  # the median
    2.0
    """
    if not (smoothing > 0 and max_iter >= 1 and tol >= 0):
        raise ValueError(
            f"weiszfeld needs smoothing > 0, max_iter >= 1, tol >= 0, got {smoothing}, "
            f"{max_iter}, {tol}"
        )
    points, alphas = finite_points(points, alphas.to(points.dtype))
    alphas = alphas / alphas.sum()
    z = alphas @ points
    distances = (points - z).norm(dim=1)
    objective = float((alphas * distances).sum())
    beta, restarted = alphas, False
    for iteration in range(1, max_iter + 1):
        if not restarted and bool(far_points(distances, alphas).any()):
            restarted = True  # far outliers dragged the mean away: go on from the median
            z = coordinate_median(points, alphas)
            distances = (points - z).norm(dim=1)
            objective = float((alphas * distances).sum())
        weights = alphas / distances.clamp(min=smoothing)
        beta = weights / weights.sum()
        new_z = beta @ points
        new_distances = (points - new_z).norm(dim=1)
        previous, objective = objective, float((alphas * new_distances).sum())
        if abs(previous - objective) <= tol * objective and settled_near(
            points, alphas, (z, distances), (new_z, new_distances), tol
        ):
            return beta, iteration
        z, distances = new_z, new_distances
    return beta, max_iter


def finite_points(points: Tensor, alphas: Tensor) -> tuple[Tensor, Tensor]:
    """``points`` and ``alphas`` with each non-finite row zeroed and its weight 0 (a point at
    infinity has Weiszfeld weight 0); unchanged when every row is finite. Refuses rows none of
    which is finite with a positive weight."""
    finite = points.isfinite().all(dim=1)
    if bool(finite.all()):
        return points, alphas
    alphas = torch.where(finite, alphas, torch.zeros_like(alphas))
    if not float(alphas.sum()) > 0:
        raise ValueError("the geometric median needs a finite point of positive weight, got none")
    return torch.where(finite[:, None], points, torch.zeros_like(points)), alphas


def median_distance(distances: Tensor, alphas: Tensor) -> float:
    """The upper median of the ``distances`` of the points of positive weight, unweighted: with
    the honest majority the breakdown check requires, an honest point's distance (one client
    holding most of the weight cannot shrink it to 0, nor can two points, one under ``z``).

    >>> median_distance(torch.tensor([5.0, 1.0, 3.0, 9.0]), torch.tensor([1.0, 9.0, 1.0, 0.0]))
    3.0
    >>> median_distance(torch.tensor([0.0, 4.0]), torch.tensor([3.0, 1.0]))
    4.0
    """
    live = alphas > 0  # no boolean indexing: its result's size is data, and every device has it
    ordered = distances.masked_fill(~live, float("inf")).sort().values
    return float(ordered[int(live.sum()) // 2])


def far_points(distances: Tensor, alphas: Tensor) -> Tensor:
    """Which points of positive weight lie farther than ``FAR`` times the median distance
    (:func:`median_distance`) from the estimate whose ``distances`` these are."""
    return (distances > FAR * median_distance(distances, alphas)) & (alphas > 0)


def coordinate_median(points: Tensor, alphas: Tensor) -> Tensor:
    """The coordinate-wise median of the points of positive weight (the mean of the two middle
    values for an even count): within the honest points' range per coordinate under an honest
    majority, wherever the others lie."""
    live = alphas > 0
    ordered = points.masked_fill(~live[:, None], float("inf")).sort(dim=0).values
    count = int(live.sum())
    return (ordered[(count - 1) // 2] + ordered[count // 2]) / 2


def settled_near(
    points: Tensor,
    alphas: Tensor,
    before: tuple[Tensor, Tensor],
    after: tuple[Tensor, Tensor],
    tol: float,
) -> bool:
    """Whether the step from ``before`` to ``after`` (each ``(z, ||x_i - z||)``) changed the
    objective by at most ``tol`` times the near points' objective (module docstring); always
    true when no point is farther than ``FAR`` times the median distance, where the
    authors' rule alone decides."""
    (z, distances), (new_z, new_distances) = before, after
    far = far_points(new_distances, alphas)
    if not bool(far.any()):
        return True
    step = new_z - z
    sum_distances = distances + new_distances
    shrink = ((2 * points - z - new_z) @ step) / sum_distances.clamp(min=torch.finfo(z.dtype).tiny)
    change = float((alphas * shrink).sum())
    near_objective = float(torch.where(far, 0.0, alphas * new_distances).sum())
    return abs(change) <= tol * near_objective
