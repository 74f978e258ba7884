"""The warm worker of a SuperNode: ``python -m fedlightning.flower_app.worker ADDRESS KEY OWNER``.

Started by the warm ClientApp (:mod:`fedlightning.flower_app.warm_client`) when a message finds
no worker. It imports the fitting code once, then listens on the Unix socket ``ADDRESS``
(``multiprocessing.connection``, authenticated with the key in the file ``KEY``) and answers
``(message type, content, node config)`` requests one at a time with the replies of
:func:`~fedlightning.flower_app.client.query_reply` and
:func:`~fedlightning.flower_app.client.train_reply`: the same code the in-process ClientApp runs,
with its per-process cache of the client module, the data module and the fitter kept warm across
messages and rounds. It exits, removing its socket and key file, when the process ``OWNER`` (the
SuperExec) is gone or on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import AuthenticationError, Listener
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(address: str, key_file: str, owner: int) -> None:
    """Answer requests on ``address`` until ``owner`` exits (module docstring)."""
    from fedlightning.flower_app.client import query_reply, train_reply

    handlers = {"query": query_reply, "train": train_reply}
    key = Path(key_file).read_bytes()
    Path(address).unlink(missing_ok=True)
    listener = Listener(address, family="AF_UNIX", authkey=key)

    def leave(*_: object) -> None:
        Path(address).unlink(missing_ok=True)
        Path(key_file).unlink(missing_ok=True)
        os._exit(0)  # the fit in progress, if any, has no one to reply to

    def watch() -> None:
        while _alive(owner):
            time.sleep(1.0)
        leave()

    signal.signal(signal.SIGTERM, leave)
    threading.Thread(target=watch, daemon=True).start()
    while True:
        try:
            connection = listener.accept()
        except (AuthenticationError, OSError, EOFError):
            continue
        with connection:
            try:
                kind, content, node_config = connection.recv()
                reply = ("ok", handlers[kind](content, node_config))
            except Exception:  # noqa: BLE001  (sent to the ClientApp, which raises it)
                reply = ("error", traceback.format_exc())
            try:
                connection.send(reply)
            except OSError:
                pass  # the ClientApp process went away


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
