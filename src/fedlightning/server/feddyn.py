"""FedDyn's server: Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021, arXiv:2111.04263 (Algorithm 1, server side).
docs/algorithms.md section 1.7."""

from __future__ import annotations

from typing import Any, Literal

from fedlightning.errors import require
from fedlightning.protocol import Payload, StateDict
from fedlightning.server.base import restrict
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.functional import owner_counts
from fedlightning.server.round import ServerRound
from fedlightning.server.summation import wide


class FedDyn(FedAvg):
    """The FedDyn server (docs/algorithms.md section 1.7): with ``mean`` the round's combination
    of the participants' models (Algorithm 1's uniform mean ``(1/|P|) sum_{k in P} theta_k`` by
    default), per trainable parameter p

        h_p <- h_p - alpha (|P_p| / N_p) (mean_p - theta_p)
        theta_p <- mean_p - h_p / alpha

    which is the paper's ``h <- h - (alpha/m) sum_{k in P} (theta_k - theta)`` with ``|P_p|`` the
    participants that own p this round and ``N_p`` all the clients that own p (``m``, every client,
    for homogeneous clients). ``h`` (declared state, zeros like the trainable parameters) stays
    ``(1/N_p) sum_k g_{k,p}``, the mean of every client's gradient state. Buffers (BatchNorm
    statistics) take the mean; keys nobody owned this round, and their ``h``, stay. Each client
    receives ``alpha`` with the model (payload extra ``"alpha"``): the one alpha of the run.
    Pair with :class:`fedlightning.clients.FedDynClient`.

    Args:
        alpha: the dynamic regulariser's weight (> 0); the paper's 0.01.
        weighting: ``uniform`` (Algorithm 1, the default) or ``samples`` (by n_i).
        aggregation, trim_beta, clip_norm, within_groups, statistic: as :class:`FedAvg` (the
            update runs on what the statistic combines).
    """

    served_objectives = frozenset({"FedDynClient"})
    payload_extras: frozenset[str] = frozenset({"alpha"})

    def __init__(
        self,
        alpha: float = 0.01,
        weighting: Literal["samples", "uniform"] = "uniform",
        **fedavg_options: Any,
    ) -> None:
        super().__init__(weighting=weighting, **fedavg_options)
        require(alpha > 0, "loop.aggregator.init_args.alpha", alpha, "a number > 0")
        self.alpha = alpha
        self.h: StateDict = {}
        self.add_state("h", "parameters")
        self.owners: dict[str, int] = {}

    def on_setup(self, initial: StateDict) -> None:
        super().on_setup(initial)
        key_sets = None if self.client_keys is None else [ck.keys for ck in self.client_keys]
        self.owners = owner_counts(list(self.h), key_sets, self.num_clients)

    def payload(self, keys: frozenset[str] | None) -> Payload:
        return Payload(restrict(self.weights, keys), extras={"alpha": self.alpha})

    def server_update(self, server_round: ServerRound) -> StateDict:
        out, h = {}, {}
        for key in server_round.parameter_keys:
            mean = wide(server_round.mean[key])
            share = server_round.owners[key] / self.owners[key]
            h_new = wide(self.h[key]) - self.alpha * share * (mean - wide(self.weights[key]))
            out[key] = (mean - h_new / self.alpha).to(server_round.mean[key].dtype)
            h[key] = h_new.to(self.h[key].dtype)
        self.h = {**self.h, **h}
        return out
