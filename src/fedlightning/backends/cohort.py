"""Cohort fits (``loop.cohort: true``): all sampled clients of a round trained at once.

The clients' parameters and SGD momentum buffers are stacked along a leading client axis and one
``torch.func.vmap`` of ``grad(functional_call(network, ...))`` computes every client's gradient
per step, as FedJAX does. Each client sees exactly the batches of its sequential fit (same
shuffles, same number of steps); batches are padded to the batch size with a per-sample mask, and
a client that has run out of steps (fewer samples, epoch budget) is masked out of the update. The
result equals the sequential fits up to floating-point reassociation.

Covered: plain cross-entropy (:class:`~fedlightning.clients.ClientModule`) and
:class:`~fedlightning.clients.FedProx`, SGD with momentum and weight decay, full precision,
networks without BatchNorm or dropout (their batch statistics and random masks are per-client
state the vmap does not carry), homogeneous payloads. Anything else is refused with a
:class:`~fedlightning.errors.ConfigurationError` before training.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedlightning.clients.base import ClientModule
from fedlightning.clients.fedprox import FedProx
from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, Upload
from fedlightning.seeding import derive_seed, seed_fit

COHORT_OBJECTIVES = (ClientModule, FedProx)
COHORT_PRECISIONS = ("32-true", "32")


def check_cohort(model: ClientModule, precision: str) -> None:
    """Raise a ConfigurationError naming ``loop.cohort`` unless ``model`` can be cohort-fitted."""

    def refuse(reason: str) -> None:
        raise ConfigurationError(
            f"loop.cohort=true is not allowed: {reason}; set loop.cohort to false"
        )

    if type(model) not in COHORT_OBJECTIVES:
        refuse(
            f"it trains the per-sample objectives of {', '.join(c.__name__ for c in COHORT_OBJECTIVES)} "
            f"only, and {type(model).__name__} has its own local training"
        )
    if model.optimizer_name != "sgd":
        refuse(
            f"it implements SGD (momentum, weight decay) only, got optimizer {model.optimizer_name!r}"
        )
    if precision not in COHORT_PRECISIONS:
        refuse(
            f"it trains in full precision ({', '.join(COHORT_PRECISIONS)}) only, got {precision!r}"
        )
    for name, module in model.network.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase):
            refuse(
                f"the network's {name} ({type(module).__name__}) keeps batch statistics per client"
            )
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            refuse(f"the network's {name} ({type(module).__name__}) draws random masks per client")


def fit_cohort(
    model: ClientModule,
    dm: FederatedDataModule,
    seed: int,
    round_index: int,
    client_ids: Sequence[int],
    payloads: dict[int, Payload],
    device: torch.device,
    local_epochs: int,
    local_steps: int | None,
) -> dict[int, Upload]:
    """Train ``client_ids`` from their payloads together; their uploads, by client id."""
    network = model.network.to(device).train()
    trainable = [n for n, p in network.named_parameters() if p.requires_grad]
    keys = set(payloads[client_ids[0]].weights)
    if any(set(payloads[c].weights) != keys for c in client_ids):
        raise ConfigurationError(
            "loop.cohort=true is not allowed: the payloads hold different models"
        )

    def stacked(names: Sequence[str]) -> dict[str, Tensor]:
        return {
            n: torch.stack([payloads[c].weights[n] for c in client_ids]).to(device) for n in names
        }

    params = stacked(trainable)
    # frozen parameters and buffers come from each client's payload too; non-persistent buffers
    # (not in a state_dict) from the network
    fixed = stacked([k for k in keys if k not in params])
    shared = {n: b.to(device) for n, b in network.named_buffers() if n not in keys}
    anchor = {n: p.clone() for n, p in params.items()}
    momentum_buf: list[Tensor] = []
    mu = model.mu if isinstance(model, FedProx) else 0.0
    lr, momentum, weight_decay = model.lr, model.momentum, model.weight_decay

    def loss(
        p: dict[str, Tensor],
        a: dict[str, Tensor],
        f: dict[str, Tensor],
        x: Tensor,
        y: Tensor,
        mask: Tensor,
    ) -> Tensor:
        logits = functional_call(network, ({**p, **f}, shared), (x,))
        value = (F.cross_entropy(logits, y, reduction="none") * mask).sum() / mask.sum().clamp(
            min=1
        )
        if mu:
            value = value + 0.5 * mu * sum(((p[n] - a[n]) ** 2).sum() for n in p)
        return value

    step = vmap(grad_and_value(loss))
    streams = [
        _batches(dm, cid, derive_seed(seed, "fit", round_index, cid), local_epochs, local_steps)
        for cid in client_ids
    ]
    steps = torch.zeros(len(client_ids), dtype=torch.long)
    loss_sums = torch.zeros(len(client_ids), dtype=torch.float64)
    x_like = dm.data.train_x[:1]
    batch_size = dm.batch_size
    with torch.no_grad():
        while True:
            batches = [next(s, None) for s in streams]
            active = torch.tensor([b is not None for b in batches])
            if not active.any():
                break
            x, y, mask = _stack(batches, batch_size, x_like, device)
            with torch.enable_grad():
                grads, values = step(params, anchor, fixed, x, y, mask)
            _sgd_step(
                [params[n] for n in trainable], [grads[n] for n in trainable], momentum_buf, active.to(device),
                lr, momentum, weight_decay,
            )  # fmt: skip
            steps += active.long()
            loss_sums += torch.where(active, values.detach().cpu().double(), 0.0)
    # the global RNG as a sequential round leaves it: seeded for the last client's fit
    seed_fit(derive_seed(seed, "fit", round_index, client_ids[-1]))
    uploads: dict[int, Upload] = {}
    for i, cid in enumerate(client_ids):
        start = payloads[cid].weights
        weights = {
            k: (params[k][i].to("cpu", copy=True) if k in params else v.clone())
            for k, v in start.items()
        }
        num_steps = int(steps[i])
        uploads[cid] = Upload(
            client_id=cid,
            weights=weights,
            num_samples=dm.client_num_samples(cid),
            num_steps=num_steps,
            model_index=payloads[cid].model_index,
            metrics={"train_loss": float(loss_sums[i]) / num_steps} if num_steps else {},
        )
    return uploads


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
    dm: FederatedDataModule, cid: int, fit_seed: int, local_epochs: int, local_steps: int | None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Client ``cid``'s batches in the order its sequential fit takes them."""
    loader = dm.client_train_dataloader(cid, fit_seed)
    taken, passes = 0, 0
    while (local_steps is None and passes < local_epochs) or (
        local_steps is not None and taken < local_steps
    ):
        passes += 1
        empty = True
        for batch in loader:
            empty = False
            yield batch
            taken += 1
            if taken == local_steps:
                return
        if empty:
            return


def _stack(
    batches: list[tuple[Tensor, Tensor] | None],
    batch_size: int,
    x_like: Tensor,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, y, mask)`` of shape ``(clients, batch_size, ...)``: short batches are zero-padded and
    masked; a finished client gets an all-masked batch."""
    x = torch.zeros((len(batches), batch_size, *x_like.shape[1:]), dtype=x_like.dtype)
    y = torch.zeros((len(batches), batch_size), dtype=torch.long)
    mask = torch.zeros((len(batches), batch_size), dtype=x_like.dtype)
    for i, batch in enumerate(batches):
        if batch is not None:
            n = len(batch[1])
            x[i, :n], y[i, :n], mask[i, :n] = batch[0], batch[1], 1
    return x.to(device), y.to(device), mask.to(device)
