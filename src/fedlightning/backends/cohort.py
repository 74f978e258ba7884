"""The cohort backend: all sampled clients of a round trained at once with ``torch.func``.

For each client, ``begin_client`` runs once, as in a sequential fit, and the client's view of the
objective is kept (:mod:`fedlightning.backends.cohort_state`): its parameters, buffers, its fresh
optimizer's state and its round context, derived from the objective's own attributes (every
tensor and frozen module that ``begin_client`` left there, :mod:`fedlightning.backends.
cohort_context`; nothing is declared). These are stacked along a leading client axis, and one
``vmap(grad_and_value(...))`` of the objective's own :meth:`ClientModule.local_loss`, called
through ``functional_call`` on each client's slice, gives every client's gradient, updated
BatchNorm buffers and tracked metrics per step; the optimizer step, clipping and ``16-mixed``
scaling are per client (:mod:`fedlightning.backends.cohort_optim`). Each client sees exactly the
batches of its sequential fit; clients whose current batch has another size (a shorter last batch)
are vmapped in a group of their own, so no padding changes the objective; a client that has run
out of steps keeps its parameters and optimizer state. Clients of different architectures
(``model.networks``) are one cohort per architecture, run back to back. After training, each
client's view is put back with its trained tensors, optimizer state and tracked metrics, and
:func:`fedlightning.fit.fit_result` builds its result from its ``end_client`` and
``client_metrics()``, as for every backend.

Equality with the sequential backend: up to floating-point reassociation for every objective,
optimizer and precision covered here; the same ``train_loss`` and tracked metrics. BatchNorm:
each client's batch statistics and running statistics come from the same kernel as in a
sequential fit (per client and channel), so after one step the running statistics are bitwise
equal and the weights equal to float rounding (about 1e-8 on the tiny ResNets of the tests). The
rounding differences then grow as the network amplifies them, and small BatchNorm ResNets amplify
them strongly: on ``resnet14`` (width 4, 8x8 inputs, three 16-sample steps a round) a one-ulp
change of the initial weights moves a sequential fit's weights by 1e-4 after one round and by 0.14
after two (3e-7 and 5e-3 at 32x32), and the cohort differs from sequential by as much (3e-5, 0.2).
With BatchNorm the two backends agree after a step, closely after a round, and in distribution
over many rounds (tested: tests/test_cohort_context.py).

Dropout masks are drawn with ``vmap(randomness="different")`` from the global generator, seeded
per round and architecture group from ``(seed, "cohort", round, group)``: runs are deterministic
and clients' masks are independent, but they are not the masks a sequential fit draws (no
per-client generator exists inside one vmapped call), so with dropout the two backends agree in
distribution only.

Refused before training, with the reason: objectives that need a Lightning Trainer (manual
optimization, overridden hooks), LR schedulers, optimizers other than SGD/Adam/AdamW (or with
dampening, amsgrad, maximize), ``64-true``, BatchNorm under mixed precision on the CPU (no vmap
rule there). At every round before any step (:mod:`fedlightning.backends.cohort_checks`): what
cannot be stacked into one ``local_loss`` (a per-client number or object, a per-client shape, a
``local_loss`` reading ``self.state``, ``self.payload`` or ``self.client_id``), naming the
attribute and the fix. A ``local_loss`` that cannot be vmapped (data-dependent Python control
flow, ``.item()``) is refused with vmap's message at its first step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedlightning.attacks.labels import training_batches
from fedlightning.backends.base import Backend, ClientDone, RoundResults
from fedlightning.backends.cohort_checks import check_cohort
from fedlightning.backends.cohort_metrics import StackedMetrics
from fedlightning.backends.cohort_optim import (
    StackedOptimizer,
    StackedScaler,
    clip_gradients,
    optimizer_refusal,
)
from fedlightning.backends.cohort_state import ClientView, ContextLoss
from fedlightning.clients.round_watch import ClientWatch
from fedlightning.compute import COHORT_PRECISIONS, Compute
from fedlightning.errors import ConfigurationError
from fedlightning.fit import fit_result, split_optimizers, trainer_reason
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.seeding import derive_seed, seed_fit

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule


def _refuse(reason: str) -> None:
    raise ConfigurationError(
        f"loop.backend=CohortBackend cannot train this run: {reason}; "
        "use the SequentialBackend (the default)"
    )


class CohortBackend(Backend):
    """Trains every sampled client of a round at once (see the module docstring)."""

    def check(self, model: ClientModule, config: FitConfig, compute: Compute) -> None:
        if config.dp_sgd is not None:
            _refuse(
                "it steps each client on its batch gradient, and loop.dp_sgd needs per-sample ones"
            )
        reason = trainer_reason(model, compute.precision)
        if reason is not None:
            _refuse(f"it vectorizes local_loss, and {reason}")
        if compute.precision not in COHORT_PRECISIONS:
            _refuse(f"it trains in {', '.join(COHORT_PRECISIONS)}, got {config.precision!r}")
        optimizer, schedulers = split_optimizers(model.configure_optimizers())
        refusal = optimizer_refusal(optimizer)
        if refusal is not None:
            _refuse(refusal)
        if schedulers:
            _refuse("it does not step LR schedulers")
        if compute.autocast_dtype is not None and compute.device.type == "cpu":
            for name, module in model.named_modules():
                if isinstance(module, nn.modules.batchnorm._NormBase):
                    _refuse(f"{name} ({type(module).__name__}) under {config.precision} on the CPU")
        self.checked = True

    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig,
        compute: Compute, on_client_done: ClientDone | None = None,
    ) -> None:  # fmt: skip
        if not getattr(self, "checked", False):
            self.check(model, config, compute)
        # the precision the fits run (16-mixed is bf16-mixed on a CPU, as in a sequential fit)
        self.model, self.dm = model, datamodule
        self.config, self.compute = replace(config, precision=compute.precision), compute
        self.device = compute.device
        self.on_client_done = on_client_done
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
        views, optimizers, names, watches = [], [], [], []
        for job in jobs:  # begin_client once per client: its view is kept until its end_client
            watches.append(ClientWatch(model, job.client_id))  # per-client state never kept
            self._begin(round_index, job)
            watches[-1].begun()
            views.append(ClientView.capture(model, job.client_id, first=not views))
            optimizers.append(split_optimizers(model.configure_optimizers())[0])
            names.append({id(p): f"objective.{n}" for n, p in model.named_parameters()})
        check_cohort(model, views)
        wrapper = ContextLoss(model, views[0])
        params, buffers, context = wrapper.stack(views, device)
        # the optimizer's parameters are trained; the others are fixed inputs of the loss
        trained = [names[0][id(p)] for g in optimizers[0].param_groups for p in g["params"]]
        trainable = {n: params[n] for n in trained}
        fixed = {n: p for n, p in params.items() if n not in trainable}
        modules = {k: v for k, v in context.items() if k.startswith("context_modules.")}
        tensors = {k: v for k, v in context.items() if k not in modules}
        optim = StackedOptimizer.stack(optimizers, names, params)
        del optimizers

        def loss(p, f, b, m, t, scale, batch):
            b = {k: v.clone() for k, v in b.items()}  # updated in place by BatchNorm, returned
            value, tracked = functional_call(wrapper, {**p, **f, **b, **m}, (batch, t))
            return value * scale, (tracked, b)

        step = vmap(grad_and_value(loss, has_aux=True), randomness="different")
        scaler = StackedScaler(len(jobs), device) if config.precision == "16-mixed" else None
        dtype = self.compute.autocast_dtype
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
        seed_fit(derive_seed(config.seed, "cohort", round_index, number))  # dropout masks
        streams = [_batches(self.dm, config, round_index, job.client_id) for job in jobs]
        steps = torch.zeros(len(jobs), dtype=torch.long)
        metrics = StackedMetrics(len(jobs))
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
                        g, (_, (tracked, new_buffers)) = step(*sub, scale, batch)
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
                metrics.add(tracked, index, group)
            active = torch.zeros(len(jobs), dtype=torch.bool, device=device)
            active[active_ids] = True
            optim.step(trainable, grads, active & finite)
            if scaler:
                scaler.update(finite, active)
            steps[active_ids] += 1
        stacks = {**params, **buffers, **context}
        return self._finish(jobs, views, wrapper, stacks, optim, steps, metrics, watches)

    def _finish(self, jobs, views, wrapper, stacks, optim, steps, metrics, watches) -> RoundResults:
        """Each client's view back on the objective with its trained tensors, optimizer state and
        tracked metrics, then the result as every backend builds it (:func:`fit_result`)."""
        model, results = self.model, {}
        for i, (job, view) in enumerate(zip(jobs, views, strict=True)):
            view.restore(model)
            wrapper.load_client(i, stacks)
            watches[i].mark()
            optimizer = split_optimizers(model.configure_optimizers())[0]
            by_id = {id(p): f"objective.{n}" for n, p in model.named_parameters()}
            num_steps = int(steps[i])
            for p in (p for g in optimizer.param_groups for p in g["params"]):
                name = by_id[id(p)]
                if name in optim.state:
                    had = dict(optimizer.state.get(p, {}))
                    optimizer.state[p] = optim.client_state(name, i, num_steps > 0, had)
            metrics.load(i, model.batch_metrics)
            samples = self.dm.client_num_samples(job.client_id)
            results[job.client_id] = fit_result(model, job, samples, num_steps)
            watches[i].ended()
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
    loader = training_batches(dm, cid, derive_seed(config.seed, "fit", round_index, cid), config)
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
