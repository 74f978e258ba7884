"""Weights & Biases tracking through Lightning's WandbLogger; offline unless an API key is set.

W&B writes outside the run directory too: its artifact staging folder (``WANDB_DATA_DIR``,
default ``~/.local/share/wandb``; the partition table is staged there) and its cache
(``WANDB_CACHE_DIR``, default ``~/.cache/wandb``). :func:`check_wandb_folders` refuses, at
start-up, folders W&B could not write (a user without a writable home), naming the folder and the
variable that moves it; a W&B write that fails later is a
:class:`~fedlightning.errors.StorageError` saying the same (:func:`wandb_writes`), never "could
not write the run's files" about the run directory.
"""

from __future__ import annotations

import logging
import netrc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml
from lightning.pytorch.loggers import WandbLogger

from fedlightning.errors import ConfigurationError, StorageError

log = logging.getLogger("fedlightning")
#: what moves W&B's files, named in messages
WANDB_VARIABLES = (
    "WANDB_DIR (its run files), WANDB_DATA_DIR (staging), WANDB_CACHE_DIR (cache), "
    "WANDB_CONFIG_DIR (settings)"
)


def wandb_folders() -> dict[str, Path]:
    """``{variable: folder}`` of the folders W&B writes outside the run directory, as W&B's
    ``wandb.env`` resolves them now."""
    from wandb import env

    return {
        env.DATA_DIR: Path(env.get_data_dir()) / "artifacts" / "staging",
        env.CACHE_DIR: Path(env.get_cache_dir()),
    }


def check_wandb_folders() -> None:
    """Raise a ConfigurationError naming the folder and its variable when W&B could not create
    or write one of :func:`wandb_folders` (its nearest existing parent is a file or is not
    writable for this user). Writes nothing."""
    for variable, folder in wandb_folders().items():
        existing = folder.expanduser()
        try:  # a parent this user cannot enter raises PermissionError: not writable either
            while not existing.exists() and existing.parent != existing:
                existing = existing.parent
            usable = existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)
            why = "is not a directory" if not existing.is_dir() else "is not writable for this user"
        except OSError as error:
            usable, why = False, f"cannot be reached: {error.strerror or error}"
        if not usable:
            raise ConfigurationError(
                f"loop.wandb=true, but W&B cannot write {str(folder)!r} ({str(existing)!r} "
                f"{why}): set {variable} to a writable directory"
            )


@contextmanager
def wandb_writes() -> Iterator[None]:
    """Within the block (W&B's own writes), an OSError is a StorageError naming W&B's folders
    and the variables that move them (the folder and its variable when the error names one:
    :func:`wandb_storage_error`)."""
    try:
        yield
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        raise wandb_storage_error(error) or StorageError(
            f"W&B could not write its files: {error.strerror or error}{where}; W&B's folders "
            f"move with {WANDB_VARIABLES}"
        ) from None


def wandb_storage_error(error: OSError) -> StorageError | None:
    """A StorageError naming the W&B folder outside the run directory that ``error`` failed to
    write (its staging, cache or settings folder under HOME) and the variable that moves it, or
    None when ``error`` names none of them (or W&B was never imported: no run used it). The
    run's own error handling asks this first, so that a W&B write failing anywhere in a run is
    not reported as the run directory's."""
    if "wandb" not in sys.modules:
        return None
    text = " ".join(str(part) for part in (error.filename, error.filename2, error) if part)
    for variable, folder in _wandb_roots().items():
        if str(folder) in text:
            return StorageError(
                f"W&B could not write {str(folder)!r}, its folder outside the run directory: "
                f"{error.strerror or error}; set {variable} to a writable directory"
            )
    return None


def _wandb_roots() -> dict[str, Path]:
    """``{variable: folder}`` of W&B's folders outside the run directory, as W&B resolves them."""
    from wandb import env

    config = os.environ.get(env.CONFIG_DIR)
    return {
        env.DATA_DIR: Path(env.get_data_dir()).expanduser(),
        env.CACHE_DIR: Path(env.get_cache_dir()).expanduser(),
        env.CONFIG_DIR: Path(config or "~/.config/wandb").expanduser(),
    }


def wandb_api_key_available() -> bool:
    """True when ``WANDB_API_KEY`` is set or ``~/.netrc`` holds credentials for api.wandb.ai."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):  # no readable ~/.netrc: no credentials there
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
    offline = os.environ.get("WANDB_MODE") == "offline" or not wandb_api_key_available()
    with wandb_writes():
        return _start_wandb_logger(run_dir, run_id, project, group, tags, name, offline)


def _start_wandb_logger(
    run_dir: Path, run_id: str | None, project: str, group: str | None,
    tags: list[str] | None, name: str | None, offline: bool,
) -> WandbLogger:  # fmt: skip
    import wandb

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
    hyperparameters and the clients x classes partition as a W&B table (staged by W&B in
    ``WANDB_DATA_DIR``)."""
    config = yaml.safe_load(config_path.read_text()) or {} if config_path.is_file() else None
    columns = ["client", *[f"class_{c}" for c in range(partition.shape[1])]]
    with wandb_writes():
        if config is not None:
            logger.log_hyperparams(config)
        logger.log_table(
            key="partition",
            columns=columns,
            data=[[i, *map(int, row)] for i, row in enumerate(partition)],
        )
