"""Start-up check of the clients' training batches against the objective's BatchNorm layers
(docs/algorithms.md section 4.1).

BatchNorm in training mode normalises each channel by the batch's own mean and variance. A batch
of one sample has no spread across samples: at a 1x1 feature map every output is zero (torch
raises for ``BatchNorm1d``), at a larger one the statistics are one image's, and the layer's
running statistics, which evaluation uses, move towards them. A run whose fits would feed such a
batch to a BatchNorm network is refused in one line before anything is trained, on every backend
alike (the batches are the data module's: :func:`fedlightning.data.loader.batch_sizes`, which the
sequential fit iterates and the cohort stacks), naming the client and ``data.min_batch_size``,
which joins a small trailing batch to the one before it.
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


def check_batches(model: nn.Module, dm: FederatedDataModule, config: FitConfig) -> None:
    """Refuse, in one line, ``data.min_batch_size`` with DP-SGD (its batches are Poisson samples
    of expected size ``batch_size``, counted by the accountant) and a client fit that would train
    a BatchNorm layer of ``model`` on a batch of one sample (module docstring)."""
    if config.dp_sgd is not None:
        if dm.min_batch_size > 1:
            raise ConfigurationError(
                f"data.min_batch_size={dm.min_batch_size} with loop.dp_sgd: DP-SGD draws each "
                "batch as a Poisson sample (its size is random, and the privacy accountant counts "
                "ceil(n_i / batch_size) batches an epoch): leave data.min_batch_size at 1"
            )
        return
    layers = batchnorm_layers(model)
    if not layers:
        return
    ones = [
        cid
        for cid in range(dm.num_clients)
        if 1 in fit_batch_sizes(_sizes(dm, cid), config.local_steps)
    ]
    if ones:
        raise ConfigurationError(_one_sample(dm, ones, layers[0]))


def _sizes(dm: FederatedDataModule, client_id: int) -> list[int]:
    return batch_sizes(dm.client_num_samples(client_id), dm.batch_size, dm.min_batch_size)


def _one_sample(dm: FederatedDataModule, clients: list[int], layer: str) -> str:
    """The refusal: the first client, how many others, why, and what to change."""
    cid, n = clients[0], dm.client_num_samples(clients[0])
    others = f" (and {len(clients) - 1} other client(s))" if len(clients) > 1 else ""
    if n == 1 or dm.batch_size == 1:
        cause = (
            f"client {cid} has {n} training sample(s) in batches of data.batch_size={dm.batch_size}"
        )
        fix = "use data.batch_size >= 2 and give every client 2 or more samples (data.min_size)"
    else:
        cause = (
            f"client {cid} has {n} training samples: data.batch_size={dm.batch_size} leaves it a "
            "last batch of 1 sample"
        )
        fix = "set data.min_batch_size to 2 or more (a smaller last batch joins the one before it)"
    return (
        f"{cause}{others}, and BatchNorm in training mode ({layer}) cannot normalise a batch of "
        f"one sample (no spread across samples to estimate); {fix}"
    )
