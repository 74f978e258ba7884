"""The warm worker of a SuperNode: ``python -m fedlightning.flower_app.worker ADDRESS KEY OWNER``.

Started by the warm ClientApp (:mod:`fedlightning.flower_app.warm_client`) when a message finds
no worker. It imports the fitting code once, then listens on the Unix socket ``ADDRESS``
(``multiprocessing.connection``, authenticated with the key in the file ``KEY``) and answers
requests one at a time, each a frame (:mod:`fedlightning.flower_app.envelope`: a JSON header with
the message ``kind`` and the node config, and for ``train`` the message's blob; nothing is
unpickled), with the replies of :func:`~fedlightning.flower_app.client.query_reply` and
:func:`~fedlightning.flower_app.client.train_reply`, keeping the client module, the data module
and the fitter warm across messages and rounds. A reply's header says ``ok`` (with the fit's
start and end times) or ``error`` (with the traceback). It exits, removing its socket and key file, when the process ``OWNER`` (the
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


def answer(header: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """The reply frame to a request frame (module docstring)."""
    from fedlightning.flower_app.client import query_reply, train_reply

    kind, node_config = header["kind"], header["node_config"]
    if kind == "query":
        return {"status": "ok", "served": query_reply(int(header["num_clients"]), node_config)}, []
    if kind == "train":
        began = time.time()
        reply = train_reply(blobs[0], node_config)
        return {"status": "ok", "fit_start": began, "fit_end": time.time()}, reply
    raise KeyError(kind)


def serve(address: str, key_file: str, owner: int) -> None:
    """Answer requests on ``address`` until ``owner`` exits (module docstring)."""
    import fedlightning.flower_app.client  # noqa: F401  (torch and Lightning, before listening)
    from fedlightning.flower_app.envelope import recv_frame, send_frame

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
                reply = answer(*recv_frame(connection))
            except Exception:  # noqa: BLE001  (sent to the ClientApp, which raises it)
                reply = ({"status": "error", "traceback": traceback.format_exc()}, [])
            try:
                send_frame(connection, *reply)
            except OSError:
                pass  # the ClientApp process went away


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))
