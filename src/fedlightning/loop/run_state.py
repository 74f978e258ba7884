"""What start-up resolved for one ``FederatedLoop.fit``: the :class:`RunState` the rounds consume.

:func:`fedlightning.loop.startup.prepare_run` builds it (every check passed, nothing written
yet); the loop keeps it for the length of the run, and the checkpoint writer updates
``last_checkpoint``. The loop's
own attributes are its options and its components, all set in ``FederatedLoop.__init__``: no
start-up function assigns them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedlightning.compute import Compute
from fedlightning.loop.scoring_model import ScoringModel
from fedlightning.loop.server_device import ServerDevice
from fedlightning.protocol import FitConfig
from fedlightning.round_components import RoundComponent

if TYPE_CHECKING:  # its package imports this module (the checkpoint writer)
    from fedlightning.loop.components.context import RunContext


@dataclass
class RunState:
    """One run's resolved state.

    Attributes:
        clients_per_round: K, the clients sampled per round (``loop.clients_per_round`` resolved
            against the number of clients).
        sampling_rate: q, the probability that a client takes part in a round (K / N, or the
            fraction given; the rate of ``loop.client_sampling: poisson``).
        compute: the run's device, precision and autocast, resolved once; the backend, the
            evaluation and the server placement read it.
        server: places the server state on ``compute.device``.
        identity: the run's identity, stored in every checkpoint and compared on resume
            (:mod:`fedlightning.loop.identity`).
        checkpoint: the checkpoint read from ``ckpt_path`` (``None``: a new run) without its
            server and client state, which start-up loaded into the aggregator and the
            ClientStore; the loop restores its records from it, and its RNG states when the
            rounds start.
        resumes_in_place: the run resumes from a checkpoint in its own run directory (and so
            continues the results there).
        first_round: the 0-based round the run starts at (the checkpoint's rounds done, or 0).
        last_checkpoint: ``(rounds done, path)`` of the newest checkpoint that resumes this run
            (the one resumed from until the run writes its own); ``None``: none yet.
        fit_config: how every client fit runs: the loop's, as the round components left it (the
            clients a label-flipping attack poisons); the backend receives it.
        scoring: what every evaluation scores the deployables with, and what ``models.pt``
            records (:mod:`fedlightning.loop.scoring_model`).
        components: the run's round components, in order (:mod:`fedlightning.loop.components`,
            docs/algorithms.md section 6.2).
        context: what the components' ``setup`` read of the run.
        nothing_to_train: the resumed checkpoint already has ``loop.rounds`` rounds done: the run
            writes nothing (decided, and said, once: :func:`fedlightning.loop.startup.restore`).
        ended: the components' ``on_run_end`` has run (it runs once per run).
    """

    clients_per_round: int
    sampling_rate: float
    compute: Compute
    server: ServerDevice
    identity: dict[str, Any]
    checkpoint: dict[str, Any] | None
    resumes_in_place: bool
    first_round: int
    last_checkpoint: tuple[int, str] | None
    fit_config: FitConfig
    scoring: ScoringModel
    components: list[RoundComponent]
    context: RunContext
    nothing_to_train: bool = False
    ended: bool = False
