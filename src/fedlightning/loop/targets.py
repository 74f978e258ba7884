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

from fedlightning.errors import require
from fedlightning.round_components import Round, RoundComponent, Row


class TargetTracker(RoundComponent):
    """Watches ``metric`` for the first evaluated round at or above ``target`` (see the module
    docstring). Always on (it times every round, so that a target set on resume is timed from
    the run's start); ``loop.target_acc: a`` is the shorthand for ``target: a``, which a resume
    may change.

    Args:
        target: the value to reach; null: no columns.
        metric: the metrics column it watches.
    """

    name = "target"
    resume_may_change = frozenset({"target"})
    transient_attributes = frozenset({"_timed"})

    def __init__(self, target: float | None = None, metric: str = "test_acc") -> None:
        require(
            target is None or 0.0 < target <= 1.0,
            "TargetTracker.target", target, "null or an accuracy in (0, 1]",
        )  # fmt: skip
        self.target = target
        self.metric = metric
        self.add_state("elapsed_s", 0.0)
        self.add_state("rounds_to_target", None)
        self.add_state("time_to_target_s", None)
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
