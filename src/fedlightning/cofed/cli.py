"""``fedlightning cofed --config configs/cofed.yaml``: CoFED's one-shot pipeline from a YAML file.

The options are :class:`~fedlightning.cofed.CoFED`'s constructor, with ``tasks`` and
``participants`` given as ``class_path``/``init_args``. The resolved config is written to
``<run_dir>/config.yaml``; ``run_dir`` defaults to ``runs/<config name>``. The run directory
follows :mod:`fedlightning.loop.rundir`: checked before anything is written, locked for the run,
refused if it holds an earlier run's results unless ``--overwrite true``, and refused if it holds
a ``config.yaml`` (or another file of a run's names) that fedlightning did not write.
"""

from __future__ import annotations

from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser

from fedlightning.cli.help import PlainHelpFormatter
from fedlightning.cofed.pipeline import CoFED, CoFEDResult
from fedlightning.errors import RunInterrupted
from fedlightning.loop.rundir import (
    RESULT_FILES,
    RunDirectory,
    check_run_dir,
    storage_error,
    write_marked,
)
from fedlightning.signals import (
    StopSignal,
    finished,
    signal_number,
    stop_on_signals,
    stopped_by,
)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fedlightning cofed",
        description="CoFED: one-shot co-training through pseudo labels on a public set (arXiv:2202.08603).",
        formatter_class=PlainHelpFormatter,
        allow_abbrev=False,  # one spelling per option (fedlightning.config_checks)
    )
    parser.add_argument(
        "-c", "--config", action=ActionConfigFile, help="a YAML config (e.g. configs/cofed.yaml)"
    )
    parser.add_class_arguments(CoFED, None, sub_configs=True)
    parser.add_argument(
        "--overwrite",
        type=bool,
        default=False,
        help="replace an earlier run's results in run_dir (otherwise such a run_dir is refused)",
    )
    return parser


def main(args: list[str]) -> CoFEDResult:
    """Parse ``args``, build the pipeline (options are validated here), write the config, run."""
    parser = build_parser()
    config = parser.parse_args(args)
    if config.run_dir is None:
        stem = Path(str(config.config[-1])).stem if config.get("config") else "cofed"
        config.run_dir = str(Path("runs") / stem)
    check_run_dir(config.run_dir, option="run_dir", overwrite=config.overwrite)
    init = parser.instantiate(config)
    pipeline = CoFED(**{k: v for k, v in vars(init).items() if k not in ("config", "overwrite")})
    with RunDirectory(pipeline.run_dir, config.overwrite, option="run_dir"), stop_on_signals():
        try:
            write_marked(
                pipeline.run_dir / "config.yaml", parser.dump(config), "cofed: the resolved config"
            )
            result = pipeline.run()
            finished()  # its report is complete: a signal from now on changes nothing
            return result
        except OSError as error:
            raise storage_error(error, pipeline.run_dir, "write the run's files") from None
        except (KeyboardInterrupt, StopSignal) as stop:
            raise _interrupted(pipeline, signal_number(stop)) from None


def _interrupted(pipeline: CoFED, signum: int) -> RunInterrupted:
    """A CoFED run has no rounds and no checkpoint: say where it stopped and how to start again."""
    again = "run the same command again"
    if any((pipeline.run_dir / name).exists() for name in RESULT_FILES):
        again += " with --overwrite true (it wrote part of its report)"
    return RunInterrupted(
        f"{stopped_by(signum)} during {pipeline.stage}; a CoFED run is one shot with no "
        f"checkpoint to resume: {again}",
        signum,
    )
