"""Federated partitions: pure functions of (labels, number of clients, parameters, seed).

Each partitioner returns one ``int64`` index array per client into the pool it was given; every
sample is assigned to exactly one client (ALGORITHMS.md section 4). ``count_table`` turns a
partition into the clients x classes table that every run saves as ``partition.csv``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from fedlightning.errors import ConfigurationError

PARTITIONS = ("iid", "dirichlet", "shards", "natural")


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle all indices and split them into ``num_clients`` parts whose sizes differ by <= 1."""
    _check_num_clients(num_clients, len(labels))
    order = np.random.default_rng(seed).permutation(len(labels))
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    beta: float,
    seed: int,
    min_size: int = 10,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Label-skewed partition (Hsu et al. 2019, arXiv:1909.06335; NIID-Bench, arXiv:2102.02079).

    For every class c, proportions ``q_c ~ Dir(beta * 1_N)`` over the N clients decide how the
    class's (shuffled) samples are cut. The whole draw is repeated until every client holds at
    least ``min_size`` samples; smaller ``beta`` means more skew. Unlike NIID-Bench's code, no
    client is capped during the draw (ALGORITHMS.md section 4 specifies plain resampling).
    """
    if not beta > 0:
        raise ConfigurationError(f"dirichlet beta must be > 0, got {beta}")
    if min_size < 0:
        raise ConfigurationError(f"min_size must be >= 0, got {min_size}")
    _check_num_clients(num_clients, len(labels))
    if min_size * num_clients > len(labels):
        raise ConfigurationError(
            f"min_size={min_size} x num_clients={num_clients} exceeds the {len(labels)} samples "
            "available: lower min_size or num_clients"
        )
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(np.int64)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
        sizes = [sum(len(chunk) for chunk in part) for part in parts]
        if min(sizes) >= min_size:
            return [np.sort(np.concatenate(part)).astype(np.int64) for part in parts]
    raise ConfigurationError(
        f"dirichlet(beta={beta}) gave some client fewer than min_size={min_size} samples in "
        f"{max_tries} draws: raise beta, lower min_size or use fewer clients"
    )


def shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, seed: int
) -> list[np.ndarray]:
    """Pathological non-IID split of McMahan et al. 2017 (arXiv:1602.05629, section 3).

    Sort the indices by label (ties broken by a seeded shuffle), cut them into
    ``num_clients * shards_per_client`` shards of equal size (``np.array_split``: sizes differ by at
    most one so that every sample is assigned) and give each client ``shards_per_client`` shards
    chosen at random. A client therefore sees at most ``shards_per_client`` classes whenever every
    class is at least one shard long.
    """
    if shards_per_client < 1:
        raise ConfigurationError(f"shards_per_client must be >= 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    _check_num_clients(num_clients, len(labels))
    if num_shards > len(labels):
        raise ConfigurationError(
            f"num_clients * shards_per_client = {num_shards} shards exceeds the {len(labels)} samples"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(labels))
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(by_label, num_shards)
    owner_of_shard = rng.permutation(num_shards)
    return [
        np.sort(np.concatenate([pieces[s] for s in owner_of_shard[c::num_clients]])).astype(
            np.int64
        )
        for c in range(num_clients)
    ]


def natural(client_ids: Sequence[int] | np.ndarray) -> list[np.ndarray]:
    """A data set's own client ids (e.g. FEMNIST writers): client k owns the samples tagged k.

    ``client_ids`` holds, per sample, a client index in ``[0, num_clients)``.
    """
    client_ids = np.asarray(client_ids)
    num_clients = int(client_ids.max()) + 1 if len(client_ids) else 0
    parts = [np.flatnonzero(client_ids == k).astype(np.int64) for k in range(num_clients)]
    empty = [k for k, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ConfigurationError(f"natural partition leaves clients {empty[:10]} without samples")
    return parts


def count_table(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """The clients x classes matrix of sample counts of a partition."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]).astype(np.int64)


def label_entropy(table: np.ndarray) -> np.ndarray:
    """Per-client Shannon entropy (nats) of the label distribution: lower means more skew."""
    probs = table / np.maximum(table.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probs > 0, -probs * np.log(probs), 0.0)
    return terms.sum(axis=1)


def partition_hash(parts: Sequence[np.ndarray]) -> str:
    """A short digest of a partition, stored in checkpoints to detect a changed data split."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(np.asarray(part, dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


def _check_num_clients(num_clients: int, num_samples: int) -> None:
    if num_clients < 1:
        raise ConfigurationError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_samples:
        raise ConfigurationError(
            f"num_clients={num_clients} exceeds the {num_samples} training samples available"
        )
