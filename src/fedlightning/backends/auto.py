"""``loop.backend: auto`` (the default): the cohort path where it is supported and faster.

The rule, decided once at start-up and logged (``backend: auto chose ...``):

1. on the CPU: always :class:`SequentialBackend`. A CPU runs one client's matrix products at
   near its full rate already, so stacking clients gains little and the vmap bookkeeping can cost
   more than it saves (the issue measured the quickstart's cohort rounds at 1.8x the sequential
   ones; ``benchmarks/cohort.py`` prints the ratio on any machine). Sequential is never the slower
   choice by much, and it is bitwise the path the tests pin down;
2. on an accelerator: :class:`CohortBackend` when its ``check`` accepts the objective, optimizer,
   precision and network; otherwise :class:`SequentialBackend`, with the cohort's refusal as the
   reason in the log line. There a small model is latency-bound and one vmapped step for all
   clients replaces one kernel launch chain per client.

Both backends give the same results up to floating-point reassociation, so the choice never
changes what a run computes beyond that (and on the CPU, nothing at all).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lightning.fabric import Fabric

from fedlightning.backends.base import Backend, RoundResults
from fedlightning.backends.cohort import CohortBackend
from fedlightning.backends.sequential import SequentialBackend
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import ClientJob, FitConfig

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule

log = logging.getLogger("fedlightning")


def choose_backend(model: ClientModule, config: FitConfig) -> tuple[Backend, str]:
    """``(backend, reason)`` by the rule of the module docstring."""
    device = Fabric(accelerator=config.accelerator, devices=1).device
    if device.type == "cpu":
        return SequentialBackend(), "on the CPU the cohort path is slower than sequential fits"
    cohort = CohortBackend()
    try:
        cohort.check(model, config)
    except ConfigurationError as refusal:
        return SequentialBackend(), str(refusal).split(": ", 1)[-1].split(";")[0]
    return cohort, f"all sampled clients vectorized in one step on {device.type}"


class AutoBackend(Backend):
    """Chooses :class:`CohortBackend` or :class:`SequentialBackend` at ``check`` (see the module
    docstring) and delegates to it; ``chosen`` is the backend in use."""

    def __init__(self) -> None:
        self.chosen: Backend | None = None
        self.reason = ""

    def check(self, model: ClientModule, config: FitConfig) -> None:
        self.chosen, self.reason = choose_backend(model, config)
        self.chosen.check(model, config)

    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig
    ) -> None:
        if self.chosen is None:
            self.check(model, config)
        assert self.chosen is not None
        # said once the run starts (every start-up check passed): a refused run prints its error only
        message = f"backend: auto chose {type(self.chosen).__name__} ({self.reason})"
        log.info(message)
        print(message, file=sys.stderr)  # the run's console line, beside the loop's done line
        self.chosen.on_client_done = self.on_client_done  # the loop set it on this backend
        self.chosen.start(model, datamodule, config)

    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        assert self.chosen is not None, "start() first"
        return self.chosen.run(round_index, jobs)

    def stop(self) -> None:
        if self.chosen is not None:
            self.chosen.stop()
