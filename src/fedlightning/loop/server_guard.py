"""Non-finite server state is never silent: a round whose aggregation leaves a NaN/Inf anywhere in
the aggregator's state, or whose evaluation gives a non-finite test loss, is a failed round.

:class:`ServerGuard` is a round component (docs/algorithms.md section 6.2) around the loop's call
of ``aggregator.aggregate``. Before it (``on_aggregating``), every declared state of the
aggregator is copied (``aggregator.snapshot()``: a plug-in may update tensors in place; counters
and lists too, docs/algorithms.md section 2.6); after it (``on_aggregated``), the state contract
is checked (:class:`~fedlightning.server.state_watch.StateWatch`: declared states keep their
layout, nothing undeclared changed; a breach stops the run with a ConfigurationError naming the
aggregator, the attribute or state and the key), then the state is checked finite (one read-back
per device, :func:`fedlightning.loop.failures.all_finite`).
A non-finite entry fails the round: the log names the aggregator, the entry and key (e.g.
``weights['fc.weight']``) and the round, the state is restored from the copy, the run summary
counts the round as skipped with its reason, and ``loop.on_round_failure`` applies (``skip`` goes
on, ``stop`` raises :class:`~fedlightning.errors.RunStopped`). A non-finite ``test_loss`` (or any
``<model>/test_loss``) after evaluation fails the round the same way; that round's metrics row is
not logged (it describes a model the run discarded), and the checkpoint written after it holds the
restored state. Skipped rounds count toward ``loop.max_skipped_fraction``, so an aggregator that
always writes NaN fails the run. Last, a non-finite final global model
(:meth:`ServerGuard.final_model_problem`) is not saved as ``global.pt`` and fails the run.

The state is restored to what it was before this round's aggregation (``aggregator.restore``:
every declared state but those declared ``rollback=False``, such as the privacy client-level DP
spent; transient attributes reset): with ``eval_every > 1`` an earlier, unevaluated round may
already have made the model useless while keeping it finite.

The watch fingerprints the aggregator when the rounds start (``on_round_start`` of the first
round, after set-up and any resume); a non-finite row is discarded at ``on_evaluated`` (so the
components after the guard do not see it) and a non-finite final model named at ``on_run_end``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from fedlightning.errors import RunStopped
from fedlightning.loop.failures import all_finite
from fedlightning.loop.summary import RunSummary
from fedlightning.round_components import Round, RoundComponent, Row
from fedlightning.server.base import Aggregator
from fedlightning.server.state_watch import StateWatch

log = logging.getLogger("fedlightning")


def non_finite_entry(state: dict[str, Any]) -> str | None:
    """The first entry of ``state`` (nested dicts and lists of tensors and floats) holding a
    NaN/Inf, written as it is indexed (``weights['fc.weight']``, ``models[1]['fc.bias']``), or
    None when every entry is finite (checked first in one pass, then searched only on failure)."""
    if all_finite(state):
        return None
    return next(_non_finite_paths(state, ""), None)


def _non_finite_paths(value: Any, path: str):
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}[{key!r}]" if path else str(key)
            yield from _non_finite_paths(item, inner)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _non_finite_paths(item, f"{path}[{index}]")
    elif isinstance(value, torch.Tensor):
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            yield path
    elif isinstance(value, float) and not math.isfinite(value):
        yield path


class ServerGuard(RoundComponent):
    """Keeps the server state finite across a run (see the module docstring). Always on; at
    set-up it takes the run's aggregator, its summary (where failed rounds are counted) and
    ``loop.on_round_failure`` (``skip`` or ``stop``)."""

    #: this round's copy and bookkeeping, and the aggregator's watch (its own fingerprints)
    transient_attributes = frozenset({"_before", "watch", "_aggregated", "_failed"})

    def __init__(self) -> None:
        self._before: dict[str, Any] | None = None  # the state before the last aggregation
        self.watch: StateWatch | None = None  # from the first round on (after set-up and resume)
        self._aggregated: int | None = None  # the round that aggregation belongs to
        self._failed: int | None = None  # the last round that failed here

    def setup(self, run: Any) -> None:
        self.aggregator: Aggregator = run.aggregator
        self.summary: RunSummary = run.summary
        self.on_round_failure: str = run.options.on_round_failure

    @property
    def aggregator_name(self) -> str:
        return type(self.aggregator).__name__

    def on_round_start(self, round: Round) -> None:
        if self.watch is None:  # the rounds start: every undeclared attribute is fingerprinted
            self.watch = StateWatch(self.aggregator)

    def on_aggregating(self, round: Round) -> None:
        self._before = self.aggregator.snapshot()
        self._aggregated = round.index

    def on_aggregated(self, round: Round) -> None:
        assert self.watch is not None
        self.watch.check(round.index)  # undeclared state changed, a declared layout broken
        entry = non_finite_entry(self.aggregator.state_dict())
        if entry is not None:
            self._fail(
                round.index,
                f"{self.aggregator_name}'s server state is not finite after aggregation ({entry} holds "
                "NaN/Inf)",
            )

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        return None if self.evaluation_failed(round.index, row) else row

    def on_run_end(self, failing: bool) -> str | None:
        return self.final_model_problem(self.aggregator.global_state())

    def evaluation_failed(self, round_index: int, metrics: dict[str, float]) -> bool:
        """Whether the round's evaluation gave a non-finite ``*test_loss``; if so, the round fails
        (once) and its metrics row must not be logged."""
        bad = [k for k, v in metrics.items() if k.endswith("test_loss") and not math.isfinite(v)]
        if not bad:
            self._before = None  # the round stands: free the copy
            return False
        if self._failed != round_index:
            losses = ", ".join(f"{k}={metrics[k]}" for k in bad)
            self._fail(
                round_index,
                f"the model aggregated by {self.aggregator_name} has a non-finite test loss ({losses})",
            )
        return True

    def final_model_problem(self, global_state: dict[str, Any]) -> str | None:
        """Why the final global model must not be saved as ``global.pt`` (a NaN/Inf entry), or
        None; the loop then fails the run (exit status 1 from the CLI)."""
        entry = non_finite_entry(global_state)
        if entry is None:
            return None
        return (
            f"the final global model of {self.aggregator_name} is not finite ({entry} holds NaN/Inf), so it "
            "is not saved as global.pt"
        )

    def _fail(self, round_index: int, reason: str) -> None:
        aggregated = self._aggregated == round_index and self._before is not None
        if aggregated:
            self.aggregator.restore(self._before)  # type: ignore[arg-type]
        self._before = None
        self._failed = round_index
        self.summary.record_failed_round(round_index, reason, aggregated)
        restored = "the server state is restored to before the round" if aggregated else ""
        message = f"round {round_index + 1}: {reason}; {restored or 'nothing to restore'}"
        if self.on_round_failure == "stop":
            raise RunStopped(message + "; stopping as on_round_failure='stop'")
        log.error("%s; the round is skipped", message)
