"""The failure policy: which client results a round keeps, and when failures are a bug.

A client that raises, or uploads non-finite values, is left out of its round and the run goes on
(a failed client never loses the run). But failures that are bugs are not client failures: when
every client of a round fails with the same exception type, or the first round this run trains has
no successful client, the objective (or the data) is broken, and the run stops with the first
traceback instead of "succeeding" at chance accuracy. A lost worker
(:class:`~fedlightning.backends.base.WorkerLost`) is never taken for a bug.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from fedlightning.backends.base import RoundResults, WorkerLost
from fedlightning.errors import StorageError
from fedlightning.loop.summary import RunSummary
from fedlightning.protocol import FitResult, Payload, Upload

log = logging.getLogger("fedlightning")


class ClientBug(RuntimeError):
    """Every client of a round failed the same way (or the first round had no successful client):
    a bug in the objective or the data, not a client failure. The CLI prints the message (which
    holds the first traceback) and exits with status 1."""


@dataclass
class RoundOutcome:
    """A round's results sorted by the policy: successful results (in sampling order), the
    clients that raised (with their exceptions) and those whose upload was refused (with the
    reason: non-finite values, or weights whose shapes differ from the payload's)."""

    results: list[tuple[int, FitResult]] = field(default_factory=list)
    failed: dict[int, BaseException] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)

    @property
    def uploads(self) -> list[Upload]:
        return [result.upload for _, result in self.results]


def sort_results(
    round_index: int,
    client_ids: list[int],
    results: RoundResults,
    payloads: dict[int, Payload] | None = None,
    summary: RunSummary | None = None,
) -> RoundOutcome:
    """Keep each client's result, or log why it is left out (each distinct traceback in full once
    per run when a ``summary`` is given). A storage error (the run's own files) is raised: it is
    no client failure."""
    outcome = RoundOutcome()
    for cid in client_ids:
        result = results[cid]
        if isinstance(result, StorageError):
            raise result
        if isinstance(result, BaseException):
            outcome.failed[cid] = result
        elif not all_finite(result.upload):
            outcome.rejected[cid] = "uploaded NaN/Inf values"
        elif payloads is not None and (wrong := wrong_shapes(result.upload, payloads[cid])):
            outcome.rejected[cid] = f"uploaded weights of the wrong shape ({wrong})"
        else:
            outcome.results.append((cid, result))
    summary = summary if summary is not None else RunSummary()
    summary.record_failures(round_index, _group_tracebacks(outcome.failed))
    summary.record_rejections(round_index, outcome.rejected)
    return outcome


def wrong_shapes(upload: Upload, payload: Payload) -> str:
    """The first upload tensor whose shape differs from the payload's tensor of the same key
    (``"key: got (a, b), expected (c, d)"``), or ``""``."""
    for key, value in upload.weights.items():
        sent = payload.weights.get(key)
        shape = getattr(value, "shape", None)
        if sent is not None and shape != sent.shape:
            got = tuple(shape) if shape is not None else type(value).__name__
            return f"{key}: got {got}, expected {tuple(sent.shape)}"
    return ""


def check_for_bug(round_index: int, first_round: bool, outcome: RoundOutcome) -> None:
    """Raise :class:`ClientBug` when the round's failures say the objective or data is broken."""
    failed = outcome.failed
    if outcome.results or any(isinstance(e, WorkerLost) for e in failed.values()):
        return
    first_error = next(iter(failed.values()), None)
    same_type = (
        bool(failed) and not outcome.rejected and len({type(e) for e in failed.values()}) == 1
    )
    if not (same_type or first_round):
        return
    if first_error is not None:
        detail = _traceback_of(first_error)
    else:
        detail = "every client uploaded NaN/Inf values (a diverging loss or non-finite data)"
    raise ClientBug(
        f"round {round_index + 1}: no client succeeded ({len(failed)} raised, "
        f"{len(outcome.rejected)} uploaded non-finite values); this is a bug in the client "
        f"objective or the data, not a client failure:\n{detail}"
    )


def _traceback_of(error: BaseException) -> str:
    text = getattr(error, "traceback", None)
    return text if text else f"{type(error).__name__}: {error}"


def _group_tracebacks(failed: dict[int, BaseException]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for cid, error in failed.items():
        grouped.setdefault(_traceback_of(error), []).append(cid)
    return grouped


def all_finite(value: Any) -> bool:
    """No NaN/Inf in any floating tensor of an upload's weights or extras (nested dicts/lists too).

    The tensors' flags are read back once per device: an upload on the GPU costs one sync, not
    one per tensor."""
    tensors: list[torch.Tensor] = []
    numbers: list[float] = []
    _collect(value, tensors, numbers)
    if not all(math.isfinite(x) for x in numbers):
        return False
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        flags.setdefault(tensor.device, []).append(torch.isfinite(tensor).all())
    return all(bool(torch.stack(group).all()) for group in flags.values())


def _collect(value: Any, tensors: list[torch.Tensor], numbers: list[float]) -> None:
    if isinstance(value, Upload):
        _collect(value.weights, tensors, numbers)
        _collect(value.extras, tensors, numbers)
    elif isinstance(value, torch.Tensor):
        if value.is_floating_point():
            tensors.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, tensors, numbers)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, tensors, numbers)
    elif isinstance(value, float):
        numbers.append(value)
