"""What the Lightning loggers of a run receive besides its metrics, through their public API: the
resolved config as hyperparameters (TensorBoard's hparams, an MLflow run's params...), the run's
figures as images (``log_image`` where the logger has it, W&B's; ``add_image`` on TensorBoard's
``SummaryWriter``), and the CLI's default TensorBoard run name: the run directory's, so that a
resumed run continues the same TensorBoard run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.loggers import Logger

#: Lightning's default TensorBoardLogger name (the user named no run)
LIGHTNING_DEFAULT_NAME = "lightning_logs"


def is_wandb(logger: Logger) -> bool:
    return type(logger).__name__ == "WandbLogger"


def is_tensorboard(logger: Logger) -> bool:
    from lightning.pytorch.loggers import TensorBoardLogger

    return isinstance(logger, TensorBoardLogger)


def log_config(loggers: Iterable[Logger], config_path: Path) -> None:
    """Log the run's ``config.yaml`` as hyperparameters to ``loggers`` (TensorBoard then shows
    the config in its HPARAMS tab and writes it to its ``hparams.yaml``)."""
    if not config_path.is_file():
        return
    config = yaml.safe_load(config_path.read_text()) or {}
    for logger in loggers:
        logger.log_hyperparams(config)


def log_figure(loggers: Iterable[Logger], key: str, path: Path, step: int) -> None:
    """Log the image file ``path`` under ``key`` at ``step`` to the loggers that take images."""
    if not path.is_file() or path.suffix.lower() != ".png":
        return
    pixels = None
    for logger in loggers:
        if is_tensorboard(logger):
            if pixels is None:
                from matplotlib.image import imread

                pixels = imread(path)[..., :3]  # RGB floats in [0, 1]
            logger.experiment.add_image(key, pixels, global_step=step, dataformats="HWC")
        elif callable(getattr(logger, "log_image", None)):  # W&B, Neptune, Comet
            logger.log_image(key=key, images=[str(path)], step=step)


def name_tensorboard_runs(loggers: Sequence[Any] | None, run_dir: str) -> None:
    """The CLI's default for ``loop.loggers`` (applied to the parsed config, so ``config.yaml``
    shows it): a TensorBoardLogger left at Lightning's default name (``lightning_logs``) is named
    after the run directory and, without a version, writes to that name's folder directly
    (``version: ""``) instead of a new ``version_N``: a run resumed from its checkpoint continues
    the same TensorBoard run, its steps (rounds) following on. A name the user gave is kept, with
    Lightning's versioning. In the Python API, pass ``TensorBoardLogger(save_dir, name=...,
    version="")`` for the same."""
    for entry in loggers or ():
        class_path = str(getattr(entry, "class_path", ""))
        args = getattr(entry, "init_args", None)
        if not class_path.endswith("TensorBoardLogger") or args is None:
            continue
        if getattr(args, "name", None) == LIGHTNING_DEFAULT_NAME:
            args.name = Path(run_dir).name
            if getattr(args, "version", None) is None:
                args.version = ""
