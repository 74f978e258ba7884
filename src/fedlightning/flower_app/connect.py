"""How a ``fedlightning fit`` process reaches a SuperLink: it submits the relay ServerApp
(:mod:`fedlightning.flower_app.relay`) with ``flwr run`` (a private ``FLWR_HOME`` holding the
SuperLink connection: address, insecure, root certificates, federation) and the relay connects back
on ``relay_host`` with a one-run key; :class:`RelayTransport` forwards the GridTransport calls.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from fedlightning.errors import ConfigurationError, WorkerLost
from fedlightning.flower_app.export import warm_client_source, write_pyproject

#: relay.py's import of the transport, replaced in the relay app's copy
RELAY_IMPORT = "from fedlightning.flower_app.transport import GridTransport"


class RelayTransport:
    """The GridTransport calls, run by the relay ServerApp on the other end of ``connection``."""

    def __init__(self, connection: Connection, timeout: float) -> None:
        self.connection = connection
        self.timeout = timeout

    def _call(self, name: str, *args: Any, timeout: float) -> Any:
        try:
            self.connection.send((name, args))
            if not self.connection.poll(timeout + self.timeout):
                raise WorkerLost(
                    f"the relay ServerApp did not answer {name} within {timeout + self.timeout:g} s"
                )
            status, value = self.connection.recv()
        except (EOFError, OSError) as error:
            raise WorkerLost(
                f"the relay ServerApp on the SuperLink went away ({error!r})"
            ) from None
        if status != "ok":
            raise RuntimeError(f"the relay ServerApp's {name} failed:\n{value}")
        return value

    def node_ids(self) -> list[int]:
        return self._call("node_ids", timeout=0)

    def served(
        self, node_ids: Sequence[int], num_clients: int, timeout: float
    ) -> dict[int, list[int]]:
        return self._call("served", list(node_ids), num_clients, timeout, timeout=timeout)

    def exchange(self, message_type: str, group_id: str, requests: list, timeout: float) -> list:
        return self._call("exchange", message_type, group_id, requests, timeout, timeout=timeout)

    def close(self) -> None:
        try:
            self.connection.send(("stop", ()))
        except OSError:
            pass
        self.connection.close()


def write_relay_modules(app: Path) -> None:
    """Copy the relay ServerApp and the Grid transport into the relay app as top-level modules
    (``fedlightning_relay``, ``fedlightning_transport``): the ServerApp process then imports
    ``flwr`` and these two files only, not the fedlightning package (whose import loads
    Lightning: seconds at every run's start)."""
    here = Path(__file__).parent
    (app / "fedlightning_transport.py").write_text((here / "transport.py").read_text())
    relay = (here / "relay.py").read_text()
    lean = relay.replace(RELAY_IMPORT, "from fedlightning_transport import GridTransport")
    if lean == relay:
        raise RuntimeError(f"relay.py no longer says {RELAY_IMPORT!r}")
    (app / "fedlightning_relay.py").write_text(lean)


def start_relay(backend: Any) -> tuple[RelayTransport, str]:
    """Submit the relay ServerApp with ``flwr run`` to ``backend.address`` and wait for it to
    connect back; the transport and the temporary directory to remove after the run."""
    tmp = tempfile.mkdtemp(prefix="fedlightning-flower-")
    try:
        return RelayTransport(_submit(backend, tmp), timeout=30.0), tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _submit(backend: Any, tmp: str) -> Connection:
    key = secrets.token_bytes(32)
    listener = Listener((backend.relay_host, 0), authkey=key)
    app = Path(tmp) / "relay"
    write_pyproject(
        app, "fedlightning-relay", "fedlightning_relay:app", "fedlightning_client:app",
        {"relay-address": f"{backend.relay_host}:{listener.address[1]}", "relay-key": key.hex()},
    )  # fmt: skip
    (app / "fedlightning_client.py").write_text(warm_client_source())
    write_relay_modules(app)
    home = Path(tmp) / "flwr-home"
    home.mkdir()
    connection = {"address": backend.address, "insecure": backend.insecure}
    if backend.root_certificates:
        connection["root-certificates"] = str(Path(backend.root_certificates).resolve())
    if backend.federation:
        connection["federation"] = backend.federation
    import tomli_w

    (home / "config.toml").write_text(
        tomli_w.dumps({"superlink": {"default": "fedlightning", "fedlightning": connection}})
    )
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent)) or shutil.which("flwr")
    if flwr is None:
        raise ConfigurationError(
            "loop.backend=FlowerBackend: Flower's `flwr` command is not on PATH"
        )
    accepted: list[Connection] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    submitted = subprocess.run(
        [flwr, "run", str(app), "fedlightning", "--format", "json"],
        env={**os.environ, "FLWR_HOME": str(home)}, capture_output=True, text=True,
        timeout=backend.connect_timeout,
    )  # fmt: skip
    if submitted.returncode != 0 or '"success": false' in submitted.stdout:
        listener.close()
        raise ConfigurationError(
            f"loop.backend=FlowerBackend could not start a run on the SuperLink at "
            f"{backend.address} (address, insecure, root_certificates):\n{submitted.stdout}{submitted.stderr}"
        )
    thread.join(backend.connect_timeout)
    listener.close()
    if not accepted:
        raise ConfigurationError(
            f"loop.backend=FlowerBackend: the relay ServerApp did not connect back to "
            f"{backend.relay_host} within {backend.connect_timeout:g} s (relay_host must be this "
            "machine's address as the SuperLink's machine reaches it)"
        )
    return accepted[0]
