"""Weights & Biases tracking through Lightning's WandbLogger; offline unless an API key is set."""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path

import numpy as np
import yaml
from lightning.pytorch.loggers import WandbLogger

log = logging.getLogger("fedlightning")


def wandb_api_key_available() -> bool:
    """True when ``WANDB_API_KEY`` is set or ``~/.netrc`` holds credentials for api.wandb.ai."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def make_wandb_logger(
    run_dir: Path,
    run_id: str | None,
    project: str,
    group: str | None = None,
    tags: list[str] | None = None,
    name: str | None = None,
) -> WandbLogger:
    """A WandbLogger writing under ``run_dir``; a resumed run passes its stored ``run_id`` to continue it."""
    import wandb

    offline = os.environ.get("WANDB_MODE") == "offline" or not wandb_api_key_available()
    # The run is started here with wandb's public API and handed to the logger: WandbLogger would
    # pass wandb.init an ``anonymous`` value, which wandb 0.31 answers with a warning that a user
    # cannot act on ("The anonymous setting has no effect"). The x-axis is WandbLogger's own.
    run = wandb.init(
        project=project, group=group, tags=tags, name=name or Path(run_dir).name,
        dir=str(run_dir), id=run_id, resume="allow", mode="offline" if offline else "online",
        settings=wandb.Settings(**quiet_settings()),
    )  # fmt: skip
    run.define_metric("trainer/global_step")
    run.define_metric("*", step_metric="trainer/global_step", step_sync=True)
    logger = WandbLogger(
        project=project, name=run.name, save_dir=str(run_dir), offline=offline, id=run.id,
        experiment=run,
    )  # fmt: skip
    if offline:
        log.warning(
            "W&B logs offline (no API key); sync later with: wandb sync %s/wandb/offline-run-*",
            run_dir,
        )
    elif quiet_settings():  # W&B's own lines, its run's address among them, are off
        log.warning("W&B run %s: %s", run.id, run.url)
    return logger


def quiet_settings() -> dict[str, bool]:
    """W&B's own console output off (``silent``: its banner, run summary and sync hints, 34 lines
    a run; its warnings stay), unless the user's environment sets ``WANDB_SILENT`` or
    ``WANDB_QUIET``: then W&B follows it. The run's one line is :func:`make_wandb_logger`'s."""
    if "WANDB_SILENT" in os.environ or "WANDB_QUIET" in os.environ:
        return {}
    return {"silent": True}


def log_run_description(logger: WandbLogger, config_path: Path, partition: np.ndarray) -> None:
    """Log the resolved config (``config.yaml`` as written by the CLI, if present) as the run's
    hyperparameters and the clients x classes partition as a W&B table."""
    if config_path.is_file():
        logger.log_hyperparams(yaml.safe_load(config_path.read_text()) or {})
    columns = ["client", *[f"class_{c}" for c in range(partition.shape[1])]]
    logger.log_table(
        key="partition",
        columns=columns,
        data=[[i, *map(int, row)] for i, row in enumerate(partition)],
    )
