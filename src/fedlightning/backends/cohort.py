"""The cohort backend: all sampled clients of a round trained at once with ``torch.func``.

For each client, ``begin_client`` runs as in a sequential fit and the objective's tensors are
read (:mod:`fedlightning.backends.cohort_state`): parameters, buffers, the round context its
``round_context`` attributes name, and its fresh optimizer's state. These are stacked along a
leading client axis, and one ``vmap(grad_and_value(...))`` of the objective's own
:meth:`ClientModule.local_loss`, called through ``functional_call`` on each client's slice, gives
every client's gradient (and updated BatchNorm buffers) per step; the optimizer step, clipping and
``16-mixed`` scaling are per client (:mod:`fedlightning.backends.cohort_optim`). Each client sees
exactly the batches of its sequential fit; clients whose current batch has another size (a shorter
last batch) are vmapped in a group of their own, so no padding changes the objective; a client
that has run out of steps keeps its parameters and optimizer state. Clients of different
architectures (``model.networks``) are one cohort per architecture, run back to back. After
training, each client's ``begin_client`` runs again, its trained tensors and optimizer state are
loaded, and its ``end_client(num_steps)`` gives the upload as in a sequential fit.

Equality with the sequential backend: up to floating-point reassociation for every objective,
optimizer, BatchNorm and precision covered here. Dropout masks are drawn with
``vmap(randomness="different")`` from the global generator, seeded per round and architecture
group from ``(seed, "cohort", round, group)``: runs are deterministic and clients' masks are
independent, but they are not the masks a sequential fit draws (no per-client generator exists
inside one vmapped call), so with dropout the two backends agree in distribution only.

Refused before training, with the reason: objectives that need a Lightning Trainer (manual
optimization, overridden hooks), LR schedulers, optimizers other than SGD/Adam/AdamW (or with
dampening, amsgrad, maximize), ``64-true``, BatchNorm under mixed precision on the CPU (no vmap
rule there). A ``local_loss`` that cannot be vmapped (data-dependent Python control flow, ``.item()``)
is refused with vmap's message at its first step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric import Fabric
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedlightning.backends.base import Backend, RoundResults
from fedlightning.backends.cohort_optim import (
    StackedOptimizer,
    StackedScaler,
    clip_gradients,
    optimizer_refusal,
)
from fedlightning.backends.cohort_state import ContextLoss, snapshot
from fedlightning.errors import ConfigurationError
from fedlightning.fit import split_optimizers, trainer_reason
from fedlightning.protocol import ClientJob, FitConfig, FitResult, Upload
from fedlightning.seeding import derive_seed, seed_fit

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule

COHORT_PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed")
_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def _refuse(reason: str) -> None:
    raise ConfigurationError(
        f"loop.backend=CohortBackend cannot train this run: {reason}; "
        "use the SequentialBackend (the default)"
    )


class CohortBackend(Backend):
    """Trains every sampled client of a round at once (see the module docstring)."""

    def check(self, model: ClientModule, config: FitConfig) -> None:
        reason = trainer_reason(model, config.precision)
        if reason is not None:
            _refuse(f"it vectorizes local_loss, and {reason}")
        if config.precision not in COHORT_PRECISIONS:
            _refuse(f"it trains in {', '.join(COHORT_PRECISIONS)}, got {config.precision!r}")
        optimizer, schedulers = split_optimizers(model.configure_optimizers())
        refusal = optimizer_refusal(optimizer)
        if refusal is not None:
            _refuse(refusal)
        if schedulers:
            _refuse("it does not step LR schedulers")
        device = Fabric(accelerator=config.accelerator, devices=1).device
        if config.precision in _AUTOCAST and device.type == "cpu":
            for name, module in model.named_modules():
                if isinstance(module, nn.modules.batchnorm._NormBase):
                    _refuse(f"{name} ({type(module).__name__}) under {config.precision} on the CPU")
        self.checked = True

    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig
    ) -> None:
        if not getattr(self, "checked", False):
            self.check(model, config)
        self.model, self.dm, self.config = model, datamodule, config
        self.device = Fabric(accelerator=config.accelerator, devices=1).device
        datamodule.place_training_data(self.device)

    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        groups: dict[frozenset[str], list[ClientJob]] = {}
        for job in jobs:  # one cohort per architecture (state_dict key set), back to back
            groups.setdefault(frozenset(job.payload.weights), []).append(job)
        results: RoundResults = {}
        for number, cohort in enumerate(groups.values()):
            results.update(self._run_cohort(round_index, number, cohort))
            for job in cohort if self.on_client_done is not None else ():
                self.on_client_done(job.client_id)  # a cohort's clients finish together
        # the global RNG as a sequential round leaves it: seeded for the last client's fit
        seed_fit(derive_seed(self.config.seed, "fit", round_index, jobs[-1].client_id))
        return results

    def _begin(self, round_index: int, job: ClientJob) -> None:
        seed_fit(derive_seed(self.config.seed, "fit", round_index, job.client_id))
        self.model.begin_client(job.client_id, job.payload, job.state)
        self.model.train()

    def _run_cohort(self, round_index: int, number: int, jobs: list[ClientJob]) -> RoundResults:
        model, config, device = self.model.to(self.device), self.config, self.device
        snaps, optimizers, names = [], [], []
        wrapper: ContextLoss | None = None
        for job in jobs:
            self._begin(round_index, job)
            wrapper = wrapper or ContextLoss(model)
            snaps.append(snapshot(wrapper))
            optimizer = split_optimizers(model.configure_optimizers())[0]
            optimizers.append(optimizer)
            names.append({id(p): f"objective.{n}" for n, p in model.named_parameters()})
        assert wrapper is not None
        params, buffers, context = (
            {k: torch.stack([s[part][k] for s in snaps]).to(device) for k in snaps[0][part]}
            for part in range(3)
        )
        # the optimizer's parameters are trained; the others are fixed inputs of the loss
        trained = [names[0][id(p)] for g in optimizers[0].param_groups for p in g["params"]]
        trainable = {n: params[n] for n in trained}
        fixed = {n: p for n, p in params.items() if n not in trainable}
        modules = {k: v for k, v in context.items() if k.startswith("context_modules.")}
        tensors = {k: v for k, v in context.items() if k not in modules}
        optim = StackedOptimizer.stack(optimizers, names, params)
        del snaps, optimizers

        def loss(p, f, b, m, t, scale, batch):
            b = {k: v.clone() for k, v in b.items()}  # updated in place by BatchNorm, returned
            value = functional_call(wrapper, {**p, **f, **b, **m}, (batch, t))
            return value * scale, (value.detach(), b)

        step = vmap(grad_and_value(loss, has_aux=True), randomness="different")
        scaler = StackedScaler(len(jobs), device) if config.precision == "16-mixed" else None
        dtype = _AUTOCAST.get(config.precision)
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
        seed_fit(derive_seed(config.seed, "cohort", round_index, number))  # dropout masks
        streams = [_batches(self.dm, config, round_index, job.client_id) for job in jobs]
        steps = torch.zeros(len(jobs), dtype=torch.long)
        loss_sums = torch.zeros(len(jobs), dtype=torch.float64)
        ones = torch.ones(len(jobs), device=device)
        while True:
            batches = [next(s, None) for s in streams]
            active_ids = [i for i, b in enumerate(batches) if b is not None]
            if not active_ids:
                break
            grads = {n: torch.zeros_like(p) for n, p in trainable.items()}
            finite = torch.ones(len(jobs), dtype=torch.bool, device=device)
            for group in _by_size(batches, active_ids):
                index = torch.tensor(group, device=device)
                batch = tuple(
                    torch.stack([batches[i][j] for i in group]).to(device) for j in range(2)
                )
                scale = scaler.scale[index] if scaler else ones[index]
                parts = (trainable, fixed, buffers, modules, tensors)
                sub = [{n: x[index] for n, x in part.items()} for part in parts]
                try:
                    with autocast:
                        g, (_, (values, new_buffers)) = step(*sub, scale, batch)
                except RuntimeError as error:  # e.g. data-dependent control flow in local_loss
                    if "vmap" not in str(error) and "functorch" not in str(error):
                        raise
                    _refuse(f"{type(model).__name__}.local_loss cannot be vmapped ({error})")
                if scaler:
                    g, ok = scaler.unscale(g, index)
                    finite[index] = ok
                if config.gradient_clip_val is not None:
                    g = clip_gradients(g, config.gradient_clip_val, config.gradient_clip_algorithm)
                for n in grads:
                    grads[n][index] = g[n]
                for n in buffers:
                    buffers[n][index] = new_buffers[n]
                loss_sums[group] += values.detach().float().cpu().double()
            active = torch.zeros(len(jobs), dtype=torch.bool, device=device)
            active[active_ids] = True
            optim.step(trainable, grads, active & finite)
            if scaler:
                scaler.update(finite, active)
            steps[active_ids] += 1
        return self._finish(round_index, jobs, wrapper, params, buffers, optim, steps, loss_sums)

    def _finish(self, round_index, jobs, wrapper, params, buffers, optim, steps, loss_sums):
        model, results = self.model, {}
        for i, job in enumerate(jobs):
            self._begin(round_index, job)
            with torch.no_grad():
                for n, p in wrapper.named_parameters():
                    if n in params:
                        p.copy_(params[n][i])
                for n, b in wrapper.named_buffers():
                    if n in buffers:
                        b.copy_(buffers[n][i])
            optimizer = split_optimizers(model.configure_optimizers())[0]
            by_id = {id(p): f"objective.{n}" for n, p in model.named_parameters()}
            num_steps = int(steps[i])
            for p in (p for g in optimizer.param_groups for p in g["params"]):
                name = by_id[id(p)]
                if name in optim.state:
                    had = dict(optimizer.state.get(p, {}))
                    optimizer.state[p] = optim.client_state(name, i, num_steps > 0, had)
            weights, extras, state = model.end_client(num_steps)
            metrics = {"train_loss": float(loss_sums[i]) / num_steps} if num_steps else {}
            upload = Upload(
                job.client_id, weights, self.dm.client_num_samples(job.client_id), num_steps,
                extras, job.payload.model_index, metrics,
            )  # fmt: skip
            results[job.client_id] = FitResult(upload, state)
        return results


def _by_size(batches: Sequence[Any], active: Sequence[int]) -> list[list[int]]:
    """The active clients grouped by the size of their current batch (one vmap per group)."""
    groups: dict[int, list[int]] = {}
    for i in active:
        groups.setdefault(len(batches[i][1]), []).append(i)
    return list(groups.values())


def _batches(
    dm: FederatedDataModule, config: FitConfig, round_index: int, cid: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Client ``cid``'s batches in the order its sequential fit takes them."""
    loader = dm.client_train_dataloader(cid, derive_seed(config.seed, "fit", round_index, cid))
    taken, passes, steps = 0, 0, config.local_steps
    while (steps is None and passes < config.local_epochs) or (steps is not None and taken < steps):
        passes += 1
        empty = True
        for batch in loader:
            empty = False
            yield batch
            taken += 1
            if taken == steps:
                return
        if empty:
            return
