"""The Backend protocol: how a round's client fits are run.

The loop hands a backend the round's :class:`~fedlightning.protocol.ClientJob` objects and gets
back, per client, a :class:`~fedlightning.protocol.FitResult` or the exception its fit raised; it
knows nothing else about a backend. A backend runs fits with
:class:`fedlightning.fit.ClientFitter` (or, for the cohort backend, the objective's own
``local_loss`` vectorized over clients), so results never depend on the backend beyond
floating-point reassociation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fedlightning.protocol import ClientJob, FitConfig, FitResult

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule

#: what a backend returns for one round
RoundResults = dict[int, FitResult | BaseException]


class WorkerLost(RuntimeError):
    """The worker that ran (or was to run) a client fit died or was unavailable (an actor killed
    by the OS, a node lost). The client failed, but this is no evidence of a bug in the objective:
    the failure policy never stops a run for it."""


class Backend(ABC):
    """Runs client fits. Lifecycle: ``start`` once per run, ``run`` once per round, ``stop``.

    ``on_client_done`` (set by the loop) is called with each client's id when its fit ends
    (succeeded or failed), for the progress line of long rounds: after each fit (sequential), as
    each actor finishes (Ray), when a cohort's one vectorized fit ends (cohort), or when a
    SuperNode's reply arrives (Flower). A backend that delegates passes it on."""

    on_client_done: Callable[[int], None] | None = None

    def check(self, model: ClientModule, config: FitConfig) -> None:  # noqa: B027 (optional hook)
        """Raise a ConfigurationError if this backend cannot fit ``model`` under ``config``;
        called by the loop at start-up, before anything is written or trained."""

    @abstractmethod
    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig
    ) -> None:
        """Prepare to fit clients of ``model`` on ``datamodule`` (set up data, devices, workers)."""

    @abstractmethod
    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        """Fit every job's client; per client id, its result or the exception its fit raised
        (a :class:`~fedlightning.errors.ConfigurationError` may be raised instead: it ends the run)."""

    def stop(self) -> None:  # noqa: B027 (optional hook)
        """Release what ``start`` acquired (workers, devices); the backend may be started again."""
