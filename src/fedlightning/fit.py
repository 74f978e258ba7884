"""One client's local fit: :class:`ClientFitter`, the one place a client fit happens.

The sequential backend, every Ray actor and every Flower node keep one ClientFitter and call its
:meth:`~ClientFitter.fit` per client job; the cohort backend alone trains differently (it vmaps
the objective's own ``local_loss`` over clients, :mod:`fedlightning.backends.cohort`).

A client objective states its local objective as :meth:`ClientModule.local_loss`; the fit runs it
in Lightning's automatic-optimization order (precision, optimizer and LR schedulers in any form
``configure_optimizers`` documents, gradient clipping), or on a lean Lightning Trainer when the
objective needs one (manual optimization, overridden training hooks, a precision this loop does not
cover): :func:`trainer_reason` says which, and why. The loop runs lean for the common case
(``32-true`` and ``bf16-mixed``: plain torch per step, the precision's autocast set up once per fit
by the run's Fabric, data already on the device left there) and on Fabric's per-step wrappers where
the precision needs them (``16-mixed``'s gradient scaler): :meth:`ClientFitter.path`. Both are the
same arithmetic, bit for bit (:mod:`fedlightning.fit_steps`). Device and precision come from the
run's :class:`~fedlightning.compute.Compute`, resolved once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from fedlightning.attacks.labels import training_batches
from fedlightning.clients.round_watch import ClientWatch
from fedlightning.compute import FABRIC_PRECISIONS, PRECISION_PATHS, Compute, canonical
from fedlightning.determinism import deterministic_compute, prepare_environment
from fedlightning.fit_steps import fabric_steps, lean_steps
from fedlightning.optim_config import split_optimizers, step_schedulers
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
    """Why ``model`` needs a Lightning Trainer for its fits (``None``: the fit loop here fits it)."""
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


class ClientFitter:
    """Fits clients of one run on one device: the automatic-optimization loop (lean or on Fabric,
    :meth:`path`), or a lean Trainer for objectives that need one (:func:`trainer_reason`).

    Args:
        config: how every fit of the run is done.
        compute: the run's resolved device and precision (the loop's, for an in-process backend);
            ``None``: resolved here from ``config``, once (a Ray actor's or a Flower node's own).
        lean: fit the common case (:meth:`path`) in plain torch; ``False`` runs those fits on
            Fabric's wrappers instead (the same bits: the reference the lean path is tested
            against).
    """

    def __init__(
        self, config: FitConfig, compute: Compute | None = None, lean: bool = True
    ) -> None:
        if compute is None:  # a worker's own: cuBLAS's workspace variable before CUDA starts
            prepare_environment(config.deterministic)
            compute = Compute.resolve(config.accelerator, config.precision)
        self.compute = compute
        # the precision the fits run (16-mixed is bf16-mixed on a CPU, as Lightning runs it)
        self.config = replace(config, precision=compute.precision)
        self.device = compute.device
        self.lean = lean

    def fit(self, model: ClientModule, dm: FederatedDataModule, job: ClientJob) -> FitResult:
        """Client ``job.client_id``'s local fit from ``job.payload``: its upload and new state.

        Seeded from ``(seed, round, client)`` so that the order in which clients are fitted never
        changes a result. ``num_steps`` (K_i) counts optimizer steps, as Lightning's
        ``global_step`` does: also those a ``16-mixed`` gradient scaler skipped. Runs under the
        run's ``loop.deterministic`` (:func:`~fedlightning.determinism.deterministic_compute`):
        in this process as in a Ray actor or a Flower node, and an op without a deterministic
        implementation is a ConfigurationError, never a client failure. Per-client data kept on
        the module instead of in the state ``end_client`` returns is refused
        (:class:`~fedlightning.clients.round_watch.ClientWatch`).
        """
        with deterministic_compute(self.config.deterministic):
            return self._fit(model, dm, job)

    def _fit(self, model: ClientModule, dm: FederatedDataModule, job: ClientJob) -> FitResult:
        fit_seed = derive_seed(self.config.seed, "fit", job.round_index, job.client_id)
        seed_fit(fit_seed)
        if model.device != self.device:  # moving walks every submodule: only when needed
            model.to(self.device)
        watch = ClientWatch(model, job.client_id)  # per-client state returned, never kept
        model.begin_client(job.client_id, job.payload, job.state)
        watch.begun()
        batches = training_batches(dm, job.client_id, fit_seed, self.config)
        num_samples = dm.client_num_samples(job.client_id)
        if self.config.dp_sgd is not None:  # sample-level DP: docs/algorithms.md section 7.2
            optimizer, schedulers = split_optimizers(model.configure_optimizers())
            dp_fit = DPSGDFit(self.config, batches, fit_seed, self.device)
            num_steps = dp_fit.run(model, optimizer, partial(step_schedulers, schedulers))
            result = dp_fit.account(fit_result(model, job, num_samples, num_steps), job.state)
        else:
            path = self.path(model)
            if path == "trainer":
                num_steps = self._trainer_fit(model, batches, job.max_steps)
            else:
                num_steps = self._optimize(model, batches, path == "lean", job.max_steps)
            result = fit_result(model, job, num_samples, num_steps)
        watch.ended()
        return result

    def path(self, model: ClientModule) -> Literal["trainer", "fabric", "lean"]:
        """How ``model``'s fits run: ``trainer`` (``fit_with='trainer'`` or
        :func:`trainer_reason`), ``fabric`` (a gradient scaler: ``16-mixed`` on a GPU, where
        Fabric's precision plugin scales, unscales and skips steps) or ``lean`` (``32-true`` and
        ``bf16-mixed``: plain torch per step, nothing around it but the precision's autocast)."""
        if self.config.fit_with == "trainer" or trainer_reason(model, self.config.precision):
            return "trainer"
        scaled = PRECISION_PATHS[self.config.precision].skips_steps
        return "lean" if self.lean and not scaled else "fabric"

    def _trainer_fit(self, model: ClientModule, batches: Iterable[Any], budget: int | None) -> int:
        config = self.config
        caps = [cap for cap in (config.local_steps, budget) if cap is not None]
        trainer = lean_trainer(
            config.accelerator,
            config.precision,
            max_epochs=-1 if config.local_steps else config.local_epochs,
            max_steps=min(caps) if caps else -1,
            limit_val_batches=0,
            gradient_clip_val=config.gradient_clip_val,
            gradient_clip_algorithm=config.gradient_clip_algorithm,
        )
        trainer.fit(model, train_dataloaders=batches)
        return trainer.global_step

    def _optimize(
        self, model: ClientModule, batches: Iterable[Any], lean: bool, budget: int | None = None
    ) -> int:
        """The automatic-optimization loop, Lightning's order: per batch ``zero_grad``,
        ``training_step`` under the precision's autocast, backward (scaled for ``16-mixed``),
        optional clipping (on unscaled gradients), the optimizer step (skipped by the scaler on
        non-finite gradients), then step-interval schedulers; epoch-interval schedulers after
        each pass; at most ``budget`` steps (the job's ``max_steps``). Its calls come from :func:`~fedlightning.fit_steps.lean_steps` or
        :func:`~fedlightning.fit_steps.fabric_steps`."""
        config = self.config
        optimizer, schedulers = split_optimizers(model.configure_optimizers())
        clip = (config.gradient_clip_val, config.gradient_clip_algorithm)
        if lean:
            step = lean_steps(optimizer, self.compute, clip)
        else:
            # a fresh Fabric per 16-mixed fit, so no gradient scaler state crosses clients and
            # their order cannot change a result (Compute.fit_fabric)
            step = fabric_steps(optimizer, self.compute.fit_fabric(), model, clip)
        model.train()
        steps, epoch, max_steps = 0, 0, config.local_steps
        monitored = any(c.monitor is not None for c in schedulers)
        limit = math.inf if budget is None else budget
        while steps < limit and (
            (max_steps is None and epoch < config.local_epochs)
            or (max_steps is not None and steps < max_steps)
        ):
            epoch_loss: Any = (
                0.0  # a tensor sum: read (a device sync) only by a monitored scheduler
            )
            epoch_batches = 0
            for batch_idx, batch in enumerate(batches):
                step.zero_grad()
                with step.forward_context:
                    loss = model.training_step(step.to_device(batch), batch_idx)
                step.backward(loss)
                if step.clip is not None:
                    step.clip()
                step.optimizer_step()
                steps += 1
                epoch_batches += 1
                if monitored:
                    epoch_loss = epoch_loss + loss.detach()
                # Lightning counts step-interval frequencies by the batch index within the epoch
                if schedulers:
                    step_schedulers(schedulers, "step", batch_idx + 1, epoch_loss / epoch_batches)
                if steps == max_steps or steps == limit:
                    break
            if not epoch_batches:
                break
            epoch += 1
            step_schedulers(schedulers, "epoch", epoch, epoch_loss / epoch_batches)
        return steps


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
