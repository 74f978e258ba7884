"""IFCA's server: Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, arXiv:2006.04088 (Algorithm 1, both options). docs/algorithms.md
section 2.9."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.server.base import Aggregator, restrict
from fedlightning.server.functional import owner_average
from fedlightning.server.summation import wide

Update = Literal["model", "gradient"]


def largest_cluster(assignment: Sequence[int], k: int) -> int:
    """The cluster most clients are assigned to (ties: the smallest index; -1 entries, clients
    never assigned, count for none)."""
    counts = [sum(1 for a in assignment if a == j) for j in range(k)]
    return max(range(k), key=lambda j: (counts[j], -j))


def gradient_step(model: StateDict, members: list[Upload], weights: list[float],
                  totals: dict[str, float], parameters: frozenset[str]) -> StateDict:  # fmt: skip
    """Option I on one cluster's model: per trainable parameter p its members own,
    ``theta_p + sum_{i in members} (q_i / Q_p) (theta_{i,p} - theta_p)`` with ``Q_p`` (``totals``)
    the sum of ``q_i`` over *every* upload of the round that owns p (all clusters: the paper's
    ``1/m``); with one plain SGD step of rate gamma per client, ``theta_i - theta = -gamma g_i``
    and this is ``theta - (gamma/m) sum_i s_ij g_i``. Buffers take the members' owner-aware mean.
    Keys no member owns are absent."""
    out = owner_average(model, [u.weights for u in members], weights)
    for key in out:
        if key not in parameters:
            continue
        theta = wide(model[key])
        step = sum(
            (q / totals[key]) * (wide(u.weights[key]) - theta)
            for u, q in zip(members, weights, strict=True)
            if key in u.weights
        )
        out[key] = (theta + step).to(model[key].dtype)
    return out


class IFCA(Aggregator):
    """Iterative Federated Clustering (docs/algorithms.md section 2.9): ``k`` cluster models,
    started from ``k`` independent initialisations (the loop supplies them,
    :meth:`initial_states_needed`). Every sampled client receives all ``k`` (the payload's weights
    are cluster 0's, its extra ``"clusters"`` the other ``k - 1``: each travels once), picks the
    one with the lowest loss on its own training data, trains it and uploads it with the extra
    ``"cluster"`` (:class:`fedlightning.clients.IFCAClient`). Per cluster j with members ``S_j``
    this round:

    - ``update="model"`` (option II, the default; the authors' code): ``theta_j <- sum_{i in S_j}
      q_i theta_i / sum_{i in S_j} q_i``, ``q_i = 1`` (``weighting="uniform"``, the paper) or
      ``n_i``;
    - ``update="gradient"`` (option I): ``theta_j <- theta_j + sum_{i in S_j} (q_i / Q)
      (theta_i - theta_j)`` with ``Q`` the sum over every upload of the round
      (:func:`gradient_step`): exactly ``theta_j - (gamma/m) sum_i s_ij g_i`` when each client
      takes one plain SGD step of rate gamma (``loop.local_steps: 1``).

    A cluster nobody picked keeps its model. Per key, only the uploads that own it count
    (heterogeneous clients: each cluster is averaged as HeteroAvg, section 2.3). Declared state:
    ``models`` (the k cluster models) and ``assignment`` (per client, the cluster it picked at its
    last participation; -1 before). Deployables: ``cluster_<j>`` for each j and ``"global"``, the
    model of the cluster most clients are assigned to (ties: the smallest index). Each round logs
    ``ifca_clients_<j>``, the uploads that picked cluster j.

    Args:
        num_clusters: k (>= 2).
        update: ``model`` (option II) or ``gradient`` (option I).
        weighting: ``uniform`` (the paper) or ``samples`` (by n_i).
    """

    served_objectives = frozenset({"IFCAClient"})
    payload_extras: frozenset[str] = frozenset({"clusters"})
    required_upload_extras: frozenset[str] = frozenset({"cluster"})
    #: this round's cluster sizes (round_metrics)
    transient_attributes = frozenset({"_counts"})

    def __init__(
        self,
        num_clusters: int = 2,
        update: Update = "model",
        weighting: Literal["samples", "uniform"] = "uniform",
    ) -> None:
        super().__init__()
        option = "loop.aggregator.init_args."
        require(isinstance(num_clusters, int) and num_clusters >= 2, option + "num_clusters",
                num_clusters, "an integer >= 2")  # fmt: skip
        require(update in ("model", "gradient"), option + "update", update, "model or gradient")
        require(weighting in ("samples", "uniform"), option + "weighting", weighting,
                "samples or uniform")  # fmt: skip
        self.num_clusters, self.update, self.weighting = num_clusters, update, weighting
        self.models: list[StateDict] = []
        self.assignment: list[int] = []
        self.add_state("models", [])
        self.add_state("assignment", [])
        self.dtypes: dict[str, Any] = {}
        self._counts: dict[int, int] = {}

    def on_setup(self, initial: StateDict) -> None:
        self.dtypes = {k: v.dtype for k, v in initial.items()}
        self.assignment = [-1] * self.num_clients

    def initial_states_needed(self, clients_per_round: int) -> int:
        """k: the cluster models start from k independent initialisations (identical models
        would tie every client's choice, and every client would pick cluster 0)."""
        return self.num_clusters

    def set_initial_states(self, states: Sequence[StateDict]) -> None:
        if len(states) != self.num_clusters or any(set(s) != set(self.dtypes) for s in states):
            raise ConfigurationError(
                f"IFCA needs {self.num_clusters} initial states with the server model's keys"
            )
        self.models = [{k: v.to(dtype=self.dtypes[k]) for k, v in s.items()} for s in states]

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        if not self.models:
            raise ConfigurationError(
                "IFCA has no cluster models: call set_initial_states with num_clusters "
                "independent initialisations (the loop does, initial_states_needed)"
            )

        def make(keys: frozenset[str] | None) -> Payload:
            first, *others = (restrict(m, keys) for m in self.models)
            return Payload(first, extras={"clusters": others})

        return self.payloads(client_ids, make)

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        clusters = [self._cluster_of(u) for u in uploads]
        weights = [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in uploads]
        totals: dict[str, float] = {}
        for upload, q in zip(uploads, weights, strict=True):
            for key in upload.weights:
                totals[key] = totals.get(key, 0.0) + q
        self._counts = {}
        for j in range(self.num_clusters):
            members = [i for i, c in enumerate(clusters) if c == j]
            self._counts[j] = len(members)
            if not members:
                continue
            ups, qs = [uploads[i] for i in members], [weights[i] for i in members]
            if self.update == "model":
                new = owner_average(self.models[j], [u.weights for u in ups], qs)
            else:
                new = gradient_step(self.models[j], ups, qs, totals, self.parameters)
            self.models[j] = {**self.models[j], **new}
        for upload, j in zip(uploads, clusters, strict=True):
            self.assignment[upload.client_id] = j

    def _cluster_of(self, upload: Upload) -> int:
        j = upload.extras.get("cluster")
        if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < self.num_clusters:
            raise ValueError(
                f"client {upload.client_id} uploaded cluster {j!r}: IFCA needs an int in "
                f"[0, {self.num_clusters})"
            )
        return j

    def global_state(self) -> StateDict:
        return self.models[largest_cluster(self.assignment, self.num_clusters)]

    def deployables(self) -> dict[str, StateDict]:
        out = super().deployables()
        out.update({f"cluster_{j}": m for j, m in enumerate(self.models)})
        return out

    def round_metrics(self) -> dict[str, float]:
        return {f"ifca_clients_{j}": float(n) for j, n in self._counts.items()}
