"""The failure policy: which client results a round keeps, and when failures are a bug.

A client that raises, uploads what does not match its payload (:func:`upload_mismatch`) or
uploads non-finite values is left out of its round and the run goes on (a failed client never
loses the run). But failures that are bugs are not client failures: when every client of a round
fails with the same exception type, or the first round this run trains has no successful client,
the objective (or the data) is broken, and the run stops with the first traceback (or rejection)
instead of "succeeding" at chance accuracy. A lost worker
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
    reason: an upload that does not match the payload, or non-finite values)."""

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
    required_extras: frozenset[str] = frozenset(),
    precision: str = "32-true",
) -> RoundOutcome:
    """Keep each client's result, or log why it is left out (each distinct traceback in full once
    per run when a ``summary`` is given). With ``payloads``, an upload must match its client's
    payload and hold the ``required_extras`` (the aggregator's), see :func:`upload_mismatch`;
    ``precision`` is the fits' (Lightning's). A storage error (the run's own files) is raised: it
    is no client failure."""
    fit_dtype = fit_float_dtype(precision)
    outcome = RoundOutcome()
    for cid in client_ids:
        result = results[cid]
        if isinstance(result, StorageError):
            raise result
        if isinstance(result, BaseException):
            outcome.failed[cid] = result
        elif payloads is not None and (
            wrong := upload_mismatch(result.upload, payloads[cid], required_extras, fit_dtype)
        ):
            outcome.rejected[cid] = wrong
        elif not all_finite(result.upload):
            outcome.rejected[cid] = "uploaded NaN/Inf values"
        else:
            outcome.results.append((cid, result))
    summary = summary if summary is not None else RunSummary()
    summary.record_failures(round_index, _group_tracebacks(outcome.failed))
    summary.record_rejections(round_index, outcome.rejected)
    return outcome


def fit_float_dtype(precision: str) -> torch.dtype | None:
    """The dtype a fit at Lightning ``precision`` gives floating weights when it is not theirs:
    ``64-true`` trains (and uploads) a float32 model in float64; other precisions keep it."""
    return torch.float64 if precision in ("64-true", "64") else None


def upload_mismatch(
    upload: Upload,
    payload: Payload,
    required_extras: frozenset[str] = frozenset(),
    fit_dtype: torch.dtype | None = None,
) -> str:
    """Why ``upload`` does not fit the ``payload`` it answers, or ``""``; checked after the loop
    placed the uploads on the server device, where the payload is.

    Weights: every key must be one of the payload's (a client may upload fewer keys: it owns
    those), and each value a ``torch.Tensor`` of the payload tensor's dtype, shape and device
    (an int64 copy of a float32 weight would be averaged in as a wrong number; a numpy array
    would crash the aggregation); a floating weight may also come back in ``fit_dtype``
    (:func:`fit_float_dtype`: float64 under ``64-true``, whose first round sends float32).

    Extras: every extra the aggregator requires must be there, and an extra that is a state_dict
    keyed like the model (SCAFFOLD's ``delta_c``) must hold, for each key, a tensor of that
    weight's shape and device, and of its dtype when floating (an integer or bool extra, e.g. a
    mask, keeps its own dtype). Other extras (numbers such as FedNova's ``a``, anything else) are
    the aggregator's to interpret: nothing generic says what they must be.

    The reason names the key, what was uploaded and what was expected."""
    for key, value in upload.weights.items():
        sent = payload.weights.get(key)
        if sent is None:
            return (
                f"uploaded weights the payload lacks ({key}: not among the payload's "
                f"{len(payload.weights)} keys)"
            )
        wrong = _tensor_mismatch(key, value, sent, True, fit_dtype)
        if wrong:
            return f"uploaded weights {wrong}"
    missing = sorted(required_extras - set(upload.extras))
    if missing:
        return f"uploaded no {', '.join(missing)} extra (the aggregator needs it)"
    for name, extra in upload.extras.items():
        if not isinstance(extra, dict) or not extra or not set(extra) <= set(payload.weights):
            continue
        for key, value in extra.items():
            wrong = _tensor_mismatch(
                f"{name}[{key!r}]", value, payload.weights[key], False, fit_dtype
            )
            if wrong:
                return f"uploaded an extra {wrong}"
    return ""


def _tensor_mismatch(
    name: str, value: Any, sent: torch.Tensor, exact_dtype: bool, fit_dtype: torch.dtype | None
) -> str:
    """How ``value`` differs from ``sent`` (``"of the wrong dtype (name: got ..., expected
    ...)"``), or ``""``; ``exact_dtype``: also an integer ``value`` must have ``sent``'s dtype."""
    if not isinstance(value, torch.Tensor):
        kind = type(value)
        return (
            f"that are not tensors ({name}: got {kind.__module__}.{kind.__qualname__}, expected "
            f"a torch.Tensor of {sent.dtype}, shape {tuple(sent.shape)})"
        )
    if value.shape != sent.shape:
        return (
            f"of the wrong shape ({name}: got {tuple(value.shape)}, expected {tuple(sent.shape)})"
        )
    floating = value.is_floating_point() and sent.is_floating_point()
    allowed = {sent.dtype, fit_dtype} if floating and fit_dtype is not None else {sent.dtype}
    if (exact_dtype or floating) and value.dtype not in allowed:
        return f"of the wrong dtype ({name}: got {value.dtype}, expected {sent.dtype})"
    if value.device != sent.device:
        return f"on the wrong device ({name}: got {value.device}, expected {sent.device})"
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
        cid, reason = next(iter(outcome.rejected.items()))
        detail = f"every upload was rejected; client {cid} {reason}"
        if reason == "uploaded NaN/Inf values":
            detail += " (a diverging loss or non-finite data)"
    raise ClientBug(
        f"round {round_index + 1}: no client succeeded ({len(failed)} raised, "
        f"{len(outcome.rejected)} uploads rejected); this is a bug in the client objective or "
        f"the data, not a client failure:\n{detail}"
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

    One fused pass (:func:`tensors_finite`), read back once per device: an upload on the GPU
    costs one sync, not one per tensor."""
    tensors: list[torch.Tensor] = []
    numbers: list[float] = []
    _collect(value, tensors, numbers)
    return all(math.isfinite(x) for x in numbers) and tensors_finite(tensors)


def tensors_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of the floating ``tensors`` is finite, in one fused pass.

    Per device and dtype, the tensors' flattened views are concatenated and summed (in float32,
    float64 for float64 tensors): a NaN or an Inf always makes that sum NaN or Inf, so a finite
    sum proves every element finite, in two kernels instead of two per tensor. A non-finite sum
    holds a NaN/Inf or is an overflow of large finite values (weights near 1e38): only then is
    each tensor checked exactly (``torch.isfinite``), so finite uploads are never refused."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor.reshape(-1))
    sums: dict[torch.device, list[torch.Tensor]] = {}
    for (device, dtype), flat in groups.items():
        accumulate = torch.float64 if dtype == torch.float64 else torch.float32
        joined = torch.cat(flat) if len(flat) > 1 else flat[0]
        sums.setdefault(device, []).append(joined.sum(dtype=accumulate))
    if all(math.isfinite(x) for group in sums.values() for x in _read_back(group)):
        return True
    return all(bool(torch.isfinite(tensor).all()) for tensor in tensors)


def _read_back(sums: list[torch.Tensor]) -> list[float]:
    """The 0-d tensors ``sums`` (on one device) as numbers, in one read-back."""
    if len(sums) == 1:
        return [sums[0].item()]
    return torch.stack([s.to(torch.float64) for s in sums]).tolist()


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
