"""``fedlightning cofed --config configs/cofed.yaml``: CoFED's one-shot pipeline from a YAML file.

The options are :class:`~fedlightning.cofed.CoFED`'s constructor, with ``tasks`` and
``participants`` given as ``class_path``/``init_args``. The resolved config is written to
``<run_dir>/config.yaml``; ``run_dir`` defaults to ``runs/<config name>``.
"""

from __future__ import annotations

from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser

from fedlightning.cli_help import PlainHelpFormatter
from fedlightning.cofed.pipeline import CoFED, CoFEDResult


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fedlightning cofed",
        description="CoFED: one-shot co-training through pseudo labels on a public set (arXiv:2202.08603).",
        formatter_class=PlainHelpFormatter,
    )
    parser.add_argument(
        "-c", "--config", action=ActionConfigFile, help="a YAML config (e.g. configs/cofed.yaml)"
    )
    parser.add_class_arguments(CoFED, None, sub_configs=True)
    return parser


def main(args: list[str]) -> CoFEDResult:
    """Parse ``args``, build the pipeline (options are validated here), write the config, run."""
    parser = build_parser()
    config = parser.parse_args(args)
    if config.run_dir is None:
        stem = Path(str(config.config[-1])).stem if config.get("config") else "cofed"
        config.run_dir = str(Path("runs") / stem)
    init = parser.instantiate(config)
    pipeline = CoFED(**{k: v for k, v in vars(init).items() if k != "config"})
    pipeline.run_dir.mkdir(parents=True, exist_ok=True)
    (pipeline.run_dir / "config.yaml").write_text(parser.dump(config))
    return pipeline.run()
