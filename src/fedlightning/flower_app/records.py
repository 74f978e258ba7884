"""Client jobs and fit results as Flower records (the wire format of the Flower backend).

One message carries all the :class:`~fedlightning.protocol.ClientJob` s of a round that one
SuperNode serves (one ClientApp process then fits them all: on Flower 1.41 each message costs a
fresh ``flwr-clientapp`` process). Its ``RecordDict`` holds ``jobs`` (ConfigRecord: the client ids,
the run's :class:`~fedlightning.protocol.FitConfig` and the model/data spec, JSON) and, per client
id ``C``:

=========================  ======================================================================
record                     content
=========================  ======================================================================
``C/weights.arrays``       ArrayRecord: the payload's (sub-)state_dict (heterogeneous clients:
                           only their group's keys)
``C/payload.arrays``       ArrayRecord: payload extras that are tensors (SCAFFOLD's ``c``)
``C/payload.objects``      ConfigRecord: any other payload extra, ``torch.save`` bytes
``C/state.arrays`` /       the client's state (from the server's ClientStore), split the same way
``C/state.objects``
``C/job``                  ConfigRecord: round, ``model_index`` (FedCross)
=========================  ======================================================================

The reply holds ``results`` (ConfigRecord: the client ids) and, per client, ``C/weights.*`` (the
trained state_dict), ``C/upload.*`` (upload extras, e.g. SCAFFOLD's ``delta_c``, FedNova's ``a``),
``C/state.*`` (the new client state), ``C/upload`` (ConfigRecord: client id, n_i, steps, model
index) and ``C/metrics`` (MetricRecord); or ``C/error`` (ConfigRecord: exception type, message,
traceback) when that client's fit raised.

Tensors whose dtype NumPy lacks (``bfloat16``) and non-tensor values go as ``torch.save`` bytes,
read back with ``torch.load(weights_only=True)`` (no code runs on load). Every conversion is exact,
so a fit on a SuperNode gives the bytes a local fit gives.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from fedlightning.placement import to_cpu
from fedlightning.protocol import ClientJob, FitConfig, FitResult, Payload, Upload


def _to_array(value: Any) -> Array | None:
    if not isinstance(value, Tensor):
        return None
    try:
        return Array(value.detach().cpu().contiguous().numpy())
    except TypeError:  # a dtype NumPy does not have (bfloat16)
        return None


def _to_tensor(array: Array) -> Tensor:
    return torch.from_numpy(array.numpy().copy())


def _dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


def put_mapping(content: RecordDict, name: str, mapping: Mapping[str, Any]) -> None:
    """Store ``mapping`` as ``<name>.arrays`` (tensors) and ``<name>.objects`` (anything else)."""
    arrays, objects = ArrayRecord(), ConfigRecord()
    for key, value in mapping.items():
        array = _to_array(value)
        if array is not None:
            arrays[key] = array
        else:
            objects[key] = _dumps(to_cpu(value))  # the server state may be on the GPU
    content[f"{name}.arrays"] = arrays
    content[f"{name}.objects"] = objects


def get_mapping(content: RecordDict, name: str) -> dict[str, Any]:
    """The mapping :func:`put_mapping` stored under ``name``."""
    mapping: dict[str, Any] = {
        k: _to_tensor(v) for k, v in content.array_records[f"{name}.arrays"].items()
    }
    for key, data in content.config_records[f"{name}.objects"].items():
        mapping[key] = _loads(data)  # type: ignore[arg-type]
    return mapping


def jobs_content(
    jobs: Sequence[ClientJob], config: FitConfig, spec: Mapping[str, Any]
) -> RecordDict:
    """The message content that asks one SuperNode for all of ``jobs`` (its clients of a round)."""
    content = RecordDict()
    content["jobs"] = ConfigRecord(
        {
            "client_ids": [job.client_id for job in jobs],
            "fit_config": json.dumps(dataclasses.asdict(config)),
            "spec": json.dumps(spec, sort_keys=True),
        }
    )
    for job in jobs:
        prefix = f"{job.client_id}/"
        put_mapping(content, prefix + "weights", job.payload.weights)
        put_mapping(content, prefix + "payload", job.payload.extras)
        put_mapping(content, prefix + "state", job.state)
        content[prefix + "job"] = ConfigRecord(
            {"round_index": job.round_index, "model_index": job.payload.model_index}
        )
    return content


def read_jobs(content: RecordDict) -> tuple[list[ClientJob], FitConfig, dict[str, Any]]:
    """The jobs, the fit config and the model/data spec from :func:`jobs_content`'s record."""
    meta = content.config_records["jobs"]
    jobs = []
    for cid in meta["client_ids"]:  # type: ignore[union-attr]
        prefix = f"{cid}/"
        job = content.config_records[prefix + "job"]
        payload = Payload(
            get_mapping(content, prefix + "weights"),
            get_mapping(content, prefix + "payload"),
            int(job["model_index"]),  # type: ignore[arg-type]
        )
        round_index = int(job["round_index"])  # type: ignore[arg-type]
        jobs.append(
            ClientJob(round_index, int(cid), payload, get_mapping(content, prefix + "state"))  # type: ignore[arg-type]
        )
    config = FitConfig(**json.loads(str(meta["fit_config"])))
    return jobs, config, json.loads(str(meta["spec"]))


def results_content(outcomes: Mapping[int, FitResult | tuple[BaseException, str]]) -> RecordDict:
    """The reply content: per client id, its fit's result, or the exception it raised and the
    traceback."""
    content = RecordDict()
    content["results"] = ConfigRecord({"client_ids": list(outcomes)})
    for cid, outcome in outcomes.items():
        prefix = f"{cid}/"
        if not isinstance(outcome, FitResult):
            error, traceback_text = outcome
            content[prefix + "error"] = ConfigRecord(
                {"type": type(error).__name__, "message": str(error), "traceback": traceback_text}
            )
            continue
        upload = outcome.upload
        put_mapping(content, prefix + "weights", upload.weights)
        put_mapping(content, prefix + "upload", upload.extras)
        put_mapping(content, prefix + "state", outcome.state)
        content[prefix + "upload"] = ConfigRecord(
            {
                "client_id": upload.client_id,
                "num_samples": upload.num_samples,
                "num_steps": upload.num_steps,
                "model_index": upload.model_index,
            }
        )
        content[prefix + "metrics"] = MetricRecord({k: float(v) for k, v in upload.metrics.items()})
    return content


def read_result(
    content: RecordDict, client_id: int, key_order: list[str]
) -> FitResult | dict[str, str]:
    """Client ``client_id``'s :class:`FitResult` in a reply (weights in ``key_order``, the
    payload's key order), or the ``error`` record's fields when its fit raised."""
    prefix = f"{client_id}/"
    if prefix + "error" in content.config_records:
        return {k: str(v) for k, v in content.config_records[prefix + "error"].items()}
    if prefix + "upload" not in content.config_records:
        return {
            "type": "LookupError",
            "message": "the SuperNode's reply holds no result for this client",
            "traceback": "",
        }
    meta = content.config_records[prefix + "upload"]
    weights = get_mapping(content, prefix + "weights")
    ordered = {k: weights[k] for k in key_order if k in weights}
    ordered.update({k: v for k, v in weights.items() if k not in ordered})
    upload = Upload(
        int(meta["client_id"]),  # type: ignore[arg-type]
        ordered,
        int(meta["num_samples"]),  # type: ignore[arg-type]
        int(meta["num_steps"]),  # type: ignore[arg-type]
        get_mapping(content, prefix + "upload"),
        int(meta["model_index"]),  # type: ignore[arg-type]
        {k: float(v) for k, v in content.metric_records[prefix + "metrics"].items()},  # type: ignore[arg-type]
    )
    return FitResult(upload, get_mapping(content, prefix + "state"))
