"""Client jobs and fit results as wire blobs (the Flower backend's message contents).

One message carries all the :class:`~fedlightning.protocol.ClientJob` s of a round that one
SuperNode serves, as one blob (:mod:`fedlightning.flower_app.wire`, carried by one Flower
``Array``, :mod:`fedlightning.flower_app.envelope`) whose value is::

    {"fit_config": FitConfig fields, "spec": the model/data classes and init args,
     "jobs": [{"round", "client", "model_index", "weights", "extras", "state"}, ...],
     "secure": the SecAgg+ round plan or None}

(``weights``: the payload's (sub-)state_dict, heterogeneous clients holding only their group's
keys; ``extras``: the payload's extras, e.g. SCAFFOLD's ``c``; ``state``: the client's state from
the server's ClientStore; ``secure``: :mod:`fedlightning.flower_app.secure`). Clients sharing a
payload share its tensors in the blob. The reply's blob is ``{"results": [...]}``, per client
either ``{"client", "weights", "num_samples", "num_steps", "extras", "model_index", "metrics",
"state"}`` or ``{"client", "error": {"type", "message", "traceback"}}`` when its fit raised.
Every value is copied bit for bit, so a fit on a SuperNode gives the bytes a local fit gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from fedlightning.flower_app.wire import decode, encode
from fedlightning.protocol import ClientJob, FitConfig, FitResult, Payload, Upload

#: what a reply says of a client whose fit raised (or that the reply lacks)
ErrorFields = dict[str, str]


def jobs_blob(
    jobs: Sequence[ClientJob],
    config: FitConfig,
    spec: Mapping[str, Any],
    secure: Mapping[str, Any] | None = None,
) -> bytes:
    """The blob that asks one SuperNode for all of ``jobs`` (its clients of a round)."""
    return encode(
        {
            "fit_config": dataclasses.asdict(config),
            "spec": dict(spec),
            "jobs": [
                {
                    "round": job.round_index,
                    "client": job.client_id,
                    "model_index": job.payload.model_index,
                    "weights": job.payload.weights,  # tensors on any device: encode copies
                    "extras": job.payload.extras,  # them to the CPU, each shared one once
                    "state": job.state,
                    "max_steps": job.max_steps,
                }
                for job in jobs
            ],
            "secure": None if secure is None else dict(secure),
        }
    )


def read_jobs(
    blob: bytes,
) -> tuple[list[ClientJob], FitConfig, dict[str, Any], dict[str, Any] | None]:
    """The jobs, the fit config, the model/data spec and the SecAgg+ plan of :func:`jobs_blob`."""
    value = decode(blob)
    jobs = [
        ClientJob(
            int(job["round"]),
            int(job["client"]),
            Payload(job["weights"], job["extras"], int(job["model_index"])),
            job["state"],
            job.get("max_steps"),
        )  # fmt: skip
        for job in value["jobs"]
    ]
    return jobs, FitConfig(**value["fit_config"]), value["spec"], value["secure"]


def outcome_fields(cid: int, outcome: FitResult | tuple[BaseException, str]) -> dict[str, Any]:
    """One client's entry in a reply: its result, or the exception its fit raised."""
    if not isinstance(outcome, FitResult):
        error, traceback_text = outcome
        return {
            "client": cid,
            "error": {"type": type(error).__name__, "message": str(error),
                      "traceback": traceback_text},
        }  # fmt: skip
    upload = outcome.upload
    return {
        "client": cid,
        "weights": upload.weights,
        "num_samples": upload.num_samples,
        "num_steps": upload.num_steps,
        "extras": upload.extras,
        "model_index": upload.model_index,
        "metrics": {k: float(v) for k, v in upload.metrics.items()},
        "state": outcome.state,
    }


def results_blob(outcomes: Mapping[int, FitResult | tuple[BaseException, str]]) -> bytes:
    """The reply's blob: per client id, its fit's result, or the exception it raised and the
    traceback."""
    return encode({"results": [outcome_fields(cid, o) for cid, o in outcomes.items()]})


def result_of(fields: Mapping[str, Any], key_order: Sequence[str]) -> FitResult | ErrorFields:
    """A reply entry as a :class:`FitResult` (weights in ``key_order``, the payload's key order),
    or its ``error`` fields."""
    if "error" in fields:
        return {k: str(v) for k, v in fields["error"].items()}
    weights = fields["weights"]
    ordered = {k: weights[k] for k in key_order if k in weights}
    ordered.update({k: v for k, v in weights.items() if k not in ordered})
    upload = Upload(
        int(fields["client"]), ordered, int(fields["num_samples"]), int(fields["num_steps"]),
        fields["extras"], int(fields["model_index"]),
        {k: float(v) for k, v in fields["metrics"].items()},
    )  # fmt: skip
    return FitResult(upload, fields["state"])


def read_results(blob: bytes) -> dict[int, dict[str, Any]]:
    """The entries of a reply blob, by client id."""
    return {int(entry["client"]): entry for entry in decode(blob)["results"]}


def missing(client_id: int) -> ErrorFields:
    """The error of a client the node's reply holds no result for."""
    return {
        "type": "LookupError",
        "message": f"the SuperNode's reply holds no result for client {client_id}",
        "traceback": "",
    }
