"""Byzantine-robust server maths as pure functions (docs/algorithms.md section 8): Krum's scores
and Multi-Krum's selection, the smoothed Weiszfeld iteration of the geometric median (in
:mod:`fedlightning.server.weiszfeld`), centered clipping. No state; the aggregators of
:mod:`fedlightning.server.krum`, :mod:`fedlightning.server.geomed` and
:mod:`fedlightning.server.centered_clip` hold what crosses rounds. The coordinate-wise median
and trimmed mean and the norm clipping are in :mod:`fedlightning.server.functional`.

An upload is one point: its floating entries (trainable parameters and BatchNorm running
statistics alike: an attacker controls the whole upload, docs/algorithms.md section 8, "BatchNorm
buffers") flattened in the first state's key order (:func:`flat_floats`). Distances are computed
in the server's wide dtype (float64 where the device has it) from differences, never from a Gram
matrix, whose cancellation would blur near ties.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedlightning.protocol import StateDict
from fedlightning.server.functional import clip_update, float_keys, owner_combine, uniform_average
from fedlightning.server.summation import wide_dtype
from fedlightning.server.weiszfeld import weiszfeld

__all__ = [
    "centered_clip", "flat_floats", "krum_neighbours", "krum_scores", "krum_select",
    "pairwise_sq_distances", "weiszfeld",
]  # fmt: skip


def flat_floats(states: Sequence[StateDict]) -> Tensor:
    """An ``(n, d)`` matrix: row i holds state i's floating entries, in the first state's key
    order, flattened and concatenated, in the wide dtype of the first state's device. Every state
    must have the first state's floating keys and shapes.

    >>> flat_floats([{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)},
    ...              {"w": torch.tensor([3.0, 4.0]), "n": torch.tensor(5)}])
    tensor([[1., 2.],
            [3., 4.]], dtype=torch.float64)
    """
    if not states:
        raise ValueError("flat_floats needs at least one state_dict")
    keys = float_keys(states[0])
    device = states[0][keys[0]].device if keys else torch.device("cpu")
    dtype = wide_dtype(device)
    rows = [
        torch.cat([s[k].detach().reshape(-1).to(device, dtype) for k in keys])
        if keys
        else torch.zeros(0, dtype=dtype, device=device)
        for s in states
    ]
    return torch.stack(rows)


def pairwise_sq_distances(points: Tensor) -> Tensor:
    """``D[i, j] = ||x_i - x_j||^2`` for the rows of ``points`` (exactly symmetric, zero diagonal).

    >>> pairwise_sq_distances(torch.tensor([[0.0, 0.0], [3.0, 4.0]]))
    tensor([[ 0., 25.],
            [25.,  0.]])
    """
    return torch.stack([(points - row).pow(2).sum(dim=1) for row in points])


def krum_neighbours(num_uploads: int, byzantine: int) -> int:
    """How many nearest neighbours Krum's score sums: ``n - f - 2`` (Blanchard et al., NeurIPS
    2017, section 4), at least 1 while there is another upload (a round too small for the rule,
    ``n <= f + 2``, scores by its nearest neighbour), 0 for a single upload.

    >>> krum_neighbours(10, 2), krum_neighbours(2, 0), krum_neighbours(1, 0)
    (6, 1, 0)
    """
    return max(num_uploads - byzantine - 2, min(1, num_uploads - 1))


def krum_scores(sq_distances: Tensor, neighbours: int) -> Tensor:
    """Krum's score of each point: the sum of its squared distances to its ``neighbours`` nearest
    other points, ``s(i) = sum_{i -> j} ||x_i - x_j||^2`` (Blanchard et al., NeurIPS 2017,
    arXiv:1703.02757, section 4).

    >>> d = pairwise_sq_distances(torch.tensor([[0.0], [1.0], [2.0], [10.0]]))
    >>> krum_scores(d, 1)  # each point's nearest other point
    tensor([ 1.,  1.,  1., 64.])
    """
    n = len(sq_distances)
    if not 0 <= neighbours <= n - 1:
        raise ValueError(f"Krum scores {n} points by 0 to {n - 1} neighbours, got {neighbours}")
    others = sq_distances.masked_fill(torch.eye(n, dtype=torch.bool, device=sq_distances.device),
                                      float("inf"))  # fmt: skip
    return others.sort(dim=1).values[:, :neighbours].sum(dim=1)


def krum_select(scores: Tensor, count: int) -> list[int]:
    """The indices of the ``count`` lowest scores, lowest first; equal scores in index order
    (Multi-Krum's selection; ``count=1`` is Krum's choice).

    >>> krum_select(torch.tensor([5.0, 2.0, 5.0, 65.0]), 3)
    [1, 0, 2]
    """
    if not 1 <= count <= len(scores):
        raise ValueError(f"Multi-Krum selects 1 to {len(scores)} of {len(scores)}, got {count}")
    return scores.sort(stable=True).indices[:count].tolist()


def centered_clip(
    updates: Sequence[StateDict], center: StateDict, radius: float, iterations: int
) -> StateDict:
    """Centered clipping (Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
    Optimization", ICML 2021, arXiv:2012.10333, eq. (CC)): ``iterations`` times,
    ``v <- v + (1/n) sum_i (x_i - v) min(1, radius / ||x_i - v||)``, from ``v = center``.

    Owner-aware (docs/algorithms.md section 2.3): ``||x_i - v||`` is over the keys update i owns,
    and each key averages over the updates that own it; the keys of ``center`` no update owns stay
    as they are. Returns the new ``v`` (every key of ``center``) in the dtype of the updates.

    >>> v = centered_clip([{"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.6, 0.8])}],
    ...                   {"w": torch.zeros(2)}, radius=1.0, iterations=2)
    >>> [round(x, 4) for x in v["w"].tolist()]
    [0.9, 1.2]
    """
    if not (radius > 0 and iterations >= 1):
        raise ValueError(
            f"centered_clip needs radius > 0, iterations >= 1, got {radius}, {iterations}"
        )
    v = dict(center)
    for _ in range(iterations):
        clipped = [clip_update(x, v, radius) for x in updates]
        v.update(owner_combine(v, clipped, lambda _, sub, __: uniform_average(sub)))
    return v
