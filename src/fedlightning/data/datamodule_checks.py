"""The ``data:`` section's checks (:class:`~fedlightning.data.datamodule.FederatedDataModule`):
one line naming the first bad option and what is allowed, before anything is loaded.
"""

from __future__ import annotations

from fedlightning.data.client_partition import PARTITION_NAMES
from fedlightning.data.sources import SOURCES
from fedlightning.errors import ConfigurationError, unknown_name


def check_data_options(
    dataset: str,
    partition: str,
    num_clients: int,
    beta: float,
    writer_min_samples: int,
    writer_top_k: int | None,
    writer_test_fraction: float | None,
    val_from_test: float,
    val_fraction: float,
    batch_size: int,
    eval_batch_size: int,
    resize: int | None,
    client_test_fraction: float = 0.0,
    min_batch_size: int = 1,
) -> None:
    """Raise :class:`~fedlightning.errors.ConfigurationError` on the first option out of range."""
    if dataset not in SOURCES:
        raise unknown_name("data set", dataset, SOURCES)
    if partition not in PARTITION_NAMES:
        raise ConfigurationError(
            f"unknown partition {partition!r}: choose one of {', '.join(PARTITION_NAMES)}"
        )
    if partition == "natural" and dataset not in ("femnist", "huggingface", "fedprox_synthetic"):
        raise ConfigurationError(
            f"partition 'natural' needs a data set with its own users (femnist, "
            f"fedprox_synthetic, or huggingface with source_options.client_column), got {dataset!r}"
        )
    if num_clients < 1:
        raise ConfigurationError(f"num_clients must be >= 1, got {num_clients}")
    if partition == "dirichlet" and not beta > 0:
        raise ConfigurationError(f"beta must be > 0 for the dirichlet partition, got {beta}")
    if writer_min_samples < 0 or (writer_top_k is not None and writer_top_k < 1):
        raise ConfigurationError(
            f"writer_min_samples must be >= 0 and writer_top_k null or >= 1, got "
            f"{writer_min_samples} and {writer_top_k}"
        )
    if writer_test_fraction is not None and not 0.0 < writer_test_fraction < 1.0:
        raise ConfigurationError(
            f"writer_test_fraction must be null or lie in (0, 1), got {writer_test_fraction}"
        )
    if not 0.0 <= val_from_test < 1.0:
        raise ConfigurationError(f"val_from_test must lie in [0, 1), got {val_from_test}")
    if not 0.0 <= client_test_fraction < 1.0:
        raise ConfigurationError(
            f"client_test_fraction must lie in [0, 1), got {client_test_fraction}"
        )
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigurationError(f"val_fraction must lie in [0, 1), got {val_fraction}")
    if batch_size < 1 or eval_batch_size < 1:
        raise ConfigurationError(
            f"batch_size and eval_batch_size must be >= 1, got {batch_size} and {eval_batch_size}"
        )
    if not 1 <= min_batch_size <= batch_size:
        raise ConfigurationError(
            f"min_batch_size must lie in [1, batch_size={batch_size}], got {min_batch_size}"
        )
    if resize is not None and resize < 1:
        raise ConfigurationError(f"resize must be a positive image size or null, got {resize}")
