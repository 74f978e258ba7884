"""FML with a shared meme backbone and per-client adaptor heads, for clients whose label spaces
differ (docs/algorithms.md section 1.6; Shen et al., "Federated Mutual Learning",
arXiv:2006.16765).

Client i's label space ``Y_i`` is the set of classes among its training samples. Its meme model is
``head_i(backbone(x))``: the backbone is the averaged meme network (a registered model whose output
layer gives ``adaptor_features`` features), ``head_i`` a private ``Linear(adaptor_features, C)``
whose logits outside ``Y_i`` are masked (:func:`mask_logits`), which makes it exactly a
``|Y_i|``-way linear head over the client's own classes: a masked logit gets probability 0 in the
softmax, contributes 0 to cross-entropy and KL, and its row receives no gradient. The personal
model's logits are masked the same way, so deep mutual learning runs over ``Y_i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from fedlightning.models import create_model
from fedlightning.protocol import StateDict

if TYPE_CHECKING:
    from fedlightning.data.datamodule import FederatedDataModule
    from fedlightning.state import ClientStore


def label_spaces_from(table: np.ndarray) -> list[Tensor]:
    """Each client's label space as a boolean class mask, from the clients x classes table of
    training-sample counts (``FederatedDataModule.partition_table()``).

    >>> [m.tolist() for m in label_spaces_from(np.array([[3, 0, 1], [0, 2, 0]]))]
    [[True, False, True], [False, True, False]]
    """
    return [torch.as_tensor(row > 0) for row in np.asarray(table)]


def mask_logits(out: Tensor, mask: Tensor) -> Tensor:
    """``out`` with the logits of classes outside ``mask`` set to half the dtype's lowest value:
    their softmax probability is exactly 0 and no gradient flows to them. Finite (unlike ``-inf``)
    so that ``0 * (log p - log q)`` in a KL term is 0, never NaN."""
    return out.masked_fill(~mask.to(out.device), torch.finfo(out.dtype).min / 2)


def assemble_head(
    heads: Sequence[tuple[Tensor, Tensor, Tensor]], num_classes: int, features: int
) -> tuple[Tensor, Tensor]:
    """The global evaluation head ``(weight, bias)`` from the clients' ``(weight, bias, counts)``
    (``counts``: the client's training samples per class): the row of class c is the mean of c's
    rows over the clients holding c, weighted by their number of samples of c (for disjoint label
    spaces: the one holder's row); a class nobody holds gets a masked bias and is never predicted.

    >>> w, b = assemble_head(
    ...     [(torch.ones(3, 2), torch.zeros(3), torch.tensor([1, 0, 0])),
    ...      (4 * torch.ones(3, 2), torch.ones(3), torch.tensor([3, 5, 0]))], 3, 2)
    >>> w.tolist(), b[:2].tolist(), bool(b[2] < -1e30)
    ([[3.25, 3.25], [4.0, 4.0], [0.0, 0.0]], [0.75, 1.0], True)
    """
    weight = torch.zeros(num_classes, features, dtype=torch.float64)
    bias = torch.zeros(num_classes, dtype=torch.float64)
    total = torch.zeros(num_classes, dtype=torch.float64)
    for w, b, counts in heads:
        n = counts.to(torch.float64)
        weight += n[:, None] * w.to(torch.float64)
        bias += n * b.to(torch.float64)
        total += n
    held = total > 0
    weight[held] /= total[held, None]
    bias[held] /= total[held]
    dtype = heads[0][0].dtype if heads else torch.float32
    bias = bias.to(dtype).masked_fill(~held, torch.finfo(dtype).min / 2)
    return weight.to(dtype), bias


@torch.no_grad()
def masked_hits(logits: Tensor, y: Tensor, mask: Tensor) -> int:
    """Correct predictions among ``y`` when only the classes in ``mask`` can be predicted."""
    return int((mask_logits(logits.float(), mask).argmax(dim=1) == y).sum())


class HeadedBackbone(nn.Module):
    """``logits = head(backbone(x))``: a backbone with ``features`` outputs and a linear head, the
    module evaluation scores for FML with adaptor heads (the assembled head, or one client's)."""

    def __init__(self, backbone: nn.Module, features: int, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(features, num_classes)

    @staticmethod
    def state(backbone: StateDict, head: StateDict) -> StateDict:
        """The module's state_dict from the backbone's and the head's."""
        named = {f"backbone.{k}": v for k, v in backbone.items()}
        return {**named, **{f"head.{k}": v for k, v in head.items()}}

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))


class AdaptorHeads:
    """FML's adaptor-head side (mixed into :class:`~fedlightning.clients.FML`, which sets
    ``adaptor_features``, ``head``, ``label_mask``, ``label_spaces`` and ``label_counts``): the
    backbone's construction, each client's head and mask at the start of its round, the masked
    meme logits of a fit, and the assembled head that evaluation scores with."""

    def create_network(self, name: str) -> nn.Module:
        """The meme network; with ``adaptor_features`` a backbone with that many outputs."""
        features = self.hparams.get("adaptor_features")
        if features is None:
            return super().create_network(name)
        hp = self.hparams
        return create_model(
            name, features, hp.in_channels, hp.image_size, **(hp.network_kwargs or {})
        )

    def prepare_clients(self, datamodule: FederatedDataModule) -> None:
        """With adaptor heads: each client's label space from its training labels."""
        if self.adaptor_features is not None:
            self.label_counts = torch.as_tensor(datamodule.partition_table())
            self.label_spaces = torch.stack(label_spaces_from(self.label_counts.numpy()))

    def _begin_head(self, client_id: int, state: dict[str, Any]) -> None:
        if self.label_spaces is None:
            raise RuntimeError(
                "FML adaptor heads need the clients' label spaces: call "
                "prepare_clients(datamodule) before the first fit (the loop does)"
            )
        if "head" in state:
            self.head.load_state_dict(state["head"])
        else:  # the first participation: a fresh head, off the fit's random stream
            with torch.random.fork_rng(devices=[]):
                fresh = nn.Linear(self.adaptor_features, self.num_classes)
            self.head.load_state_dict(fresh.state_dict())
        self.label_mask = self.label_spaces[client_id].to(self.network_device)

    @property
    def network_device(self) -> torch.device:
        return next(self.network.parameters()).device

    def meme_logits(self, x: Tensor) -> Tensor:
        """The meme model's logits in a fit: the network's, or with adaptor heads the client's
        head on the backbone, masked to its label space."""
        if self.adaptor_features is None:
            return self.network(x)
        return mask_logits(self.head(self.network(x)), self.label_mask)

    def scoring_network(self, network: nn.Module) -> nn.Module:
        """With adaptor heads: the backbone followed by a head, which evaluation loads with the
        clients' heads assembled into one (:meth:`scoring_state`)."""
        if self.adaptor_features is None:
            return network
        return HeadedBackbone(network, self.adaptor_features, self.num_classes)

    def scoring_state(self, weights: StateDict) -> StateDict:
        """With adaptor heads: the backbone's ``weights`` and the assembled head of
        :meth:`prepare_evaluation`, as :class:`HeadedBackbone` names them."""
        if self.adaptor_features is None:
            return weights
        if self._eval_head is None:
            raise RuntimeError("FML adaptor heads: no client has a head yet to evaluate with")
        weight, bias = self._eval_head
        return HeadedBackbone.state(weights, {"weight": weight, "bias": bias})

    def prepare_evaluation(self, store: ClientStore) -> None:
        """With adaptor heads: assemble every client's head into the evaluation head of
        :meth:`scoring_state` (:func:`~fedlightning.clients.fml_heads.assemble_head`)."""
        if self.adaptor_features is None or self.label_spaces is None:
            return
        heads = []
        for cid in store.client_ids():
            state = store.get(cid)
            if "head" in state:
                heads.append(
                    (state["head"]["weight"], state["head"]["bias"], self.label_counts[cid])
                )
        if heads:
            self._eval_head = assemble_head(heads, self.num_classes, self.adaptor_features)
