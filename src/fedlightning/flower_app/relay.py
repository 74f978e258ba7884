"""The relay ServerApp: how a ``fedlightning fit`` process with ``loop.backend: FlowerBackend``
reaches a SuperLink while staying the server.

The backend starts this ServerApp on the SuperLink with ``flwr run`` (Flower's public way to obtain a
``Grid``) and listens on ``relay-address`` (run config); the ServerApp connects back with the
one-run ``relay-key`` (``multiprocessing.connection``: authenticated, HMAC challenge) and runs the
:class:`~fedlightning.flower_app.transport.GridTransport` calls the backend asks for, until the
backend says ``stop`` or goes away. It holds no model and makes no decisions. The relay app
carries a copy of this module and of :mod:`fedlightning.flower_app.transport` as top-level
modules (:func:`fedlightning.flower_app.connect.write_relay_modules`), so that its process imports
only ``flwr``, not the fedlightning package.
"""

from __future__ import annotations

import traceback
from multiprocessing.connection import Client

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedlightning.flower_app.transport import GridTransport

app = ServerApp()

#: the transport calls the backend may ask for
CALLS = ("node_ids", "served", "exchange")


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Serve the backend's transport calls until it stops."""
    config = context.run_config
    connection = Client(
        _address(str(config["relay-address"])), authkey=bytes.fromhex(str(config["relay-key"]))
    )
    transport = GridTransport(grid)
    with connection:
        while True:
            try:
                name, args = connection.recv()
            except EOFError:
                return
            if name not in CALLS:
                return
            try:
                connection.send(("ok", getattr(transport, name)(*args)))
            except Exception:  # noqa: BLE001  (reported to the backend, which raises it)
                connection.send(("error", traceback.format_exc()))
