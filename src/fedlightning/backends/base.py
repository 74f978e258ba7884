"""The Backend protocol: how a round's client fits are run.

The loop hands a backend the round's :class:`~fedlightning.protocol.ClientJob` objects and gets
back, per client, a :class:`~fedlightning.protocol.FitResult` or the exception its fit raised; it
knows nothing else about a backend. A backend runs fits with
:class:`fedlightning.fit.ClientFitter` (or, for the cohort backend, the objective's own
``local_loss`` vectorized over clients) and builds each result with
:func:`fedlightning.fit.fit_result`. The sequential, Ray and Flower backends give bitwise the same
results; the cohort gives the same up to floating-point reassociation, with two qualifications
(:mod:`fedlightning.backends.cohort`): networks that amplify rounding (small BatchNorm ResNets)
agree after one step and closely after a round but only in distribution over many rounds, and
dropout masks are not the sequential ones. The run's device and precision come resolved, once, as
a :class:`~fedlightning.compute.Compute` (a backend whose workers live in other processes sends
them the :class:`~fedlightning.protocol.FitConfig` instead, and each worker resolves its own).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fedlightning.errors import WorkerLost
from fedlightning.protocol import ClientJob, FitConfig, FitResult
from fedlightning.recorded_args import RecordsInitArgs

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.compute import Compute
    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.server.base import Aggregator

__all__ = ["Backend", "ClientDone", "RoundResults", "WorkerLost"]

#: what a backend returns for one round
RoundResults = dict[int, FitResult | BaseException]
#: called with a client id after each client fit (progress reports in long rounds)
ClientDone = Callable[[int], None]


class Backend(RecordsInitArgs, ABC):
    """Runs client fits. Lifecycle: ``check`` and ``start`` once per run, ``run`` once per round,
    ``stop``. The arguments a backend is constructed with are recorded
    (:mod:`fedlightning.recorded_args`).

    ``on_client_done`` (given to ``start``) is called with each client's id when its fit ends
    (succeeded or failed), for the progress line of long rounds: after each fit (sequential), as
    each actor finishes (Ray), when a cohort's one vectorized fit ends (cohort), or when a
    SuperNode's reply arrives (Flower). A backend that delegates passes it on."""

    on_client_done: ClientDone | None = None

    @property
    def individual_uploads(self) -> bool:
        """Whether the uploads :meth:`run` returns are the clients' own (an attack can replace
        a malicious one); False: stand-ins that carry only their sum (secure aggregation)."""
        return True

    def check(self, model: ClientModule, config: FitConfig, compute: Compute) -> None:  # noqa: B027 (optional hook)
        """Raise a ConfigurationError if this backend cannot fit ``model`` under ``config`` on
        ``compute``; called by the loop at start-up, before anything is written or trained."""

    def decide(  # noqa: B027 (optional hook)
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, clients_per_round: int, recorded: Any = None,
    ) -> None:  # fmt: skip
        """Settle what needs the run's data and device (:class:`~fedlightning.backends.
        AutoBackend` chooses its path); called by the loop at start-up once the data module and
        the objective are set up, before the run's identity is computed. ``recorded`` is the
        ``backend_results`` of the checkpoint a resume starts from (``None``: a new run)."""

    def check_aggregator(self, aggregator: Aggregator) -> None:  # noqa: B027 (optional hook)
        """Raise a ConfigurationError if this backend cannot serve ``aggregator`` (the Flower
        backend under secure aggregation delivers only the sum of the uploads); called by the loop
        at start-up after :meth:`check`, before anything is written or trained."""

    @abstractmethod
    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, on_client_done: ClientDone | None = None,
    ) -> None:  # fmt: skip
        """Prepare to fit clients of ``model`` on ``datamodule`` with ``config`` on ``compute``
        (set up data, devices, workers); ``on_client_done``, if given, is kept as
        :attr:`on_client_done`."""

    @abstractmethod
    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        """Fit every job's client; per client id, its result or the exception its fit raised
        (a :class:`~fedlightning.errors.ConfigurationError` may be raised instead: it ends the run)."""

    def stop(self) -> None:  # noqa: B027 (optional hook)
        """Release what ``start`` acquired (workers, devices); the backend may be started again."""
