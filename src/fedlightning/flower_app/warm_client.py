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

This file is copied into each Flower App fedlightning writes (its ClientApp module), so it
imports nothing from fedlightning: importing the fedlightning package would import Lightning.
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

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()

#: seconds to wait for a new worker to listen (it imports torch and Lightning first)
START_TIMEOUT = 600.0


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


def forward(message: Message, context: Context) -> Message:
    """The worker's reply to ``message`` (its type, content and this node's config)."""
    with connect() as connection:
        connection.send((message.metadata.message_type, message.content, dict(context.node_config)))
        status, value = connection.recv()
    if status != "ok":
        raise RuntimeError(f"the fedlightning worker failed:\n{value}")
    return Message(value, reply_to=message)


@app.query()
def query(message: Message, context: Context) -> Message:
    """Which clients this node serves (answered by the worker, which warms up meanwhile)."""
    return forward(message, context)


@app.train()
def train(message: Message, context: Context) -> Message:
    """The message's client fits, run by the worker."""
    return forward(message, context)
