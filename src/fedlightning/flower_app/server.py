"""The exported app's ServerApp: the whole fedlightning loop runs inside it.

The run config holds the fedlightning config (YAML text) and the run directory; the loop is built
by :class:`~fedlightning.cli.fit.FederatedCLI` as ``fedlightning fit`` would, with
``loop.backend: FlowerBackend`` (``address: null``) on the Grid this ServerApp was given, which
:func:`main` passes to the command (``fedlightning.cli.main(..., grid=grid)``) and the CLI hands to
the backend (:meth:`~fedlightning.backends.flower.FlowerBackend.use_grid`). Like
:mod:`fedlightning.cli`, this module is an entry point: it runs the whole command.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``fedlightning fit`` on the run config's fedlightning config over ``grid``."""
    from fedlightning.cli import main as fit_main

    config = context.run_config
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fedlightning.yaml"
        path.write_text(str(config["fedlightning-config"]))
        sys.argv = ["fedlightning"]
        fit_main(
            [
                "fit", "--config", str(path), "--loop.run_dir", str(config["run-dir"]),
                "--loop.backend", "fedlightning.backends.flower.FlowerBackend",
                "--loop.backend.init_args.address", "null",
            ],
            grid=grid,
        )  # fmt: skip
