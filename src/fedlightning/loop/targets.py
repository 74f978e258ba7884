"""Rounds (and wall time) to reach a target accuracy (docs/algorithms.md section 6).

The papers compare methods by the communication rounds needed to first reach a test accuracy
(FedCross, section 4: "needs more communication rounds to achieve its best accuracy"). With
``loop.target_acc = a`` the first *evaluated* round whose ``test_acc >= a`` is recorded as
``rounds_to_target`` (1-based) with ``time_to_target_s``, the wall time of the run's rounds up to
and including it (summed over resumed segments). The resolution is ``loop.eval_every``. Both
appear in the row of the round that reaches the target and in the last row of the run (NaN in the
last row when the target was never reached).

:class:`TargetTracker` is a round component (docs/algorithms.md section 6.2) placed after the
server guard, so a round whose evaluation failed neither reaches the target nor loses its time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedlightning.round_components import Round, RoundComponent, Row


class TargetTracker(RoundComponent):
    """Watches ``metric`` (``test_acc``) for the first evaluated round at or above ``target``."""

    name = "target"

    def __init__(self, target: float | None, metric: str = "test_acc") -> None:
        self.target = target
        self.metric = metric
        self.elapsed_s = 0.0
        self.rounds_to_target: int | None = None
        self.time_to_target_s: float | None = None
        self._timed: int | None = None  # the round whose time is already added

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        self.add_time(row["round_time_s"])
        self._timed = round.index
        return {**row, **self.update(round.index + 1, row, round.last)}

    def on_round_end(self, round: Round) -> None:
        if self._timed != round.index:  # not evaluated, or its row discarded
            self.add_time(round.seconds())

    def done_note(self) -> str:
        return self.summary()

    def add_time(self, seconds: float) -> None:
        self.elapsed_s += seconds

    def update(self, round_number: int, metrics: Mapping[str, float], last: bool) -> dict[str, Any]:
        """The target columns to add to this evaluated round's row."""
        if self.target is None:
            return {}
        value = metrics.get(self.metric, math.nan)
        newly = self.rounds_to_target is None and value >= self.target
        if newly:
            self.rounds_to_target, self.time_to_target_s = round_number, self.elapsed_s
        if not (newly or last):
            return {}
        return {
            "rounds_to_target": float(self.rounds_to_target or math.nan),
            "time_to_target_s": self.time_to_target_s or math.nan,
        }

    def summary(self) -> str:
        if self.target is None:
            return ""
        if self.rounds_to_target is None:
            return f", {self.metric} {self.target} not reached"
        return (
            f", {self.metric} >= {self.target} at round {self.rounds_to_target} "
            f"({self.time_to_target_s:.1f} s)"
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "elapsed_s": self.elapsed_s,
            "rounds_to_target": self.rounds_to_target,
            "time_to_target_s": self.time_to_target_s,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.elapsed_s = float(state.get("elapsed_s", 0.0))
        self.rounds_to_target = state.get("rounds_to_target")
        self.time_to_target_s = state.get("time_to_target_s")
