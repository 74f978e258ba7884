"""A Flower deployment on this machine, from Flower's own commands, for tests and benchmarks.

:class:`LocalFederation` starts ``flower-superlink`` and ``flower-supernode`` processes on
127.0.0.1 only (ports picked free at start, a private ``FLWR_HOME``, runtime dependency
installation off, so nothing is fetched), node ``i`` with ``--node-config "partition-id=i
num-partitions=N"``. Insecure by default; ``tls=True`` serves the SuperLink with a throwaway CA
and certificate (:mod:`fedlightning.flower_app.credentials`) that nodes, ``flwr`` and the backend
verify; ``node_auth=True`` also turns on SuperNode authentication: each node gets a key pair, its
public key registered with ``flwr supernode register`` before the node starts with
``--auth-supernode-private-key``. ``kill_node(i)`` kills a node with its ClientApp processes.
``start_flower=False`` starts nothing: :meth:`LocalFederation.start` runs your own commands (the
README's), torn down the same way.

Teardown: leaving the ``with`` block (or a failed start) stops every process group (SIGTERM, then
SIGKILL after a bounded wait); and a small reaper process SIGKILLs them when this process dies
without tearing down (killed, or interpreter exit), so no Flower process outlives a test run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from fedlightning.flower_app.credentials import write_node_key, write_tls

#: run by the reaper: read process group ids until this process's end of the pipe closes, then
#: SIGKILL the groups (those already gone are skipped)
_REAPER = """import os, signal, sys
groups = [int(line) for line in sys.stdin]
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def wait_listening(port: int, timeout: float, process: subprocess.Popen, log: Path) -> None:
    """Wait until something listens on 127.0.0.1:``port``; raise, with ``log``'s tail, if
    ``process`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{process.args[0]} exited with {process.returncode} before listening on "
                f"127.0.0.1:{port}; its log ({log}):\n{_tail(log)}"
            )
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(
        f"{process.args[0]} does not listen on 127.0.0.1:{port} after {timeout:g} s; its log "
        f"({log}):\n{_tail(log)}"
    )


class LocalFederation:
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        num_nodes: int = 2,
        threads: int = 1,
        timeout: float = 120.0,
        tls: bool = False,
        node_auth: bool = False,
        start_flower: bool = True,
    ) -> None:
        if node_auth and not tls:
            raise ValueError("Flower's SuperNode authentication needs TLS: pass tls=True")
        self.num_nodes, self.timeout, self.tls, self.node_auth = num_nodes, timeout, tls, node_auth
        self.start_flower = start_flower
        self.dir = Path(tempfile.mkdtemp(prefix="fedlightning-localfed-"))
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "FLWR_HOME": str(self.dir / "home"),
            "OMP_NUM_THREADS": str(threads),
        }
        self.certs = write_tls(self.dir / "certs") if tls else None
        self.port = 0
        self.address = ""
        self.link: subprocess.Popen | None = None
        self.nodes: list[subprocess.Popen | None] = []
        self.logs: list[Path] = []
        self.started: list[subprocess.Popen] = []
        self._reaper: subprocess.Popen | None = None

    @property
    def root_certificates(self) -> str | None:
        """The CA certificate's path (``tls=True``), else ``None``."""
        return str(self.certs.ca) if self.certs else None

    def write_flwr_home(self, home: Path, name: str = "local") -> Path:
        """Write a ``FLWR_HOME`` whose default SuperLink connection ``name`` reaches this
        federation (``flwr run``/``flwr supernode register`` with ``FLWR_HOME=home``)."""
        home.mkdir(parents=True, exist_ok=True)
        lines = [
            f'[superlink]\ndefault = "{name}"\n[superlink.{name}]',
            f'address = "{self.address}"',
        ]
        if self.certs:
            lines.append(f"root-certificates = {json.dumps(str(self.certs.ca))}")
        else:
            lines.append("insecure = true")
        (home / "config.toml").write_text("\n".join(lines) + "\n")
        return home

    def start(self, name: str, args: list[str]) -> tuple[subprocess.Popen, Path]:
        """Start ``args`` in its own process group, output in ``<dir>/<name>.log``, torn down
        with this federation (:meth:`close`, or the reaper)."""
        log = self.dir / f"{name}.log"
        self.logs.append(log)
        with log.open("w") as out:
            process = subprocess.Popen(
                args, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started.append(process)
        self._reap(process)
        return process, log

    def _reap(self, process: subprocess.Popen) -> None:
        if self._reaper is None:
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER],
                stdin=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        stdin: IO[str] = self._reaper.stdin  # type: ignore[assignment]
        stdin.write(f"{process.pid}\n")
        stdin.flush()

    def _listening(self, name: str, make_args, attempts: int = 3) -> subprocess.Popen:
        """Start ``make_args(port)`` on a free port until it listens (a port taken between
        picking and binding is retried)."""
        for attempt in range(attempts):
            port = free_port()
            process, log = self.start(name, make_args(port))
            try:
                wait_listening(port, self.timeout, process, log)
                return process
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _link_args(self, port: int) -> list[str]:
        self.port, self.address = port, f"127.0.0.1:{port}"
        args = ["flower-superlink", "--host", "127.0.0.1", "--port", str(port),
                "--disable-runtime-dependency-installation"]  # fmt: skip
        if self.certs is None:
            return [*args, "--insecure"]
        args += ["--ssl-ca-certfile", str(self.certs.ca), "--ssl-certfile", str(self.certs.cert),
                 "--ssl-keyfile", str(self.certs.key)]  # fmt: skip
        return [*args, "--enable-supernode-auth"] if self.node_auth else args

    def _node_args(self, i: int, port: int, key: str | None = None) -> list[str]:
        args = ["flower-supernode", "--superlink", self.address, "--host", "127.0.0.1",
                "--port", str(port),
                "--node-config", f"partition-id={i} num-partitions={self.num_nodes}"]  # fmt: skip
        if self.certs is None:
            return [*args, "--insecure"]
        args += ["--root-certificates", str(self.certs.ca)]
        if self.node_auth:
            args += ["--auth-supernode-private-key", key or str(self.dir / "keys" / f"node{i}")]
        return args

    def register_node_key(self, public_key: Path) -> None:
        """Register a SuperNode public key with the SuperLink (``flwr supernode register``)."""
        home = self.write_flwr_home(self.dir / "register-home")
        done = subprocess.run(
            ["flwr", "supernode", "register", str(public_key), "local", "--format", "json"],
            env={**self.env, "FLWR_HOME": str(home)}, capture_output=True, text=True,
            timeout=self.timeout,
        )  # fmt: skip
        if done.returncode != 0 or '"success": true' not in done.stdout:
            raise RuntimeError(
                f"flwr supernode register {public_key} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}\nSuperLink log:\n{_tail(self.logs[0])}"
            )

    def __enter__(self) -> LocalFederation:
        if not self.start_flower:
            return self
        try:
            self.link = self._listening("superlink", self._link_args)
            for i in range(self.num_nodes):
                if self.node_auth:
                    _, public = write_node_key(self.dir / "keys", f"node{i}")
                    self.register_node_key(public)
                self.nodes.append(
                    self._listening(f"supernode{i}", lambda port, i=i: self._node_args(i, port))
                )
        except BaseException:
            self.close()
            raise
        return self

    def refused_node(self) -> str:
        """Start a SuperNode whose key was never registered (``node_auth=True``) and return its
        log once it exits; raise if it was not refused within the timeout."""
        key, _ = write_node_key(self.dir / "keys", "stranger")
        args = self._node_args(self.num_nodes, free_port(), key=str(key))
        process, log = self.start("stranger", [*args, "--max-retries", "1"])
        try:
            code = process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
            raise TimeoutError(
                f"a SuperNode with an unregistered key was not refused within {self.timeout:g} s:"
                f"\n{_tail(log)}"
            ) from None
        if code == 0:
            raise RuntimeError(f"a SuperNode with an unregistered key exited 0:\n{_tail(log)}")
        return log.read_text(errors="replace")

    def node_log(self, i: int) -> str:
        return (self.dir / f"supernode{i}.log").read_text(errors="replace")

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` and its ClientApp processes (a machine lost mid-round)."""
        node = self.nodes[i]
        if node is not None and node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)
        self.nodes[i] = None

    def close(self) -> None:
        """Stop every process group: SIGTERM, SIGKILL after 15 s (also the reaper's job)."""
        for process in reversed(self.started):  # a group outlives its leader: signal it anyway
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
            except ProcessLookupError:
                pass
        self.nodes, self.link, self.started = [], None, []
        if self._reaper is not None:  # also SIGKILLs what is left of those groups
            self._reaper.stdin.close()  # type: ignore[union-attr]
            self._reaper.wait(timeout=15)
            self._reaper = None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
