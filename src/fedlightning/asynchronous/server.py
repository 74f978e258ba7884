"""The asynchronous server's event loop on the virtual clock (docs/algorithms.md section 6.4).

A run with an :class:`AsyncServer` in ``loop.components`` has no synchronous rounds: each row is
one server update. Clients train concurrently (at most ``concurrency`` fits in flight); the
server reacts to arrivals in virtual-time order:

1. Dispatch: while a slot is free and no in-flight fit arrives at the current time, the server
   starts fits with its current model. Dispatch ``d`` (counted over the run) takes, in the order
   of the permutation a synchronous round ``d`` draws (``sample_clients(seed, d, N, N)``: its
   first K are the synchronous round's K clients), the clients neither in flight nor waiting in
   the buffer that the system model lets take part, up to the free slots. The fits dispatched
   together run as one backend call (the cohort batches them); each arrives after its duration
   (:class:`~fedlightning.system.SystemModel`).
2. Arrival: the in-flight fit first in (arrival time, dispatch index, place in the dispatch's
   draw) order (the tie rule) joins the buffer; the clock moves to its arrival. Arrivals at the same time are all
   handled before the next dispatch.
3. Update: when the buffer holds ``buffer_size`` arrivals, the server turns each into the upload
   its aggregator receives (:meth:`AsyncServer.server_weights`, with its staleness: the server
   updates since its dispatch), and the round body aggregates them as a synchronous round's.

In flight, the buffer, the clock and the dispatch count are the component's declared state: a
checkpoint holds them and a resume continues bit for bit.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from fedlightning.asynchronous.events import entry, fit_result, job, next_arrival
from fedlightning.errors import ConfigurationError, RunStopped, require
from fedlightning.protocol import FitResult, Payload
from fedlightning.round_components import Round, RoundComponent, Row
from fedlightning.seeding import sample_clients
from fedlightning.system.model import SystemModel, time_to_target_columns

__all__ = ["AsyncServer", "Fits"]

#: dispatches in a row, with no fit in flight, that may put none in flight (every client
#: unavailable, dropping out or failing) before the run stops: nothing can train
MAX_EMPTY_DISPATCHES = 100


class Fits(Protocol):
    """What the loop does for an asynchronous server (:class:`fedlightning.loop.dispatch.Dispatcher`)."""

    def fit(
        self, dispatch: int, version: int, clients: list[int]
    ) -> list[tuple[int, Payload, FitResult]]:
        """Fit ``clients`` on the current model: the successful fits (the failed ones counted)."""

    def payloads(self, version: int, clients: list[int]) -> dict[int, Payload]:
        """The current model's payloads for ``clients``."""


class AsyncServer(RoundComponent):
    """An asynchronous server (module docstring): :class:`~fedlightning.asynchronous.FedBuff`
    or :class:`~fedlightning.asynchronous.FedAsync`.

    Args:
        concurrency: the most fits in flight at once (it, not ``loop.clients_per_round``, which
            an asynchronous run does not read, bounds how many clients train together).
        system: the clients' speeds, links, availability and dropouts (default
            ``SystemModel()``); a synchronous round's ``deadline`` and ``keep`` are refused.
    """

    name = "asynchronous"
    transient_attributes = frozenset({"system", "last"})

    def __init__(self, concurrency: int, system: SystemModel | None = None) -> None:
        require(concurrency >= 1, f"{type(self).__name__}.concurrency", concurrency, "an int >= 1")
        self.concurrency = concurrency
        self.system = system if system is not None else SystemModel()
        self.add_state("virtual_time", 0.0)
        self.add_state("dispatches", 0)
        self.add_state("in_flight", [])
        self.add_state("buffer", [])
        self.add_state("virtual_time_to_target", None)
        self.last: dict[str, float] = {}

    @property
    def buffer_size(self) -> int:
        """The arrivals of one server update."""
        raise NotImplementedError

    def server_weights(
        self, item: dict[str, Any], current: dict[str, torch.Tensor], staleness: int
    ) -> dict[str, torch.Tensor]:
        """The weights the aggregator receives for the arrived fit ``item`` (it trained from
        ``item["received"]``; ``current`` is the server's model now, ``staleness`` the updates
        since its dispatch)."""
        raise NotImplementedError

    def setup(self, run: Any) -> None:
        own = type(self).__name__
        require(
            self.system.deadline is None and self.system.keep is None, f"{own}.system",
            "a deadline or keep", "a SystemModel without them (a synchronous round's options)",
        )  # fmt: skip
        require(run.options.client_sampling == "fixed", "loop.client_sampling",
                run.options.client_sampling, f"fixed with {own} (it draws its own clients)")  # fmt: skip
        require(self.concurrency <= run.num_clients, f"{own}.concurrency", self.concurrency,
                f"at most the {run.num_clients} clients")  # fmt: skip
        if self.buffer_size > self.concurrency:
            raise ConfigurationError(
                f"{own}: a buffer of {self.buffer_size} arrivals is not allowed with concurrency="
                f"{self.concurrency}: the buffer would never fill (expected buffer_size <= "
                "concurrency)"
            )
        self.system.setup(run)
        self.seed, self.num_clients = run.options.seed, run.num_clients

    def gather(self, rnd: Round, fits: Fits) -> None:
        """Run the event loop until the buffer is full, then fill ``rnd`` with the arrived fits as
        the aggregator receives them (the round body screens and aggregates them)."""
        empty = 0
        while len(self.buffer) < self.buffer_size:
            if not any(item["finish"] == self.virtual_time for item in self.in_flight):
                self._dispatch(rnd.index, fits)
            if not self.in_flight:
                empty += 1
                if empty < MAX_EMPTY_DISPATCHES:
                    continue
                raise RunStopped(
                    f"update {rnd.index + 1}: {MAX_EMPTY_DISPATCHES} dispatches in a row put no "
                    "fit in flight (every client unavailable, dropping out or failing): check "
                    "the system model and the clients"
                )
            item = next_arrival(self.in_flight)
            self.virtual_time = item["finish"]
            self.buffer.append(item)
        arrived, self.buffer = self.buffer, []
        clients = [item["client"] for item in arrived]
        current = fits.payloads(rnd.index, clients)
        staleness = [rnd.index - item["version"] for item in arrived]
        rnd.client_ids, rnd.payloads = clients, current
        rnd.jobs = [job(item) for item in arrived]
        rnd.results = {
            item["client"]: fit_result(item, self.server_weights(item, dict(current[c].weights), s))
            for item, c, s in zip(arrived, clients, staleness, strict=True)
        }  # fmt: skip
        self.last = {
            "staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness),
            "buffer_fill": len(arrived), "in_flight": len(self.in_flight),
        }  # fmt: skip

    def _dispatch(self, version: int, fits: Fits) -> None:
        """Start fits in the free slots (module docstring)."""
        free = self.concurrency - len(self.in_flight)
        if free <= 0:
            return
        index = self.dispatches
        self.dispatches += 1
        busy = {item["client"] for item in [*self.in_flight, *self.buffer]}
        order = [c for c in sample_clients(self.seed, index, self.num_clients, self.num_clients)
                 if c not in busy]  # fmt: skip
        chosen = self.system.taking_part(index, order, self.virtual_time)[:free]
        for cid, payload, result in fits.fit(index, version, chosen) if chosen else []:
            finish = self.virtual_time + self.system.fit_duration(cid, result.upload)
            place = (index, chosen.index(cid))
            self.in_flight.append(entry(cid, place, version, finish, payload, result))

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        self.virtual_time_to_target, columns = time_to_target_columns(
            round, row, self.virtual_time, self.virtual_time_to_target
        )
        return {**row, **self.last, "virtual_time": self.virtual_time, **columns}

    def done_note(self) -> str:
        return f", virtual time {self.virtual_time:.1f} s"


def floating(tensor: torch.Tensor) -> bool:
    """Whether a state entry is mixed (floating point); others (BatchNorm's step counts) are
    taken from the arrived fit as they are."""
    return tensor.is_floating_point() or tensor.is_complex()
