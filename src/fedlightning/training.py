"""Lean Lightning Trainers for the many small fits of a federated run, and a context that keeps
Lightning's per-Trainer banners out of the output."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl


def lean_trainer(accelerator: str = "auto", precision: str = "32-true", devices: int = 1, **kwargs: Any) -> pl.Trainer:
    """A Trainer with no logger, checkpointing, progress bar, model summary, sanity check or
    distributed sampler: one client's local fit (or an evaluation) and nothing else."""
    return pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        **kwargs,
    )


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-Trainer banners and hints: a run builds hundreds of Trainers."""
    names = ["lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda", "lightning.fabric"]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*Experiment logs directory.*")
        warnings.filterwarnings("ignore", message=".*You defined a `validation_step` but have no `val_dataloader`.*")
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)
