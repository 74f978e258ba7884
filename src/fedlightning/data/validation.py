"""Data validation at load time: a data set that would train to garbage is refused before training.

Refused, naming the file (LEAF) or the client: non-finite inputs (NaN/Inf pixels or features),
labels that are not integers or lie outside ``[0, num_classes)``, an empty test set and a client
with no training samples. A NaN pixel otherwise turns every fit of its client into a NaN upload
and the run "succeeds" at chance accuracy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedlightning.errors import ConfigurationError

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule


def integer_labels(raw: object, where: str) -> np.ndarray:
    """``raw`` as int64 labels; refuse non-numeric, non-finite or fractional values (1.5 is not
    silently truncated to 1)."""
    try:
        values = np.asarray(raw, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(f"{where}: labels must be integers, got {err}") from None
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ConfigurationError(
            f"{where}: labels must be integers, got {float(values[first]):g} at position {first}"
        )
    return values.astype(np.int64)


def nonfinite_rows(x: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    """One bool per sample of ``x``: whether any of its values is NaN/Inf (checked ``chunk``
    samples at a time: ``isfinite`` makes temporaries the size of what it checks)."""
    flat = x.reshape(len(x), -1)
    bad = torch.zeros(len(x), dtype=torch.bool)
    for start in range(0, len(x), chunk):
        bad[start : start + chunk] = ~torch.isfinite(flat[start : start + chunk]).all(dim=1)
    return bad


def finite_inputs(x: np.ndarray | torch.Tensor, where: str) -> None:
    """Refuse NaN/Inf inputs, naming the first bad sample."""
    values = torch.as_tensor(x)
    if not values.is_floating_point():
        return
    bad = nonfinite_rows(values) if len(values) else None
    if bad is not None and bool(bad.any()):
        first = int(bad.nonzero()[0])
        raise ConfigurationError(
            f"{where}: {int(bad.sum())} sample(s) have NaN/Inf inputs (the first is sample "
            f"{first}): clean the data"
        )


def labels_in_range(y: torch.Tensor, num_classes: int, where: str) -> None:
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ConfigurationError(
            f"{where}: labels must lie in [0, {num_classes}), got range "
            f"[{int(y.min())}, {int(y.max())}]"
        )


def validate_datamodule(dm: FederatedDataModule) -> None:
    """Check a set-up data module: a non-empty, finite test set; every client has training
    samples with finite inputs; all labels in range."""
    data = dm.data
    name = f"data set {dm.dataset!r}"
    if len(data.test_y) == 0:
        raise ConfigurationError(
            f"{name} has an empty test set: the global test set needs at least one sample"
        )
    finite_inputs(data.test_x, f"{name}, test set")
    labels_in_range(data.test_y, dm.num_classes, f"{name}, test set")
    labels_in_range(data.train_y, dm.num_classes, f"{name}, training set")
    if data.train_x.is_floating_point():
        bad_rows = nonfinite_rows(data.train_x)
        if bool(bad_rows.any()):
            splits = [dm._train_idx] + ([dm._val_idx] if dm.val_from_test == 0 else [])
            bad_clients = np.unique(
                np.concatenate([s.owners()[bad_rows[s.values].numpy()] for s in splits])
            ).tolist()
            raise ConfigurationError(
                f"{name}: {int(bad_rows.sum())} training sample(s) have NaN/Inf inputs, held by "
                f"client(s) {bad_clients[:10]}{' ...' if len(bad_clients) > 10 else ''}: clean "
                "the data"
            )
    empty = np.flatnonzero(dm._train_idx.sizes() == 0)
    if len(empty):
        raise ConfigurationError(f"{name}: client {int(empty[0])} has no training samples")
