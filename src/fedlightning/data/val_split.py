"""Client validation splits (docs/algorithms.md section 4): held out of each client's own samples
(:func:`holdout`), or taken from the test set (FML section 4: "1/5 test data as private validate
data"; :func:`proportional_split`, :func:`validation_from_test`).

Both work on :class:`~fedlightning.data.ragged.Ragged` partitions, vectorised but for one seeded
permutation per client that holds out samples.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedlightning.data.partition import count_table
from fedlightning.data.ragged import Ragged
from fedlightning.errors import ConfigurationError
from fedlightning.seeding import derive_seed


def holdout(parts: Ragged, fraction: float, seed: int) -> tuple[Ragged, Ragged]:
    """``(train, val)``, each part sorted: client c's samples (``parts[c]``, in the partition's
    order) shuffled by ``torch.randperm`` from a generator seeded with
    ``derive_seed(seed, "val-split", c)``, the first ``floor(n_c * fraction)`` of them its
    validation split and the rest its training split. A client that holds out nothing draws no
    permutation (its split would not depend on it).

    >>> train, val = holdout(Ragged.from_parts([np.arange(10), np.array([12, 11])]), 0.2, seed=0)
    >>> [len(p) for p in train], [len(p) for p in val], val[1].tolist()
    ([8, 2], [2, 0], [])
    """
    parts = parts.numpy()
    sizes = parts.sizes()
    num_val = np.floor(sizes * fraction).astype(np.int64)
    short = np.flatnonzero(sizes - num_val < 1)
    if len(short):
        cid = int(short[0])
        raise ConfigurationError(
            f"client {cid} has {int(sizes[cid])} samples, none left for training after "
            f"val_fraction={fraction}: lower val_fraction or num_clients"
        )
    held = np.zeros(len(parts.values), dtype=bool)
    # the one per-client Python loop of a partition, by client size: clients of one size n hold
    # out the same number, so one permutation buffer (a NumPy view of it) and one rows x held
    # array serve them all, with no per-client Python lists
    holding = np.flatnonzero(num_val)
    for n in np.unique(sizes[holding]).tolist():
        clients = holding[sizes[holding] == n]
        hold = int(num_val[clients[0]])
        order = torch.empty(n, dtype=torch.int64)
        view = order.numpy()  # shares order's memory: randperm(out=order) of size n fills it
        first = np.empty((len(clients), hold), dtype=np.int64)
        generator = torch.Generator()
        for row, cid in enumerate(clients.tolist()):
            generator.manual_seed(derive_seed(seed, "val-split", cid))
            torch.randperm(n, generator=generator, out=order)
            first[row] = view[:hold]
        held[(parts.offsets[clients][:, None] + first).reshape(-1)] = True
    return parts.take(~held).sorted(), parts.take(held).sorted()


def stratified_holdout(
    parts: Ragged, labels: np.ndarray, fraction: float, seed: int
) -> tuple[Ragged, Ragged]:
    """``(train, test)``, each part sorted: each client's own test split, following its label
    distribution. Client c's ``n_{c,k}`` samples of class k (``labels`` of the pool ``parts``
    index) contribute ``floor(n_{c,k} * fraction + 1/2)`` to its test split: the first of them in
    the client's shuffle by ``torch.randperm`` from a generator seeded with
    ``derive_seed(seed, "test-split", c)``; the rest stay for training (and validation).

    >>> labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    >>> train, test = stratified_holdout(Ragged.from_parts([np.arange(12)]), labels, 0.25, 0)
    >>> np.bincount(labels[test[0]]).tolist(), len(train[0])
    ([1, 2], 9)
    """
    parts = parts.numpy()
    labels = np.asarray(labels)
    held = np.zeros(len(parts.values), dtype=bool)
    generator = torch.Generator()
    for cid, (start, stop) in enumerate(zip(parts.offsets[:-1], parts.offsets[1:], strict=True)):
        if stop == start:
            continue
        generator.manual_seed(derive_seed(seed, "test-split", cid))
        order = torch.randperm(int(stop - start), generator=generator).numpy()
        classes = labels[parts.values[start + order]]
        counts = np.bincount(classes)
        wanted = np.floor(counts * fraction + 0.5).astype(np.int64)
        # the rank of each shuffled sample among its class's: the first `wanted` of a class go
        rank = np.empty(len(order), np.int64)
        by_class = np.argsort(classes, kind="stable")
        rank[by_class] = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
        held[start + order[rank < wanted[classes]]] = True
        if (~held[start:stop]).sum() < 1:
            raise ConfigurationError(
                f"client {cid} has {stop - start} samples, none left for training after "
                f"client_test_fraction={fraction}: lower it or num_clients"
            )
    return parts.take(~held).sorted(), parts.take(held).sorted()


def proportional_split(labels: np.ndarray, counts: np.ndarray, seed: int) -> Ragged:
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
    values, owners = [], []
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
        values.append(members)  # client i takes the next share[i] of them, in client order
        owners.append(np.repeat(np.arange(num_clients, dtype=np.int64), share))
    if not values:
        return Ragged(np.zeros(0, np.int64), np.zeros(num_clients + 1, np.int64))
    return Ragged.group(np.concatenate(values), np.concatenate(owners), num_clients)


def validation_from_test(
    test_y: torch.Tensor,
    train_y: torch.Tensor,
    train: Ragged,
    num_classes: int,
    fraction: float,
    seed: int,
) -> tuple[Ragged, torch.Tensor]:
    """``(val, test_rows)``: a seeded ``fraction`` of the test set held out as the clients'
    validation splits, dealt class by class in proportion to their ``train`` counts
    (:func:`proportional_split`), as rows of the test set; and the test rows left (sorted)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "val-split", -1))
    order = torch.randperm(len(test_y), generator=generator)
    held = order[: math.floor(len(test_y) * fraction)].sort().values
    test_rows = order[len(held) :].sort().values
    counts = count_table(train_y.numpy(), train, num_classes)
    parts = proportional_split(test_y[held].numpy(), counts, seed)
    return Ragged(held.numpy()[parts.values], parts.offsets), test_rows
