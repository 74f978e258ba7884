"""One index array per client, stored flat: what a partition is, at any number of clients.

A list of one small array (or tensor) per client costs a Python object each (about 100 bytes for
a NumPy array, 500 for a tensor) and a Python call per client for every pass over it; with 100,000
clients that is tens of megabytes and seconds of start-up. :class:`Ragged` keeps every client's
indices in one flat array with offsets (the CSR layout), so whole-partition work (the clients x
classes table, the partition's hash, each sample's owner) is one vectorised pass, and a client's
indices are a view made on demand.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch


class Ragged(Sequence):
    """``len(offsets) - 1`` parts; part ``c`` is ``values[offsets[c]:offsets[c + 1]]``, a view.

    ``values`` is a 1-d NumPy array or torch tensor (parts are the same kind); ``offsets`` a
    non-decreasing int64 NumPy array starting at 0 and ending at ``len(values)``.

    >>> parts = Ragged.from_parts([np.array([4, 1]), np.array([], dtype=np.int64), np.array([7])])
    >>> len(parts), [part.tolist() for part in parts], parts.sizes().tolist()
    (3, [[4, 1], [], [7]], [2, 0, 1])
    >>> parts.owners().tolist()  # the part each value belongs to
    [0, 0, 2]
    >>> [part.tolist() for part in parts.sorted()]  # each part sorted
    [[1, 4], [], [7]]
    """

    def __init__(self, values: np.ndarray | torch.Tensor, offsets: np.ndarray) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or not len(offsets) or offsets[0] != 0 or offsets[-1] != len(values):
            raise ValueError(
                f"offsets must run from 0 to len(values)={len(values)}, got {offsets[:3]}..."
            )
        if (np.diff(offsets) < 0).any():
            raise ValueError("offsets must be non-decreasing")
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_parts(cls, parts: Sequence[Any]) -> Ragged:
        """From one int64 array per part (a Ragged is returned as it is)."""
        if isinstance(parts, Ragged):
            return parts
        arrays = [np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]
        values = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        return cls(values, _offsets(np.array([len(a) for a in arrays], dtype=np.int64)))

    @classmethod
    def group(cls, values: np.ndarray, owners: np.ndarray, num_parts: int) -> Ragged:
        """``values`` grouped by ``owners`` (each value's part, in ``[0, num_parts)``), each part
        sorted: the same as ``[np.sort(values[owners == c]) for c in range(num_parts)]``."""
        values = np.asarray(values, dtype=np.int64)
        owners = np.asarray(owners, dtype=np.int64)
        if len(owners) and (owners.min() < 0 or owners.max() >= num_parts):
            raise ValueError(f"owners must lie in [0, {num_parts})")
        order = np.lexsort((values, owners))
        return cls(values[order], _offsets(np.bincount(owners, minlength=num_parts)))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):  # a run of consecutive parts (step 1), as a Ragged
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("a Ragged slices with step 1 only")
            stop = max(start, stop)
            lo, hi = self.offsets[start], self.offsets[stop]
            return Ragged(self.values[lo:hi], self.offsets[start : stop + 1] - lo)
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"part {index} of {len(self)}")
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def __iter__(self) -> Iterator[Any]:
        for start, stop in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist(), strict=True):
            yield self.values[start:stop]

    def sizes(self) -> np.ndarray:
        """Each part's length (int64)."""
        return np.diff(self.offsets)

    def owners(self) -> np.ndarray:
        """The part each of ``values`` belongs to (int64, ``len(values)`` long)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes())

    def numpy(self) -> Ragged:
        """The same parts with NumPy values (a tensor's memory is shared, not copied)."""
        values = self.values
        return self if isinstance(values, np.ndarray) else Ragged(values.numpy(), self.offsets)

    def torch(self) -> Ragged:
        """The same parts with torch values (a NumPy array's memory is shared, not copied)."""
        values = self.values
        if isinstance(values, torch.Tensor):
            return self
        return Ragged(torch.from_numpy(np.ascontiguousarray(values)), self.offsets)

    def sorted(self) -> Ragged:
        """Each part sorted (NumPy values)."""
        values = np.asarray(self.numpy().values)
        return Ragged.group(values, self.owners(), len(self))

    def take(self, mask: np.ndarray) -> Ragged:
        """Each part restricted to the values where ``mask`` (one bool per value) holds, in
        order (NumPy values)."""
        mask = np.asarray(mask, dtype=bool)
        kept = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        return Ragged(np.asarray(self.numpy().values)[mask], kept[self.offsets])


def client_rows(
    parts: Ragged, x: torch.Tensor, y: torch.Tensor, client_ids: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, client_id)`` of the rows ``parts`` (torch values) gives ``client_ids`` (``None``:
    every part, as stored), by client.

    >>> parts = Ragged.from_parts([np.array([2]), np.array([0, 1])]).torch()
    >>> [t.tolist() for t in client_rows(parts, torch.arange(3) * 10, torch.arange(3), [1])]
    [[0, 10], [0, 1], [1, 1]]
    """
    if client_ids is None:
        idx, owners = parts.values, torch.from_numpy(parts.owners())
    else:
        ids = list(client_ids)
        chosen = [parts[c] for c in ids]
        idx = torch.cat(chosen) if chosen else parts.values[:0]
        sizes = torch.tensor([len(part) for part in chosen], dtype=torch.int64)
        owners = torch.repeat_interleave(torch.tensor(ids, dtype=torch.int64), sizes)
    return x[idx], y[idx], owners


def _offsets(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
