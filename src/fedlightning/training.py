"""Lean Lightning Trainers for the many small fits of a federated run, a context that keeps
Lightning's per-Trainer banners out of the output, and one that sets torch's CPU compute settings
(threads, oneDNN) for the length of a run."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import torch

from fedlightning.errors import ConfigurationError


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


#: LightningModule hooks the direct fit (:func:`direct_fit`) does not run; a module overriding
#: any of them is fitted by a Lightning Trainer instead
_TRAINER_ONLY_HOOKS = (
    "prepare_data",
    "on_train_batch_start",
    "configure_gradient_clipping",
    "transfer_batch_to_device",
    "on_before_batch_transfer",
    "on_after_batch_transfer",
    "lr_scheduler_step",
    "configure_callbacks",
    "on_validation_model_zero_grad",
)
_DIRECT_PRECISIONS = ("32-true", "32")


def direct_fit_refusal(model: pl.LightningModule, precision: str) -> str | None:
    """Why ``model`` cannot be fitted by :func:`direct_fit` (``None``: it can).

    The direct fit covers the common client fit: automatic optimization, one optimizer, full
    precision, no hooks that need the Trainer's machinery (batch transfer hooks, gradient
    clipping, schedulers, callbacks).
    """
    if precision not in _DIRECT_PRECISIONS:
        return f"precision {precision!r} needs Lightning's precision plugin"
    if not model.automatic_optimization:
        return "manual optimization needs the Trainer's optimizer wrappers"
    overridden = [
        h
        for h in _TRAINER_ONLY_HOOKS
        if getattr(type(model), h) is not getattr(pl.LightningModule, h)
    ]
    if overridden:
        return f"{type(model).__name__} overrides {', '.join(overridden)}"
    return None


class _FitState:
    """What a module may read from ``self.trainer`` during a direct fit: the step and epoch
    counters and the precision. ``barebones`` makes ``self.log`` a no-op (with Lightning's
    warning) rather than an error."""

    barebones = True
    is_global_zero = True
    global_rank = local_rank = node_rank = 0
    world_size = num_devices = num_nodes = 1
    sanity_checking = fast_dev_run = False

    def __init__(self, precision: str, device: torch.device) -> None:
        self.precision = precision
        self.global_step = 0
        self.current_epoch = 0
        self.root_device = device
        self.training = True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and hasattr probes
            raise AttributeError(name)
        raise ConfigurationError(
            f"the client module reads trainer.{name}, which a direct client fit does not provide: "
            "set loop.direct_fit=false to fit every client with a Lightning Trainer"
        )


class _CountingOptimizer:
    """The optimizer handed to ``optimizer_step``: counts the steps taken (Lightning's
    ``global_step``) and forwards everything else."""

    def __init__(self, optimizer: torch.optim.Optimizer, state: _FitState) -> None:
        self.optimizer = optimizer
        self._state = state

    def step(self, closure: Any = None) -> Any:
        out = self.optimizer.step(closure=closure)
        self._state.global_step += 1
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def direct_fit(
    model: pl.LightningModule,
    batches: Iterable[Any],
    device: torch.device,
    precision: str = "32-true",
    max_epochs: int = 1,
    max_steps: int = -1,
) -> int:
    """Fit ``model`` on ``batches`` the way ``Trainer.fit`` does with automatic optimization (the
    same hooks in the same order, the same closure: ``training_step``, ``zero_grad``,
    ``backward``, ``optimizer.step``), without the Trainer's per-fit setup and per-step
    bookkeeping; returns the number of optimizer steps taken.

    Runs ``max_epochs`` passes over ``batches`` or, if ``max_steps >= 0``, exactly that many steps
    (new passes as needed). Only for modules :func:`direct_fit_refusal` accepts.
    """
    state = _FitState(precision, device)
    model.trainer = state  # type: ignore[assignment]
    model.to(device)
    model.setup("fit")
    model.configure_model()
    optimizer = model.configure_optimizers()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("direct_fit needs configure_optimizers() to return one torch optimizer")
    wrapped = _CountingOptimizer(optimizer, state)
    model.train()
    torch.set_grad_enabled(True)
    model.zero_grad()
    model.on_fit_start()
    model.on_train_start()
    epoch = 0
    while (max_steps < 0 and epoch < max_epochs) or (
        max_steps >= 0 and state.global_step < max_steps
    ):
        state.current_epoch = epoch
        model.on_train_epoch_start()
        empty = True
        for batch_idx, batch in enumerate(batches):
            empty = False
            batch = _to_device(batch, device)
            outputs: dict[str, Any] = {}

            def closure(batch=batch, batch_idx=batch_idx, outputs=outputs, epoch=epoch) -> Any:
                out = model.training_step(batch, batch_idx)
                loss = out["loss"] if isinstance(out, dict) else out
                outputs["loss"] = loss.detach()
                model.on_before_zero_grad(optimizer)
                model.optimizer_zero_grad(epoch, batch_idx, optimizer)
                model.on_before_backward(loss)
                model.backward(loss)
                model.on_after_backward()
                model.on_before_optimizer_step(optimizer)
                return loss

            model.optimizer_step(epoch, batch_idx, wrapped, closure)
            model.on_train_batch_end(outputs, batch, batch_idx)
            if state.global_step == max_steps:
                break
        model.on_train_epoch_end()
        epoch += 1
        if empty:
            break
    model.on_train_end()
    model.on_fit_end()
    model.teardown("fit")
    return state.global_step


def _to_device(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(b, device) for b in batch)
    return batch
