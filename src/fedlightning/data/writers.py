"""FEMNIST writers: filters and a per-writer train/test split (docs/algorithms.md section 4).

The papers select writers before partitioning: FedCross keeps the writers with more than 100
samples (180 clients), CoFED the 100 writers with the most samples and splits each one's samples
40/60 into train/test. Both are pure functions of the writer ids (and a seed).
"""

from __future__ import annotations

import numpy as np

from fedlightning.seeding import derive_seed


def select_writers(
    writers: np.ndarray, min_samples: int = 0, top_k: int | None = None
) -> np.ndarray:
    """The writer ids to keep (ascending): those with at least ``min_samples`` samples, then of
    those the ``top_k`` with the most samples (ties to the smaller id); ``None``: all.

    >>> select_writers(np.array([0, 0, 0, 1, 2, 2, 3, 3, 3]), min_samples=2).tolist()
    [0, 2, 3]
    >>> select_writers(np.array([0, 0, 0, 1, 2, 2, 3, 3, 3]), top_k=2).tolist()
    [0, 3]
    """
    ids, counts = np.unique(writers, return_counts=True)
    keep = counts >= min_samples
    ids, counts = ids[keep], counts[keep]
    if top_k is not None:
        order = np.lexsort((ids, -counts))[:top_k]
        ids = ids[order]
    return np.sort(ids)


def split_per_writer(
    writers: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays ``(train, test)``: each writer's samples shuffled (from ``(seed, writer)``)
    and ``floor(n_w * test_fraction)`` of them put in the test part; sorted."""
    train, test = [], []
    for writer in np.unique(writers):
        members = np.flatnonzero(writers == writer)
        rng = np.random.default_rng(derive_seed(seed, "writer-split", int(writer)))
        members = rng.permutation(members)
        cut = int(np.floor(len(members) * test_fraction))
        test.append(members[:cut])
        train.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
