"""The ``fedlightning`` command: ``fit`` (:mod:`fedlightning.cli.fit`), ``cofed``, ``plot``,
``flower-app`` and ``list``, ``--help`` and ``--version``.

This module imports only what the front door needs: ``--version``, ``--help``, ``list`` and the
refusals that need no class (a bare ``fit``, an unknown subcommand, a config file that is missing
or not text) answer without importing Lightning (``benchmarks/startup.py`` times them); each
subcommand imports its own modules when it runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from fedlightning.gc_tuning import freeze_imported, gc_paused

with gc_paused():  # see fedlightning.gc_tuning
    from fedlightning.cli.errors import (
        check_config_files,
        check_subcommand,
        configuration_error,
        one_line_error,
        stop_report,
    )
    from fedlightning.cli.help import (
        print_catalog,
        print_fit_usage,
        print_overview,
        readable_output,
        version,
    )
    from fedlightning.config_checks import check_repeated_options
    from fedlightning.errors import PluginError, RunStopped, StorageError
    from fedlightning.signals import StopSignal, stop_on_signals


def main(args: list[str] | None = None, grid: Any = None) -> None:
    """Entry point of the ``fedlightning`` command; ``fedlightning plot ...`` overlays runs
    (:func:`fedlightning.analysis.plot_command.plot_command`); ``fedlightning cofed ...`` runs CoFED's one-shot
    pipeline (:mod:`fedlightning.cofed.cli`), which has no rounds and so no FederatedLoop;
    ``fedlightning flower-app ...`` writes a Flower App (:mod:`fedlightning.flower_app.export`);
    ``fedlightning test RUN_DIR`` scores a run's saved models (:mod:`fedlightning.cli.scoring`);
    ``fedlightning list [KIND]`` prints what configs can name (:mod:`fedlightning.cli.catalog`).
    ``grid``: a Flower ServerApp's Grid for ``fit`` with ``FlowerBackend(address=None)``
    (:mod:`fedlightning.flower_app.server`)."""
    argv = sys.argv[1:] if args is None else list(args)
    readable_output()  # an ASCII terminal gets "+-" for "±", not a UnicodeEncodeError
    if not argv or argv[0] in ("-h", "--help"):
        print_overview()
        raise SystemExit(0 if argv else 2)
    if argv[0] == "--version":
        print(f"fedlightning {version()}")
        raise SystemExit(0)
    if argv == ["fit"]:
        print_fit_usage()
        raise SystemExit(2)
    try:
        check_subcommand(argv)
        if argv[0] == "list":
            _print_catalog(argv[1:])
        check_config_files(argv)  # missing, not UTF-8 text, a key twice: one line
        check_repeated_options(argv[1:])  # an option given twice says two things
        # SIGINT and SIGTERM alike, from start-up on (ignored once the run is done)
        with stop_on_signals(ignore_once_finished=args is None):
            _dispatch(argv, args, grid)
    except (RunStopped, PluginError, StorageError) as err:
        kind = "storage error" if isinstance(err, StorageError) else "stopped"
        print(f"fedlightning: {kind}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except (KeyboardInterrupt, StopSignal) as stop:
        lines, status = stop_report(stop, argv)
        for line in lines:
            print(f"fedlightning: {line}", file=sys.stderr)
        raise SystemExit(status) from None
    except Exception as err:
        cause = configuration_error(err) or one_line_error(err)
        if cause is None:
            raise
        print(f"fedlightning: error: {cause}", file=sys.stderr)
        raise SystemExit(2) from None


def _print_catalog(titles: list[str]) -> None:
    """``fedlightning list``; into a pipe that closes early (``| head``) without a traceback."""
    try:
        print_catalog(titles)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to say
    raise SystemExit(0)


def _dispatch(argv: list[str], args: list[str] | None, grid: Any) -> None:
    """Run the subcommand ``argv[0]``, its modules imported now (``args``: as given to main)."""
    with gc_paused():  # Lightning's imports: see fedlightning.gc_tuning
        if argv[0] == "plot":
            from fedlightning.analysis.plot_command import plot_command as command
        elif argv[0] == "cofed":
            from fedlightning.cofed.cli import main as command
        elif argv[0] == "flower-app":
            from fedlightning.flower_app.export import main as command
        elif argv[0] == "test":
            from fedlightning.cli.scoring import test_command as command
        else:
            from fedlightning.cli import fit as cli_fit
            from fedlightning.cli import runs as cli_runs

            cli_fit.import_named_classes()  # before the freeze: they live as long as the process
    if args is None:  # the `fedlightning` process itself (not a call from Python, e.g. a test)
        freeze_imported()  # its imports live as long as it does (fedlightning.gc_tuning)
    if argv[0] != "fit":
        command(argv[1:])
        return
    options = cli_runs.run_options(argv)  # --seeds, --fast_dev_run
    if "--print_config" in argv:  # with =flags: jsonargparse's
        rest = [a for a in options.args if a != "--print_config"]
        cli_fit.fit_command(rest, print_config=True)
    elif options.plain:
        cli_fit.fit_command(args, grid=grid)
    else:
        cli_runs.run(options)


def __getattr__(name: str) -> Any:
    """``fedlightning.cli.FederatedCLI``, imported on first use (it imports Lightning)."""
    if name == "FederatedCLI":
        from fedlightning.cli.fit import FederatedCLI

        return FederatedCLI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
