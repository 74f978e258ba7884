"""Communication cost of a run, counted from what actually travels (docs/algorithms.md section 6).

A message's size is the sum of ``Tensor.nbytes`` over its ``weights`` and every tensor in its
``extras`` (nested dicts, lists and tuples are walked); a Python number in the extras counts 8
bytes (it would travel as a 64-bit value), a string its UTF-8 length, ``None`` nothing, a NumPy
array its ``nbytes`` and any other object (a user objective's own extras) its pickled size. The
:class:`~fedlightning.protocol.Payload`'s ``model_index`` and the
:class:`~fedlightning.protocol.Upload`'s bookkeeping fields (client id, sample and step counts,
metrics) are metadata of a few bytes and are not counted, so FedCross, whose every client receives
and uploads exactly one model, costs exactly what FedAvg costs.

Per round: ``comm_sent_bytes`` is the server-to-client traffic (every dispatched payload, one copy
per sampled client even when clients share one payload object), ``comm_received_bytes`` the
client-to-server traffic (every upload that came back, including those the failure policy rejects
as non-finite; a client that raised sent nothing). ``comm_sent_total`` and ``comm_received_total``
accumulate over all rounds run so far, evaluated or not, and survive a resume.

:class:`CommunicationMeter` is a round component (docs/algorithms.md section 6.2): it counts at
``on_results`` and adds its columns to each evaluated row. The sizes are
:func:`fedlightning.protocol.message_bytes` (the messages' module: the system model times uploads
by them too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fedlightning.protocol import ClientJob, FitResult, message_bytes
from fedlightning.round_components import Round, RoundComponent, Row


class CommunicationMeter(RoundComponent):
    """Counts the bytes of each round's payloads and uploads and keeps the running totals
    (declared state ``sent_total``, ``received_total``). Always on."""

    name = "communication"
    transient_attributes = frozenset({"last"})

    def __init__(self) -> None:
        self.add_state("sent_total", 0)
        self.add_state("received_total", 0)
        self.last: dict[str, int] = {}  # the latest round's columns

    def on_results(self, round: Round) -> None:
        self.last = self.count(round.jobs, round.results)

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        return {**row, **self.last}

    def count(
        self, jobs: Iterable[ClientJob], results: Mapping[int, FitResult | BaseException]
    ) -> dict[str, int]:
        """One round: the jobs dispatched and the backend's results (exceptions send nothing)."""
        sent = sum(message_bytes(job.payload) for job in jobs)
        received = sum(
            message_bytes(r.upload) for r in results.values() if isinstance(r, FitResult)
        )
        self.sent_total += sent
        self.received_total += received
        return {
            "comm_sent_bytes": sent,
            "comm_received_bytes": received,
            "comm_sent_total": self.sent_total,
            "comm_received_total": self.received_total,
        }
