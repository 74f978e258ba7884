"""The cohort backend: all sampled clients of a round trained at once with ``torch.func``.

For each client, ``begin_client`` runs once, as in a sequential fit, and the client's view of the
objective is kept (:mod:`fedlightning.backends.cohort.state`): its parameters, buffers, its fresh
optimizer's state and its round context, derived from the objective's own attributes (every
tensor and frozen module that ``begin_client`` left there, :mod:`fedlightning.backends.cohort.
context`; nothing is declared). These are stacked along a leading client axis, and one
``vmap(grad_and_value(...))`` of the objective's own :meth:`ClientModule.local_loss`, called
through ``functional_call`` on each client's slice, gives every client's gradient, updated
BatchNorm buffers and tracked metrics per step; the optimizer step, clipping and ``16-mixed``
scaling are per client (:mod:`fedlightning.backends.cohort.optim`). Each client sees exactly the
batches of its sequential fit, drawn for the whole round before the first step and sliced on the
device (:mod:`fedlightning.backends.cohort.plan`). A step where every client has a batch of one
size (the common case) works on the stacked tensors in place, with no gather, scatter or host
synchronisation, and on a CUDA device is captured once and replayed (:mod:`fedlightning.backends.cohort.
step`, :mod:`fedlightning.backends.cohort.capture`; docs/algorithms.md section 9.2); in
other steps, clients whose current batch has another size (a shorter last batch) are vmapped in a
group of their own, so no padding changes the objective, and a client that has run out of steps
keeps its parameters and optimizer state. Clients of different architectures (``model.networks``)
are one cohort per architecture, run back to back; on a GPU, a cohort whose clients do not fit in
memory together runs in chunks sized from the free memory (:mod:`fedlightning.backends.cohort.
memory`). After training, each client's view is put back with its trained tensors, optimizer state and tracked metrics, and
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
per round, architecture group and chunk from ``(seed, "cohort", round, group)`` (and the chunk
after the first): runs are deterministic and clients' masks are independent, but they are not the
masks a sequential fit draws (no per-client generator exists inside one vmapped call), so with
dropout the two backends agree in distribution only.

Refused before training, with the reason: objectives that need a Lightning Trainer (manual
optimization, overridden hooks), LR schedulers, optimizers other than SGD/Adam/AdamW (or with
dampening, amsgrad, maximize), ``64-true``, BatchNorm under mixed precision on the CPU (no vmap
rule there). At every round before any step (:mod:`fedlightning.backends.cohort.checks`): what
cannot be stacked into one ``local_loss`` (a per-client number or object, a per-client shape, a
``local_loss`` reading ``self.state``, ``self.payload`` or ``self.client_id``), naming the
attribute and the fix. A ``local_loss`` that cannot be vmapped (data-dependent Python control
flow, ``.item()``) is refused with vmap's message at its first step. An objective that raises
while its clients train together fails them all: the run stops with one line naming the objective,
the exception and where it was raised (:mod:`fedlightning.backends.cohort.failure`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from torch import nn

from fedlightning.attacks.labels import training_batches
from fedlightning.backends.base import Backend, ClientDone, RoundResults
from fedlightning.backends.cohort.capture import FullSteps
from fedlightning.backends.cohort.checks import CohortRefusal, check_cohort
from fedlightning.backends.cohort.failure import cohort_failures
from fedlightning.backends.cohort.memory import ChunkSizes
from fedlightning.backends.cohort.optim import StackedOptimizer, StackedScaler, optimizer_refusal
from fedlightning.backends.cohort.plan import RoundPlan
from fedlightning.backends.cohort.state import ClientView, ContextLoss
from fedlightning.backends.cohort.step import CohortStep, Stacks
from fedlightning.clients.round_watch import ClientWatch
from fedlightning.compute import COHORT_PRECISIONS, Compute
from fedlightning.fit import fit_result, split_optimizers, trainer_reason
from fedlightning.protocol import ClientJob, FitConfig
from fedlightning.seeding import derive_seed, seed_fit

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule


def _refuse(reason: str) -> None:
    raise CohortRefusal(
        f"loop.backend=CohortBackend cannot train this run: {reason}; "
        "use the SequentialBackend (the default)"
    )


class CohortBackend(Backend):
    """Trains every sampled client of a round at once (see the module docstring).

    Args:
        capture: on a CUDA device, capture a round's full steps as a CUDA graph and replay them
            (:mod:`fedlightning.backends.cohort.capture`); no result depends on it.
    """

    def __init__(self, capture: bool = True) -> None:
        self.capture = capture
        self.chunks = ChunkSizes()
        self._capture_failures: set[str] = set()  # each reason logged once a run

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
        for number, (architecture, cohort) in enumerate(groups.items()):
            start = 0
            while start < len(cohort):  # chunks that fit in the device's memory
                size = self.chunks.size(architecture, len(cohort) - start, self.device)
                chunk = cohort[start : start + size]
                seed = derive_seed(self.config.seed, "cohort", round_index, number)
                if start:
                    seed = derive_seed(seed, "chunk", start)
                ids = [job.client_id for job in chunk]
                with (
                    self.chunks.attempt(architecture, len(chunk), self.device) as fitted,
                    cohort_failures(self.model, round_index, ids),
                ):
                    results.update(self._run_cohort(round_index, seed, chunk))
                if not fitted:
                    continue  # out of memory: the same clients again in a smaller chunk
                start += size
                for job in chunk if self.on_client_done is not None else ():
                    self.on_client_done(job.client_id)  # a chunk's clients finish together
        # the global RNG as a sequential round leaves it: seeded for the last client's fit
        seed_fit(derive_seed(self.config.seed, "fit", round_index, jobs[-1].client_id))
        return results

    def _begin(self, round_index: int, job: ClientJob) -> None:
        seed_fit(derive_seed(self.config.seed, "fit", round_index, job.client_id))
        self.model.begin_client(job.client_id, job.payload, job.state)
        self.model.train()

    def _run_cohort(self, round_index: int, seed: int, jobs: list[ClientJob]) -> RoundResults:
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
        trained = {names[0][id(p)] for g in optimizers[0].param_groups for p in g["params"]}
        modules = {k: v for k, v in context.items() if k.startswith("context_modules.")}
        stacks = Stacks(
            {n: p for n, p in params.items() if n in trained},
            {n: p for n, p in params.items() if n not in trained},
            buffers, modules, {k: v for k, v in context.items() if k not in modules},
        )  # fmt: skip
        optim = StackedOptimizer.stack(optimizers, names, params)
        del optimizers
        scaler = StackedScaler(len(jobs), device) if config.precision == "16-mixed" else None
        clip = (config.gradient_clip_val, config.gradient_clip_algorithm)
        step = CohortStep(wrapper, stacks, optim, scaler, clip, self.compute.autocast_dtype, device)
        seed_fit(seed)  # dropout masks
        loaders = [
            training_batches(self.dm, job.client_id,
                             derive_seed(config.seed, "fit", round_index, job.client_id), config)
            for job in jobs
        ]  # fmt: skip
        plan = RoundPlan.build(
            loaders, config.local_epochs, config.local_steps, device, [j.max_steps for j in jobs]
        )
        with step.context(), wrapper.vectorized(), _vmap_refusal(model):
            self._train(step, plan)
        stacked = {**params, **buffers, **context}
        return self._finish(jobs, views, wrapper, stacked, step, plan, watches)

    def _train(self, step: CohortStep, plan: RoundPlan) -> None:
        """Every step of the round's ``plan``: full ones through :class:`FullSteps`, the others
        by batch-size group."""
        full = FullSteps(step, plan, self.capture, self._capture_failures)
        for planned in plan.steps:
            if planned.full is not None:
                full(planned.size, planned.full)
            else:
                assert planned.active is not None
                groups = [(group.index, plan.batch(group.rows)) for group in planned.groups]
                step.partial(groups, planned.active)

    def _finish(self, jobs, views, wrapper, stacks, step, plan, watches) -> RoundResults:
        """Each client's view back on the objective with its trained tensors, optimizer state and
        tracked metrics, then the result as every backend builds it (:func:`fit_result`)."""
        model, optim, results = self.model, step.optimizer, {}
        for i, (job, view) in enumerate(zip(jobs, views, strict=True)):
            view.restore(model)
            wrapper.load_client(i, stacks)
            watches[i].mark()
            optimizer = split_optimizers(model.configure_optimizers())[0]
            by_id = {id(p): f"objective.{n}" for n, p in model.named_parameters()}
            num_steps = plan.num_steps[i]
            for p in (p for g in optimizer.param_groups for p in g["params"]):
                name = by_id[id(p)]
                if name in optim.state:
                    had = dict(optimizer.state.get(p, {}))
                    optimizer.state[p] = optim.client_state(name, i, num_steps > 0, had)
            step.metrics.load(i, model.batch_metrics)
            samples = self.dm.client_num_samples(job.client_id)
            results[job.client_id] = fit_result(model, job, samples, num_steps)
            watches[i].ended()
        return results


@contextmanager
def _vmap_refusal(model: ClientModule) -> Iterator[None]:
    """A ``local_loss`` that vmap cannot run (data-dependent control flow, ``.item()``) is
    refused with vmap's message."""
    try:
        yield
    except RuntimeError as error:
        if "vmap" not in str(error) and "functorch" not in str(error):
            raise
        _refuse(f"{type(model).__name__}.local_loss cannot be vmapped ({error})")
