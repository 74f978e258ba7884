"""The rounds of one ``FederatedLoop.fit`` (:class:`Rounds`), after start-up.

A round reads as the algorithm (:meth:`Rounds._round`): sample clients from ``(seed, round)``,
dispatch the aggregator's payloads, train on the backend, screen the results (the failure policy,
:mod:`fedlightning.loop.failures`), aggregate, evaluate, record. Every feature around it (the
communication meter, the targets, the privacy report, the adversary, the server guard, the
checkpoint writer) is a round component that start-up built (:mod:`fedlightning.loop.components`)
and the round calls at the protocol's named points (:mod:`fedlightning.round_components`,
docs/algorithms.md section 6.2); this module knows the protocol, not the components. With an
asynchronous server among them (:mod:`fedlightning.asynchronous`, section 6.4) a round is one
server update: the server's event loop gives the round its arrived fits instead of sampling and
training, and the rest of the round is the same.
"""

from __future__ import annotations

import logging
import math
import time

from fedlightning.asynchronous.server import AsyncServer
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.errors import RunStopped
from fedlightning.loop.checkpoint import atomic_save
from fedlightning.loop.components.watch import ComponentWatch
from fedlightning.loop.deployables import save_models
from fedlightning.loop.dispatch import Dispatcher
from fedlightning.loop.evaluation import Evaluator
from fedlightning.loop.failures import RoundOutcome, check_for_bug, sort_results
from fedlightning.loop.options import RunParts
from fedlightning.loop.run_state import RunState
from fedlightning.loop.sampling import round_clients
from fedlightning.protocol import ClientJob
from fedlightning.round_components import Round, Row
from fedlightning.signals import finished

log = logging.getLogger("fedlightning")


class Rounds:
    """Runs the rounds of one fit and ends the run (``global.pt``, ``models.pt``, the summary).

    Args:
        parts: the loop's options, parts and records.
        run: what start-up resolved, the round components included.
        dm: the run's data module.
    """

    def __init__(self, parts: RunParts, run: RunState, dm: FederatedDataModule) -> None:
        self.o, self.options, self.run_state, self.dm = parts, parts.options, run, dm
        self.evaluator = Evaluator(run.scoring, parts.options.seed, parts.options.val_clients)
        self.watch: ComponentWatch | None = None  # from the first round on
        servers = [c for c in run.components if isinstance(c, AsyncServer)]
        self.asynchronous = servers[0] if servers else None
        self.dispatcher = Dispatcher(parts, run)

    def run(self) -> dict[str, float]:
        """The rounds, then the run's end: each component's ``on_run_end`` (the checkpoint in
        flight lands, also before an error goes up), then :meth:`_finish`; returns the last
        evaluated metrics."""
        o, run, rounds = self.o, self.run_state, self.options.rounds
        started = time.perf_counter()
        try:
            # every undeclared attribute of the components fingerprinted, after any resume
            parts = [*run.context.parts(), o, run, run.identity, run.components]
            self.watch = ComponentWatch(run.components, parts)
            with o.reporter.progress(rounds, run.first_round) as advance:
                for r in range(run.first_round, rounds):
                    self._round(Round(r, last=r == rounds - 1))
                    advance(o.history[-1] if o.history else {})
        except BaseException:
            _end(run, failing=True)
            raise
        unsaved = _end(run, failing=False)  # and before global.pt
        return self._finish(unsaved, started)

    def _round(self, rnd: Round) -> None:
        """One round: sample, dispatch, train, screen, aggregate, evaluate, record; the run's
        round components see it at their points (docs/algorithms.md section 6.2)."""
        o, r, components = self.o, rnd.index, self.run_state.components
        for c in components:
            c.on_round_start(rnd)
        if self.asynchronous is not None:  # the arrivals of one server update (section 6.4)
            self.asynchronous.gather(rnd, self.dispatcher)
        else:
            self._train(rnd)
        outcome = self._screen(rnd)
        rnd.uploads = outcome.uploads
        for c in components:
            c.on_results(rnd)
        uploads = outcome.uploads
        for c in components:  # one place for every backend: after the fits
            uploads = c.transform_uploads(rnd, uploads)
        rnd.uploads = uploads
        rnd.aggregated = self._aggregates(rnd)
        if rnd.aggregated:
            for c in components:
                c.on_aggregating(rnd)
            o.aggregator.aggregate(r, rnd.uploads)
            for c in components:
                c.on_aggregated(rnd)
        if (r + 1) % self.options.eval_every == 0 or rnd.last:
            self._record(rnd, self._evaluate(rnd, outcome))
        for c in components:
            c.on_round_end(rnd)
        assert self.watch is not None
        self.watch.check(r)  # a component's undeclared state changed: refused, naming it

    def _train(self, rnd: Round) -> None:
        """A synchronous round's fits: sample, let the components select, dispatch, train."""
        o, run, r = self.o, self.run_state, rnd.index
        sampled = round_clients(
            self.options.client_sampling, self.options.seed, r, self.dm.num_clients,
            run.clients_per_round, run.sampling_rate,
        )  # fmt: skip
        for c in run.components:  # the system model's available clients
            sampled = c.select_clients(rnd, sampled)
        rnd.client_ids = sampled
        rnd.payloads = o.aggregator.configure_round(r, rnd.client_ids)
        jobs = [ClientJob(r, i, rnd.payloads[i], o.store.get(i)) for i in rnd.client_ids]
        for c in run.components:  # a straggler's step budget
            jobs = c.configure_jobs(rnd, jobs)
        rnd.jobs = jobs
        with o.reporter.watch_round(r, len(rnd.jobs)):  # Poisson sampling may draw none
            rnd.results = run.server.arrivals(o.backend.run(r, rnd.jobs)) if rnd.jobs else {}

    def _screen(self, rnd: Round) -> RoundOutcome:
        """The failure policy (:mod:`fedlightning.loop.failures`): the round's successful,
        failed and rejected fits; the store keeps the successful ones' new state."""
        o = self.o
        outcome = sort_results(
            rnd.index, rnd.client_ids, rnd.results, rnd.payloads, o.summary,
            frozenset(o.aggregator.required_upload_extras), o.fit_config.precision,
        )  # fmt: skip
        if rnd.jobs:
            check_for_bug(rnd.index, rnd.index == self.run_state.first_round, outcome)
        for cid, result in outcome.results:
            o.store.put(cid, result.state)
        rnd.kept = outcome.results
        return outcome

    def _aggregates(self, rnd: Round) -> bool:
        """Whether the round aggregates: enough uploads (client-level DP releases every round,
        also one with none) that every component admits (a round beyond the rule's breakdown
        point fails). A round that does not is counted, logged, or stops the run."""
        o, r, uploads, jobs = self.o, rnd.index, rnd.uploads, rnd.jobs
        min_clients, on_round_failure = self.options.min_clients, self.options.on_round_failure
        enough = len(uploads) >= min_clients or o.aggregator.releases_every_round
        admitted = not enough or all(c.admits(rnd) for c in self.run_state.components)
        o.summary.record_round(enough and admitted, drew_clients=bool(jobs))
        if enough and admitted:
            return True
        if not jobs:  # Poisson sampling drew no client: nothing failed
            log.info("round %d: Poisson sampling drew no client", r + 1)
        elif on_round_failure == "stop":
            _end(self.run_state, failing=False)  # the message names the checkpoint on disk
            self._stop(r, len(uploads), len(jobs))
        elif admitted:
            log.warning(
                "round %d: only %d of %d clients succeeded (min_clients=%d): aggregation skipped",
                r + 1, len(uploads), len(jobs), min_clients,
            )  # fmt: skip
        return False

    def _evaluate(self, rnd: Round, outcome: RoundOutcome) -> Row:
        """The round's metrics row before the components add theirs."""
        o = self.o
        scores = self.evaluator.evaluate(
            self.dm, o.aggregator.deployables(), [u.client_id for u in rnd.uploads], o.store,
            rnd.index,
        )  # fmt: skip
        losses = [u.metrics.get("train_loss", math.nan) for u in rnd.uploads]
        return {
            "round": rnd.index + 1, **scores, "train_loss": _mean(losses),
            "clients_failed": len(outcome.failed), "clients_rejected": len(outcome.rejected),
            "round_time_s": rnd.seconds(), **o.aggregator.round_metrics(),
        }  # fmt: skip

    def _record(self, rnd: Round, row: Row | None) -> None:
        """Log the row, with every component's columns, unless one discards it."""
        o = self.o
        for c in self.run_state.components:
            if row is None:
                return  # the round failed (its state is restored): the row is not logged
            row = c.on_evaluated(rnd, row)
        if row is not None:
            o.history.append(row)
            o.reporter.log(row)
            o.reporter.round_line(row, self.options.rounds, rnd.last)

    def _finish(self, unsaved: str | None, started: float) -> dict[str, float]:
        """After the rounds and their last checkpoint write: ``global.pt`` and ``models.pt``
        (every deployable, as the run's scoring model scores it; unless ``unsaved`` says why
        not), the summary and the run's verdict."""
        o, run, rounds, run_dir = self.o, self.run_state, self.options.rounds, self.options.run_dir
        if unsaved is None:
            atomic_save(o.aggregator.global_state(), run_dir / "global.pt")
            deployables = o.aggregator.deployables()
            run.scoring.prepare(o.store, deployables)
            save_models(run.scoring.saved(deployables), rounds, run_dir)
        o.reporter.close()
        lines = [line for c in run.components for line in c.summary_lines()]
        o.reporter.summary([*o.summary.lines(), *lines])
        failure = unsaved or o.summary.verdict(self.options.max_skipped_fraction)
        if failure is not None:
            raise RunStopped(f"run failed: {failure}; results are in {run_dir}")
        finished()  # every file is complete: a signal from now on changes nothing
        metrics = o.history[-1] if o.history else {}
        note = "".join(c.done_note() for c in run.components)
        o.reporter.done(metrics, rounds, time.perf_counter() - started, note)
        return metrics

    def _stop(self, r: int, succeeded: int, per_round: int) -> None:
        checkpoint = self.options.run_dir / "last.ckpt"
        resume = f"; --ckpt_path {checkpoint} resumes" if checkpoint.is_file() else ""
        raise RunStopped(
            f"round {r + 1}: only {succeeded} of {per_round} clients succeeded "
            f"(min_clients={self.options.min_clients}); stopping as on_round_failure='stop'"
            + resume
        )


def _end(run: RunState, failing: bool) -> str | None:
    """Each round component's ``on_run_end``, once per run; why the final model must not be
    saved (the first reason given), or None."""
    if run.ended:
        return None
    run.ended = True
    reasons = [c.on_run_end(failing) for c in run.components]
    return next((reason for reason in reasons if reason), None)


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan
