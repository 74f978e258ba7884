"""Secure aggregation with Flower's SecAgg+: what each SuperNode masks, and how the server turns
the one sum it learns back into what the owner-aware weighted mean needs (docs/algorithms.md
section 2.7).

Each round every SuperNode (those without a sampled client too) sends Flower's ``secaggplus_mod``
one float64 vector with the same layout, the round's *plan* (:func:`plan_round`):

- one slot per distinct floating tensor of the round's payloads (per tensor object: clients of a
  group share their payload's tensors; keys shared across groups are one server tensor), holding
  ``sum_i alpha_i (w_i - w)`` over the node's clients ``i`` whose payload has that tensor, with
  ``w`` the payload's value, ``w_i`` the client's trained value and ``alpha_i = q_i / Q`` (``q_i``
  the aggregator's weight, ``n_i`` or 1, ``Q`` its sum over the round's sampled clients);
- one slot for ``sum_i train_loss_i / (K C)`` (``K`` sampled clients, ``C`` the clipping range).

Flower quantises each node's vector to integers (``C`` the clipping range, ``T`` the quantisation
range), masks it, and the server unmasks the sum over the ``J`` nodes whose vectors arrived: it
learns ``S = sum_nodes v + e`` with ``|e| < J 2C/T`` per entry, never a node's or a client's
vector. Per slot, with ``m = sum alpha_i`` over the clients that succeeded and own it,
``mean = w + S / m`` (float64), the owner-aware weighted mean up to ``J (2C/T) / m``. The unit
SecAgg+ protects is the SuperNode: a node fits its own clients, so it sees their uploads; the
server sees only the sum over the nodes.

What else the server learns, in plain, per client: whether its fit succeeded (and the exception
if not), ``n_i``, its optimizer steps, its model index and its integer buffers (BatchNorm's
``num_batches_tracked``: a counter, taken from the first owner as in the plain mean). Each
succeeding client's upload, as the loop sees it, is a stand-in: the round's securely aggregated
mean of its keys, its own integer buffers, no upload extras and the round's mean train loss; a
mean-based aggregator (FedAvg's mean, FedAvgM, FedAdam) computes from those exactly what it
computes from the real uploads, up to the quantisation above.

A node refuses (the run stops with a ConfigurationError) a vector entry outside ``[-C, C]``
(Flower would clip it silently) and a client state that is not empty (the server's ClientStore
would hold it in plain: SCAFFOLD's ``c_i`` reveals the client's model); a non-finite upload is
that client's failure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.common import bytes_to_ndarray, ndarray_to_bytes

from fedlightning.protocol import ClientJob, FitResult, Upload

#: the error types for which a node refuses the whole round (the run stops), not one client
REFUSED = ("SecAggClientState",)


def client_weight(weighting: str, num_samples: int) -> float:
    """``q_i``: the aggregator's weight of a client (``samples``: ``n_i``; ``uniform``: 1)."""
    return float(num_samples) if weighting == "samples" else 1.0


def plan_round(
    batches: Mapping[int, Sequence[ClientJob]],
    weighting: str,
    num_samples: Mapping[int, int],
    clipping_range: float,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Per node (every node of ``batches``, those without a job too), its plan: the slot sizes
    (the same for every node), ``alpha``'s parts, ``K``, ``C`` and, per client of the node, the
    slot of each floating key. And the server's layout: the same with every client's keys and
    ``tensors``, each slot's payload tensor (``None`` for the loss slot, the last)."""
    slot_of: dict[int, int] = {}  # id(payload tensor) -> slot
    tensors: list[Any] = []
    keys: dict[str, dict[str, int]] = {}
    for jobs in batches.values():
        for job in jobs:
            assigned = {}
            for key, tensor in job.payload.weights.items():
                if tensor.is_floating_point():
                    if id(tensor) not in slot_of:
                        slot_of[id(tensor)] = len(tensors)
                        tensors.append(tensor)
                    assigned[key] = slot_of[id(tensor)]
            keys[str(job.client_id)] = assigned
    jobs = [job for batch in batches.values() for job in batch]
    common = {
        "slots": [t.numel() for t in tensors] + [1],
        "weighting": weighting,
        "total_weight": sum(client_weight(weighting, num_samples[j.client_id]) for j in jobs),
        "sampled": len(jobs),
        "clipping_range": float(clipping_range),
    }
    plans = {
        node: {**common, "keys": {str(j.client_id): keys[str(j.client_id)] for j in batch}}
        for node, batch in batches.items()
    }
    return plans, {**common, "keys": keys, "tensors": [*tensors, None]}


# -- on the node ---------------------------------------------------------------------------------
def node_vector(
    jobs: Sequence[ClientJob],
    outcomes: Mapping[int, FitResult | tuple[BaseException, str]],
    plan: Mapping[str, Any],
) -> tuple[dict[str, Any], bytes]:
    """What this node sends: the plain part (per client: its outcome, ``n_i``, steps, model
    index, integer buffers; or ``refused``) and the vector for SecAgg+ (``.npy`` bytes)."""
    offsets = np.cumsum([0, *plan["slots"]])
    vector = torch.zeros(int(offsets[-1]), dtype=torch.float64)
    entries, refused = [], None
    scale_loss = 1.0 / (plan["sampled"] * plan["clipping_range"])
    for job in jobs:
        outcome = outcomes[job.client_id]
        if not isinstance(outcome, FitResult):
            error, text = outcome
            entries.append(_error(job.client_id, type(error).__name__, str(error), text))
            continue
        upload, keys = outcome.upload, plan["keys"][str(job.client_id)]
        problem = _problem(job, outcome)
        if problem is not None:
            entries.append(_error(job.client_id, *problem))
            if problem[0] in REFUSED:
                refused = refused or problem[1]
            continue
        alpha = client_weight(plan["weighting"], upload.num_samples) / plan["total_weight"]
        for key, slot in keys.items():
            delta = upload.weights[key].detach().cpu().double() - job.payload.weights[key].double()
            vector[offsets[slot] : offsets[slot + 1]] += alpha * delta.reshape(-1)
        loss = upload.metrics.get("train_loss")
        if loss is not None and math.isfinite(loss):
            vector[-1] += float(loss) * scale_loss
        entries.append({
            "client": job.client_id, "num_samples": upload.num_samples,
            "num_steps": upload.num_steps, "model_index": upload.model_index,
            "ints": {k: v for k, v in upload.weights.items() if not v.is_floating_point()},
            "has_loss": loss is not None and math.isfinite(loss),
        })  # fmt: skip
    limit = plan["clipping_range"]
    if refused is None and not bool((vector.abs() <= limit).all()):
        worst = int(vector.abs().nan_to_num(float("inf")).argmax())
        slot = int(np.searchsorted(offsets, worst, side="right")) - 1
        names = {s: k for keys in plan["keys"].values() for k, s in keys.items()}
        what = names.get(slot, "the train loss slot")
        refused = (
            f"a value of this node's SecAgg+ vector, {float(vector[worst]):.6g} (for {what}), "
            f"lies outside [-clipping_range, clipping_range] = [-{limit:g}, {limit:g}]: SecAgg+ "
            "would clip it; raise clipping_range, and quantization_range with it to keep the "
            "quantisation step 2 clipping_range / quantization_range (nodes x "
            "quantization_range must stay below modulus_range); BatchNorm running variances "
            "can move by far more than the weights"
        )
    if refused is not None:
        vector.zero_()  # the node still takes part, adding nothing
    plain = {"results": entries, "refused": refused}
    return plain, ndarray_to_bytes(vector.numpy())


def _error(cid: int, kind: str, message: str, text: str = "") -> dict[str, Any]:
    return {"client": cid, "error": {"type": kind, "message": message, "traceback": text}}


def _problem(job: ClientJob, outcome: FitResult) -> tuple[str, str] | None:
    """Why a fit's result cannot enter the sum (``(type, message)``), or ``None``."""
    if outcome.state:
        return (
            "SecAggClientState",
            f"the client objective keeps per-client state ({sorted(outcome.state)[:4]}), which "
            "the server's ClientStore would hold in plain (e.g. SCAFFOLD's c_i reveals the "
            "client's model): secure aggregation needs a stateless objective",
        )
    weights, payload = outcome.upload.weights, job.payload.weights
    if set(weights) != set(payload) or any(
        weights[k].shape != payload[k].shape or weights[k].dtype != payload[k].dtype
        for k in payload
    ):
        return "UploadMismatch", "the upload's keys, shapes or dtypes differ from its payload's"
    if not all(bool(torch.isfinite(v).all()) for v in weights.values() if v.is_floating_point()):
        return "NonFiniteUpload", "the upload holds NaN or Inf"
    return None


# -- on the server -------------------------------------------------------------------------------
def stand_ins(
    jobs: Sequence[ClientJob],
    layout: Mapping[str, Any],
    aggregate: bytes,
    contributors: int,
    entries: Mapping[int, Mapping[str, Any]],
) -> dict[int, FitResult]:
    """The stand-in result of every client with a successful ``entries`` item (module
    docstring): ``aggregate`` is Flower's unmasked mean over the ``contributors`` vectors laid out
    as :func:`plan_round`'s ``layout`` says."""
    total = contributors * bytes_to_ndarray(aggregate).astype(np.float64)
    offsets = np.cumsum([0, *layout["slots"]])
    if total.shape != (offsets[-1],):
        raise ValueError(f"SecAgg+ returned {total.shape} values, the plan has {offsets[-1]}")
    ok = [j for j in jobs if j.client_id in entries and "error" not in entries[j.client_id]]
    mass = np.zeros(len(layout["slots"]))
    for job in ok:
        weight = client_weight(layout["weighting"], entries[job.client_id]["num_samples"])
        alpha = weight / layout["total_weight"]  # as the node computed it
        for slot in layout["keys"][str(job.client_id)].values():
            mass[slot] += alpha
    means: dict[int, torch.Tensor] = {}
    for slot, tensor in enumerate(layout["tensors"][:-1]):
        if mass[slot] > 0:
            part = torch.from_numpy(total[offsets[slot] : offsets[slot + 1]])
            flat = tensor.detach().cpu().double().reshape(-1) + part / mass[slot]
            means[slot] = flat.reshape(tensor.shape).to(tensor.dtype)
    with_loss = sum(bool(entries[j.client_id]["has_loss"]) for j in ok)
    loss = float(total[-1]) * layout["sampled"] * layout["clipping_range"] / max(with_loss, 1)
    out = {}
    for job in ok:
        entry, keys = entries[job.client_id], layout["keys"][str(job.client_id)]
        weights = {
            k: means[keys[k]] if k in keys else entry["ints"][k] for k in job.payload.weights
        }
        upload = Upload(
            job.client_id, weights, int(entry["num_samples"]), int(entry["num_steps"]), {},
            int(entry["model_index"]), {"train_loss": loss} if with_loss else {},
        )  # fmt: skip
        out[job.client_id] = FitResult(upload, {})
    return out
