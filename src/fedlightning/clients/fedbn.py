"""FedBN: X. Li, M. Jiang, X. Zhang, M. Kamp, Q. Dou, "FedBN: Federated Learning on Non-IID
Features via Local Batch Normalization", ICLR 2021, arXiv:2102.07623 (Algorithm 1)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from fedlightning.clients.partial import PartialSharing

#: the layers FedBN keeps local: batch normalisation (its affine weights and running statistics)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class FedBN(PartialSharing):
    """FedAvg with every BatchNorm layer kept local (docs/algorithms.md section 10.3): each client
    trains the whole network on ``CE(f(x), y)``, uploads every entry but its BatchNorm layers'
    (``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``), which it
    keeps in its state; the server averages the rest (``FedAvg``). A client deploys the averaged
    layers with its own BatchNorm layers (:class:`~fedlightning.clients.partial.PartialSharing`).
    A network without BatchNorm is refused (FedBN would be FedAvg).

    Args:
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    def kept_keys(self, network: nn.Module) -> Iterable[str]:
        for name, module in network.named_modules():
            if isinstance(module, BATCH_NORMS):
                yield from (f"{name}.{k}" for k in module.state_dict())
