"""The run's attack as a round component (docs/algorithms.md sections 6.2 and 8.1): it replaces
the malicious clients' uploads after the fits and their checks (the same place for every
backend), refuses a round beyond the aggregator's breakdown point, and counts
``malicious_uploads`` in each evaluated row (:class:`~fedlightning.loop.byzantine.Adversary`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedlightning.loop.byzantine import Adversary
from fedlightning.loop.summary import RunSummary
from fedlightning.protocol import Upload
from fedlightning.round_components import Round, RoundComponent, Row
from fedlightning.server.base import Aggregator


class AdversaryComponent(RoundComponent):
    """``adversary`` at the points of a round; the attack's state (what the mimic attack has
    learnt, :attr:`~fedlightning.attacks.base.Attack.state_attributes`) is this component's, in
    every checkpoint under ``attack``.

    Args:
        adversary: the attack with its malicious clients, resolved at start-up.
        aggregator: the run's aggregator (its breakdown point).
        summary: the run summary, where a refused round is counted.
        on_round_failure: ``skip`` or ``stop`` (``loop.on_round_failure``).
    """

    name = "attack"

    def __init__(
        self, adversary: Adversary, aggregator: Aggregator, summary: RunSummary,
        on_round_failure: str,
    ) -> None:  # fmt: skip
        self.adversary = adversary
        self.aggregator = aggregator
        self.summary = summary
        self.on_round_failure = on_round_failure

    def transform_uploads(self, round: Round, uploads: list[Upload]) -> list[Upload]:
        return self.adversary.corrupt(round.index, uploads, round.payloads)

    def admits(self, round: Round) -> bool:
        return self.adversary.admits(
            round.index, round.uploads, self.aggregator, self.summary, self.on_round_failure
        )

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        # a round refused (beyond the breakdown point) or skipped aggregated no upload
        return {**row, **self.adversary.round_metrics(round.uploads if round.aggregated else [])}

    def state_dict(self) -> dict[str, Any]:
        return self.adversary.attack.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.adversary.attack.load_state_dict(state)
