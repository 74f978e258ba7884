"""How a ``fedlightning fit`` process reaches a SuperLink: it submits the relay ServerApp
(:mod:`fedlightning.flower_app.relay`) with ``flwr run`` (a private ``FLWR_HOME`` holding the
SuperLink connection: address, insecure, root certificates, federation) and the relay connects back
on ``relay_host`` with a one-run key; :class:`RelayTransport` forwards the GridTransport calls as
frames (:mod:`fedlightning.flower_app.envelope`: JSON and blobs, nothing unpickled).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from fedlightning.errors import ConfigurationError, WorkerLost
from fedlightning.flower_app.envelope import recv_frame, send_frame
from fedlightning.flower_app.export import write_lean_modules, write_pyproject


class RelayTransport:
    """The GridTransport calls, run by the relay ServerApp on the other end of ``connection``."""

    def __init__(self, connection: Connection, timeout: float) -> None:
        self.connection = connection
        self.timeout = timeout

    def _call(
        self, name: str, blobs: Sequence[bytes] = (), *, wait: float,
        on_progress: Callable[[int], None] | None = None, **args: Any,
    ) -> tuple[Any, list[bytes]]:  # fmt: skip
        """Send the call ``name`` with ``args`` and ``blobs``; its answer, waited for up to
        ``wait`` (plus this transport's own timeout) seconds. Progress frames before it (a node
        replied) go to ``on_progress(node)``."""
        deadline = time.monotonic() + wait + self.timeout
        try:
            send_frame(self.connection, {"call": name, **args}, list(blobs))
            while True:
                if not self.connection.poll(max(0.0, deadline - time.monotonic())):
                    raise WorkerLost(
                        f"the relay ServerApp did not answer {name} within "
                        f"{wait + self.timeout:g} s"
                    )
                header, out = recv_frame(self.connection)
                if header.get("status") != "progress":
                    break
                if on_progress is not None:
                    on_progress(int(header["node"]))
        except (EOFError, OSError) as error:
            raise WorkerLost(
                f"the relay ServerApp on the SuperLink went away ({error!r})"
            ) from None
        if header.get("status") != "ok":
            raise RuntimeError(f"the relay ServerApp's {name} failed:\n{header.get('traceback')}")
        return header["value"], out

    def node_ids(self) -> list[int]:
        return self._call("node_ids", wait=0)[0]

    def served(
        self, node_ids: Sequence[int], num_clients: int, timeout: float
    ) -> dict[int, list[int]]:
        value, _ = self._call(
            "served",
            wait=timeout,
            node_ids=list(node_ids),
            num_clients=num_clients,
            timeout=timeout,
        )
        return {int(node): ids for node, ids in value}

    def exchange(
        self, message_type: str, group_id: str, requests: Sequence[tuple[int, bytes]],
        timeout: float, on_reply: Callable[[int], None] | None = None,
    ) -> list[tuple[bytes | str, dict[str, float]]]:  # fmt: skip
        value, blobs = self._call(
            "exchange", [blob for _, blob in requests], wait=timeout, on_progress=on_reply,
            timeout=timeout, message_type=message_type, group_id=group_id,
            nodes=[n for n, _ in requests],
        )  # fmt: skip
        replies, out = iter(blobs), []
        for item in value:
            out.append((item["error"], {}) if "error" in item else (next(replies), item["timing"]))
        return out

    def secure_exchange(
        self, group_id: str, requests: Sequence[tuple[int, bytes]], options: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:  # fmt: skip
        # each of SecAgg+'s four stages may wait up to `timeout`
        value, blobs = self._call(
            "secure_exchange", [blob for _, blob in requests], wait=4 * timeout,
            timeout=timeout, group_id=group_id, nodes=[n for n, _ in requests], options=options,
        )  # fmt: skip
        aggregate = blobs.pop(0) if value["aggregate"] else None
        return {
            "aggregate": aggregate, "contributors": value["contributors"],
            "plain": dict(zip(value["nodes"], blobs, strict=True)), "failures": value["failures"],
        }  # fmt: skip

    def close(self) -> None:
        try:
            send_frame(self.connection, {"call": "stop"})
        except OSError:
            pass
        self.connection.close()


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
        app, "fedlightning-relay", "fedlightning_relay:app", "fedlightning_warm_client:app",
        {"relay-address": f"{backend.relay_host}:{listener.address[1]}", "relay-key": key.hex()},
    )  # fmt: skip
    write_lean_modules(app)
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
