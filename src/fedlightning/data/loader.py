"""Mini-batches straight from in-memory tensors.

Client data sets are small and already tensors, so a ``DataLoader`` with its sampler, collate and
worker machinery costs more than the indexing it wraps. Lightning accepts any sized iterable as a
data loader.

A pass over ``n`` samples in batches of ``B`` is ``n // B`` full batches and a trailing batch of
the remaining ``n % B`` (:func:`batch_sizes`). With ``min_batch_size`` ``m``, a trailing batch of
fewer than ``m`` samples joins the batch before it (one batch of ``B + n % B`` samples), so no
sample is left out of an epoch and no step trains on a handful of samples: BatchNorm in training
mode normalises a batch by its own mean and variance, which two samples estimate badly and one not
at all (docs/algorithms.md section 4.1). A pass that is one batch keeps it, whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

import torch


def batch_sizes(
    n: int, batch_size: int, min_batch_size: int = 1, drop_last: bool = False
) -> list[int]:
    """The sizes of one pass's batches over ``n`` samples (module docstring): ``n // batch_size``
    batches of ``batch_size``, then the ``n % batch_size`` left over, dropped with ``drop_last``,
    joined to the batch before it when fewer than ``min_batch_size`` and there is one."""
    full, rest = divmod(n, batch_size)
    sizes = [batch_size] * full
    if rest and not drop_last:
        if sizes and rest < min_batch_size:
            sizes[-1] += rest
        else:
            sizes.append(rest)
    return sizes


class TensorBatches:
    """Iterate ``(x[idx], y[idx])`` batches; reshuffled at each pass from a seeded generator.

    The shuffle order depends only on ``seed`` and the number of passes so far, which keeps
    client fits reproducible regardless of what else used the global RNG. The batches' sizes are
    :func:`batch_sizes` (``min_batch_size``: a smaller trailing batch joins the one before it).
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        min_batch_size: int = 1,
    ) -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.x, self.y = x, y
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.min_batch_size = min_batch_size
        self._generator = torch.Generator().manual_seed(seed) if shuffle else None
        sizes = batch_sizes(len(y), batch_size, min_batch_size, drop_last)
        #: each batch's first and one-past-last row of a pass
        self._bounds = [
            (stop - size, stop) for size, stop in zip(sizes, accumulate(sizes), strict=True)
        ]

    def __len__(self) -> int:
        return len(self._bounds)

    def _order(self) -> torch.Tensor | None:
        """The next pass's row order (``None``: unshuffled), one draw from the generator."""
        if not self.shuffle:
            return None
        return torch.randperm(len(self.y), generator=self._generator)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order()
        x, y = (self.x, self.y) if order is None else (self.x[order], self.y[order])
        for start, stop in self._bounds:
            yield x[start:stop], y[start:stop]

    def batch_rows(self) -> list[torch.Tensor]:
        """The row indices into ``(x, y)`` of each batch of the next pass: the batches iterating
        would yield, with the same draw from the generator (the cohort backend indexes a whole
        round's batches on the device from these)."""
        order = self._order()
        order = torch.arange(len(self.y)) if order is None else order
        return [order[start:stop] for start, stop in self._bounds]


def device_copy(
    x: torch.Tensor, y: torch.Tensor, device: torch.device, max_fraction: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(x, y)`` copied to ``device`` if they take at most ``max_fraction`` of its free memory
    (checked on CUDA devices), else ``None``."""
    size = x.element_size() * x.numel() + y.element_size() * y.numel()
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if size > max_fraction * free:
            return None
    return x.to(device), y.to(device)
