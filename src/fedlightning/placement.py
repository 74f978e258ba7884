"""Moving nested messages between devices: tensors inside dicts, lists, tuples and dataclasses
(:class:`~fedlightning.protocol.Payload`, :class:`~fedlightning.protocol.Upload`,
:class:`~fedlightning.protocol.ClientJob`, :class:`~fedlightning.protocol.FitResult`).

The loop keeps the server state on its training device (:mod:`fedlightning.loop.server_device`);
backends that cross processes put what they send on the CPU (:func:`to_cpu`, the wire), and every
file the loop writes holds CPU tensors. A tensor already on the target device is returned as is
(no copy), and a container whose tensors all stay returns itself, so on a CPU run these moves do
nothing at all. Objects shared inside one message (one payload for many jobs, FedCross's identical
middleware models) stay shared after the move.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def move(value: T, device: torch.device | str) -> T:
    """``value`` with every tensor inside it on ``device`` (see the module docstring)."""
    return _move(value, torch.device(device), {})


def to_cpu(value: T) -> T:
    """``value`` with every tensor inside it on the CPU (for the wire and for files)."""
    return move(value, "cpu")


def _move(value: Any, device: torch.device, memo: dict[int, Any]) -> Any:
    key = id(value)
    if key in memo:
        return memo[key]
    out = value
    if isinstance(value, torch.Tensor):
        out = value.to(device)
    elif isinstance(value, dict):
        items = {k: _move(v, device, memo) for k, v in value.items()}
        if any(items[k] is not v for k, v in value.items()):
            out = type(value)(items) if type(value) is not dict else items
    elif isinstance(value, list | tuple):
        items = [_move(v, device, memo) for v in value]
        if any(a is not b for a, b in zip(items, value, strict=True)):
            out = (
                type(value)(*items)
                if hasattr(value, "_fields")  # a NamedTuple
                else type(value)(items)
            )
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _move(getattr(value, f.name), device, memo)
            for f in dataclasses.fields(value)
            if f.init
        }
        if any(v is not getattr(value, k) for k, v in fields.items()):
            out = dataclasses.replace(value, **fields)
    memo[key] = out
    return out
