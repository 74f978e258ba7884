"""The run's attack as a round component (docs/algorithms.md sections 6.2 and 8.1): at start-up
it draws the malicious clients and refuses an attack the aggregator, the attack itself or the
backend cannot serve (:func:`~fedlightning.loop.byzantine.prepare_attack`); a label-flipping
attack poisons their fits (:meth:`Adversary.configure_fit`); each round it replaces the malicious
clients' uploads after the fits and their checks (the same place for every backend), refuses a
round beyond the aggregator's breakdown point, and counts ``malicious_uploads`` in each evaluated
row. ``loop.attack: X`` is the shorthand for ``loop.components: [{class_path:
fedlightning.loop.components.Adversary, init_args: {attack: X}}]``."""

from __future__ import annotations

import dataclasses
from typing import Any

from fedlightning.attacks.base import Attack
from fedlightning.errors import require
from fedlightning.loop import byzantine
from fedlightning.protocol import FitConfig, Upload
from fedlightning.round_components import Round, RoundComponent, Row


class Adversary(RoundComponent):
    """Byzantine clients: ``attack`` (``fedlightning.attacks``) with its malicious clients.

    Args:
        attack: what the malicious clients do, and which they are (a seeded fraction or a list).
    """

    def __init__(self, attack: Attack) -> None:
        require(
            isinstance(attack, Attack),
            "Adversary.attack", attack, "an Attack (fedlightning.attacks: LabelFlip, SignFlip, ...)",
        )  # fmt: skip
        self.attack = attack
        self.adversary: byzantine.Adversary | None = None  # the malicious clients, at start-up
        self.flipped: tuple[int, ...] = ()

    def setup(self, run: Any) -> None:
        self.run = run
        self.adversary, self.flipped = byzantine.prepare_attack(
            self.attack, run.aggregator, run.backend, run.num_clients, run.clients_per_round,
            run.options.client_sampling, run.options.seed,
        )  # fmt: skip

    def configure_fit(self, config: FitConfig) -> FitConfig:
        return dataclasses.replace(config, label_flip_clients=self.flipped)

    def transform_uploads(self, round: Round, uploads: list[Upload]) -> list[Upload]:
        assert self.adversary is not None
        return self.adversary.corrupt(round.index, uploads, round.payloads)

    def admits(self, round: Round) -> bool:
        assert self.adversary is not None
        return self.adversary.admits(
            round.index, round.uploads, self.run.aggregator, self.run.summary,
            self.run.options.on_round_failure,
        )  # fmt: skip

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        assert self.adversary is not None
        # a round refused (beyond the breakdown point) or skipped aggregated no upload
        return {**row, **self.adversary.round_metrics(round.uploads if round.aggregated else [])}
