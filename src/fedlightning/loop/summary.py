"""The run summary: what happened over a whole run, printed at its end, and the exit rule.

Counts rounds aggregated and skipped (a round whose aggregation was undone for a non-finite server
state or test loss, :mod:`fedlightning.loop.server_guard`, counts as skipped, by reason), and
client failures (by distinct traceback) and rejections (by distinct reason). Each distinct traceback is logged in full once, the first time it occurs;
later occurrences are one line pointing back to it, and the summary gives each a count (a broken
objective no longer prints the same traceback once per client per round). :meth:`RunSummary.verdict`
says whether the run failed: no round aggregated, or more than ``max_skipped_fraction`` of the
rounds trained skipped (a run that cannot learn must not exit 0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger("fedlightning")


@dataclass
class _Failure:
    first_round: int
    count: int = 0
    clients: set[int] = field(default_factory=set)


class RunSummary:
    """Accumulates a run's rounds, failures and rejections (rounds are 1-based in messages)."""

    def __init__(self) -> None:
        self.rounds_aggregated = 0
        self.rounds_skipped = 0
        self.rounds_empty = 0  # Poisson sampling drew no client (loop.client_sampling)
        self.failures: dict[str, _Failure] = {}
        self.rejections: dict[str, _Failure] = {}
        self.failed_rounds: dict[str, _Failure] = {}  # by reason (loop.server_guard)

    # -- during the run -------------------------------------------------------------------------
    def record_failures(self, round_index: int, grouped: dict[str, list[int]]) -> None:
        """Log a round's failed clients, grouped by traceback text (full text on first sight)."""
        for text, cids in grouped.items():
            seen = self.failures.get(text)
            if seen is None:
                seen = self.failures[text] = _Failure(round_index + 1)
                log.error(
                    "round %d: client(s) %s failed and are left out:\n%s",
                    round_index + 1, ", ".join(map(str, cids)), text,
                )  # fmt: skip
            else:
                log.error(
                    "round %d: client(s) %s failed and are left out: %s (traceback shown at round "
                    "%d; %d time(s) before)",
                    round_index + 1, ", ".join(map(str, cids)), _last_line(text),
                    seen.first_round, seen.count,
                )  # fmt: skip
            seen.count += len(cids)
            seen.clients.update(cids)

    def record_rejections(self, round_index: int, rejected: dict[int, str]) -> None:
        """Log a round's rejected uploads, one line per distinct reason."""
        by_reason: dict[str, list[int]] = {}
        for cid, reason in rejected.items():
            by_reason.setdefault(reason, []).append(cid)
        for reason, cids in by_reason.items():
            log.warning(
                "round %d: client(s) %s %s and are left out",
                round_index + 1, ", ".join(map(str, cids)), reason,
            )  # fmt: skip
            seen = self.rejections.setdefault(reason, _Failure(round_index + 1))
            seen.count += len(cids)
            seen.clients.update(cids)

    def record_round(self, aggregated: bool, drew_clients: bool = True) -> None:
        """A round that ``aggregated`` or not; one that drew no client (Poisson sampling) and
        did not aggregate is no failure: it counts apart, not as skipped."""
        if aggregated:
            self.rounds_aggregated += 1
        elif not drew_clients:
            self.rounds_empty += 1
        else:
            self.rounds_skipped += 1

    def record_failed_round(self, round_index: int, reason: str, aggregated: bool) -> None:
        """Round ``round_index`` failed for ``reason`` (a non-finite server state or test loss):
        an aggregated round it undid counts as skipped from now on."""
        if aggregated:
            self.rounds_aggregated -= 1
            self.rounds_skipped += 1
        seen = self.failed_rounds.setdefault(reason, _Failure(round_index + 1))
        seen.count += 1

    # -- at the end -----------------------------------------------------------------------------
    @property
    def rounds_trained(self) -> int:
        return self.rounds_aggregated + self.rounds_skipped

    def lines(self) -> list[str]:
        """The summary, one plain line per fact."""
        failed = sum(f.count for f in self.failures.values())
        rejected = sum(f.count for f in self.rejections.values())
        lines = [
            f"summary: {self.rounds_aggregated} round(s) aggregated, {self.rounds_skipped} "
            f"skipped; {failed} client fit(s) failed, {rejected} upload(s) rejected"
        ]
        if self.rounds_empty:
            lines.append(f"  {self.rounds_empty} round(s) drew no client (Poisson sampling)")
        for text, seen in self.failures.items():
            lines.append(
                f"  failed {seen.count}x ({len(seen.clients)} client(s), first in round "
                f"{seen.first_round}): {_last_line(text)}"
            )
        for reason, seen in self.rejections.items():
            lines.append(
                f"  rejected {seen.count}x ({len(seen.clients)} client(s), first in round "
                f"{seen.first_round}): {reason}"
            )
        for reason, seen in self.failed_rounds.items():
            lines.append(f"  round failed {seen.count}x (first round {seen.first_round}): {reason}")
        return lines

    def verdict(self, max_skipped_fraction: float) -> str | None:
        """Why this run failed, or None if it did not."""
        if self.rounds_trained == 0 and not self.rounds_empty:
            return None  # a resumed run with nothing left to train
        if self.rounds_aggregated == 0:
            return (
                f"no round aggregated ({self.rounds_skipped} skipped): the model never changed; "
                "see the failures above"
            )
        fraction = self.rounds_skipped / self.rounds_trained
        if fraction > max_skipped_fraction:
            return (
                f"{self.rounds_skipped} of {self.rounds_trained} rounds were skipped "
                f"({fraction:.0%} > loop.max_skipped_fraction={max_skipped_fraction}); "
                "see the failures above"
            )
        return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text
