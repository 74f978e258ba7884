"""The fedlightning ClientApp that Flower Apps from fedlightning carry: it forwards each message
to a warm worker process on the SuperNode (:mod:`fedlightning.flower_app.worker`).

Why: Flower 1.41's SuperNode handles every message in a fresh ``flwr-clientapp`` process; a
ClientApp that fits in that process imports torch and Lightning and builds the data module for
every message (seconds each). This module imports only the standard library and ``flwr``; the
worker, started by the first message a SuperNode gets, keeps torch, Lightning, the client module
and the data module loaded and serves the following messages of every run. It fits exactly as
:mod:`fedlightning.flower_app.client` does (same functions), so results are the same bytes.

The worker belongs to the process that starts ``flwr-clientapp`` processes (the SuperNode's
SuperExec): one per SuperExec, reached on a Unix socket in a private directory
(``<tmp>/fedlightning-workers-<uid>``, mode 0700) with a one-time key in a 0600 file; it exits
when that SuperExec is gone (so when its SuperNode stops) and is started again when a message
finds none. A worker that dies mid-fit makes that message fail (the server's failure policy
treats its clients as lost workers). Stopping the SuperNode also stops its worker.

Messages and replies are one wire blob each (:mod:`fedlightning.flower_app.envelope`), handed to
the worker as bytes. Under secure aggregation the train handler runs inside Flower's
``secaggplus_mod`` (applied to the messages of the SecAgg+ protocol only): its masked-vector stage
gets the worker's SecAgg+ vector as the legacy fit result it masks, with the plain part
(:func:`fedlightning.flower_app.secure.node_vector`) in the result's metrics.

This file and :mod:`~fedlightning.flower_app.envelope` are copied into each Flower App
fedlightning writes (:func:`fedlightning.flower_app.export.lean_source`), so they import nothing
else from fedlightning: importing the fedlightning package would import Lightning for every
message.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import AuthenticationError, Client, Connection
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

from fedlightning.flower_app.envelope import (
    PLAIN,
    add_timing,
    process_start,
    recv_frame,
    send_frame,
    unwrap,
    wrap,
)

app = ClientApp()

#: seconds to wait for a new worker to listen (it imports torch and Lightning first)
START_TIMEOUT = 600.0
#: when this flwr-clientapp process started (for the backend's per-round timings)
STARTED = process_start()
#: the record of the legacy fit instructions SecAgg+'s last stage delivers to the ClientApp
FITINS = "fitins.parameters"


def _paths() -> tuple[Path, Path, int]:
    owner = os.getppid()  # the SuperExec that starts flwr-clientapp processes
    directory = Path(tempfile.gettempdir()) / f"fedlightning-workers-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid() or directory.stat().st_mode & 0o077:
        raise PermissionError(f"{directory} must be a directory only this user can access")
    return directory / f"{owner}.sock", directory / f"{owner}.key", owner


def _try(address: Path, key: Path) -> Connection | None:
    try:
        return Client(str(address), family="AF_UNIX", authkey=key.read_bytes())
    except (OSError, EOFError, AuthenticationError):
        return None


def connect() -> Connection:
    """A connection to this SuperNode's worker, started first if none runs."""
    address, key, owner = _paths()
    connection = _try(address, key)
    if connection is not None:
        return connection
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(secrets.token_bytes(32))
    worker = subprocess.Popen(
        [sys.executable, "-m", "fedlightning.flower_app.worker", str(address), str(key),
         str(owner)],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"the fedlightning worker exited with {worker.returncode}")
        connection = _try(address, key)
        if connection is not None:
            return connection
        time.sleep(0.05)
    worker.kill()
    raise TimeoutError(f"the fedlightning worker did not listen within {START_TIMEOUT:g} s")


def ask(header: dict, blobs: list[bytes], context: Context) -> tuple[dict, list[bytes]]:
    """The worker's reply frame to a request (``header`` gets this node's config)."""
    with connect() as connection:
        send_frame(connection, {**header, "node_config": dict(context.node_config)}, blobs)
        reply, out = recv_frame(connection)
    if reply.get("status") != "ok":
        raise RuntimeError(f"the fedlightning worker failed:\n{reply.get('traceback')}")
    return reply, out


def _timing(handler: float, reply: dict) -> dict[str, float]:
    return {"process_start": STARTED, "handler": handler, "fit_start": reply["fit_start"],
            "fit_end": reply["fit_end"], "replied": time.time()}  # fmt: skip


def _secure_only(message: Message, context: Context, call_next) -> Message:  # noqa: ANN001
    """Flower's SecAgg+ client mod for the messages of its protocol; plain train messages go
    straight to :func:`train`."""
    if RECORD_KEY_CONFIGS not in message.content.config_records:
        return call_next(message, context)
    from flwr.client.mod import secaggplus_mod

    return secaggplus_mod(message, context, call_next)


@app.query()
def query(message: Message, context: Context) -> Message:
    """Which clients this node serves (answered by the worker, which warms up meanwhile)."""
    num_clients = int(message.content.config_records["query"]["num_clients"])  # type: ignore[arg-type]
    reply, _ = ask({"kind": "query", "num_clients": num_clients}, [], context)
    served = RecordDict({"served": ConfigRecord({"client_ids": reply["served"] or [-1]})})
    return Message(served, reply_to=message)


@app.train(mods=[_secure_only])
def train(message: Message, context: Context) -> Message:
    """The message's client fits, run by the worker: a plain reply, or under SecAgg+ (its
    masked-vector stage) the legacy fit result whose parameters Flower's mod masks."""
    handler = time.time()
    if FITINS in message.content.array_records:
        return _secure_train(message, context, handler)
    reply, blobs = ask({"kind": "train"}, [unwrap(message.content)], context)
    return Message(wrap(blobs[0], _timing(handler, reply)), reply_to=message)


def _secure_train(message: Message, context: Context, handler: float) -> Message:
    from flwr.common import Code, FitRes, Parameters, Status
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict

    blob = next(iter(message.content.array_records[FITINS].values())).data
    reply, (plain, vector) = ask({"kind": "train"}, [blob], context)
    fitres = FitRes(
        Status(Code.OK, ""), Parameters([vector], "numpy.ndarray"), num_examples=1,
        metrics={PLAIN: plain},
    )  # fmt: skip
    content = fitres_to_recorddict(fitres, keep_input=False)
    return Message(add_timing(content, _timing(handler, reply)), reply_to=message)
