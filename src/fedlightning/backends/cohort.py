"""The cohort backend: all sampled clients of a round trained at once with ``torch.func``.

The clients' parameters (and SGD momentum buffers) are stacked along a leading client axis, and
one ``vmap(grad_and_value(...))`` of the objective's own :meth:`ClientModule.local_loss`, called
through ``functional_call`` on each client's slice, gives every client's gradient per step. Each
client sees exactly the batches of its sequential fit (same shuffles, same number of steps);
clients whose current batch has another size (a shorter last batch) are vmapped in a group of
their own, so no padding changes the objective; a client that has run out of steps keeps its
parameters. After training, each client's :meth:`ClientModule.end_client` runs on its trained
weights as in a sequential fit. The result equals the sequential fits up to floating-point
reassociation.

Covered here: objectives whose round context comes from the payload alone (``ClientModule``,
``FedProx``, ``FedNovaClient``, user objectives that override ``local_loss``), one shared payload
per round, SGD (momentum, weight decay) without LR schedulers, full precision, networks without
BatchNorm or dropout, homogeneous clients. Anything else is refused before training with the
reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric import Fabric
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedlightning.backends.base import Backend, RoundResults
from fedlightning.errors import ConfigurationError
from fedlightning.fit import split_optimizers, trainer_reason
from fedlightning.protocol import ClientJob, FitConfig, FitResult, Upload
from fedlightning.seeding import derive_seed, seed_fit

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.data.datamodule import FederatedDataModule

COHORT_PRECISIONS = ("32-true", "32")


class _Loss(nn.Module):
    """``forward(batch) = objective.local_loss(batch)``, so that ``functional_call`` can run the
    objective's own loss on one client's parameters."""

    def __init__(self, objective: ClientModule) -> None:
        super().__init__()
        self.objective = objective

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        return self.objective.local_loss(batch)


class CohortBackend(Backend):
    """Trains every sampled client of a round at once (see the module docstring)."""

    def check(self, model: ClientModule, config: FitConfig) -> None:
        def refuse(reason: str) -> None:
            raise ConfigurationError(
                f"loop.backend=CohortBackend cannot train this run: {reason}; "
                "use the SequentialBackend (the default)"
            )

        reason = trainer_reason(model, config.precision)
        if reason is not None:
            refuse(f"it vectorizes local_loss, and {reason}")
        if model.loss_uses_client_state:
            refuse(f"{type(model).__name__}'s local loss depends on each client's own state")
        if config.precision not in COHORT_PRECISIONS:
            refuse(f"it trains in full precision only, got loop.precision={config.precision!r}")
        if config.gradient_clip_val is not None:
            refuse("it does not clip gradients (loop.gradient_clip_val is set)")
        if model.groups:
            refuse("the clients train different architectures (model.networks)")
        optimizer, schedulers = split_optimizers(model.configure_optimizers())
        group = optimizer.param_groups[0]
        if type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1:
            refuse(f"it implements SGD only, got {type(optimizer).__name__}")
        if group["nesterov"] or group["dampening"] or schedulers:
            refuse("it implements SGD without Nesterov, dampening or LR schedulers")
        for name, module in model.network.named_modules():
            if isinstance(module, nn.modules.batchnorm._NormBase):
                refuse(f"the network's {name} ({type(module).__name__}) keeps batch statistics")
            if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
                refuse(f"the network's {name} ({type(module).__name__}) draws random masks")
        self.hyper = (group["lr"], group["momentum"], group["weight_decay"])

    def start(
        self, model: ClientModule, datamodule: FederatedDataModule, config: FitConfig
    ) -> None:
        if not hasattr(self, "hyper"):
            self.check(model, config)
        self.model, self.dm, self.config = model, datamodule, config
        self.device = Fabric(accelerator=config.accelerator, devices=1).device
        datamodule.place_training_data(self.device)

    def run(self, round_index: int, jobs: Sequence[ClientJob]) -> RoundResults:
        model, config = self.model.to(self.device).train(), self.config
        first = jobs[0].payload
        if any(job.payload.weights is not first.weights for job in jobs):
            raise ConfigurationError(
                "loop.backend=CohortBackend cannot train this run: the aggregator sends clients "
                "different models (e.g. FedCross); use the SequentialBackend"
            )
        model.begin_client(jobs[0].client_id, first, jobs[0].state)  # the shared round context
        wrapper = _Loss(model)
        named = dict(wrapper.named_parameters())
        trainable = [n for n, p in named.items() if p.requires_grad]
        prefix = "objective.network."
        params = {n: _stack([job.payload.weights[n[len(prefix):]] for job in jobs], self.device) for n in trainable}  # fmt: skip
        # frozen parameters and persistent buffers: each client's copy from its payload
        fixed = {
            prefix + k: _stack([job.payload.weights[k] for job in jobs], self.device)
            for k in first.weights
            if prefix + k not in params
        }
        step = vmap(grad_and_value(lambda p, f, batch: functional_call(wrapper, (p, f), (batch,))))
        streams = [_batches(self.dm, config, round_index, job.client_id) for job in jobs]
        steps = torch.zeros(len(jobs), dtype=torch.long)
        loss_sums = torch.zeros(len(jobs), dtype=torch.float64)
        momentum_buffers: list[Tensor] = []
        while True:
            batches = [next(s, None) for s in streams]
            active = [i for i, b in enumerate(batches) if b is not None]
            if not active:
                break
            grads = {n: torch.zeros_like(p) for n, p in params.items()}
            for group in _by_size(batches, active):
                index = torch.tensor(group, device=self.device)
                batch = tuple(
                    torch.stack([batches[i][j] for i in group]).to(self.device) for j in range(2)
                )
                sub_p = {n: p[index] for n, p in params.items()}
                sub_f = {n: f[index] for n, f in fixed.items()}
                g, values = step(sub_p, sub_f, batch)
                for n in grads:
                    grads[n][index] = g[n]
                loss_sums[group] += values.detach().cpu().double()
            mask = torch.zeros(len(jobs), dtype=torch.bool)
            mask[active] = True
            with torch.no_grad():
                _sgd_step(
                    [params[n] for n in trainable], [grads[n] for n in trainable], momentum_buffers,
                    mask.to(self.device), *self.hyper,
                )  # fmt: skip
            steps += mask.long()
        # the global RNG as a sequential round leaves it: seeded for the last client's fit
        seed_fit(derive_seed(config.seed, "fit", round_index, jobs[-1].client_id))
        results: RoundResults = {}
        for i, job in enumerate(jobs):
            model.begin_client(job.client_id, job.payload, job.state)
            trained = {n[len(prefix) :]: p[i] for n, p in params.items()}
            model.network.load_state_dict({**job.payload.weights, **trained})
            num_steps = int(steps[i])
            weights, extras, state = model.end_client(num_steps)
            metrics = {"train_loss": float(loss_sums[i]) / num_steps} if num_steps else {}
            upload = Upload(
                job.client_id, weights, self.dm.client_num_samples(job.client_id), num_steps,
                extras, job.payload.model_index, metrics,
            )  # fmt: skip
            results[job.client_id] = FitResult(upload, state)
        return results


def _stack(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    return torch.stack(list(tensors)).to(device)


def _by_size(batches: Sequence[Any], active: Sequence[int]) -> list[list[int]]:
    """The active clients grouped by the size of their current batch (one vmap per group)."""
    groups: dict[int, list[int]] = {}
    for i in active:
        groups.setdefault(len(batches[i][1]), []).append(i)
    return list(groups.values())


def _sgd_step(
    params: list[Tensor],
    grads: list[Tensor],
    buffers: list[Tensor],
    active: Tensor,
    lr: float,
    momentum: float,
    weight_decay: float,
) -> None:
    """One ``torch.optim.SGD`` step (dampening 0, no Nesterov) on stacked per-client tensors, in
    place and with SGD's own operations; clients not ``active`` keep their parameters and buffers.
    ``buffers`` is empty before the first step (every client's first step: buffer = gradient)."""
    if not bool(active.all()):  # some clients are done: step a copy and keep their rows
        old_params, old_buffers = [p.clone() for p in params], [b.clone() for b in buffers]
        _sgd_step(params, grads, buffers, torch.ones_like(active), lr, momentum, weight_decay)
        for new, old in (
            *zip(params, old_params, strict=True),
            *zip(buffers, old_buffers, strict=True),
        ):
            keep = active.view(-1, *([1] * (new.ndim - 1)))
            new.copy_(torch.where(keep, new, old))
        return
    if weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum:
        if buffers:
            torch._foreach_mul_(buffers, momentum)
            torch._foreach_add_(buffers, grads)
        else:
            buffers.extend(g.clone() for g in grads)
        grads = buffers
    torch._foreach_add_(params, grads, alpha=-lr)


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
