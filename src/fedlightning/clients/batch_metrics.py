"""Per-batch training metrics of one client fit, recorded by the objective and averaged by the
module (:meth:`fedlightning.clients.ClientModule.track`), the same way on every backend.

A fit step runs ``local_loss`` through :meth:`BatchMetrics.step`, which collects the values the
objective tracked during that call (``train_loss`` defaults to ``local_loss``'s value); the fit
adds them up (:meth:`BatchMetrics.add`) and :meth:`BatchMetrics.means` gives each metric's mean
over the batches that recorded it. The cohort backend runs ``step`` inside its vectorized call,
returns the values per client and adds each client's sums before its ``client_metrics()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class BatchMetrics:
    """Sums and counts of the values tracked in one client's fit steps."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, int] = {}
        self._step: dict[str, Tensor] | None = None

    def record(self, name: str, value: Tensor | float) -> None:
        """``value`` as this step's ``name`` (a later record of the same name in the step wins);
        ignored outside a step (``local_loss`` called directly)."""
        if self._step is None:
            return
        value = torch.as_tensor(value).detach()
        if value.numel() != 1:
            raise ValueError(
                f"track({name!r}, value): value must hold one number per batch, got shape "
                f"{tuple(value.shape)}"
            )
        self._step[name] = value.reshape(())

    def step(self, loss: Callable[[Any], Tensor], batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """``(loss(batch), this step's tracked values)``; ``train_loss`` is the loss's value
        unless the objective tracked ``train_loss`` itself."""
        self._step = {}
        try:
            value = loss(batch)
            tracked = self._step
        finally:
            self._step = None
        tracked.setdefault("train_loss", value.detach().reshape(()))
        return value, tracked

    def add(self, name: str, total: Tensor, count: int = 1) -> None:
        """Add ``total`` (the sum of ``count`` batches' values) to ``name``; summed in at least
        float32, as a tensor (read, a device sync, only by :meth:`means`)."""
        total = total.to(torch.promote_types(total.dtype, torch.float32))
        self.sums[name] = self.sums[name] + total if name in self.sums else total
        self.counts[name] = self.counts.get(name, 0) + count

    def means(self) -> dict[str, float]:
        """Each tracked metric's mean over the batches that recorded it."""
        return {name: float(self.sums[name]) / self.counts[name] for name in self.sums}
