"""One round of the Flower backend (:class:`~fedlightning.backends.flower.FlowerBackend`): plain,
one message per SuperNode with its clients' jobs and one reply with their uploads; or under
secure aggregation, Flower's SecAgg+ over one vector per SuperNode
(:mod:`fedlightning.flower_app.secure`). Either way, per client its result, the error its fit
raised on the node (:class:`RemoteClientError`), or :class:`~fedlightning.errors.WorkerLost`
when its node gave no reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlightning.backends.base import RoundResults
from fedlightning.errors import ConfigurationError, WorkerLost
from fedlightning.protocol import ClientJob, FitResult

if TYPE_CHECKING:
    from fedlightning.backends.flower import FlowerBackend

PREFIX = "loop.backend.init_args."


class RemoteClientError(RuntimeError):
    """A client's fit raised on its SuperNode (the node's traceback is in ``traceback``)."""


def plain_round(
    backend: FlowerBackend, round_index: int, batches: dict[int, list[ClientJob]]
) -> RoundResults:
    """Each node's jobs as one message, its clients' uploads from its one reply; a node's clients
    are reported done as its reply arrives (a node fits its clients in one message, so that is
    the finest step the round's progress can take)."""
    from fedlightning.flower_app.records import jobs_blob, missing, read_results, result_of

    requests = [
        (node, jobs_blob(batch, backend.config, backend.spec)) for node, batch in batches.items()
    ]
    replies = backend.transport.exchange(
        "train", str(round_index), requests, backend.round_timeout,
        lambda node: backend.report_done(j.client_id for j in batches.get(node, ())),
    )  # fmt: skip
    backend.round_timings = [timing for reply, timing in replies if not isinstance(reply, str)]
    results: RoundResults = {}
    for (node, batch), (reply, _) in zip(batches.items(), replies, strict=True):
        if isinstance(reply, str):
            backend.served.pop(node, None)  # asked again when listed again
            results.update(lost(batch, node, reply))
            continue
        entries = read_results(reply)
        for job in batch:
            fields = entries.get(job.client_id)
            result = result_of(fields, list(job.payload.weights)) if fields else None
            results[job.client_id] = remote(job.client_id, node, result or missing(job.client_id))
    return results


def secure_round(
    backend: FlowerBackend, round_index: int, batches: dict[int, list[ClientJob]]
) -> RoundResults:
    """One round under SecAgg+: every connected node takes part (those without a sampled client
    add zeros), and the server learns only the sum of their vectors; each succeeding client's
    result is a stand-in (:func:`fedlightning.flower_app.secure.stand_ins`)."""
    from fedlightning.flower_app.records import jobs_blob, missing
    from fedlightning.flower_app.secure import plan_round, stand_ins
    from fedlightning.flower_app.secure_options import check_modulus
    from fedlightning.flower_app.wire import decode

    options = backend.secure
    check_modulus(options, len(backend.served))  # nodes may have joined since the start
    if len(backend.served) < 2:  # SecAgg+ would reveal the one node's vector
        return {
            cid: result
            for node, batch in batches.items()
            for cid, result in lost(batch, node, "SecAgg+ needs 2 SuperNodes, 1 is left").items()
        }
    batches = {node: batches.get(node, []) for node in sorted(backend.served)}
    jobs = [job for batch in batches.values() for job in batch]
    samples = {job.client_id: backend.num_samples(job.client_id) for job in jobs}
    plans, layout = plan_round(batches, backend.weighting, samples, options["clipping_range"])
    requests = [
        (node, jobs_blob(batch, backend.config, backend.spec, plans[node]))
        for node, batch in batches.items()
    ]
    out = backend.transport.secure_exchange(
        str(round_index), requests, options, backend.round_timeout
    )
    entries: dict[int, dict[str, Any]] = {}
    for node, blob in out["plain"].items():
        plain = decode(blob)
        if plain["refused"]:
            raise ConfigurationError(
                f"{PREFIX}secure_aggregation=true: SuperNode {node} refused round "
                f"{round_index + 1}: {plain['refused']}"
            )
        entries.update({int(e["client"]): e for e in plain["results"]})
    halted = out["aggregate"] is None
    good = {} if halted else stand_ins(jobs, layout, out["aggregate"], out["contributors"], entries)
    why = "; ".join(out["failures"]) or "no reply"
    results: RoundResults = {}
    for node, batch in batches.items():
        if halted or node not in out["plain"]:
            reason = "SecAgg+ halted" if halted else "it dropped out of SecAgg+"
            results.update(lost(batch, node, f"{reason} ({why})"))
            continue
        for job in batch:
            entry = entries.get(job.client_id) or {}
            result = good.get(job.client_id) or entry.get("error") or missing(job.client_id)
            results[job.client_id] = remote(job.client_id, node, result)
    return results


def lost(batch: Sequence[ClientJob], node: int, reason: str) -> RoundResults:
    """Every client of ``batch`` lost with its node."""
    return {j.client_id: WorkerLost(f"client {j.client_id} on SuperNode {node}: {reason}")
            for j in batch}  # fmt: skip


def remote(cid: int, node: int, result: FitResult | dict[str, str]) -> FitResult | BaseException:
    """A client's result, or the error its fit raised on ``node`` (``result``'s fields)."""
    if isinstance(result, FitResult):
        return result
    error = RemoteClientError(
        f"client {cid} on SuperNode {node} raised {result['type']}: {result['message']}"
    )
    error.traceback = result["traceback"]  # type: ignore[attr-defined]
    return error
