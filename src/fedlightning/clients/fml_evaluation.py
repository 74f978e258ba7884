"""What FML deploys and scores (docs/algorithms.md sections 1.6 and 10).

Each client deploys its personal model: :class:`FMLEvaluation` tells the loop's personalized
evaluation so (``personal_state``, ``personal_network``), and the loop scores it on the client's
own split through the one scoring path (``personal_acc``, :mod:`fedlightning.loop.personal`).
With adaptor heads the personal model predicts within the client's label space
(:class:`LabelMasked`), and FML adds ``adaptor_acc``: each client's meme model (the global
backbone with its own head) on its validation split, scored through networks of the scoring path,
never the objective's own modules.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from fedlightning.clients.evaluation_hooks import PersonalNetwork
from fedlightning.clients.fml_heads import HeadedBackbone, mask_logits, masked_hits
from fedlightning.metrics import accuracy_distribution
from fedlightning.protocol import StateDict
from fedlightning.scoring import ScoringNetworks

if TYPE_CHECKING:
    from fedlightning.state import ClientStore


class LabelMasked(nn.Module):
    """``network``'s logits with the classes outside ``mask`` masked (:func:`~fedlightning.
    clients.fml_heads.mask_logits`): a personal model of FML with adaptor heads, which predicts
    within its client's label space. Its state: ``network.*`` and the bool buffer ``mask``."""

    def __init__(self, network: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.network = network
        self.register_buffer("mask", torch.ones(num_classes, dtype=torch.bool))

    @staticmethod
    def state(network: StateDict, mask: Tensor) -> StateDict:
        return {**{f"network.{k}": v for k, v in network.items()}, "mask": mask}

    def forward(self, x: Tensor) -> Tensor:
        return mask_logits(self.network(x), self.mask)


class FMLEvaluation:
    """The evaluation hooks of :class:`~fedlightning.clients.FML` (mixed into it)."""

    personalized: ClassVar[bool] = True

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict | None:
        """The client's personal model (``None`` before its first fit: it has none yet); with
        adaptor heads, with its label-space mask."""
        personal = state.get("personal")
        if personal is None or self.adaptor_features is None:
            return personal
        return LabelMasked.state(personal, self.label_spaces[client_id])  # type: ignore[index]

    def personal_network(self, client_id: int) -> PersonalNetwork:
        """The client's personal architecture (masked to its label space with adaptor heads)."""
        name = self.personal_name(client_id)
        build: Callable[[], nn.Module] = functools.partial(self._build_personal, name)
        if self.adaptor_features is not None:
            build = functools.partial(_masked, build, self.num_classes)
        return PersonalNetwork(name, build)

    def evaluate_clients(
        self,
        client_ids: Sequence[int],
        store: ClientStore,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
        *,
        scoring: ScoringNetworks | None = None,
    ) -> dict[str, float]:
        """With adaptor heads, each client's meme model (the global backbone,
        ``scoring.deployables["global"]``, with the client's own head) on its validation split,
        predicting within its label space: ``adaptor_acc``, the mean over this round's
        ``client_ids``, and ``adaptor_acc_all`` with its distribution (:mod:`fedlightning.
        metrics`) over every client that holds a head (clients without validation samples left
        out). Nothing without adaptor heads (the personal models are the loop's
        ``personal_acc``).

        Without ``scoring`` (a direct call), the networks are built for this call, in the dtype
        of the objective's network."""
        if self.adaptor_features is None:
            return {}
        if scoring is None:
            scoring = ScoringNetworks(device, next(self.network.parameters()).dtype)
        if "global" not in scoring.deployables:
            raise ValueError(
                "FML adaptor heads score each client's head on the global backbone: pass a "
                "ScoringNetworks whose deployables hold 'global'"
            )
        everyone = [cid for cid in store.client_ids() if "head" in store.get(cid)]
        hits = {}
        with torch.no_grad():
            for cid in everyone:
                hits[cid] = self._meme_hits(cid, store.get(cid), scoring, val_dataloader, device)
        results = _accuracies(hits, client_ids, everyone, "adaptor_acc")
        if everyone:
            results["adaptor_clients"] = float(len(everyone))
        return results

    def _meme_hits(
        self,
        cid: int,
        state: dict[str, Any],
        scoring: ScoringNetworks,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
    ) -> tuple[int, int]:
        """``(hits, samples)`` of client ``cid``'s meme model on its validation split, within
        its label space."""
        meme = scoring.load("FML_meme", _meme_state(scoring, state["head"]), self._meme_network)
        dtype = next(meme.parameters()).dtype
        mask = self.label_spaces[cid]  # type: ignore[index]
        hits, count = 0, 0
        for x, y in val_dataloader(cid):
            x, y = x.to(device, dtype), y.to(device)
            hits += masked_hits(meme(x), y, mask)
            count += len(y)
        return hits, count

    def _meme_network(self) -> HeadedBackbone:
        """A client's meme model for scoring: a copy of the server model's architecture (the
        global backbone's) with a head."""
        groups = self.client_groups
        backbone = copy.deepcopy(groups.networks[groups.server_index])
        return HeadedBackbone(backbone, self.adaptor_features, self.num_classes)


def _masked(build: Callable[[], nn.Module], num_classes: int) -> LabelMasked:
    return LabelMasked(build(), num_classes)


def _meme_state(scoring: ScoringNetworks, head: dict[str, Tensor]) -> dict[str, Tensor]:
    return HeadedBackbone.state(scoring.deployables["global"], head)


def _accuracies(
    hits: dict[int, tuple[int, int]], sampled: Sequence[int], everyone: list[int], name: str
) -> dict[str, float]:
    """``name``: the mean accuracy over the ``sampled`` clients; ``name_all`` with its
    distribution (:mod:`fedlightning.metrics`) over ``everyone``."""
    values = [hits[c][0] / hits[c][1] for c in sampled if c in hits and hits[c][1]]
    results = {name: sum(values) / len(values)} if values else {}
    if everyone:
        counts = torch.tensor([hits[c] for c in everyone], dtype=torch.float64)
        results.update(accuracy_distribution(counts[:, 0], counts[:, 1], f"{name}_all"))
    return results
