"""Start-up check of the clients' training batches against what the objective's fits need: two
samples or more for a BatchNorm layer, and an objective's own ``min_batch_samples``
(docs/algorithms.md section 4.1).

BatchNorm in training mode normalises each channel by the batch's own mean and variance. A batch
of one sample has no spread across samples: at a 1x1 feature map every output is zero (torch
raises for ``BatchNorm1d``), at a larger one the statistics are one image's, and the layer's
running statistics, which evaluation uses, move towards them. A run whose fits would feed such a
batch to a BatchNorm network is refused in one line before anything is trained, on every backend
alike (the batches are the data module's: :func:`fedlightning.data.loader.batch_sizes`, which the
sequential fit iterates and the cohort stacks), naming the client and ``data.min_batch_size``,
which joins a small trailing batch to the one before it. An objective that needs more samples a
batch declares it (``ClientModule.min_batch_samples``: Per-FedAvg splits each batch into two
halves) and is refused the same way.
"""

from __future__ import annotations

from torch import nn

from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.data.loader import batch_sizes
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import FitConfig

#: torch's BatchNorm layers (public classes; a subclass is one too)
BATCH_NORMS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
    nn.SyncBatchNorm,
)


def batchnorm_layers(model: nn.Module) -> list[str]:
    """The names of ``model``'s BatchNorm layers (``network.bn1``), in module order."""
    return [name for name, module in model.named_modules() if isinstance(module, BATCH_NORMS)]


def fit_batch_sizes(sizes: list[int], local_steps: int | None) -> list[int]:
    """The sizes of the batches one fit trains on: every pass's ``sizes`` (each pass cuts its
    shuffle alike), or with ``local_steps`` the first ``local_steps`` batches of the passes."""
    if local_steps is None or not sizes:
        return sizes
    return [sizes[i % len(sizes)] for i in range(min(local_steps, len(sizes)))]


def batch_requirement(model: nn.Module) -> tuple[int, str]:
    """The fewest samples a training batch of ``model``'s fits may hold, and why: the objective's
    ``min_batch_samples`` (Per-FedAvg: 2), and 2 where a BatchNorm layer trains (module
    docstring); ``(1, "")`` where any batch will do."""
    declared = getattr(model, "min_batch_samples", (1, ""))
    if not (
        isinstance(declared, tuple) and len(declared) == 2 and type(declared[0]) is int
        and declared[0] >= 1 and isinstance(declared[1], str)
    ):  # fmt: skip
        raise ConfigurationError(
            f"{type(model).__name__}.min_batch_samples={declared!r}: expected a pair (count >= 1, "
            'reason), e.g. (2, "it splits each batch into two halves")'
        )
    need, reason = declared
    layers = batchnorm_layers(model)
    if layers and need < 2:
        reason = f"BatchNorm in training mode ({layers[0]}) cannot normalise a batch of one sample"
        need, reason = 2, reason + " (no spread across samples to estimate)"
    return need, reason


def check_batches(model: nn.Module, dm: FederatedDataModule, config: FitConfig) -> None:
    """Refuse, in one line, ``data.min_batch_size`` with DP-SGD (its batches are Poisson samples
    of expected size ``batch_size``, counted by the accountant), and a client fit that would train
    on a batch smaller than :func:`batch_requirement` allows (a BatchNorm layer on one sample,
    Per-FedAvg's two halves of one: module docstring)."""
    need, reason = batch_requirement(model)
    if config.dp_sgd is not None:
        if dm.min_batch_size > 1:
            raise ConfigurationError(
                f"data.min_batch_size={dm.min_batch_size} with loop.dp_sgd: DP-SGD draws each "
                "batch as a Poisson sample (its size is random, and the privacy accountant counts "
                "ceil(n_i / batch_size) batches an epoch): leave data.min_batch_size at 1"
            )
        if need > 1:
            raise ConfigurationError(
                f"loop.dp_sgd draws each batch as a Poisson sample, of any size down to 0, and "
                f"{reason} (batches of {need} or more samples): train it without loop.dp_sgd"
            )
        return
    if need <= 1:
        return
    short = [
        cid
        for cid in range(dm.num_clients)
        if min(fit_batch_sizes(_sizes(dm, cid), config.local_steps), default=need) < need
    ]
    if short:
        raise ConfigurationError(_too_small(dm, short, need, reason))


def _sizes(dm: FederatedDataModule, client_id: int) -> list[int]:
    return batch_sizes(dm.client_num_samples(client_id), dm.batch_size, dm.min_batch_size)


def _too_small(dm: FederatedDataModule, clients: list[int], need: int, reason: str) -> str:
    """The refusal: the first client, how many others, why, and what to change."""
    cid, n = clients[0], dm.client_num_samples(clients[0])
    others = f" (and {len(clients) - 1} other client(s))" if len(clients) > 1 else ""
    if n < need or dm.batch_size < need:
        cause = (
            f"client {cid} has {n} training sample(s) in batches of data.batch_size={dm.batch_size}"
        )
        fix = (
            f"use data.batch_size >= {need} and give every client {need} or more samples "
            "(data.min_size)"
        )
    else:
        last = n % dm.batch_size
        cause = (
            f"client {cid} has {n} training samples: data.batch_size={dm.batch_size} leaves it a "
            f"last batch of {last} sample{'s' if last > 1 else ''}"
        )
        fix = (
            f"set data.min_batch_size to {need} or more (a smaller last batch joins the one "
            "before it)"
        )
    return f"{cause}{others}, and {reason}; {fix}"
