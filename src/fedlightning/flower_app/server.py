"""The exported app's ServerApp: the whole fedlightning loop runs inside it.

The run config holds the fedlightning config (YAML text) and the run directory; the loop is built
by :class:`~fedlightning.cli.FederatedCLI` as ``fedlightning fit`` would, with
``loop.backend: FlowerBackend`` on the Grid this ServerApp was given (``address: null``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()

#: the Grid of the ServerApp running in this process (read by FlowerBackend(address=None))
GRID: list[Grid] = []


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``fedlightning fit`` on the run config's fedlightning config over ``grid``."""
    from fedlightning.cli import main as fit_main

    config = context.run_config
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fedlightning.yaml"
        path.write_text(str(config["fedlightning-config"]))
        GRID[:] = [grid]
        sys.argv = ["fedlightning"]
        try:
            fit_main(
                [
                    "fit", "--config", str(path), "--loop.run_dir", str(config["run-dir"]),
                    "--loop.backend", "fedlightning.backends.flower.FlowerBackend",
                    "--loop.backend.init_args.address", "null",
                ]
            )  # fmt: skip
        finally:
            GRID.clear()
