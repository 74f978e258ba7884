"""IFCA's client: Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, arXiv:2006.04088 (Algorithm 1: the cluster identity estimate)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from fedlightning.clients.base import ClientModule
from fedlightning.protocol import Payload, StateDict

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule


def select_cluster(losses: Sequence[float]) -> int:
    """``argmin_j losses[j]``; ties go to the smallest index, a NaN loss counts as +inf (a
    diverged cluster model is never picked over a finite one).

    >>> select_cluster([0.7, 0.3, 0.3])
    1
    >>> select_cluster([float("nan"), 2.0])
    1
    """
    finite = [math.inf if math.isnan(v) else v for v in losses]
    return min(range(len(finite)), key=lambda j: (finite[j], j))


class IFCAClient(ClientModule):
    """Cross-entropy training of the cluster model this client picks (docs/algorithms.md 2.9):
    the payload carries all k cluster models (its weights are cluster 0's, the extra
    ``"clusters"`` the others); :meth:`begin_client` computes each one's mean cross-entropy on
    the client's whole training split, in eval mode without gradients (:meth:`cluster_losses`),
    loads ``argmin_j`` (:func:`select_cluster`) and trains it; the upload carries the extra
    ``"cluster"``, the index picked. The training data comes from the data module the loop hands
    :meth:`prepare_clients` (a Ray worker and a Flower node get it with the objective). The choice
    is round context (a 0-dim tensor), so the cohort backend trains every client's pick at once.

    Pair with :class:`fedlightning.server.IFCA` (``required_aggregator``).

    Args:
        **kwargs: the :class:`~fedlightning.clients.ClientModule` arguments (network, lr...).
    """

    required_aggregator: ClassVar[frozenset[str]] = frozenset({"IFCA"})
    required_payload_extras: ClassVar[frozenset[str]] = frozenset({"clusters"})
    upload_extras: ClassVar[frozenset[str]] = frozenset({"cluster"})
    #: the data module (set once by prepare_clients): a setting of the run, not round context
    bookkeeping_attributes: ClassVar[frozenset[str]] = ClientModule.bookkeeping_attributes | {
        "_datamodule"
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._datamodule: FederatedDataModule | None = None
        self._cluster = torch.zeros((), dtype=torch.int64)

    def prepare_clients(self, datamodule: FederatedDataModule) -> None:
        super().prepare_clients(datamodule)
        self._datamodule = datamodule

    def begin_client(self, client_id: int, payload: Payload, state: dict[str, Any]) -> None:
        super().begin_client(client_id, payload, state)
        candidates = [payload.weights, *payload.extras["clusters"]]
        chosen = select_cluster(self.cluster_losses(client_id, candidates))
        self.load_network_state(candidates[chosen])
        self._cluster = torch.tensor(chosen, dtype=torch.int64, device=self.device)

    @torch.no_grad()
    def cluster_losses(self, client_id: int, candidates: Sequence[StateDict]) -> list[float]:
        """``F_i(theta_j)`` for each candidate: the mean cross-entropy of the network loaded with
        it over client ``client_id``'s training samples, in order, in eval mode (BatchNorm's
        running statistics, no dropout), summed in float64; 0 for a client with no samples."""
        if self._datamodule is None:
            raise RuntimeError(
                f"{type(self).__name__} picks its cluster on the client's training data: call "
                "prepare_clients(datamodule) before the first fit (the loop does)"
            )
        data = self._datamodule.client_train_dataloader(client_id, seed=0)
        size = self._datamodule.eval_batch_size
        was_training, losses = self.network.training, []
        for weights in candidates:
            self.load_network_state(weights)
            self.network.eval()
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            for start in range(0, len(data.y), size):
                x, y = (t[start : start + size].to(self.device) for t in (data.x, data.y))
                dtype = next(self.network.parameters()).dtype
                logits = self(x.to(dtype) if x.is_floating_point() else x)
                total += F.cross_entropy(logits.double(), y, reduction="sum")
            losses.append(float(total) / len(data.y) if len(data.y) else 0.0)
        self.network.train(was_training)
        return losses

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        weights, extras, state = super().end_client(num_steps)
        return weights, {**extras, "cluster": int(self._cluster)}, state
