"""The training pool dealt to the clients by partition name (docs/algorithms.md section 4): ours
(:mod:`fedlightning.data.partition`) or a Flower Datasets partitioner
(:mod:`fedlightning.data.flower`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlightning.data import partition as P
from fedlightning.data import skew
from fedlightning.data.flower import FLOWER_PARTITIONERS, flower_partition
from fedlightning.data.ragged import Ragged
from fedlightning.errors import ConfigurationError

#: every partition name the ``data:`` section accepts
PARTITION_NAMES: tuple[str, ...] = (
    *P.PARTITIONS, "quantity", "pathological", *FLOWER_PARTITIONERS,
)  # fmt: skip


def partition_clients(
    partition: str,
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    beta: float,
    min_size: int,
    shards_per_client: int,
    partition_options: dict[str, Any],
    client_ids: np.ndarray | None,
    skew_options: dict[str, Any] | None = None,
) -> Ragged:
    """Each client's rows of the training pool (``labels``): ``iid``, ``dirichlet`` (``beta``,
    ``min_size``), ``shards`` (``shards_per_client``), ``quantity`` (``skew_options``'
    ``distribution`` and ``skew``, ``min_size``: :func:`~fedlightning.data.skew.quantity_skew`),
    ``pathological`` (``skew_options``' ``classes_per_client``:
    :func:`~fedlightning.data.skew.pathological`), a ``flwr.*`` partitioner (with
    ``partition_options``) or ``natural`` (the first ``num_clients`` of the data's own users,
    ``client_ids``)."""
    options = skew_options or {}
    if partition == "iid":
        return P.iid(labels, num_clients, seed)
    if partition == "dirichlet":
        return P.dirichlet(labels, num_clients, beta, seed, min_size=min_size)
    if partition == "shards":
        return P.shards(labels, num_clients, shards_per_client, seed)
    if partition == "quantity":
        return skew.quantity_skew(
            labels, num_clients, seed, options.get("distribution", "lognormal"),
            options.get("skew", 1.0), min_size,
        )  # fmt: skip
    if partition == "pathological":
        return skew.pathological(labels, num_clients, options.get("classes_per_client", 2), seed)
    if partition in FLOWER_PARTITIONERS:
        return Ragged.from_parts(
            flower_partition(partition, labels, num_clients, seed, partition_options, client_ids)
        )
    if client_ids is None:
        raise ConfigurationError(
            "partition 'natural' needs each sample's client: set data.source_options.client_column"
        )
    parts = P.natural(client_ids)
    if num_clients > len(parts):
        raise ConfigurationError(
            f"num_clients={num_clients} exceeds the {len(parts)} writers in the LEAF data"
        )
    return parts[:num_clients]
