"""The client system model and the synchronous run's virtual clock (docs/algorithms.md section
6.3): a round component (``loop.components``) that gives each client a compute speed, a link and
an availability, and each round a duration in virtual seconds.

A round, on the clock that starts at 0:

1. Of the sampled clients, those unavailable at the round's start (``availability``: always, a
   probability per round drawn from ``(seed, round, client)``, or the trace's windows) and those
   that drop out during the fit (probability ``dropout``, drawn from ``(seed, round, client)``)
   do not train: they upload nothing and keep their state.
2. Each fit that succeeds arrives after ``samples / speed + upload_bytes / bandwidth + latency``
   (:class:`~fedlightning.system.profiles.ClientProfiles`); ``samples`` is ``n_i * local_epochs``,
   or ``num_steps * batch_size`` with ``local_steps``.
3. Arrivals are taken in order of (duration, client id): the tie rule. With a ``deadline``, an
   upload arriving after it is dropped (the client trained: it keeps its new state; the server
   ignores its upload), or, with ``partial_work``, a client that cannot finish by it stops after
   the steps it can do by then (its fit's step budget) and sends that work; with ``keep = K`` (over-selection: sample more than K clients), only the
   first K arrivals are aggregated.
4. The clock advances by the round's duration: the latest admitted arrival; the deadline itself
   when an upload missed it; with ``keep``, the K-th arrival.

Every evaluated row gains ``virtual_time`` (the clock after the round, s), ``clients_late``,
``clients_unavailable`` and ``clients_dropped_out``; with a target
(:class:`~fedlightning.loop.targets.TargetTracker`), ``virtual_time_to_target`` is the clock at
the round that first reached it. The clock is the component's declared state (checkpointed); the
profiles are a function of the seed and the options (part of the run's identity).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

import torch

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import ClientJob, FitResult, Upload, message_bytes
from fedlightning.round_components import Round, RoundComponent, Row
from fedlightning.seeding import derive_seed
from fedlightning.system.distributions import Distribution
from fedlightning.system.profiles import ClientProfiles, as_distribution, read_trace

__all__ = ["SystemModel", "time_to_target_columns"]


class SystemModel(RoundComponent):
    """Client speeds, links, availability and dropouts; the run's virtual clock (module docstring).

    Args:
        speed: samples per second of each client (a number, or a
            :mod:`~fedlightning.system.distributions` distribution drawn once per client).
        bandwidth: upload bytes per second of each client (a number or a distribution).
        latency: seconds added to each upload (a number or a distribution).
        trace: a CSV file giving each client's speed, bandwidth, latency and availability
            windows (:mod:`fedlightning.system.profiles`); replaces the three above.
        availability: ``always``; a probability that a client is available in a round; or
            ``trace`` (the trace's windows, at the round's start).
        dropout: the probability that an available client drops out during its fit.
        deadline: virtual seconds after which a round's uploads are dropped; null: none.
        keep: aggregate only the first ``keep`` arrivals of a round (over-selection); null: all.
        partial_work: with a deadline, a client that cannot finish by it sends the work done by
            then: its fit stops after ``floor((deadline - latency - payload bytes / bandwidth)
            * speed / batch_size)`` steps (at least one; FedProx's and FedNova's stragglers).
    """

    name = "system"
    transient_attributes = frozenset({"profiles", "samples_per_fit", "_full_steps", "last"})

    def __init__(
        self,
        speed: float | Distribution = 100.0,
        bandwidth: float | Distribution = 1.0e6,
        latency: float | Distribution = 0.0,
        trace: str | None = None,
        availability: float | Literal["always", "trace"] = "always",
        dropout: float = 0.0,
        deadline: float | None = None,
        keep: int | None = None,
        partial_work: bool = False,
    ) -> None:
        require(
            availability in ("always", "trace") or (
                isinstance(availability, float | int) and 0 < availability <= 1),
            "SystemModel.availability", availability, "always, trace or a probability in (0, 1]",
        )  # fmt: skip
        require(availability != "trace" or trace is not None, "SystemModel.availability",
                availability, "always or a probability without a trace file")  # fmt: skip
        require(0 <= dropout < 1, "SystemModel.dropout", dropout, "a probability in [0, 1)")
        require(deadline is None or deadline > 0, "SystemModel.deadline", deadline, "null or > 0")
        require(keep is None or keep >= 1, "SystemModel.keep", keep, "null or an int >= 1")
        require(not partial_work or deadline is not None, "SystemModel.partial_work",
                partial_work, "false without a deadline (the work done by the deadline)")  # fmt: skip
        self.speed, self.bandwidth = as_distribution(speed), as_distribution(bandwidth)
        self.latency, self.trace = as_distribution(latency), trace
        self.availability, self.dropout = availability, float(dropout)
        self.deadline, self.keep, self.partial_work = deadline, keep, partial_work
        self.add_state("virtual_time", 0.0)
        self.add_state("virtual_time_to_target", None)
        self.profiles: ClientProfiles | None = None
        self.samples_per_fit: Any = None  # upload -> samples processed, set at setup
        self.last: dict[str, Any] = {}  # this round's admitted clients and counts

    def setup(self, run: Any) -> None:
        self.seed = run.options.seed
        if self.trace is not None:
            self.profiles = read_trace(self.trace)
            self.profiles.check(run.num_clients, f"SystemModel.trace={self.trace!r}")
        else:
            self.profiles = ClientProfiles.draw(
                self.seed, run.num_clients, self.speed, self.bandwidth, self.latency
            )
            self.profiles.check(run.num_clients, "SystemModel")
        steps, epochs, batch = (
            run.fit_config.local_steps,
            run.fit_config.local_epochs,
            run.batch_size,
        )
        self.batch_size = batch
        self._full_steps = (  # the steps of a whole fit: every batch of every epoch
            (lambda u: math.ceil(u.num_samples / batch) * epochs)
            if steps is None
            else (lambda u: steps)
        )
        self.samples_per_fit = (  # a fit stopped by its budget processed num_steps batches
            (lambda u: min(u.num_samples * epochs, u.num_steps * batch))
            if steps is None
            else (lambda u: u.num_steps * batch)
        )
        require(not (self.partial_work and run.fit_config.dp_sgd is not None),
                "SystemModel.partial_work", True, "false with loop.dp_sgd (a DP-SGD fit has no "
                "step budget)")  # fmt: skip
        if self.deadline is not None and self.deadline <= min(self.profiles.latency):
            raise ConfigurationError(
                f"SystemModel.deadline={self.deadline} is not allowed: no client can meet it (the "
                f"smallest latency is {min(self.profiles.latency):.6g} s)"
            )
        if self.keep is not None and self.keep > run.clients_per_round:
            raise ConfigurationError(
                f"SystemModel.keep={self.keep} is not allowed: the run samples "
                f"{run.clients_per_round} clients a round (loop.clients_per_round); over-"
                "selection samples more than it keeps"
            )

    def select_clients(self, round: Round, client_ids: list[int]) -> list[int]:
        return self.taking_part(round.index, client_ids, self.virtual_time)

    def taking_part(self, index: int, client_ids: list[int], time: float) -> list[int]:
        """Of ``client_ids``, those available at virtual ``time`` that do not drop out, with the
        coins of round (or dispatch) ``index``; counts the others in this round's columns."""
        unavailable = [i for i in client_ids if not self._available(index, i, time)]
        dropped = [i for i in client_ids if i not in unavailable and self._drops(index, i)]
        self.last = {"clients_unavailable": len(unavailable), "clients_dropped_out": len(dropped)}
        return [i for i in client_ids if i not in unavailable and i not in dropped]

    def configure_jobs(self, round: Round, jobs: list[ClientJob]) -> list[ClientJob]:
        if not self.partial_work:
            return jobs
        return [replace(job, max_steps=self._budget(job)) for job in jobs]

    def _budget(self, job: ClientJob) -> int | None:
        """The steps ``job``'s client can do by the deadline, its upload estimated as large as
        its payload (None: not one, so it trains in full and misses the deadline)."""
        assert self.profiles is not None and self.deadline is not None
        c, p = job.client_id, self.profiles
        seconds = self.deadline - p.latency[c] - message_bytes(job.payload) / p.bandwidth[c]
        steps = math.floor(seconds * p.speed[c] / self.batch_size)
        return steps if steps >= 1 else None

    def fit_duration(self, client: int, upload: Upload) -> float:
        """Virtual seconds from dispatch to arrival of ``client``'s fit that sent ``upload``."""
        assert self.profiles is not None
        return self.profiles.duration(client, self.samples_per_fit(upload), message_bytes(upload))

    def on_results(self, round: Round) -> None:
        assert self.profiles is not None
        arrivals = sorted(
            (self.fit_duration(cid, r.upload), cid)
            for cid, r in round.results.items()
            if isinstance(r, FitResult)
        )
        on_time = [a for a in arrivals if self.deadline is None or a[0] <= self.deadline]
        admitted = on_time[: self.keep] if self.keep is not None else on_time
        late = len(arrivals) - len(on_time)
        if self.keep is not None and len(on_time) >= self.keep:
            duration = admitted[-1][0]  # the round closes at the K-th arrival
        elif late:
            duration = float(self.deadline)  # the server waited until the deadline
        else:
            duration = admitted[-1][0] if admitted else 0.0
        self.virtual_time += duration
        budgets = {job.client_id: job.max_steps for job in round.jobs}
        partial = [
            cid for _, cid in admitted
            if (budget := budgets.get(cid)) is not None and budget < self._full_steps(
                round.results[cid].upload)  # type: ignore[union-attr]
        ]  # fmt: skip
        self.last = {
            **self.last, "admitted": {cid for _, cid in admitted}, "clients_late": late,
            "clients_partial": len(partial),
        }  # fmt: skip

    def transform_uploads(self, round: Round, uploads: list[Upload]) -> list[Upload]:
        admitted = self.last["admitted"]
        return [u for u in uploads if u.client_id in admitted]

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        self.virtual_time_to_target, target = time_to_target_columns(
            round, row, self.virtual_time, self.virtual_time_to_target
        )
        counts = ("clients_late", "clients_unavailable", "clients_dropped_out", "clients_partial")
        return {
            **row, "virtual_time": self.virtual_time, **{k: self.last.get(k, 0) for k in counts},
            **target,
        }  # fmt: skip

    def done_note(self) -> str:
        return f", virtual time {self.virtual_time:.1f} s"

    def _available(self, index: int, client: int, time: float) -> bool:
        assert self.profiles is not None
        if self.availability == "always":
            return True
        if self.availability == "trace":
            return self.profiles.available_at(client, time)
        return _coin(self.seed, "available", index, client) < float(self.availability)

    def _drops(self, round_index: int, client: int) -> bool:
        return self.dropout > 0 and _coin(self.seed, "dropout", round_index, client) < self.dropout


def time_to_target_columns(
    round: Round, row: Row, virtual_time: float, reached_at: float | None
) -> tuple[float | None, Row]:
    """``(reached_at, columns)``: the virtual time at which the target tracker's target was first
    reached (this round's ``virtual_time`` when its row says it reached it now), and the
    ``virtual_time_to_target`` column for the rows that carry the tracker's columns."""
    reached = row.get("rounds_to_target")
    if reached == round.index + 1 and reached_at is None:
        reached_at = virtual_time
    if reached is None:
        return reached_at, {}
    return reached_at, {"virtual_time_to_target": math.nan if reached_at is None else reached_at}


def _coin(seed: int, what: str, round_index: int, client: int) -> float:
    """A uniform draw in [0, 1) that is a function of ``(seed, what, round, client)`` only."""
    generator = torch.Generator().manual_seed(derive_seed(seed, what, round_index, client))
    return float(torch.rand((), generator=generator, dtype=torch.float64))
