"""The in-flight fits of an asynchronous run, as plain values a checkpoint holds
(docs/algorithms.md section 6.4).

A fit runs when it is dispatched (its result depends only on its payload, its state and its
seed), then waits, in flight, until its arrival in virtual time. An entry is a dict of tensors,
numbers and strings (``torch.load(weights_only=True)`` reads it back): ``client``, ``dispatch``
(the index of the dispatch that started it), ``order`` (its place in that dispatch's draw),
``version`` (the server updates before it),
``finish`` (its arrival time), ``received`` (the weights it was sent), the upload's fields and
the client's new ``state``.
"""

from __future__ import annotations

from typing import Any

import torch

from fedlightning.protocol import ClientJob, FitResult, Payload, Upload
from fedlightning.server.declared_state import clone_value

__all__ = ["arrival_key", "entry", "fit_result", "job", "next_arrival"]


def entry(
    client: int,
    dispatch: tuple[int, int],
    version: int,
    finish: float,
    payload: Payload,
    result: FitResult,
) -> dict[str, Any]:
    """One in-flight fit, ``dispatch`` its (dispatch index, place in the draw) (copies: a later in-place update of the server's weights or of the
    client's state cannot reach it)."""
    upload = result.upload
    return clone_value({
        "client": client, "dispatch": dispatch[0], "order": dispatch[1], "version": version, "finish": finish,
        "received": dict(payload.weights), "received_extras": dict(payload.extras),
        "model_index": payload.model_index, "weights": dict(upload.weights),
        "num_samples": upload.num_samples, "num_steps": upload.num_steps,
        "extras": dict(upload.extras), "metrics": dict(upload.metrics), "state": result.state,
    })  # fmt: skip


def arrival_key(item: dict[str, Any]) -> tuple[float, int, int]:
    """The tie rule: arrivals in order of (arrival time, dispatch index, place in the dispatch's
    draw): of fits arriving together, the one started first, then the one drawn first."""
    return item["finish"], item["dispatch"], item["order"]


def next_arrival(in_flight: list[dict[str, Any]]) -> dict[str, Any]:
    """The in-flight fit that arrives first (:func:`arrival_key`), taken out of ``in_flight``."""
    first = min(range(len(in_flight)), key=lambda i: arrival_key(in_flight[i]))
    return in_flight.pop(first)


def fit_result(item: dict[str, Any], weights: dict[str, torch.Tensor]) -> FitResult:
    """The arrived fit as the server receives it, its upload carrying ``weights``."""
    upload = Upload(
        client_id=item["client"], weights=weights, num_samples=item["num_samples"],
        num_steps=item["num_steps"], extras=item["extras"], model_index=item["model_index"],
        metrics=item["metrics"],
    )  # fmt: skip
    return FitResult(upload, item["state"])


def job(item: dict[str, Any]) -> ClientJob:
    """The fit as it was dispatched (what the communication meter counts as sent)."""
    payload = Payload(item["received"], item["received_extras"], item["model_index"])
    return ClientJob(item["dispatch"], item["client"], payload, {})
