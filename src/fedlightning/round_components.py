"""Round components: what the loop does around the algorithm, each behind one small protocol
(docs/algorithms.md section 6.2).

The round body (:mod:`fedlightning.loop.core`) reads as the algorithm: sample, dispatch, train,
screen, aggregate, evaluate, record. Every feature around it (the communication meter, the
targets, the privacy report, the adversary, the server guard, the checkpoint writer) is a
:class:`RoundComponent`: it sees the round (a :class:`Round`) at the named points below, in the
order the run's components are listed, and owns its checkpointed state. Each hook does nothing by
default, so a component overrides only the points it needs; a new one is one file and one line
in the list :data:`fedlightning.loop.components.COMPONENTS`, with no edit of the round body.

Points of a round, in order:

1. :meth:`~RoundComponent.on_round_start`: before the clients are sampled.
2. :meth:`~RoundComponent.on_results`: after the fits and the failure policy (``round.jobs``,
   ``round.results`` as the backend answered, ``round.kept``, ``round.uploads``).
3. :meth:`~RoundComponent.transform_uploads`: may replace uploads (the adversary), each
   component seeing the previous one's output; ``round.uploads`` is then the result.
4. :meth:`~RoundComponent.admits`: whether the round may be aggregated (asked only of a round
   with enough uploads; every component is asked until one refuses).
5. :meth:`~RoundComponent.on_aggregating` and :meth:`~RoundComponent.on_aggregated`: around the
   aggregator's ``aggregate`` (the server guard copies and checks the state).
6. :meth:`~RoundComponent.on_evaluated`: an evaluated round's metrics row; returns it with the
   component's own columns, or ``None`` to discard the row (the round failed).
7. :meth:`~RoundComponent.on_round_end`: after the row is recorded (time meters, checkpoints).

And per run: :meth:`~RoundComponent.on_run_end` when the rounds are over (or the run stops),
:meth:`~RoundComponent.summary_lines` and :meth:`~RoundComponent.done_note` for the closing
output, and :meth:`~RoundComponent.state_dict` / :meth:`~RoundComponent.load_state_dict` under
the component's :attr:`~RoundComponent.name` in every checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedlightning.protocol import ClientJob, FitResult, Payload, Upload

#: a metrics row of an evaluated round: column -> value
Row = dict[str, float]


@dataclass
class Round:
    """One round as the components see it (filled in as the round goes).

    Attributes:
        index: the 0-based round.
        last: the run's last round.
        started: ``time.perf_counter()`` when the round started.
        client_ids: the sampled clients.
        payloads: the server's payload per sampled client.
        jobs: the fits handed to the backend.
        results: the backend's answer per client (a FitResult or the exception it raised).
        kept: the successful fits whose new state the ClientStore keeps, ``(client, result)``.
        uploads: the uploads the aggregator receives (after :meth:`RoundComponent.
            transform_uploads`).
        aggregated: whether the aggregator aggregated them (False: too few uploads, or a
            component refused the round in :meth:`RoundComponent.admits`).
    """

    index: int
    last: bool
    started: float = field(default_factory=time.perf_counter)
    client_ids: list[int] = field(default_factory=list)
    payloads: dict[int, Payload] = field(default_factory=dict)
    jobs: list[ClientJob] = field(default_factory=list)
    results: Mapping[int, FitResult | BaseException] = field(default_factory=dict)
    kept: Sequence[tuple[int, FitResult]] = ()
    uploads: list[Upload] = field(default_factory=list)
    aggregated: bool = False

    def seconds(self) -> float:
        """Wall time since the round started."""
        return time.perf_counter() - self.started


class RoundComponent:
    """A feature of the loop around the algorithm (see the module docstring for the points).

    Attributes:
        name: the key of the component's state in checkpoints; ``""``: it keeps none.
    """

    name: str = ""

    def on_round_start(self, round: Round) -> None:
        """Before the round's clients are sampled."""

    def on_results(self, round: Round) -> None:
        """After the fits and the failure policy."""

    def transform_uploads(self, round: Round, uploads: list[Upload]) -> list[Upload]:
        """The uploads the aggregator receives (default: ``uploads`` as they are)."""
        return uploads

    def admits(self, round: Round) -> bool:
        """Whether the round may aggregate ``round.uploads``; a refusing component logs and
        counts why (or raises RunStopped)."""
        return True

    def on_aggregating(self, round: Round) -> None:
        """Just before the aggregator aggregates ``round.uploads``."""

    def on_aggregated(self, round: Round) -> None:
        """Just after the aggregation."""

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        """An evaluated round's row, with this component's columns added; ``None`` discards
        the row (the later components do not see it)."""
        return row

    def on_round_end(self, round: Round) -> None:
        """After the round's row is recorded (every round, evaluated or not)."""

    def on_run_end(self, failing: bool) -> str | None:
        """The rounds are over or the run stops: finish what is in flight (``failing``: another
        error is on its way up, so log rather than raise). Returns why the final model must not
        be saved, or None."""
        return None

    def summary_lines(self) -> list[str]:
        """Lines of the run summary printed at the end."""
        return []

    def done_note(self) -> str:
        """Appended to the closing ``done:`` line (e.g. ``, test_acc >= 0.9 at round 12``)."""
        return ""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this component (plain data and tensors)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (``{}``: a checkpoint written before the component was)."""


def component_states(components: Iterable[RoundComponent]) -> dict[str, dict[str, Any]]:
    """``{name: state}`` of the components that keep state, for a checkpoint."""
    return {c.name: c.state_dict() for c in components if c.name}


def load_component_states(
    components: Iterable[RoundComponent], states: Mapping[str, Mapping[str, Any]]
) -> None:
    """Restore each named component from ``states`` (a missing entry restores ``{}``)."""
    for component in components:
        if component.name:
            component.load_state_dict(states.get(component.name, {}))
