"""Moving nested messages between devices: tensors inside dicts, lists, tuples and dataclasses
(:class:`~fedlightning.protocol.Payload`, :class:`~fedlightning.protocol.Upload`,
:class:`~fedlightning.protocol.ClientJob`, :class:`~fedlightning.protocol.FitResult`).

The loop keeps the server state on its training device (:mod:`fedlightning.loop.server_device`);
backends that cross processes put what they send on the CPU (:func:`to_cpu`, the wire), and every
file the loop writes holds CPU tensors. A tensor already on the target device is returned as is
(no copy), and a container whose tensors all stay returns itself, so on a CPU run these moves do
nothing at all. Objects shared inside one message (one payload for many jobs, FedCross's identical
middleware models) stay shared after the move.

``copy=True`` makes a snapshot instead (the ClientStore's, so later in-place training cannot reach
what it stored): every tensor is a detached copy and every container a new one, with sharing
inside the value kept as in :func:`copy.deepcopy`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def move(value: T, device: torch.device | str, *, copy: bool = False) -> T:
    """``value`` with every tensor inside it on ``device`` (see the module docstring)."""
    return _move(value, torch.device(device), copy, {})


def to_cpu(value: T, *, copy: bool = False) -> T:
    """``value`` with every tensor inside it on the CPU (for the wire, for files and, with
    ``copy=True``, for the ClientStore's snapshots)."""
    return move(value, "cpu", copy=copy)


def _move(value: Any, device: torch.device, copy: bool, memo: dict[int, Any]) -> Any:
    key = id(value)
    if key in memo:
        return memo[key]
    out = value
    if isinstance(value, torch.Tensor):
        out = value.detach().to(device, copy=True) if copy else value.to(device)
    elif isinstance(value, dict):
        items = {k: _move(v, device, copy, memo) for k, v in value.items()}
        if copy or any(items[k] is not v for k, v in value.items()):
            out = type(value)(items) if type(value) is not dict else items
    elif isinstance(value, list | tuple):
        items = [_move(v, device, copy, memo) for v in value]
        if copy or any(a is not b for a, b in zip(items, value, strict=True)):
            out = (
                type(value)(*items)
                if hasattr(value, "_fields")  # a NamedTuple
                else type(value)(items)
            )
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _move(getattr(value, f.name), device, copy, memo)
            for f in dataclasses.fields(value)
            if f.init
        }
        if copy or any(v is not getattr(value, k) for k, v in fields.items()):
            out = dataclasses.replace(value, **fields)
    memo[key] = out
    return out
