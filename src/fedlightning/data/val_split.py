"""Client validation splits taken from the test set (FML section 4: "1/5 test data as private
validate data"; docs/algorithms.md section 4).

:func:`proportional_split` deals held-out test samples to the clients class by class, each class
in proportion to the clients' training counts of that class, so every client validates on its own
label distribution.
"""

from __future__ import annotations

import numpy as np


def proportional_split(labels: np.ndarray, counts: np.ndarray, seed: int) -> list[np.ndarray]:
    """One sorted index array (into ``labels``) per client.

    For class c with ``m_c`` samples and client training counts ``n_ic`` (``counts``: clients x
    classes), client i receives ``m_c * n_ic / sum_j n_jc`` samples rounded by largest remainder
    (ties to the smaller client id); which samples is a seeded shuffle. A class no client trains on
    is given to nobody.

    Example:
        >>> parts = proportional_split(np.array([0, 0, 0, 0, 1, 1]), np.array([[3, 0], [1, 5]]), 0)
        >>> [len(p) for p in parts], [int(np.sum(np.array([0, 0, 0, 0, 1, 1])[p])) for p in parts]
        ([3, 3], [0, 2])
    """
    rng = np.random.default_rng(seed)
    num_clients = counts.shape[0]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(counts.shape[1]):
        members = rng.permutation(np.flatnonzero(labels == c))
        weights = counts[:, c].astype(np.float64)
        if not len(members) or weights.sum() == 0:
            continue
        exact = len(members) * weights / weights.sum()
        share = np.floor(exact).astype(np.int64)
        remainder = len(members) - int(share.sum())
        order = np.lexsort((np.arange(num_clients), -(exact - share)))
        share[order[:remainder]] += 1
        for client, piece in enumerate(np.split(members, np.cumsum(share)[:-1])):
            parts[client].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]
