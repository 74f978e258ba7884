"""One blob of bytes for a tree of tensors and plain values: the Flower backend's wire codec.

A node's message and its reply (all its clients' jobs, or all their uploads) travel as one blob,
carried by one Flower ``Array`` (:mod:`fedlightning.flower_app.envelope`), so a message is O(1)
Flower objects whatever the number of clients and tensors. Layout (a safetensors-like format
written with the standard library and torch, little-endian)::

    b"FLWIRE1\\n" | header length (8 bytes, unsigned) | header (UTF-8 JSON) | tensor data

The header holds ``tensors`` (per tensor: dtype name, shape, byte offset into the data, byte
length; offsets aligned to 64 bytes) and ``value``, the tree: JSON numbers, strings, booleans and
``null`` as themselves, every other node a one-key object: ``{"t": i}`` tensor ``i``,
``{"l": [...]}`` a list, ``{"u": [...]}`` a tuple, ``{"d": [[key, value], ...]}`` a dict (keys
``str`` or ``int``, order kept). A tensor object that appears several times is stored once and
read back as one object (the clients of a group share one payload).

Why not ``torch.save``/``pickle``: reading a blob runs no code and builds only tensors and plain
values (JSON and ``torch.frombuffer``), whatever a peer sent; why not Flower's ``ArrayRecord``
per tensor: every ``Array`` is a Flower object pushed and pulled on its own (22 objects per
message and 95 per reply on the quickstart before this codec). Values are copied bit for bit
(``bfloat16`` included), so a fit on a SuperNode gives the bytes a local fit gives.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import torch
from torch import Tensor

MAGIC = b"FLWIRE1\n"
ALIGN = 64
#: the dtypes a blob may name (anything else is refused on read)
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
        torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
        torch.bool,
    )
}  # fmt: skip


class WireError(ValueError):
    """A value that cannot be encoded, or a blob that is not a valid one."""


def encode(value: Any) -> bytes:
    """The blob of ``value`` (tensors on any device are copied to the CPU)."""
    if sys.byteorder != "little":
        raise WireError("the Flower wire format is little-endian; this machine is not")
    tensors: list[Tensor] = []
    index: dict[int, int] = {}
    tree = _tree(value, tensors, index, "value")
    entries, chunks, offset = [], [], 0
    for tensor in tensors:
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        pad = -offset % ALIGN
        chunks += [bytes(pad), data]
        offset += pad
        entries.append([str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset,
                        data.nbytes])  # fmt: skip
        offset += data.nbytes
    header = json.dumps({"tensors": entries, "value": tree}, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<Q", len(header)), header, *chunks])


def decode(blob: bytes | bytearray | memoryview) -> Any:
    """The value :func:`encode` wrote (each tensor with its own storage)."""
    view = memoryview(blob)
    if bytes(view[: len(MAGIC)]) != MAGIC or len(view) < len(MAGIC) + 8:
        raise WireError("not a fedlightning wire blob (bad magic)")
    (length,) = struct.unpack("<Q", view[len(MAGIC) : len(MAGIC) + 8])
    start = len(MAGIC) + 8 + length
    if start > len(view):
        raise WireError("truncated fedlightning wire blob (header)")
    try:
        header = json.loads(bytes(view[len(MAGIC) + 8 : start]))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WireError(f"bad fedlightning wire header: {error}") from None
    data = bytearray(view[start:])  # writable, for torch.frombuffer
    tensors = [_tensor(data, entry) for entry in header["tensors"]]
    return _value(header["value"], tensors)


def _tree(value: Any, tensors: list[Tensor], index: dict[int, int], path: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value if type(value) in (int, float) else _refuse(value, path)
    if isinstance(value, Tensor):
        if id(value) not in index:
            index[id(value)] = len(tensors)
            tensors.append(value)
        return {"t": index[id(value)]}
    if isinstance(value, (list, tuple)):
        items = [_tree(v, tensors, index, f"{path}[{i}]") for i, v in enumerate(value)]
        return {"l" if isinstance(value, list) else "u": items}
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if type(key) not in (str, int):
                raise WireError(f"{path} has a key of type {type(key).__name__}: use str or int")
            out.append([key, _tree(item, tensors, index, f"{path}[{key!r}]")])
        return {"d": out}
    return _refuse(value, path)


def _refuse(value: Any, path: str) -> Any:
    raise WireError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}: the Flower wire carries "
        "tensors, int, float, bool, str, None and lists, tuples and dicts of them"
    )


def _tensor(data: bytearray, entry: list[Any]) -> Tensor:
    name, shape, offset, nbytes = entry
    dtype = DTYPES.get(name)
    if dtype is None:
        raise WireError(f"fedlightning wire blob names an unknown dtype {name!r}")
    if not (0 <= offset and offset + nbytes <= len(data)):
        raise WireError("truncated fedlightning wire blob (tensor data)")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
    return raw.view(dtype).reshape(shape).clone()


def _value(node: Any, tensors: list[Tensor]) -> Any:
    if not isinstance(node, dict):
        return node
    if len(node) != 1:
        raise WireError(f"bad fedlightning wire node {str(node)[:80]}")
    ((kind, body),) = node.items()
    if kind == "t":
        return tensors[body]
    if kind in ("l", "u"):
        items = [_value(v, tensors) for v in body]
        return items if kind == "l" else tuple(items)
    if kind == "d":
        return {key: _value(item, tensors) for key, item in body}
    raise WireError(f"bad fedlightning wire node kind {kind!r}")
