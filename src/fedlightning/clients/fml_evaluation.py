"""FML's per-client metrics: each client's personal model and, with adaptor heads, its meme model
(the global backbone with its own head), scored on the client's validation split through networks
of the scoring path, never the objective's own modules (docs/algorithms.md sections 1.6 and 6.1).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlightning.clients.fml_heads import HeadedBackbone, masked_hits
from fedlightning.metrics import accuracy_distribution
from fedlightning.scoring import ScoringNetworks

if TYPE_CHECKING:
    from fedlightning.state import ClientStore


class PersonalEvaluation:
    """:meth:`evaluate_clients` of :class:`~fedlightning.clients.FML` (mixed into it)."""

    def evaluate_clients(
        self,
        client_ids: Sequence[int],
        store: ClientStore,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
        *,
        scoring: ScoringNetworks | None = None,
    ) -> dict[str, float]:
        """Personal models on their own clients' validation splits (clients without validation
        samples left out):

        * ``personal_acc``: the mean over this round's ``client_ids``;
        * with adaptor heads, predictions are restricted to each client's label space, and
          ``adaptor_acc`` (``adaptor_acc_all``...) scores each client's meme model, the global
          backbone (``scoring.deployables["global"]``) with the client's own head, the same way;
        * ``personal_acc_all`` (with ``_weighted``, ``_std``, ``_min``, ``_worst10``: the
          distribution of :mod:`fedlightning.metrics`): every client that holds a
          personal model, i.e. every client that has trained at least once, sampled this round or
          not (``personal_clients`` counts them).

        Without ``scoring`` (a direct call), the networks are built for this call, in the dtype of
        the objective's network.
        """
        if scoring is None:
            scoring = ScoringNetworks(device, next(self.network.parameters()).dtype)
        everyone = [cid for cid in store.client_ids() if "personal" in store.get(cid)]
        heads = self.adaptor_features is not None
        if heads and "global" not in scoring.deployables:
            raise ValueError(
                "FML adaptor heads score each client's head on the global backbone: pass a "
                "ScoringNetworks whose deployables hold 'global'"
            )
        hits: dict[int, tuple[int, int]] = {}
        adaptor: dict[int, tuple[int, int]] = {}
        with torch.no_grad():
            for cid in everyone:
                personal, meme_hits, count = self._client_hits(
                    cid, store.get(cid), scoring, val_dataloader, device, heads
                )
                hits[cid], adaptor[cid] = (personal, count), (meme_hits, count)
        results = _accuracies(hits, client_ids, everyone, "personal_acc")
        if heads:
            results.update(_accuracies(adaptor, client_ids, everyone, "adaptor_acc"))
        if everyone:
            results["personal_clients"] = float(len(everyone))
        return results

    def _client_hits(
        self,
        cid: int,
        state: dict[str, Any],
        scoring: ScoringNetworks,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
        heads: bool,
    ) -> tuple[int, int, int]:
        """``(personal hits, meme hits, samples)`` of client ``cid`` (its stored ``state``) on its
        validation split; with adaptor ``heads`` within the client's own label space (else no
        meme hits)."""
        name = self.personal_name(cid)
        build = functools.partial(self._build_personal, name)
        model = scoring.load(f"FML_personal_{name}", state["personal"], build)
        dtype = next(model.parameters()).dtype
        if heads:
            meme = scoring.load("FML_meme", _meme_state(scoring, state["head"]), self._meme_network)
            mask = self.label_spaces[cid]  # type: ignore[index]
        personal, meme_hits, count = 0, 0, 0
        for x, y in val_dataloader(cid):
            x, y = x.to(device, dtype), y.to(device)
            if heads:  # predictions within the client's own label space
                personal += masked_hits(model(x), y, mask)
                meme_hits += masked_hits(meme(x), y, mask)
            else:
                personal += int((model(x).argmax(dim=1) == y).sum())
            count += len(y)
        return personal, meme_hits, count

    def _meme_network(self) -> HeadedBackbone:
        """A client's meme model for scoring: a copy of the server model's architecture (the
        global backbone's) with a head."""
        groups = self.client_groups
        backbone = copy.deepcopy(groups.networks[groups.server_index])
        return HeadedBackbone(backbone, self.adaptor_features, self.num_classes)


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
