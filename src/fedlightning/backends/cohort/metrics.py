"""The values an objective tracks in the cohort's vectorized steps, summed per client.

Inside the cohort's ``vmap`` each client's ``local_loss`` runs through its module's
:meth:`~fedlightning.clients.batch_metrics.BatchMetrics.step`, which returns the values tracked in
that step (``train_loss`` included) per client. :class:`StackedMetrics` adds them up per client the
way :meth:`~fedlightning.clients.batch_metrics.BatchMetrics.add` adds one client's (the same
dtypes, the same order), on the device and in place, with no host synchronisation per step (a
captured step replays these additions: docs/algorithms.md section 9.2), and hands each client's
sums to its module before its ``client_metrics()``: the means come out of the same code on every
backend.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedlightning.clients.batch_metrics import BatchMetrics


class StackedMetrics:
    """Per-client sums and counts (batches that recorded the value), on the cohort's device."""

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, Tensor] = {}
        self._host_counts: dict[str, list[int]] | None = None

    def add(self, tracked: dict[str, Tensor], index: Tensor | None = None) -> None:
        """Add one step's ``tracked`` values of the clients ``index`` (``None``: all) to their
        sums."""
        for name, values in tracked.items():
            values = values.detach().to(torch.promote_types(values.dtype, torch.float32))
            if name not in self.sums:
                self.sums[name] = values.new_zeros(self.num_clients)
                self.counts[name] = torch.zeros_like(self.sums[name], dtype=torch.long)
            if index is None:
                self.sums[name] += values
                self.counts[name] += 1
            else:
                self.sums[name][index] += values
                self.counts[name][index] += 1

    def load(self, i: int, metrics: BatchMetrics) -> None:
        """Give client ``i``'s sums to its module's ``metrics`` (after the round's last step: the
        counts are read back once)."""
        if self._host_counts is None:
            self._host_counts = {name: counts.tolist() for name, counts in self.counts.items()}
        for name, sums in self.sums.items():
            count = self._host_counts[name][i]
            if count:
                metrics.add(name, sums[i], count)
