"""How many clients of a cohort train together: chunks sized from the free memory
(docs/algorithms.md section 9.2).

A cohort holds every client's parameters, gradients, optimizer state, round context and
activations at once. The first cohort of an architecture group tries all its clients; when a
chunk runs out of device memory (``torch.cuda.OutOfMemoryError``), nothing of it is kept (its
clients' fits are pure functions of their jobs) and it runs again with half the clients, until one
fits. Later chunks are sized from what fitted: the clients that fitted, scaled by the free memory
now over the free memory then, never more. Results do not depend on the chunking beyond float
rounding of the batched kernels and the dropout masks (seeded per chunk).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

log = logging.getLogger("fedlightning")


def free_memory(device: torch.device) -> int:
    """Bytes a cohort can still allocate on ``device``: the device's free memory plus what
    torch's caching allocator holds unused (1 off a CUDA device, where memory is not sized)."""
    if device.type != "cuda":
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


@dataclass
class Attempt:
    """Whether a chunk fitted (set when its block ends without running out of memory)."""

    fitted: bool = False

    def __bool__(self) -> bool:
        return self.fitted


class ChunkSizes:
    """The chunk sizes of a run's cohorts, per architecture group (any hashable key, e.g. its
    state_dict keys; module docstring)."""

    def __init__(self) -> None:
        #: per group: the clients of the largest chunk that fitted and the free memory before it
        self.fitted: dict[Hashable, tuple[int, int]] = {}

    def size(self, group: Hashable, remaining: int, device: torch.device) -> int:
        """The clients of the next chunk of ``group``, ``remaining`` clients left to train."""
        if group not in self.fitted:
            return remaining
        clients, free_then = self.fitted[group]
        scale = min(1.0, free_memory(device) / free_then)
        return max(1, min(remaining, int(clients * scale)))

    @contextmanager
    def attempt(self, group: Hashable, clients: int, device: torch.device) -> Iterator[Attempt]:
        """Train a chunk of ``clients`` clients of ``group`` in the block; running out of memory
        there halves the group's chunk size (the block's :class:`Attempt` stays false) unless the
        chunk is one client already."""
        outcome, free = Attempt(), free_memory(device)
        try:
            yield outcome
        except torch.cuda.OutOfMemoryError:
            if clients == 1:
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            self.fitted[group] = (clients // 2, free)
            log.info("cohort: %d clients ran out of memory; chunks of %d", clients, clients // 2)
            return
        outcome.fitted = True
        if group not in self.fitted or self.fitted[group][0] < clients:
            self.fitted[group] = (clients, free)
