"""What a checkpoint can hold: what ``torch.save`` pickles and a weights-only ``torch.load`` (how
a resume reads it, :func:`fedlightning.loop.checkpoint.read_checkpoint`) reads back.

That is tensors, numbers, strings, bytes, ``None``, torch dtypes, devices and sizes, and dicts,
lists, tuples and sets of them. A plug-in's state holding anything else (a lock, a numpy array, a
function) would fail the background write with a pickling traceback, or write a checkpoint no
resume can read. :func:`unsavable_entry` names the first such entry; the
:class:`~fedlightning.loop.checkpoint_writer.CheckpointWriter` checks the aggregator's state with
it before every write (a walk over its entries: known types are not serialized), and searches
the whole checkpoint with it when a write fails.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

import torch

#: leaves a weights-only load reads back, besides tensors (exact types: numpy's float64 is a
#: float subclass that the load refuses)
SAFE_LEAVES = frozenset(
    {bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size}
)
#: containers walked entry by entry (exact types: a subclass, e.g. a namedtuple, is tried whole)
CONTAINERS = (dict, OrderedDict, list, tuple, set, frozenset)


def unsavable_entry(value: Any, path: str = "") -> tuple[str, str] | None:
    """``(where, why)`` of the first entry of ``value`` a checkpoint cannot hold, written as it is
    indexed (``['lock']``, ``['models'][1]``), or None when every entry can be saved and read
    back."""
    if isinstance(value, torch.Tensor) or type(value) in SAFE_LEAVES:
        return None
    if type(value) in CONTAINERS:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            found = unsavable_entry(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    why = _round_trip_failure(value)
    return None if why is None else (path, why)


def _round_trip_failure(value: Any) -> str | None:
    """Why ``value`` cannot be saved and read back weights-only, or None."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception as error:  # noqa: BLE001 (pickle raises TypeError, AttributeError, ...)
        return f"a {kind}, which cannot be pickled ({type(error).__name__}: {_first_line(error)})"
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001 (torch's UnpicklingError names the global at length)
        return f"a {kind}, which a weights-only load (how a resume reads it) refuses"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:160] if text else ""
