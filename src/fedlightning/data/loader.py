"""Mini-batches straight from in-memory tensors.

Client data sets are small and already tensors, so a ``DataLoader`` with its sampler, collate and
worker machinery costs more than the indexing it wraps. Lightning accepts any sized iterable as a
data loader.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class TensorBatches:
    """Iterate ``(x[idx], y[idx])`` batches; reshuffled at each pass from a seeded generator.

    The shuffle order depends only on ``seed`` and the number of passes so far, which keeps
    client fits reproducible regardless of what else used the global RNG.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.x, self.y = x, y
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._generator = torch.Generator().manual_seed(seed) if shuffle else None

    def __len__(self) -> int:
        n = len(self.y)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self) -> torch.Tensor | None:
        """The next pass's row order (``None``: unshuffled), one draw from the generator."""
        if not self.shuffle:
            return None
        return torch.randperm(len(self.y), generator=self._generator)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order()
        x, y = (self.x, self.y) if order is None else (self.x[order], self.y[order])
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield x[start : start + self.batch_size], y[start : start + self.batch_size]

    def batch_rows(self) -> list[torch.Tensor]:
        """The row indices into ``(x, y)`` of each batch of the next pass: the batches iterating
        would yield, with the same draw from the generator (the cohort backend indexes a whole
        round's batches on the device from these)."""
        order = self._order()
        order = torch.arange(len(self.y)) if order is None else order
        stops = range(0, len(self) * self.batch_size, self.batch_size)
        return [order[start : start + self.batch_size] for start in stops]


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
