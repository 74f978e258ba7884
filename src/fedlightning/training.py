"""A lean Lightning Trainer (for the client fits that need one, see :mod:`fedlightning.fit`), a
context that keeps Lightning's per-Trainer banners out of the output, and one that sets torch's CPU
compute settings (threads, oneDNN) for the length of a run."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import torch


def lean_trainer(
    accelerator: str = "auto", precision: str = "32-true", devices: int = 1, **kwargs: Any
) -> pl.Trainer:
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
def cpu_compute(num_threads: int | None = None, onednn: bool = False) -> Iterator[None]:
    """Run the block with ``num_threads`` torch intra-op threads (``None``: unchanged) and oneDNN
    (MKL-DNN) CPU kernels on or off; both are restored afterwards.

    oneDNN is off by default: with torch 2.14.1 on this project's CPUs, oneDNN's convolution
    backward (``mkldnn_convolution_backward_weights``) corrupted the heap while training the
    ResNet10..26 family on 8x8 inputs (glibc aborts the process: ``corrupted double-linked list``,
    ``free(): invalid pointer``), with 1 thread as with 2. torch's native CPU convolutions give the
    same results up to floating-point rounding and are as fast for the small models federated
    simulations train on a CPU (``benchmarks/overhead.py --onednn`` compares). GPU kernels are not
    affected by this setting.
    """
    threads, onednn_before = torch.get_num_threads(), torch.backends.mkldnn.enabled
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    torch.backends.mkldnn.enabled = onednn
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.backends.mkldnn.enabled = onednn_before


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-Trainer banners and hints: a run builds hundreds of Trainers."""
    names = [
        "lightning.pytorch.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
        "lightning.fabric",
        "lightning.pytorch.trainer.connectors.signal_connector",  # "Received SIGTERM" per fit
    ]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*Experiment logs directory.*")
        warnings.filterwarnings(
            "ignore", message=".*You defined a `validation_step` but have no `val_dataloader`.*"
        )
        warnings.filterwarnings(
            "ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*"
        )
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)
