"""One client's local fit: :class:`ClientFitter`, the one place a client fit happens.

The sequential backend, every Ray actor and every Flower node keep one ClientFitter and call its
:meth:`~ClientFitter.fit` per client job; the cohort backend alone trains differently (it vmaps
the objective's own ``local_loss`` over clients, :mod:`fedlightning.backends.cohort`).

A client objective states its local objective as :meth:`ClientModule.local_loss`; the fit runs it
on Lightning Fabric (precision and gradient scaler, optimizer and LR schedulers in any form
``configure_optimizers`` documents, gradient clipping), or on a lean Lightning Trainer when the
objective needs one (manual optimization, overridden training hooks, a precision Fabric's loop
here does not cover): :func:`trainer_reason` says which, and why. Device and precision come from
the run's :class:`~fedlightning.compute.Compute`, resolved once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric import Fabric

from fedlightning.compute import FABRIC_PRECISIONS, Compute, canonical
from fedlightning.errors import ConfigurationError
from fedlightning.privacy.dp_sgd_fit import DPSGDFit
from fedlightning.protocol import ClientJob, FitConfig, FitResult, Upload
from fedlightning.seeding import derive_seed, seed_fit
from fedlightning.training import lean_trainer

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule

#: LightningModule hooks the Fabric fit does not call: a module overriding any of them (relative to
#: ClientModule) is fitted by a Trainer so that its hooks run
TRAINER_HOOKS = (
    "training_step", "optimizer_step", "optimizer_zero_grad", "backward", "on_before_backward",
    "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_start",
    "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_start",
    "on_train_end", "on_fit_start", "on_fit_end", "configure_gradient_clipping",
    "lr_scheduler_step", "transfer_batch_to_device", "on_before_batch_transfer",
    "on_after_batch_transfer", "configure_callbacks", "configure_model", "setup", "teardown",
)  # fmt: skip


def trainer_reason(model: ClientModule, precision: str) -> str | None:
    """Why ``model`` needs a Lightning Trainer for its fits (``None``: Fabric fits it)."""
    from fedlightning.clients.base import ClientModule

    if canonical(precision) not in FABRIC_PRECISIONS:
        return f"precision {precision!r} (the Fabric fit covers {', '.join(FABRIC_PRECISIONS)})"
    if not model.automatic_optimization:
        return "it uses manual optimization"
    overridden = [
        h for h in TRAINER_HOOKS if getattr(type(model), h) is not getattr(ClientModule, h)
    ]
    if overridden:
        return f"{type(model).__name__} overrides {', '.join(overridden)}"
    return None


@dataclass
class SchedulerConfig:
    """One LR scheduler as Lightning's ``lr_scheduler_config`` describes it."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None


def split_optimizers(
    returned: Any, name: str = "configure_optimizers"
) -> tuple[torch.optim.Optimizer, list[SchedulerConfig]]:
    """The optimizer and LR schedulers from what ``configure_optimizers`` returned, in any of
    Lightning's documented forms: an optimizer; a list/tuple of one optimizer; two lists
    ``([optimizer], [scheduler or config])``; a dict ``{"optimizer": ..., "lr_scheduler":
    scheduler or {"scheduler": ..., "interval": "epoch"|"step", "frequency": n, "monitor": ...}}``.

    Automatic optimization trains with one optimizer (Lightning's rule too): several are refused.
    """
    optimizers: list[Any]
    schedulers: list[Any] = []
    if isinstance(returned, torch.optim.Optimizer):
        optimizers = [returned]
    elif isinstance(returned, Mapping):
        optimizers = [returned.get("optimizer")]
        if returned.get("lr_scheduler") is not None:
            schedulers = [returned["lr_scheduler"]]
    elif (
        isinstance(returned, Sequence)
        and len(returned) == 2
        and all(isinstance(part, Sequence) for part in returned)
    ):
        optimizers, schedulers = list(returned[0]), list(returned[1])
    elif isinstance(returned, Sequence) and not isinstance(returned, str | bytes):
        optimizers = list(returned)
    else:
        raise ConfigurationError(
            f"{name}() returned {type(returned).__name__}: return an optimizer, a list of one, "
            "([optimizer], [scheduler]) or {'optimizer': ..., 'lr_scheduler': ...}"
        )
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        raise ConfigurationError(
            f"{name}() must give exactly one torch optimizer for automatic optimization, got "
            f"{[type(o).__name__ for o in optimizers]}: use manual optimization for several"
        )
    configs = []
    for entry in schedulers:
        config = SchedulerConfig(**entry) if isinstance(entry, Mapping) else SchedulerConfig(entry)
        if config.interval not in ("epoch", "step") or config.frequency < 1:
            raise ConfigurationError(
                f"lr_scheduler interval={config.interval!r}, frequency={config.frequency!r}: "
                "expected interval 'epoch' or 'step' and an integer frequency >= 1"
            )
        if config.monitor not in (None, "train_loss"):
            raise ConfigurationError(
                f"lr_scheduler monitor={config.monitor!r}: a client fit provides 'train_loss' only"
            )
        configs.append(config)
    return optimizers[0], configs


class ClientFitter:
    """Fits clients of one run on one device: Fabric's precision, optimizers and clipping, or a
    lean Trainer for objectives that need one (:func:`trainer_reason`).

    Args:
        config: how every fit of the run is done.
        compute: the run's resolved device and precision (the loop's, for an in-process backend);
            ``None``: resolved here from ``config``, once (a Ray actor's or a Flower node's own).
    """

    def __init__(self, config: FitConfig, compute: Compute | None = None) -> None:
        if compute is None:
            compute = Compute.resolve(config.accelerator, config.precision)
        self.compute = compute
        # the precision the fits run (16-mixed is bf16-mixed on a CPU, as Lightning runs it)
        self.config = replace(config, precision=compute.precision)
        self.device = compute.device

    def fit(self, model: ClientModule, dm: FederatedDataModule, job: ClientJob) -> FitResult:
        """Client ``job.client_id``'s local fit from ``job.payload``: its upload and new state.

        Seeded from ``(seed, round, client)`` so that the order in which clients are fitted never
        changes a result. ``num_steps`` (K_i) counts optimizer steps, as Lightning's
        ``global_step`` does: also those a ``16-mixed`` gradient scaler skipped.
        """
        fit_seed = derive_seed(self.config.seed, "fit", job.round_index, job.client_id)
        seed_fit(fit_seed)
        if model.device != self.device:  # moving walks every submodule: only when needed
            model.to(self.device)
        model.begin_client(job.client_id, job.payload, job.state)
        batches = dm.client_train_dataloader(job.client_id, fit_seed)
        num_samples = dm.client_num_samples(job.client_id)
        if self.config.dp_sgd is not None:  # sample-level DP: docs/algorithms.md section 7.2
            optimizer, schedulers = split_optimizers(model.configure_optimizers())
            dp_fit = DPSGDFit(self.config, batches, fit_seed, self.device)
            num_steps = dp_fit.run(model, optimizer, partial(_step_schedulers, schedulers))
            return dp_fit.account(fit_result(model, job, num_samples, num_steps), job.state)
        reason = trainer_reason(model, self.config.precision)
        if self.config.fit_with == "trainer" or reason is not None:
            num_steps = self._trainer_fit(model, batches)
        else:
            num_steps = self._fabric_fit(model, batches)
        return fit_result(model, job, num_samples, num_steps)

    def _trainer_fit(self, model: ClientModule, batches: Iterable[Any]) -> int:
        config = self.config
        trainer = lean_trainer(
            config.accelerator,
            config.precision,
            max_epochs=-1 if config.local_steps else config.local_epochs,
            max_steps=config.local_steps or -1,
            limit_val_batches=0,
            gradient_clip_val=config.gradient_clip_val,
            gradient_clip_algorithm=config.gradient_clip_algorithm,
        )
        trainer.fit(model, train_dataloaders=batches)
        return trainer.global_step

    def _fabric_fit(self, model: ClientModule, batches: Iterable[Any]) -> int:
        """The automatic-optimization loop on Fabric: per batch ``zero_grad``, ``training_step``
        under the precision's autocast, ``fabric.backward`` (scaled for ``16-mixed``), optional
        clipping (on unscaled gradients), the optimizer step (skipped by the scaler on non-finite
        gradients), then step-interval schedulers; epoch-interval schedulers after each pass."""
        config = self.config
        # the run's Fabric; a fresh one per 16-mixed fit, so no gradient scaler state crosses
        # clients and their order cannot change a result (Compute.fit_fabric)
        fabric = self.compute.fit_fabric()
        optimizer, schedulers = split_optimizers(model.configure_optimizers())
        fabric_optimizer = fabric.setup_optimizers(optimizer)
        model.train()
        steps, epoch, max_steps = 0, 0, config.local_steps
        monitored = any(c.monitor is not None for c in schedulers)
        while (max_steps is None and epoch < config.local_epochs) or (
            max_steps is not None and steps < max_steps
        ):
            epoch_loss: Any = (
                0.0  # a tensor sum: read (a device sync) only by a monitored scheduler
            )
            epoch_batches = 0
            for batch_idx, batch in enumerate(batches):
                fabric_optimizer.zero_grad()
                with fabric.autocast():
                    loss = model.training_step(fabric.to_device(batch), batch_idx)
                fabric.backward(loss)
                self._clip(fabric, model, fabric_optimizer)
                fabric_optimizer.step()
                steps += 1
                epoch_batches += 1
                if monitored:
                    epoch_loss = epoch_loss + loss.detach()
                # Lightning counts step-interval frequencies by the batch index within the epoch
                _step_schedulers(schedulers, "step", batch_idx + 1, epoch_loss / epoch_batches)
                if steps == max_steps:
                    break
            if not epoch_batches:
                break
            epoch += 1
            _step_schedulers(schedulers, "epoch", epoch, epoch_loss / epoch_batches)
        return steps

    def _clip(self, fabric: Fabric, model: ClientModule, optimizer: Any) -> None:
        value = self.config.gradient_clip_val
        if value is None:
            return
        if self.config.gradient_clip_algorithm == "value":
            fabric.clip_gradients(model, optimizer, clip_val=value)
        else:
            fabric.clip_gradients(model, optimizer, max_norm=value, error_if_nonfinite=False)


def _step_schedulers(
    schedulers: Sequence[SchedulerConfig], interval: str, count: int, mean_loss: Any
) -> None:
    for config in schedulers:
        if config.interval == interval and count % config.frequency == 0:
            if config.monitor is None:
                config.scheduler.step()
            else:
                config.scheduler.step(float(mean_loss))


def fit_result(model: ClientModule, job: ClientJob, num_samples: int, num_steps: int) -> FitResult:
    """The result of client ``job.client_id``'s fit, built the same way on every backend: after
    the fit (``num_steps`` optimizer steps on ``num_samples`` samples) the module's
    ``end_client`` gives the upload's weights and extras and the client's new state, and its
    ``client_metrics()`` the means of what the fit's steps tracked (``train_loss``...)."""
    weights, extras, state = model.end_client(num_steps)
    upload = Upload(
        client_id=job.client_id,
        weights=weights,
        num_samples=num_samples,
        num_steps=num_steps,
        extras=extras,
        model_index=job.payload.model_index,
        metrics=model.client_metrics(),
    )
    return FitResult(upload, state)
