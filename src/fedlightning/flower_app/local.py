"""A Flower deployment on this machine, from Flower's own commands, for tests and benchmarks.

:class:`LocalFederation` starts ``flower-superlink --insecure`` and ``flower-supernode --insecure``
processes on 127.0.0.1 only (free ports, a private ``FLWR_HOME``, runtime dependency installation
off, so nothing is fetched), node ``i`` with ``--node-config "partition-id=i num-partitions=N"``;
``kill_node(i)`` kills a node with its ClientApp processes; leaving the ``with`` block tears
everything down (each process group, bounded waits).
"""

from __future__ import annotations

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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, timeout: float, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


class LocalFederation:
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1 (see the module docstring)."""

    def __init__(self, num_nodes: int = 2, threads: int = 1, timeout: float = 120.0) -> None:
        self.num_nodes, self.timeout = num_nodes, timeout
        self.dir = Path(tempfile.mkdtemp(prefix="fedlightning-localfed-"))
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "FLWR_HOME": str(self.dir / "home"),
            "OMP_NUM_THREADS": str(threads),
        }
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.link: subprocess.Popen | None = None
        self.nodes: list[subprocess.Popen | None] = []
        self.logs: list[Path] = []

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.dir / f"{name}.log"
        self.logs.append(log)
        return subprocess.Popen(
            args,
            env=self.env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def __enter__(self) -> LocalFederation:
        try:
            self.link = self._start(
                "superlink",
                ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(self.port),
                 "--disable-runtime-dependency-installation"],
            )  # fmt: skip
            _wait_listening(self.port, self.timeout, self.link, self.logs[-1])
            for i in range(self.num_nodes):
                port = free_port()
                node = self._start(
                    f"supernode{i}",
                    ["flower-supernode", "--insecure", "--superlink", self.address,
                     "--host", "127.0.0.1", "--port", str(port),
                     "--node-config", f"partition-id={i} num-partitions={self.num_nodes}"],
                )  # fmt: skip
                self.nodes.append(node)
                _wait_listening(port, self.timeout, node, self.logs[-1])
        except BaseException:
            self.close()
            raise
        return self

    def node_log(self, i: int) -> str:
        return (self.dir / f"supernode{i}.log").read_text()

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` and its ClientApp processes (a machine lost mid-round)."""
        node = self.nodes[i]
        if node is not None and node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)
        self.nodes[i] = None

    def close(self) -> None:
        for process in [*self.nodes, self.link]:
            if process is None or process.poll() is not None:
                continue
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
            except ProcessLookupError:
                pass
        self.nodes, self.link = [], None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
