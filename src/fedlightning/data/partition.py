"""Federated partitions: pure functions of (labels, number of clients, parameters, seed).

Each partitioner returns one ``int64`` index array per client into the pool it was given; every
sample is assigned to exactly one client (docs/algorithms.md section 4). ``count_table`` turns a
partition into the clients x classes table that every run saves as ``partition.csv``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from fedlightning.errors import ConfigurationError, require

PARTITIONS = ("iid", "dirichlet", "shards", "natural")


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle all indices and split them into ``num_clients`` parts whose sizes differ by <= 1.

    >>> labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    >>> [part.tolist() for part in iid(labels, num_clients=3, seed=0)]
    [[2, 4, 7, 9], [0, 3, 5, 11], [1, 6, 8, 10]]
    """
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
    client is capped during the draw (docs/algorithms.md section 4 specifies plain resampling).

    >>> labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    >>> parts = dirichlet(labels, num_clients=2, beta=0.5, seed=0, min_size=2)
    >>> [part.tolist() for part in parts]
    [[7, 8, 9], [0, 1, 2, 3, 4, 5, 6, 10, 11]]
    >>> count_table(labels, parts, num_classes=3)
    array([[0, 1, 2],
           [4, 3, 2]])
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

    >>> labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    >>> parts = shards(labels, num_clients=3, shards_per_client=2, seed=0)
    >>> [part.tolist() for part in parts]
    [[4, 7, 8, 10], [0, 1, 2, 3], [5, 6, 9, 11]]
    >>> count_table(labels, parts, num_classes=3)  # each client: at most 2 classes
    array([[0, 2, 2],
           [4, 0, 0],
           [0, 2, 2]])
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


#: FML's Non-IID(k) (Shen et al. 2020, arXiv:2006.16765, experiments): label-sorted shards a client
#: of the ``shards`` partition; a higher level gives each client fewer shards, so fewer classes.
FML_NON_IID_SHARDS: dict[int, int] = {1: 6, 2: 4, 3: 2}


def fml_non_iid_shards(level: int) -> int:
    """``shards_per_client`` of FML's Non-IID(``level``): 6, 4 and 2 shards for Non-IID(1), (2)
    and (3) (docs/algorithms.md section 4). With 5 clients on MNIST, Non-IID(3) is 10 shards of
    6,000 sorted images, so each client holds about 2 digits.

    >>> [fml_non_iid_shards(level) for level in (1, 2, 3)]
    [6, 4, 2]
    """
    require(
        level in FML_NON_IID_SHARDS,
        "non_iid",
        level,
        "1, 2 or 3 (FML's Non-IID(1), (2), (3): 6, 4, 2 shards per client)",
    )
    return FML_NON_IID_SHARDS[level]


def natural(client_ids: Sequence[int] | np.ndarray) -> list[np.ndarray]:
    """A data set's own client ids (e.g. FEMNIST writers): client k owns the samples tagged k.

    ``client_ids`` holds, per sample, a client index in ``[0, num_clients)``.

    >>> [part.tolist() for part in natural([0, 1, 0, 2, 1])]
    [[0, 2], [1, 4], [3]]
    """
    client_ids = np.asarray(client_ids)
    num_clients = int(client_ids.max()) + 1 if len(client_ids) else 0
    parts = [np.flatnonzero(client_ids == k).astype(np.int64) for k in range(num_clients)]
    empty = [k for k, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ConfigurationError(f"natural partition leaves clients {empty[:10]} without samples")
    return parts


def count_table(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """The clients x classes matrix of sample counts of a partition.

    >>> count_table(np.array([0, 0, 1, 2]), [np.array([0, 2]), np.array([1, 3])], num_classes=3)
    array([[1, 1, 0],
           [1, 0, 1]])
    """
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]).astype(np.int64)


def label_entropy(table: np.ndarray) -> np.ndarray:
    """Per-client Shannon entropy (nats) of the label distribution: lower means more skew.

    >>> label_entropy(np.array([[2, 2], [4, 0]])).round(4).tolist()  # log 2 and 0
    [0.6931, 0.0]
    """
    probs = table / np.maximum(table.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probs > 0, -probs * np.log(probs), 0.0)
    return terms.sum(axis=1)


def partition_hash(parts: Sequence[np.ndarray]) -> str:
    """A short digest of a partition, stored in checkpoints to detect a changed data split.

    >>> partition_hash([np.array([0, 1]), np.array([2])])
    '63f3ba7526e7ecb6'
    >>> partition_hash([np.array([0]), np.array([1, 2])])  # the same samples, split otherwise
    'a692e6d897c32e0f'
    """
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
