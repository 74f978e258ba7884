"""Federated partitions: pure functions of (labels, number of clients, parameters, seed).

Each partitioner returns one sorted ``int64`` index array per client into the pool it was given,
as a :class:`~fedlightning.data.ragged.Ragged` (a sequence of arrays stored flat: vectorised at
any number of clients); every sample is assigned to exactly one client (docs/algorithms.md section
4). ``count_table`` turns a partition into the clients x classes table that every run saves as
``partition.csv``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedlightning.data.ragged import Ragged
from fedlightning.errors import ConfigurationError, require

PARTITIONS = ("iid", "dirichlet", "shards", "natural")


def iid(labels: np.ndarray, num_clients: int, seed: int) -> Ragged:
    """Shuffle all indices and split them into ``num_clients`` parts whose sizes differ by <= 1.

    >>> labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    >>> [part.tolist() for part in iid(labels, num_clients=3, seed=0)]
    [[2, 4, 7, 9], [0, 3, 5, 11], [1, 6, 8, 10]]
    """
    _check_num_clients(num_clients, len(labels))
    order = np.random.default_rng(seed).permutation(len(labels))
    # np.array_split's cut: the first len % num_clients parts are one longer
    return Ragged.group(order, _chunk_owners(len(order), num_clients), num_clients)


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    beta: float,
    seed: int,
    min_size: int = 10,
    max_tries: int = 1000,
) -> Ragged:
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
        values, owners = [], []
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(np.int64)
            # np.split(idx, cuts)'s chunks (cuts never decrease): position j goes to the client
            # whose chunk [cuts[k-1], cuts[k]) holds it
            values.append(idx)
            owners.append(np.searchsorted(cuts, np.arange(len(idx)), side="right"))
        owner = np.concatenate(owners)
        if np.bincount(owner, minlength=num_clients).min() >= min_size:
            return Ragged.group(np.concatenate(values), owner, num_clients)
    raise ConfigurationError(
        f"dirichlet(beta={beta}) gave some client fewer than min_size={min_size} samples in "
        f"{max_tries} draws: raise beta, lower min_size or use fewer clients"
    )


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, seed: int) -> Ragged:
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
    # np.array_split(by_label, num_shards)'s shards; client c gets shards owner_of_shard[c::N],
    # i.e. the shard at position j of owner_of_shard goes to client j % N
    owner_of_shard = rng.permutation(num_shards)
    client_of_shard = np.empty(num_shards, np.int64)
    client_of_shard[owner_of_shard] = np.arange(num_shards) % num_clients
    owners = client_of_shard[_chunk_owners(len(by_label), num_shards)]
    return Ragged.group(by_label, owners, num_clients)


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


def natural(client_ids: Sequence[int] | np.ndarray) -> Ragged:
    """A data set's own client ids (e.g. FEMNIST writers): client k owns the samples tagged k.

    ``client_ids`` holds, per sample, a client index in ``[0, num_clients)``.

    >>> [part.tolist() for part in natural([0, 1, 0, 2, 1])]
    [[0, 2], [1, 4], [3]]
    """
    client_ids = np.asarray(client_ids, dtype=np.int64)
    num_clients = int(client_ids.max()) + 1 if len(client_ids) else 0
    parts = Ragged.group(np.arange(len(client_ids)), client_ids, num_clients)
    empty = np.flatnonzero(parts.sizes() == 0)
    if len(empty):
        raise ConfigurationError(
            f"natural partition leaves clients {empty[:10].tolist()} without samples"
        )
    return parts


def count_table(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """The clients x classes matrix of sample counts of a partition.

    >>> count_table(np.array([0, 0, 1, 2]), [np.array([0, 2]), np.array([1, 3])], num_classes=3)
    array([[1, 1, 0],
           [1, 0, 1]])
    """
    rows = Ragged.from_parts(parts).numpy()
    picked = np.asarray(labels)[rows.values]
    if len(picked) and (picked.min() < 0 or picked.max() >= num_classes):
        raise ConfigurationError(
            f"labels must lie in [0, {num_classes}) for a clients x classes table, got range "
            f"[{picked.min()}, {picked.max()}]"
        )
    cells = rows.owners() * num_classes + picked
    counts = np.bincount(cells, minlength=len(rows) * num_classes)
    return counts.reshape(len(rows), num_classes).astype(np.int64)


def label_entropy(table: np.ndarray) -> np.ndarray:
    """Per-client Shannon entropy (nats) of the label distribution: lower means more skew.

    >>> label_entropy(np.array([[2, 2], [4, 0]])).round(4).tolist()  # log 2 and 0
    [0.6931, 0.0]
    """
    probs = table / np.maximum(table.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probs > 0, -probs * np.log(probs), 0.0)
    return terms.sum(axis=1)


def write_count_table(table: np.ndarray, path: str | Path) -> None:
    """Write a clients x classes table as CSV (``client,class_0,...``), a few rows at a time (any
    number of clients)."""
    with open(path, "w") as handle:
        handle.write("client," + ",".join(f"class_{c}" for c in range(table.shape[1])) + "\n")
        for start in range(0, len(table), 4096):
            rows = table[start : start + 4096].tolist()
            handle.writelines(
                f"{start + i}," + ",".join(map(str, row)) + "\n" for i, row in enumerate(rows)
            )


def partition_hash(parts: Sequence[np.ndarray]) -> str:
    """A short digest of a partition, stored in checkpoints to detect a changed data split.

    >>> partition_hash([np.array([0, 1]), np.array([2])])
    '63f3ba7526e7ecb6'
    >>> partition_hash([np.array([0]), np.array([1, 2])])  # the same samples, split otherwise
    'a692e6d897c32e0f'
    """
    rows = Ragged.from_parts(parts).numpy()
    digest = hashlib.sha256()
    for start in range(0, len(rows), 65536):  # every part's int64 bytes, then b"|"
        chunk = rows[start : start + 65536]
        values = np.ascontiguousarray(chunk.values, dtype=np.int64).view(np.uint8)
        data = np.full(len(values) + len(chunk), ord("|"), dtype=np.uint8)
        is_value = np.ones(len(data), dtype=bool)
        is_value[chunk.offsets[1:] * 8 + np.arange(len(chunk))] = False
        data[is_value] = values
        digest.update(data)
    return digest.hexdigest()[:16]


def _chunk_owners(length: int, num_chunks: int) -> np.ndarray:
    """Which of ``np.array_split(range(length), num_chunks)``'s chunks each position falls in."""
    size, longer = divmod(length, num_chunks)
    sizes = np.full(num_chunks, size, dtype=np.int64)
    sizes[:longer] += 1
    return np.repeat(np.arange(num_chunks, dtype=np.int64), sizes)


def _check_num_clients(num_clients: int, num_samples: int) -> None:
    if num_clients < 1:
        raise ConfigurationError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_samples:
        raise ConfigurationError(
            f"num_clients={num_clients} exceeds the {num_samples} training samples available"
        )
