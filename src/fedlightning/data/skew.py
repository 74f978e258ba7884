"""The partitions of personalized-FL benchmarks (docs/algorithms.md section 4): quantity skew
(client sizes from a log-normal or power law, labels IID) and the pathological split of exactly
``k`` classes per client. Pure functions of (labels, number of clients, parameters, seed), like
those of :mod:`fedlightning.data.partition`; every sample is assigned to exactly one client.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from fedlightning.data.ragged import Ragged
from fedlightning.errors import ConfigurationError, require

QUANTITY_DISTRIBUTIONS = ("lognormal", "powerlaw")


def largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split in proportion to ``weights``: ``floor(total * w_i / sum w)`` plus one for
    the ``total - sum floor(...)`` largest remainders (ties to the smaller index).

    >>> largest_remainder(10, np.array([1.0, 1.0, 1.0])).tolist()
    [4, 3, 3]
    """
    exact = total * weights / weights.sum()
    share = np.floor(exact).astype(np.int64)
    order = np.lexsort((np.arange(len(weights)), -(exact - share)))
    share[order[: total - int(share.sum())]] += 1
    return share


def quantity_skew(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    distribution: Literal["lognormal", "powerlaw"] = "lognormal",
    skew: float = 1.0,
    min_size: int = 10,
) -> Ragged:
    """Quantity skew with IID labels: client i holds ``n_i = min_size + m_i`` samples of one
    shuffle of the pool, where the ``M - N * min_size`` samples left after the minimum are split
    in proportion to seeded weights (:func:`largest_remainder`):

    * ``lognormal``: ``w_i ~ LogNormal(0, skew^2)`` (``skew`` is the log-sizes' standard deviation;
      FedProx's and LEAF's synthetic sizes follow a log-normal law);
    * ``powerlaw``: ``w_i ~ Pareto(skew)``, i.e. ``P(w > t) = t^-skew`` for ``t >= 1`` (smaller
      ``skew``: heavier tail).

    Larger ``skew`` (log-normal) or smaller (power law) makes sizes more unequal.

    >>> parts = quantity_skew(np.zeros(100, np.int64), 4, seed=0, skew=1.0, min_size=5)
    >>> parts.sizes().tolist(), int(parts.sizes().sum())
    ([23, 19, 35, 23], 100)
    """
    require(
        distribution in QUANTITY_DISTRIBUTIONS,
        "data.quantity_distribution", distribution, f"one of {', '.join(QUANTITY_DISTRIBUTIONS)}",
    )  # fmt: skip
    require(skew > 0, "data.quantity_skew", skew, "a number > 0")
    require(min_size >= 0, "data.min_size", min_size, "an integer >= 0")
    if num_clients < 1 or num_clients * max(min_size, 1) > len(labels):
        raise ConfigurationError(
            f"quantity skew needs at least min_size={max(min_size, 1)} samples for each of the "
            f"num_clients={num_clients} clients, and the pool has {len(labels)}: lower min_size "
            "or num_clients"
        )
    rng = np.random.default_rng(seed)
    if distribution == "lognormal":
        weights = rng.lognormal(0.0, skew, size=num_clients)
    else:
        weights = rng.pareto(skew, size=num_clients) + 1.0
    sizes = min_size + largest_remainder(len(labels) - num_clients * min_size, weights)
    order = rng.permutation(len(labels))
    owners = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)
    return Ragged.group(order, owners, num_clients)


def pathological(
    labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int
) -> Ragged:
    """Exactly ``k = classes_per_client`` distinct classes per client (the pathological split of
    the personalized-FL tables: FedRep, FedBABU, PFLlib with 2 classes per client). Client c
    holds positions ``c k .. c k + k - 1`` of a sequence of seeded permutations of the ``C``
    classes laid end to end (:func:`_class_slots`: a permutation is redrawn while it would give a
    client one class twice), so every class is held by ``floor(N k / C)`` or one more clients;
    each class's samples, shuffled, are split as evenly as possible among its holders (by client
    id, :func:`largest_remainder`).

    >>> labels = np.repeat(np.arange(4), 6)
    >>> parts = pathological(labels, num_clients=4, classes_per_client=2, seed=0)
    >>> [sorted(set(labels[p].tolist())) for p in parts]
    [[0, 2], [1, 3], [2, 3], [0, 1]]
    >>> parts.sizes().tolist()
    [6, 6, 6, 6]
    """
    classes = np.unique(labels)
    require(
        1 <= classes_per_client <= len(classes),
        "data.classes_per_client", classes_per_client,
        f"an integer in [1, {len(classes)}] (the classes in the data)",
    )  # fmt: skip
    if num_clients * classes_per_client < len(classes):
        raise ConfigurationError(
            f"num_clients * classes_per_client = {num_clients * classes_per_client} is fewer than "
            f"the {len(classes)} classes: some class would have no client; raise either"
        )
    rng = np.random.default_rng(seed)
    held_by = _class_slots(classes, num_clients, classes_per_client, rng)  # clients x k labels
    values, owners = [], []
    for c in classes:
        holders = np.flatnonzero((held_by == c).any(axis=1))
        members = rng.permutation(np.flatnonzero(labels == c))
        if len(members) < len(holders):
            raise ConfigurationError(
                f"class {int(c)} has {len(members)} samples for its {len(holders)} clients: "
                "lower num_clients or classes_per_client"
            )
        sizes = largest_remainder(len(members), np.ones(len(holders)))
        values.append(members)
        owners.append(np.repeat(holders, sizes))
    return Ragged.group(np.concatenate(values), np.concatenate(owners), num_clients)


def _class_slots(
    classes: np.ndarray, num_clients: int, k: int, rng: np.random.Generator, tries: int = 1000
) -> np.ndarray:
    """``num_clients x k`` class labels: consecutive windows of seeded permutations of
    ``classes`` laid end to end, each client's ``k`` distinct (a permutation that would repeat a
    class within the window crossing into it is redrawn)."""
    sequence: list[int] = []
    while len(sequence) < num_clients * k:
        for _ in range(tries):
            drawn = classes[rng.permutation(len(classes))].tolist()
            start = len(sequence) - len(sequence) % k  # the window crossing the boundary
            window = sequence[start:] + drawn[: k - (len(sequence) - start)]
            if len(set(window)) == len(window):
                break
        else:  # k <= C: some permutation always fits; this guards the loop
            raise ConfigurationError(f"no class order gives {k} distinct classes per client")
        sequence += drawn
    return np.asarray(sequence[: num_clients * k]).reshape(num_clients, k)
