"""Lean Lightning Trainers for the many small fits of a federated run, a context that keeps
Lightning's per-Trainer banners out of the output, and one that sets torch's CPU compute settings
(threads, oneDNN) for the length of a run."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loops.optimization.automatic import Closure
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

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
#: the precision flags the direct fit reproduces, each with the name Lightning's precision plugin
#: gives it (``trainer.precision``) before the device is known
_DIRECT_PRECISIONS = {
    "32-true": "32-true",
    "32": "32-true",
    "bf16-mixed": "bf16-mixed",
    "16-mixed": "16-mixed",
}
#: the devices whose ``torch.autocast`` Lightning's MixedPrecision plugin drives for a string
#: accelerator (the connector passes ``"cpu"``/``"mps"`` through and maps every GPU to ``"cuda"``)
_AUTOCAST_DEVICES = ("cpu", "cuda", "mps")
_CPU_FP16_WARNING = (
    "You passed `Trainer(accelerator='cpu', precision='16-mixed')` but AMP with fp16 is not supported"
    " on CPU. Using `precision='bf16-mixed'` instead."
)


def _plugin_precision(precision: str, device: torch.device | None) -> tuple[str | None, str]:
    """The precision Lightning's accelerator connector gives a single-device Trainer with a
    string accelerator on ``device`` (``None``: not known yet), or ``None`` and why the direct
    fit cannot reproduce it.

    ``"32"`` is Lightning's alias of ``"32-true"``. ``"16-mixed"`` on a CPU becomes
    ``"bf16-mixed"``: Lightning warns that fp16 AMP is not supported on CPU and builds a bf16
    MixedPrecision plugin instead (no gradient scaler).
    """
    name = _DIRECT_PRECISIONS.get(str(precision))
    if name is None:
        return None, (
            f"precision {precision!r} needs Lightning's precision plugin (the direct fit "
            f"reproduces {', '.join(_DIRECT_PRECISIONS)})"
        )
    if name != "32-true" and device is not None:
        if device.type not in _AUTOCAST_DEVICES:
            return None, f"precision {precision!r} on a {device.type} device needs the Trainer"
        if name == "16-mixed" and device.type == "cpu":
            name = "bf16-mixed"
    return name, ""


def direct_fit_refusal(
    model: pl.LightningModule, precision: str, device: torch.device | None = None
) -> str | None:
    """Why ``model`` cannot be fitted by :func:`direct_fit` (``None``: it can).

    The direct fit covers the common client fit: automatic optimization, one optimizer, precision
    ``32-true`` (``32``), ``bf16-mixed`` or ``16-mixed`` on a CPU, CUDA or MPS ``device`` (when
    given), no hooks that need the Trainer's machinery (batch transfer hooks, gradient clipping,
    schedulers, callbacks). ``64-true``, ``bf16-true``/``16-true`` and the other precision plugins
    are refused.
    """
    name, reason = _plugin_precision(precision, device)
    if name is None:
        return reason
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
    counters, the precision (the name Lightning's precision plugin reports) and the gradient
    scaler (``16-mixed``; else ``None``). ``barebones`` makes ``self.log`` a no-op (with
    Lightning's warning) rather than an error."""

    barebones = True
    is_global_zero = True
    global_rank = local_rank = node_rank = 0
    world_size = num_devices = num_nodes = 1
    sanity_checking = fast_dev_run = False

    def __init__(
        self, precision: str, device: torch.device, scaler: torch.amp.GradScaler | None = None
    ) -> None:
        self.precision = precision
        self.scaler = scaler
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


class _PluginOptimizer:
    """The optimizer handed to the ``optimizer_step`` hook, in the place of Lightning's
    ``LightningOptimizer``: ``step(closure)`` does what Lightning's precision plugin does in
    ``optimizer_step``; everything else is forwarded to the torch optimizer.

    Full precision and ``bf16-mixed`` (``Precision.optimizer_step``): ``optimizer.step`` with a
    closure that runs the training closure, then ``on_before_optimizer_step``.

    ``16-mixed`` (``MixedPrecision.optimizer_step``): LBFGS is refused as Lightning refuses it; the
    training closure runs, then ``scaler.unscale_(optimizer)`` (unless the optimizer unscales in its
    own step, as fused ones do, or ``training_step`` returned ``None``), ``on_before_optimizer_step``
    (so it sees unscaled gradients), then ``scaler.step(optimizer)`` (which skips
    ``optimizer.step`` when a gradient is not finite) and ``scaler.update()``; both are skipped when
    ``training_step`` returned ``None``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: pl.LightningModule,
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        self.optimizer = optimizer
        self._model = model
        self._scaler = scaler

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        if closure is None:
            closure = _do_nothing
        optimizer, model, scaler = self.optimizer, self._model, self._scaler
        if scaler is None:

            def after_closure() -> Any:
                result = closure()
                model.on_before_optimizer_step(optimizer)
                return result

            return optimizer.step(closure=after_closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise MisconfigurationException("AMP and the LBFGS optimizer are not compatible.")
        result = closure()
        skip = result is None  # training_step returned None: no backward, no step
        # Lightning's _optimizer_handles_unscaling: fused optimizers unscale in their own step
        if not getattr(optimizer, "_step_supports_amp_scaling", False) and not skip:
            scaler.unscale_(optimizer)
        model.on_before_optimizer_step(optimizer)
        if skip:
            return result
        out = scaler.step(optimizer, **kwargs)
        scaler.update()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _do_nothing() -> None:
    return None


def direct_fit(
    model: pl.LightningModule,
    batches: Iterable[Any],
    device: torch.device,
    precision: str = "32-true",
    max_epochs: int = 1,
    max_steps: int = -1,
) -> int:
    """Fit ``model`` on ``batches`` the way ``Trainer.fit`` on one ``device`` does with automatic
    optimization, without the Trainer's per-fit setup and per-step bookkeeping; returns
    Lightning's ``global_step`` (optimizer steps, counting the ones a ``16-mixed`` gradient scaler
    skips). Only for modules :func:`direct_fit_refusal` accepts.

    Runs ``max_epochs`` passes over ``batches`` or, if ``max_steps >= 0``, exactly that many steps
    (new passes as needed). Each batch runs Lightning's automatic-optimization closure inside the
    precision plugin's ``optimizer_step`` (see :class:`_PluginOptimizer`): ``training_step`` (under
    the precision's forward context), ``on_before_zero_grad``, ``optimizer_zero_grad``, the loss
    scaled by the gradient scaler (``16-mixed`` only), ``on_before_backward`` (with the scaled
    loss), ``backward``, ``on_after_backward``; then ``on_before_optimizer_step`` and the step;
    ``global_step`` is incremented once the ``optimizer_step`` hook returns, as Lightning's
    optimization progress is, whether or not the scaler skipped the step.

    Precision, as Lightning's accelerator connector and MixedPrecision plugin set it up:

    - ``32-true`` (``32``): no autocast, no scaler.
    - ``bf16-mixed``: only ``training_step`` runs under
      ``torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)`` (the strategy's
      ``training_step`` enters ``precision_plugin.train_step_context()``); the backward pass, the
      hooks and the optimizer step run outside it. No scaler.
    - ``16-mixed`` on CUDA or MPS: the same autocast with ``torch.float16`` and a new
      ``torch.amp.GradScaler(device.type)`` with torch's defaults for each fit (Lightning builds one
      per Trainer, that is per client fit).
    - ``16-mixed`` on a CPU: Lightning warns and trains in ``bf16-mixed`` (no scaler); so does this,
      with the same warning, and ``trainer.precision`` reads ``"bf16-mixed"``.

    The module sees the same calls with the same tensors in the same order as in a Trainer fit, so
    with the same seeds and batches the trained weights and the step count are bitwise those of a
    ``Trainer.fit`` (``tests/test_lean_fit.py`` compares them). No validation runs during the fit
    (the loop's Trainer fits use ``limit_val_batches=0``). Known differences outside the
    numerics: the module is moved to ``device`` before ``setup`` (a Trainer moves it after
    ``configure_model``, and runs an overridden ``configure_model`` under ``with device:``); it is
    put in train mode (Lightning 2.6 keeps each submodule's mode); and it stays on ``device``
    after the fit (a Trainer's strategy teardown moves it and the optimizer state to the CPU
    before ``on_fit_end``; the next client fit would move it back).
    """
    name, reason = _plugin_precision(precision, device)
    if name is None:
        raise ConfigurationError(f"direct_fit cannot reproduce this fit: {reason}")
    if str(precision) == "16-mixed" and name == "bf16-mixed":
        rank_zero_warn(_CPU_FP16_WARNING)
    if name == "32-true":
        forward_context: Any = nullcontext
        scaler = None
    else:
        dtype = torch.bfloat16 if name == "bf16-mixed" else torch.half
        forward_context = partial(torch.autocast, device.type, dtype=dtype, cache_enabled=False)
        scaler = torch.amp.GradScaler(device=device.type) if name == "16-mixed" else None
    state = _FitState(name, device, scaler)
    model.trainer = state  # type: ignore[assignment]
    model.to(device)
    model.setup("fit")
    model.configure_model()
    optimizer = model.configure_optimizers()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("direct_fit needs configure_optimizers() to return one torch optimizer")
    wrapped = _PluginOptimizer(optimizer, model, scaler)
    pass_batch_idx = is_param_in_hook_signature(model.training_step, "batch_idx", min_args=2)
    model.train()
    torch.set_grad_enabled(True)
    model.on_fit_start()
    model.zero_grad()
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
            args = (batch, batch_idx) if pass_batch_idx else (batch,)
            results: list[tuple[Any, dict[str, Any]]] = []

            def closure(args=args, results=results, batch_idx=batch_idx, epoch=epoch) -> Any:
                with torch.enable_grad():
                    with forward_context():
                        out = model.training_step(*args)
                    loss, extra = _step_output(out)
                    results.append((loss, extra))
                    if loss is None:
                        Closure.warning_cache.warn(
                            "`training_step` returned `None`. If this was on purpose, ignore this "
                            "warning..."
                        )
                    model.on_before_zero_grad(optimizer)
                    model.optimizer_zero_grad(epoch, batch_idx, optimizer)
                    if loss is not None:
                        scaled = loss if scaler is None else scaler.scale(loss)
                        model.on_before_backward(scaled)
                        model.backward(scaled)
                        model.on_after_backward()
                    return None if loss is None else loss.detach()

            model.optimizer_step(epoch, batch_idx, wrapped, closure)
            state.global_step += 1
            if not results:
                raise MisconfigurationException(
                    "The closure hasn't been executed. HINT: did you call `optimizer_closure()` in "
                    "your `optimizer_step` hook? It could also happen because the "
                    "`optimizer.step(optimizer_closure)` call did not execute it internally."
                )
            loss, extra = results[-1]
            outputs = {} if loss is None else {"loss": loss.detach(), **extra}
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


def _step_output(out: Any) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """``(loss, extra keys)`` from ``training_step``'s output, read as Lightning's ``ClosureResult``
    reads it (a tensor, a dict with ``"loss"``, or ``None`` to skip the step). Lightning also
    divides the loss by ``accumulate_grad_batches`` (1 here) and clones it for the outputs: exact
    no-ops on the values that cost two tensor ops per step, left out."""
    if isinstance(out, Mapping):
        if out.get("loss") is None:
            raise MisconfigurationException(
                "In automatic_optimization, when `training_step` returns a dict, the 'loss' key "
                "needs to be present"
            )
        return out["loss"], {k: v for k, v in out.items() if k != "loss"}
    if out is None or isinstance(out, torch.Tensor):
        return out, {}
    raise MisconfigurationException(
        "In automatic optimization, `training_step` must return a Tensor, a dict, or None (where "
        "the step will be skipped)."
    )


def _to_device(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(b, device) for b in batch)
    return batch
