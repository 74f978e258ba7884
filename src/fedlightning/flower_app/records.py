"""Client jobs and fit results as Flower records (the wire format of the Flower backend).

A :class:`~fedlightning.protocol.ClientJob` travels to a SuperNode as a ``RecordDict``:

=====================  ==========================================================================
record                 content
=====================  ==========================================================================
``weights``            ArrayRecord: the payload's (sub-)state_dict (heterogeneous clients: only
                       their group's keys)
``payload.arrays``     ArrayRecord: payload extras that are tensors (SCAFFOLD's ``c`` entries)
``payload.objects``    ConfigRecord: any other payload extra, ``torch.save`` bytes
``state.arrays`` /     the client's state (from the server's ClientStore), split the same way
``state.objects``
``job``                ConfigRecord: round, client id, ``model_index`` (FedCross), the run's
                       :class:`~fedlightning.protocol.FitConfig` and the model/data spec (JSON)
=====================  ==========================================================================

The reply holds ``weights`` (the trained state_dict), ``upload.arrays``/``upload.objects`` (upload
extras, e.g. SCAFFOLD's ``delta_c``, FedNova's ``a``), ``state.*`` (the new client state), ``upload``
(ConfigRecord: client id, n_i, steps, model index) and ``metrics`` (MetricRecord); or ``error``
(ConfigRecord: exception type, message, traceback) when the fit raised.

Tensors whose dtype NumPy lacks (``bfloat16``) and non-tensor values go as ``torch.save`` bytes,
read back with ``torch.load(weights_only=True)`` (no code runs on load). Every conversion is exact,
so a fit on a SuperNode gives the bytes a local fit gives.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping
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


def job_content(job: ClientJob, config: FitConfig, spec: Mapping[str, Any]) -> RecordDict:
    """The message content that asks a SuperNode for ``job``."""
    content = RecordDict()
    put_mapping(content, "weights", job.payload.weights)
    put_mapping(content, "payload", job.payload.extras)
    put_mapping(content, "state", job.state)
    content["job"] = ConfigRecord(
        {
            "round_index": job.round_index,
            "client_id": job.client_id,
            "model_index": job.payload.model_index,
            "fit_config": json.dumps(dataclasses.asdict(config)),
            "spec": json.dumps(spec, sort_keys=True),
        }
    )
    return content


def read_job(content: RecordDict) -> tuple[ClientJob, FitConfig, dict[str, Any]]:
    """The job, the fit config and the model/data spec from :func:`job_content`'s record."""
    meta = content.config_records["job"]
    payload = Payload(
        get_mapping(content, "weights"),
        get_mapping(content, "payload"),
        int(meta["model_index"]),  # type: ignore[arg-type]
    )
    job = ClientJob(
        int(meta["round_index"]),  # type: ignore[arg-type]
        int(meta["client_id"]),  # type: ignore[arg-type]
        payload,
        get_mapping(content, "state"),
    )
    config = FitConfig(**json.loads(str(meta["fit_config"])))
    return job, config, json.loads(str(meta["spec"]))


def result_content(result: FitResult) -> RecordDict:
    """The reply content for a successful fit."""
    upload = result.upload
    content = RecordDict()
    put_mapping(content, "weights", upload.weights)
    put_mapping(content, "upload", upload.extras)
    put_mapping(content, "state", result.state)
    content["upload"] = ConfigRecord(
        {
            "client_id": upload.client_id,
            "num_samples": upload.num_samples,
            "num_steps": upload.num_steps,
            "model_index": upload.model_index,
        }
    )
    content["metrics"] = MetricRecord({k: float(v) for k, v in upload.metrics.items()})
    return content


def error_content(error: BaseException, traceback_text: str) -> RecordDict:
    """The reply content for a fit that raised."""
    content = RecordDict()
    content["error"] = ConfigRecord(
        {"type": type(error).__name__, "message": str(error), "traceback": traceback_text}
    )
    return content


def read_result(content: RecordDict, key_order: list[str]) -> FitResult | dict[str, str]:
    """The :class:`FitResult` in a reply (weights in ``key_order``, the payload's key order), or
    the ``error`` record's fields when the fit raised."""
    if "error" in content.config_records:
        return {k: str(v) for k, v in content.config_records["error"].items()}
    meta = content.config_records["upload"]
    weights = get_mapping(content, "weights")
    ordered = {k: weights[k] for k in key_order if k in weights}
    ordered.update({k: v for k, v in weights.items() if k not in ordered})
    upload = Upload(
        int(meta["client_id"]),  # type: ignore[arg-type]
        ordered,
        int(meta["num_samples"]),  # type: ignore[arg-type]
        int(meta["num_steps"]),  # type: ignore[arg-type]
        get_mapping(content, "upload"),
        int(meta["model_index"]),  # type: ignore[arg-type]
        {k: float(v) for k, v in content.metric_records["metrics"].items()},  # type: ignore[arg-type]
    )
    return FitResult(upload, get_mapping(content, "state"))
