"""What a round component reads of the run at start-up (docs/algorithms.md section 6.2)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from fedlightning.backends.base import Backend
from fedlightning.loop.options import RunOptions
from fedlightning.loop.summary import RunSummary
from fedlightning.protocol import FitConfig
from fedlightning.server.base import Aggregator
from fedlightning.state import ClientStore


@dataclass(frozen=True)
class RunContext:
    """The run as :meth:`~fedlightning.round_components.RoundComponent.setup` sees it: its
    options and parts, which a component may read at any point of the run and keep as
    attributes (they are the run's, not the component's state, and not watched as such).

    Attributes:
        options: the run's own options (``rounds``, ``seed``, ``client_sampling``,
            ``on_round_failure``, ``run_dir``...).
        fit_config: how every client fit runs, as the loop's options give it (``dp_sgd``...).
        aggregator: the run's aggregator (not set up yet: its state is built after start-up's
            checks).
        backend: the run's backend.
        store: the ClientStore (each client's persistent state).
        summary: the run summary (where a refused round is counted).
        num_clients: the number of clients N.
        clients_per_round: K, the clients sampled per round (``loop.clients_per_round``
            resolved).
        sampling_rate: q, the probability that a client takes part in a round.
        batch_size: B, the local training batch size of every client.
    """

    options: RunOptions
    fit_config: FitConfig
    aggregator: Aggregator
    backend: Backend
    store: ClientStore
    summary: RunSummary
    num_clients: int
    clients_per_round: int
    sampling_rate: float
    batch_size: int = 0

    def parts(self) -> list[object]:
        """This context and everything in it: what a component may hold that is not its state
        (:class:`~fedlightning.loop.components.watch.ComponentWatch` compares the objects by
        identity)."""
        return [self, *(getattr(self, f.name) for f in fields(self))]
