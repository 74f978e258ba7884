"""The FederatedLoop's arguments that are not the run's own options (those check themselves:
:class:`~fedlightning.loop.options.RunOptions`) checked when it is constructed: how every client
fit runs, and the parts given by ``class_path``. A bad value is a ConfigurationError naming the
option before anything is read, trained or written (the aggregator's and the backend's own
options are checked where they are used, at start-up: :mod:`fedlightning.loop.startup`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedlightning.backends.base import Backend
from fedlightning.compute import PRECISIONS
from fedlightning.errors import require
from fedlightning.privacy.dp_sgd import DPSGD
from fedlightning.protocol import FitConfig
from fedlightning.state import ClientStore


def check_fit_config(config: FitConfig, devices: int) -> None:
    """Check how every client fit runs (``loop.local_epochs``, ``loop.precision``...;
    ``devices``: ``loop.devices``, one per fit)."""
    require(config.local_epochs >= 1, "loop.local_epochs", config.local_epochs, "an integer >= 1")
    require(
        config.local_steps is None or config.local_steps >= 1,
        "loop.local_steps", config.local_steps, "null or an integer >= 1",
    )  # fmt: skip
    require(
        config.precision in PRECISIONS,
        "loop.precision", config.precision, f"one of {', '.join(PRECISIONS)}",
    )  # fmt: skip
    require(devices == 1, "loop.devices", devices, "1 (each client fit uses one device)")
    require(
        config.fit_with in ("auto", "trainer"),
        "loop.fit_with",
        config.fit_with,
        "'auto' or 'trainer'",
    )
    require(
        config.gradient_clip_val is None or config.gradient_clip_val > 0,
        "loop.gradient_clip_val", config.gradient_clip_val, "null or a number > 0",
    )  # fmt: skip
    require(
        config.gradient_clip_algorithm in ("norm", "value"),
        "loop.gradient_clip_algorithm", config.gradient_clip_algorithm, "'norm' or 'value'",
    )  # fmt: skip
    require(
        config.num_threads is None or config.num_threads >= 1,
        "loop.num_threads", config.num_threads, "null or an integer >= 1",
    )  # fmt: skip


def dp_sgd_settings(dp_sgd: Any) -> dict[str, Any] | None:
    """``loop.dp_sgd`` as the fit config carries it (plain data), after checking it is a DPSGD."""
    require(
        dp_sgd is None or isinstance(dp_sgd, DPSGD),
        "loop.dp_sgd", dp_sgd, "null or a fedlightning.privacy.DPSGD",
    )  # fmt: skip
    return dp_sgd.settings() if dp_sgd is not None else None


def check_backend(backend: Any) -> Backend | None:
    """``loop.backend`` after checking it is a Backend (or null: the default)."""
    require(
        backend is None or isinstance(backend, Backend),
        "loop.backend", backend, "a Backend (AutoBackend, SequentialBackend, CohortBackend, RayBackend)",
    )  # fmt: skip
    return backend


def client_store(client_state: str, run_dir: Path) -> ClientStore:
    """The run's ClientStore (``loop.client_state``: ``memory``, or ``disk`` under
    ``run_dir/client_state``)."""
    require(
        client_state in ("memory", "disk"), "loop.client_state", client_state, "'memory' or 'disk'"
    )
    return ClientStore(client_state, run_dir / "client_state")  # type: ignore[arg-type]
