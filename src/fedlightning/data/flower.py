"""Flower Datasets' partitioners by name (``data.partition: flwr.dirichlet`` ...), beside the
built-in ones of :mod:`fedlightning.data.partition`.

The partitioner is built from ``flwr_datasets.partitioner`` (public API) with ``num_partitions =
data.num_clients``, ``partition_by = "label"`` and ``seed`` = the run's partition seed unless
``data.partition_options`` sets them; ``partition_options`` passes any other constructor argument
(``alpha``, ``num_classes_per_partition``, ``num_shards_per_partition``, ``min_partition_size``
...). The partitioner sees a small ``datasets.Dataset`` of the training labels (``label``), the
natural client ids (``client``, when the source has them) and each sample's position, and each
client's part is read back with ``load_partition``: the split is Flower's, the tensors stay
fedlightning's. Needs ``flwr-datasets`` (``pip install flwr-datasets``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from fedlightning.errors import ConfigurationError

#: partition name -> Flower Datasets partitioner class name
FLOWER_PARTITIONERS = {
    "flwr.iid": "IidPartitioner",
    "flwr.dirichlet": "DirichletPartitioner",
    "flwr.pathological": "PathologicalPartitioner",
    "flwr.shard": "ShardPartitioner",
    "flwr.natural_id": "NaturalIdPartitioner",
    "flwr.linear": "LinearPartitioner",
    "flwr.square": "SquarePartitioner",
    "flwr.exponential": "ExponentialPartitioner",
    "flwr.inner_dirichlet": "InnerDirichletPartitioner",
}


#: pyarrow >= 25 deprecates the ``null_placement`` argument of ``SortOptions`` that Flower
#: Datasets' sorting partitioners (``ShardPartitioner``) pass; a user cannot act on it
PYARROW_SORT_DEPRECATION = r"Specifying null_placement in SortOptions is deprecated"


@contextmanager
def _quiet_pyarrow_sort() -> Iterator[None]:
    """Ignore pyarrow's FutureWarning about ``SortOptions(null_placement=...)`` (by message and
    category) around Flower's partitioning; any other warning passes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PYARROW_SORT_DEPRECATION, category=FutureWarning)
        yield


def flower_available() -> bool:
    try:
        import flwr_datasets.partitioner  # noqa: F401
    except ImportError:
        return False
    return True


def flower_partition(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    options: dict[str, Any] | None = None,
    client_ids: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The training-sample indices of each client under Flower's partitioner ``name``."""
    if name not in FLOWER_PARTITIONERS:
        raise ConfigurationError(
            f"unknown partition {name!r}: the Flower ones are {', '.join(FLOWER_PARTITIONERS)}"
        )
    try:
        from flwr_datasets import partitioner as flwr_partitioners
    except ImportError as error:
        raise ConfigurationError(
            f"data.partition={name!r} needs Flower Datasets: pip install flwr-datasets"
        ) from error
    import datasets

    kind = getattr(flwr_partitioners, FLOWER_PARTITIONERS[name])
    kwargs = _partitioner_kwargs(name, kind, options, num_clients, seed, client_ids)
    columns: dict[str, Any] = {"label": labels.tolist(), "position": np.arange(len(labels))}
    if client_ids is not None:
        columns["client"] = [str(c) for c in client_ids]
    try:
        partitioner = kind(**kwargs)
        partitioner.dataset = datasets.Dataset.from_dict(columns)
        with _quiet_pyarrow_sort():
            count = partitioner.num_partitions
            parts = [
                np.sort(np.asarray(partitioner.load_partition(i)["position"], dtype=np.int64))
                for i in range(count)
            ]
    except (ValueError, TypeError) as error:
        raise ConfigurationError(f"data.partition={name!r} ({kind.__name__}): {error}") from error
    if name == "flwr.natural_id":
        if num_clients > len(parts):
            raise ConfigurationError(
                f"num_clients={num_clients} exceeds the {len(parts)} natural clients of the data"
            )
        parts = parts[:num_clients]
    empty = [i for i, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ConfigurationError(f"{kind.__name__} left clients {empty[:10]} without samples")
    return parts


def _partitioner_kwargs(
    name: str,
    kind: type,
    options: dict[str, Any] | None,
    num_clients: int,
    seed: int,
    client_ids: np.ndarray | None,
) -> dict[str, Any]:
    """The constructor arguments of the Flower partitioner class ``kind``: the user's ``options``,
    then ``num_partitions``, ``partition_by`` (the label, or the client for ``flwr.natural_id``)
    and ``seed`` where ``kind`` takes them; one line naming any option it does not take."""
    parameters = inspect.signature(kind).parameters
    kwargs = dict(options or {})
    defaults = {"num_partitions": num_clients, "partition_by": "label", "seed": seed}
    if name == "flwr.natural_id":
        if client_ids is None:
            raise ConfigurationError(
                "data.partition='flwr.natural_id' needs a source with natural clients "
                "(femnist, or huggingface with source_options.client_column)"
            )
        defaults["partition_by"] = "client"
    for key, value in defaults.items():
        if key in parameters:
            kwargs.setdefault(key, value)
    unknown = sorted(set(kwargs) - set(parameters))
    if unknown:
        raise ConfigurationError(
            f"data.partition_options {unknown} are not arguments of {kind.__name__}: "
            f"it takes {', '.join(p for p in parameters)}"
        )
    return kwargs
