"""How a wire blob (:mod:`fedlightning.flower_app.wire`) travels: in a Flower message, and over the
local connections between fedlightning's own processes.

- In a Flower ``Message``: the content is one ``ArrayRecord`` (``fedlightning``) holding one
  ``Array`` whose bytes are the blob (``stype`` :data:`STYPE`; Flower splits its data into 5 MB
  chunks on the wire), plus, in a reply, one ``ConfigRecord`` of timestamps
  (``fedlightning.timing``). So a node's message and its reply are O(1) Flower objects, however
  many clients and tensors they carry.
- Over a ``multiprocessing.connection`` (the relay ServerApp and the backend; a ClientApp and its
  node's warm worker): a frame is one JSON header, then the blobs it announces, each sent with
  ``send_bytes``: nothing received is unpickled.

Imports only the standard library and ``flwr``: the apps fedlightning writes carry a copy of this
module (``fedlightning_envelope``, :func:`fedlightning.flower_app.export.lean_modules`), so that
their ClientApp and relay processes never import Lightning.
"""

from __future__ import annotations

import json
import time
from multiprocessing.connection import Connection
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

#: the record, array and serialisation type of a blob in a Flower message
RECORD, ARRAY, STYPE = "fedlightning", "blob", "fedlightning.wire"
#: the reply's record of timestamps (seconds since the epoch, this machine's clock)
TIMING = "fedlightning.timing"
#: under SecAgg+, the legacy fit result's metric holding a node's plain part
PLAIN = "fedlightning"


def wrap(blob: bytes, timing: dict[str, float] | None = None) -> RecordDict:
    """Message content carrying ``blob`` (and, in a reply, the node's ``timing``)."""
    array = Array(dtype="uint8", shape=(len(blob),), stype=STYPE, data=bytes(blob))
    content = RecordDict({RECORD: ArrayRecord({ARRAY: array})})
    return add_timing(content, timing) if timing else content


def add_timing(content: RecordDict, timing: dict[str, float]) -> RecordDict:
    """``content`` with the ``timing`` record (timestamps of the node's work on a message)."""
    content[TIMING] = ConfigRecord({k: float(v) for k, v in timing.items()})
    return content


def unwrap(content: RecordDict) -> bytes:
    """The blob :func:`wrap` put in ``content``."""
    if RECORD not in content.array_records:
        raise ValueError(
            f"a fedlightning message carries the ArrayRecord {RECORD!r}; this has none"
        )
    array = content.array_records[RECORD][ARRAY]
    if array.stype != STYPE:
        raise ValueError(f"a fedlightning message's array has stype {STYPE!r}, not {array.stype!r}")
    return array.data


def timing_of(content: RecordDict) -> dict[str, float]:
    """The timestamps a reply carries (``{}``: none)."""
    record = content.config_records.get(TIMING)
    return {k: float(v) for k, v in record.items()} if record else {}  # type: ignore[arg-type]


def send_frame(connection: Connection, header: dict[str, Any], blobs: list[bytes] = ()) -> None:
    """Send ``header`` (JSON) and ``blobs`` as one frame."""
    connection.send_bytes(json.dumps({**header, "blobs": len(blobs)}).encode())
    for blob in blobs:
        connection.send_bytes(blob)


def recv_frame(connection: Connection) -> tuple[dict[str, Any], list[bytes]]:
    """A frame :func:`send_frame` sent: its header and blobs."""
    header = json.loads(connection.recv_bytes())
    if not isinstance(header, dict):
        raise ValueError("a fedlightning frame starts with a JSON object")
    blobs = [connection.recv_bytes() for _ in range(int(header.pop("blobs", 0)))]
    return header, blobs


def process_start() -> float:
    """When this process started (seconds since the epoch; Linux's ``/proc``, else now)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            age = float(uptime.read().split()[0]) - ticks / _clock_ticks()
        return time.time() - age
    except (OSError, ValueError, IndexError):
        return time.time()


def _clock_ticks() -> int:
    import os

    return int(os.sysconf("SC_CLK_TCK"))
