"""What a run is: the fields a checkpoint stores so that a resume can refuse another run's state.

A checkpoint made by :func:`run_identity` records the client objective class, the aggregator class
and its configuration, the network architecture (class, option and a hash of every state_dict key
with its shape), the data set and number of clients, the partition hash, the seed and the client
state mode. :func:`compare_identity` refuses a resume whose identity differs in any of them, with
a message naming the field, both values and what to do. The library version is stored too, but a
different one only warns: a checkpoint of an older release that still matches every field resumes.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from typing import Any

import torch

import fedlightning
from fedlightning.errors import ConfigurationError

log = logging.getLogger("fedlightning")

#: fields compared on resume, in the order they are checked, with what to do on a mismatch
COMPARED = {
    "objective": "resume with the same --model class_path",
    "aggregator": "resume with the same --loop.aggregator class_path",
    "aggregator_config": "resume with the same --loop.aggregator init_args",
    "network": "resume with the same model.network/networks and network_kwargs",
    "architecture": "resume with the same model.network/networks and network_kwargs",
    "dataset": "resume with the same --data.dataset",
    "num_clients": "resume with the same --data.num_clients",
    "seed": "resume with the same --loop.seed",
    "partition_hash": "resume with the same data options (partition, beta, val_fraction, ...)",
    "client_state": "resume with the same --loop.client_state",
}


def class_path(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def object_config(obj: Any, depth: int = 0) -> dict[str, Any]:
    """The constructor arguments of ``obj`` that it keeps as attributes of the same name (nested
    objects, e.g. InCo's ``inner`` aggregator, as ``{"class_path", "init_args"}``)."""
    config: dict[str, Any] = {}
    try:
        parameters = inspect.signature(type(obj).__init__).parameters
    except (TypeError, ValueError):  # a builtin: no Python signature
        return config
    for name in parameters:
        if name == "self" or not hasattr(obj, name):
            continue
        config[name] = _plain(getattr(obj, name), depth)
    return config


def _plain(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v, depth) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, depth) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    if callable(value) and not hasattr(value, "__dict__"):
        return class_path(value)
    if depth >= 3:  # deep object graphs (a network passed as an object): its class says enough
        return class_path(value)
    return {"class_path": class_path(value), "init_args": object_config(value, depth + 1)}


def architecture(state: dict[str, torch.Tensor]) -> str:
    """``"<n> tensors, <p> parameters, sha256 <12 hex>"`` of the server model's keys and shapes."""
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(f"{key}:{tuple(state[key].shape)}:{state[key].dtype};".encode())
    params = sum(v.numel() for v in state.values())
    return f"{len(state)} tensors, {params:,} parameters, sha256 {digest.hexdigest()[:12]}"


def run_identity(
    model: Any,
    aggregator: Any,
    initial: dict[str, torch.Tensor],
    dataset: str,
    num_clients: int,
    partition_hash: str,
    seed: int,
    client_state: str,
) -> dict[str, Any]:
    """The identity of a run, as stored in its checkpoints."""
    hparams = dict(getattr(model, "hparams", {}) or {})
    network = {
        "class": type(getattr(model, "network", None)).__name__,
        "network": _plain(hparams.get("network")),
        "networks": _plain(hparams.get("networks")),
        "network_kwargs": _plain(hparams.get("network_kwargs")),
    }
    return {
        "objective": class_path(model),
        "aggregator": class_path(aggregator),
        "aggregator_config": object_config(aggregator),
        "network": network,
        "architecture": architecture(initial),
        "dataset": dataset,
        "num_clients": num_clients,
        "seed": seed,
        "partition_hash": partition_hash,
        "client_state": client_state,
        "library_version": fedlightning.__version__,
    }


def compare_identity(ckpt_path: str, stored: Any, current: dict[str, Any]) -> None:
    """Raise a one-line :class:`ConfigurationError` at the first field in which the checkpoint's
    identity ``stored`` differs from this run's ``current``."""
    if not isinstance(stored, dict):
        raise ConfigurationError(
            f"ckpt_path={ckpt_path!r} does not say which run wrote it (no identity): it is not a "
            "checkpoint of this fedlightning; start a new run"
        )
    for field, todo in COMPARED.items():
        if field not in stored:
            raise ConfigurationError(
                f"ckpt_path={ckpt_path!r} lacks the field {field!r}: it is inconsistent; start a "
                "new run or resume from another checkpoint"
            )
        if stored[field] != current[field]:
            name, old, new = _first_difference(field, stored[field], current[field])
            raise ConfigurationError(
                f"ckpt_path={ckpt_path!r} was written by another run: {name} is {_short(old)} "
                f"in the checkpoint but {_short(new)} in this run; {todo}, or start a new run "
                "in another --loop.run_dir"
            )
    if stored.get("library_version") != current["library_version"]:
        log.warning(
            "%s was written by fedlightning %s, this is %s: resuming (every compared field matches)",
            ckpt_path, stored.get("library_version"), current["library_version"],
        )  # fmt: skip


def _first_difference(name: str, old: Any, new: Any) -> tuple[str, Any, Any]:
    """Narrow two differing dicts to their first differing key (``aggregator_config.aggregation``)."""
    while isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        key = next(k for k in old if old[k] != new[k])
        name, old, new = f"{name}.{key}", old[key], new[key]
    return name, old, new


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
