"""The distribution of per-client accuracies (docs/algorithms.md section 6): read by the loop's
evaluation (``val_acc``) and by client objectives that score their own personal models (FML's
``personal_acc``), so it lives below both.

Given client ``i``'s accuracy ``a_i`` on its own split of ``n_i`` samples (clients without samples
left out), over the ``M`` remaining clients (for ``val_acc``: the clients the loop scores, every
client or a seeded sample of ``loop.val_clients`` per evaluated round, whose statistics then
estimate those of all clients: :mod:`fedlightning.loop.evaluation`):

* ``mean``: ``(1/M) sum_i a_i`` (unweighted; the library's ``val_acc``),
* ``weighted``: ``sum_i n_i a_i / sum_i n_i`` (PFLlib's reported accuracy: all correct over all
  samples),
* ``std``: the population standard deviation ``sqrt((1/M) sum_i (a_i - mean)^2)`` (PFLlib's
  ``np.std`` of the per-client accuracies),
* ``min``: ``min_i a_i``,
* ``worst10``: the mean of the ``ceil(M / 10)`` lowest accuracies (the worst 10% of clients).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def accuracy_distribution(correct: Tensor, counts: Tensor, name: str) -> dict[str, float]:
    """``{name: mean, name_weighted, name_std, name_min, name_worst10}`` from per-client counts of
    correct predictions and of samples (1-D, one entry per client; clients with 0 samples skipped)."""
    correct, counts = correct.double(), counts.double()
    has = counts > 0
    if not bool(has.any()):
        return {}
    acc = correct[has] / counts[has]
    worst = torch.sort(acc).values[: math.ceil(len(acc) / 10)]
    return {
        name: float(acc.mean()),
        f"{name}_weighted": float(correct[has].sum() / counts[has].sum()),
        f"{name}_std": float(acc.std(correction=0)),
        f"{name}_min": float(acc.min()),
        f"{name}_worst10": float(worst.mean()),
    }
