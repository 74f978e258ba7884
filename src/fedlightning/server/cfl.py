"""Clustered FL (CFL): Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic
Distributed Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2021, arXiv:1910.01991
(Algorithm 1). The maths: :mod:`fedlightning.server.cfl_maths`. docs/algorithms.md section 2.10."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Literal

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.server.base import Aggregator
from fedlightning.server.cfl_maths import (
    Bipartition,
    Linkage,
    bipartition,
    cosine_matrix,
    cross_similarity,
    mean_update_norm,
    update_vectors,
)
from fedlightning.server.functional import clone_state, weighted_average
from fedlightning.server.ifca import largest_cluster

log = logging.getLogger("fedlightning")
_OPTION = "loop.aggregator.init_args."


class ClusteredFL(Aggregator):
    """Recursive bi-partitioning of the clients by the cosine similarity of their updates
    (docs/algorithms.md section 2.10). The clients start in one cluster; each cluster c has its
    model ``theta_c``, which its members receive and train. After a round, per cluster with the
    members' updates ``Delta_i = theta_i - theta_c`` (trainable parameters) and ``q_i = n_i``
    (``weighting="samples"``, the paper) or 1:

    - split test (only when every member of c uploaded this round, from ``warmup_rounds`` on, for
      ``|c| >= min_cluster_size``): ``|| sum_i q_i Delta_i / sum q || < eps1`` (near a stationary
      point of the cluster's joint objective) and ``max_i ||Delta_i|| > eps2`` (some client still
      far from its own), then the bipartition ``(c1, c2)`` of the members by the cosine
      similarities ``alpha_ij`` (:func:`~fedlightning.server.cfl_maths.bipartition`: the paper's
      optimal one, ``linkage="single"``, or the authors' code's complete linkage), kept when
      ``gamma_max < sqrt((1 - alpha_cross^max) / 2)``;
    - aggregation: ``theta_g <- theta_c + sum_{i in g} q_i Delta_i / sum_{i in g} q_i`` (the
      weighted mean of the uploads) for ``g = c``, or for c1 (keeps index c) and c2 (a new index)
      after a split; the half holding the smallest client id is c1.

    Declared state: ``models`` (one per cluster) and ``membership`` (each client's cluster).
    Deployables: ``cluster_<j>`` for each cluster and ``"global"``, the largest cluster's model
    (ties: the smallest index). Each round logs ``cfl_clusters`` and, per cluster with uploads,
    ``cfl_mean_update_norm_<c>`` and ``cfl_max_update_norm_<c>`` (the two split criteria).
    Clients of one architecture only: groups with different keys are refused at set-up.

    Args:
        eps1: the mean-update bound (> 0); the authors' code's 0.4.
        eps2: the largest-update bound (> 0); the authors' code's 1.6.
        weighting: ``samples`` (the paper: ``|D_i|``) or ``uniform`` (the authors' code).
        linkage: ``single`` (Algorithm 2, optimal) or ``complete`` (the authors' code).
        gamma_max: the split's required separation, in [0, 1); 0: any ``alpha_cross^max < 1``.
        warmup_rounds: rounds before the first split test (the authors' code: 20).
        min_cluster_size: the smallest cluster tested for a split (>= 2; the code: 3).
    """

    #: this round's criteria (round_metrics)
    transient_attributes = frozenset({"_metrics", "_warned"})

    def __init__(
        self,
        eps1: float = 0.4,
        eps2: float = 1.6,
        weighting: Literal["samples", "uniform"] = "samples",
        linkage: Linkage = "single",
        gamma_max: float = 0.0,
        warmup_rounds: int = 0,
        min_cluster_size: int = 2,
    ) -> None:
        super().__init__()
        require(eps1 > 0, _OPTION + "eps1", eps1, "a number > 0")
        require(eps2 > 0, _OPTION + "eps2", eps2, "a number > 0")
        require(weighting in ("samples", "uniform"), _OPTION + "weighting", weighting,
                "samples or uniform")  # fmt: skip
        require(linkage in ("single", "complete"), _OPTION + "linkage", linkage,
                "single or complete")  # fmt: skip
        require(0 <= gamma_max < 1, _OPTION + "gamma_max", gamma_max, "a number in [0, 1)")
        require(warmup_rounds >= 0, _OPTION + "warmup_rounds", warmup_rounds, "an integer >= 0")
        require(min_cluster_size >= 2, _OPTION + "min_cluster_size", min_cluster_size,
                "an integer >= 2")  # fmt: skip
        self.eps1, self.eps2, self.weighting, self.linkage = eps1, eps2, weighting, linkage
        self.gamma_max, self.warmup_rounds = gamma_max, warmup_rounds
        self.min_cluster_size = min_cluster_size
        self.models: list[StateDict] = []
        self.membership: list[int] = []
        self.add_state("models", [])
        self.add_state("membership", [])
        self._metrics: dict[str, float] = {}
        self._warned = False

    def on_setup(self, initial: StateDict) -> None:
        if self.is_heterogeneous():
            raise ConfigurationError(
                "ClusteredFL compares whole-model updates by their cosine similarity, defined "
                "for clients of one architecture (Sattler et al.), but the client groups own "
                "different keys: use one network, or FedAvg or InCo for heterogeneous clients"
            )
        self.models = [clone_state(initial)]
        self.membership = [0] * self.num_clients
        self._metrics = {}
        self._warned = False

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        if len(client_ids) < self.num_clients and not self._warned:
            log.warning(
                "ClusteredFL: %d of %d clients a round; a cluster is tested for a split only in "
                "a round where all its members upload (Sattler et al. train every client every "
                "round: loop.clients_per_round = data.num_clients)",
                len(client_ids), self.num_clients,
            )  # fmt: skip
            self._warned = True
        payloads = {c: Payload(model) for c, model in enumerate(self.models)}
        return {cid: payloads[self.membership[cid]] for cid in client_ids}

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        self._metrics = {}
        for cluster in range(len(self.models)):  # the clusters as the round began
            members = sorted(
                (u for u in uploads if self.membership[u.client_id] == cluster),
                key=lambda u: u.client_id,
            )
            if not members:
                continue
            split = self._split(round_index, cluster, members)
            groups = [members] if split is None else [[members[i] for i in g] for g in split]
            for index, group in enumerate(groups):
                model = weighted_average([u.weights for u in group], self._weights(group))
                if index == 0:
                    self.models[cluster] = model
                else:
                    for upload in group:
                        self.membership[upload.client_id] = len(self.models)
                    self.models.append(model)
        self._metrics["cfl_clusters"] = float(len(self.models))

    def _weights(self, uploads: Sequence[Upload]) -> list[float]:
        return [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in uploads]

    def _split(self, round_index: int, cluster: int, members: list[Upload]) -> Bipartition | None:
        """The bipartition of ``members`` (positions) if cluster ``cluster`` splits this round."""
        keys = [k for k in self.models[cluster] if k in self.parameters]
        updates = update_vectors([u.weights for u in members], self.models[cluster], keys)
        mean_norm = mean_update_norm(updates, self._weights(members))
        max_norm = float(updates.norm(dim=1).max())
        self._metrics[f"cfl_mean_update_norm_{cluster}"] = mean_norm
        self._metrics[f"cfl_max_update_norm_{cluster}"] = max_norm
        size = sum(1 for c in self.membership if c == cluster)
        tested = (
            round_index >= self.warmup_rounds
            and len(members) == size >= self.min_cluster_size
            and mean_norm < self.eps1
            and max_norm > self.eps2
        )
        if not tested:
            return None
        similarity = cosine_matrix(updates)
        split = bipartition(similarity, self.linkage)
        separation = math.sqrt(max(0.0, 1 - cross_similarity(similarity, split)) / 2)
        return split if self.gamma_max < separation else None

    def global_state(self) -> StateDict:
        return self.models[largest_cluster(self.membership, len(self.models))]

    def deployables(self) -> dict[str, StateDict]:
        out = {"global": self.global_state()}
        out.update({f"cluster_{j}": m for j, m in enumerate(self.models)})
        return out

    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)
