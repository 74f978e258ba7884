"""The relay ServerApp: how a ``fedlightning fit`` process with ``loop.backend: FlowerBackend``
reaches a SuperLink while staying the server.

The backend starts this ServerApp on the SuperLink with ``flwr run`` (Flower's public way to obtain a
``Grid``) and listens on ``relay-address`` (run config); the ServerApp connects back with the
one-run ``relay-key`` (``multiprocessing.connection``: authenticated, HMAC challenge) and runs the
:class:`~fedlightning.flower_app.transport.GridTransport` calls the backend asks for, until the
backend says ``stop`` or goes away. While an ``exchange`` waits, a ``progress`` frame names each
node as its reply arrives (the backend counts that node's clients done). Calls and answers are frames
(:mod:`fedlightning.flower_app.envelope`: a JSON header and the blobs, never pickles; :func:`answer`
says which). It holds no model and makes no decisions. The relay app carries a copy of this
module and of the lean modules it imports, as top-level modules
(:func:`fedlightning.flower_app.export.write_lean_modules`), so that its process imports only
``flwr``, not the fedlightning package.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from multiprocessing.connection import Client

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedlightning.flower_app.envelope import recv_frame, send_frame
from fedlightning.flower_app.transport import GridTransport

app = ServerApp()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def answer(
    transport: GridTransport, call: dict, blobs: list[bytes],
    progress: Callable[[int], None] | None = None,
) -> tuple[dict, list[bytes]]:  # fmt: skip
    """The answer frame to a call frame: ``node_ids``; ``served`` (``node_ids``,
    ``num_clients``, ``timeout``); ``exchange`` (``message_type``, ``group_id``, ``nodes``,
    ``timeout``, one blob per node: per node ``{"error"}`` or ``{"timing"}``, the replies' blobs
    in order; ``progress(node)`` as each node's reply arrives); ``secure_exchange``
    (``group_id``, ``nodes``, ``options``, ``timeout``, one blob per node: ``contributors``,
    ``failures``, ``nodes`` whose plain parts follow the aggregate)."""
    name = call["call"]
    if name == "node_ids":
        return {"value": transport.node_ids()}, []
    if name == "served":
        served = transport.served(call["node_ids"], call["num_clients"], call["timeout"])
        return {"value": [[node, ids] for node, ids in served.items()]}, []
    requests = list(zip(call["nodes"], blobs, strict=True))
    if name == "exchange":
        replies = transport.exchange(
            call["message_type"], call["group_id"], requests, call["timeout"], progress
        )
        header = [
            {"error": r} if isinstance(r, str) else {"timing": timing} for r, timing in replies
        ]
        return {"value": header}, [r for r, _ in replies if not isinstance(r, str)]
    if name == "secure_exchange":
        out = transport.secure_exchange(
            call["group_id"], requests, call["options"], call["timeout"]
        )
        aggregate = [] if out["aggregate"] is None else [out["aggregate"]]
        nodes = list(out["plain"])
        header = {"contributors": out["contributors"], "failures": out["failures"],
                  "nodes": nodes, "aggregate": bool(aggregate)}  # fmt: skip
        return {"value": header}, [*aggregate, *(out["plain"][n] for n in nodes)]
    raise KeyError(f"unknown relay call {name!r}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Serve the backend's transport calls until it stops."""
    config = context.run_config
    connection = Client(
        _address(str(config["relay-address"])), authkey=bytes.fromhex(str(config["relay-key"]))
    )
    transport = GridTransport(grid)

    def progress(node: int) -> None:  # a frame before the answer, as each node replies
        send_frame(connection, {"status": "progress", "node": node})

    with connection:
        while True:
            try:
                call, blobs = recv_frame(connection)
            except (EOFError, OSError):
                return
            if call.get("call") == "stop":
                return
            try:
                header, out = answer(transport, call, blobs, progress)
                send_frame(connection, {"status": "ok", **header}, out)
            except Exception:  # noqa: BLE001  (reported to the backend, which raises it)
                send_frame(connection, {"status": "error", "traceback": traceback.format_exc()})
