"""The fits an asynchronous server starts (:class:`Dispatcher`, docs/algorithms.md section
6.4): the aggregator's payloads, one backend call for the fits that start together, and the
failure policy applied when they come back (a fit that raised or sent a bad upload frees its
slot at once and is counted; when no fit of the run's first dispatch succeeds, the objective
or data is broken and the run stops, as after a synchronous first round)."""

from __future__ import annotations

from fedlightning.loop.failures import check_for_bug, sort_results
from fedlightning.loop.options import RunParts
from fedlightning.loop.run_state import RunState
from fedlightning.protocol import ClientJob, FitResult, Payload

__all__ = ["Dispatcher"]


class Dispatcher:
    """Starts an asynchronous server's fits on the run's backend (module docstring)."""

    def __init__(self, parts: RunParts, run: RunState) -> None:
        self.o, self.run_state = parts, run

    def payloads(self, version: int, clients: list[int]) -> dict[int, Payload]:
        """The aggregator's payloads for ``clients`` from its current model."""
        return self.o.aggregator.configure_round(version, clients)

    def fit(
        self, dispatch: int, version: int, clients: list[int]
    ) -> list[tuple[int, Payload, FitResult]]:
        """Fit ``clients`` on the current model, seeded by ``(seed, dispatch, client)``; the
        successful fits with the payload each trained from."""
        o = self.o
        payloads = self.payloads(version, clients)
        jobs = [ClientJob(dispatch, i, payloads[i], o.store.get(i)) for i in clients]
        with o.reporter.watch_round(version, len(jobs)):
            results = self.run_state.server.arrivals(o.backend.run(dispatch, jobs))
        outcome = sort_results(
            dispatch, clients, results, payloads, o.summary,
            frozenset(o.aggregator.required_upload_extras), o.fit_config.precision,
        )  # fmt: skip
        if dispatch == 0:  # a later dispatch may start one fit: its failure is no verdict
            check_for_bug(dispatch, True, outcome)
        return [(cid, payloads[cid], result) for cid, result in outcome.results]
