"""SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, arXiv:1910.06378 (Algorithm 1, server side, global step size 1).
docs/algorithms.md section 1.4."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from fedlightning.protocol import Payload, StateDict
from fedlightning.server.base import restrict
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.functional import owner_counts
from fedlightning.server.round import ServerRound
from fedlightning.server.summation import WeightedSum, wide


def scaffold_server_control(
    c: StateDict, delta_cs: Sequence[StateDict], num_clients: int | Mapping[str, int]
) -> StateDict:
    """``c_p + (1/N_p) sum_i delta_c_{i,p}`` over the keys of ``c`` (a delta that lacks p adds
    nothing; a key no delta has is unchanged).

    ``N_p`` (``num_clients``: one number for every key, or one per key) counts all the clients
    that own p, not the number sampled: ``c_p`` stays the mean of its owners' ``c_{i,p}`` when every
    ``c_i`` starts at zero.

    Computed on ``c``'s device: the deltas summed in float64 (compensated float32 on a device
    without float64, :mod:`fedlightning.server.summation`), ``c`` updated in float64 (float32 there).
    """
    out: StateDict = {}
    for key, value in c.items():
        total = WeightedSum(value.shape, value.device)
        for delta in delta_cs:
            if key in delta:
                total.add(delta[key])
        n = num_clients if isinstance(num_clients, int) else max(num_clients.get(key, 1), 1)
        out[key] = (wide(value) + total.result(wide(value).dtype) / n).to(value.dtype)
    return out


class Scaffold(FedAvg):
    """The SCAFFOLD server (docs/algorithms.md section 1.4): ``x <- sum_i p_i y_i`` (the mean per
    key over its owners, i.e. global step size 1) and
    ``c_p <- c_p + (1/N_p) sum_{i in S} delta_c_{i,p}``, ``N_p`` the number of clients (sampled or
    not) that own p (``N`` for homogeneous clients). ``p_i = 1/|S|`` by default, Algorithm 1's
    uniform mean (``weighting="uniform"``); ``weighting="samples"`` weights the models by ``n_i``
    like FedAvg. The control variate is always the uniform mean of the ``delta_c_i``.

    ``c`` (declared state) starts at zero for every floating entry of the model and is updated in
    the :meth:`server_update` hook from the round's uploads; each sampled client receives ``c``
    restricted to its keys as the payload extra ``"c"``. Clients only use (and report ``delta_c``
    for) the trainable parameters, so the entries of ``c`` for float buffers stay zero. Each
    evaluated round logs ``c_norm``, the L2 norm of ``c`` (:meth:`round_metrics`). Pair with
    :class:`fedlightning.clients.ScaffoldClient` (``served_objectives``).

    Args:
        weighting: ``uniform`` (Algorithm 1, the default) or ``samples`` (by n_i) for the model
            average.
        within_groups: one model (and one ``c``) per client group; see :class:`FedAvg`.
    """

    served_objectives = frozenset({"ScaffoldClient"})
    payload_extras: frozenset[str] = frozenset({"c"})
    required_upload_extras: frozenset[str] = frozenset({"delta_c"})

    def __init__(
        self, weighting: Literal["samples", "uniform"] = "uniform", within_groups: bool = False
    ) -> None:
        super().__init__(weighting=weighting, within_groups=within_groups)
        self.c: StateDict = {}
        self.add_state("c", "floating")
        self.owners: dict[str, int] = {}

    def on_setup(self, initial: StateDict) -> None:
        super().on_setup(initial)
        key_sets = None if self.client_keys is None else [ck.keys for ck in self.client_keys]
        self.owners = owner_counts(list(self.c), key_sets, self.num_clients)

    def payload(self, keys: frozenset[str] | None) -> Payload:
        return Payload(restrict(self.weights, keys), extras={"c": restrict(self.c, keys)})

    def server_update(self, server_round: ServerRound) -> StateDict:
        """Fold the uploads' ``delta_c`` into ``c``; the model takes the mean."""
        self.c = scaffold_server_control(
            self.c,
            [u.extras["delta_c"] for u in server_round.uploads],
            self.owners or self.num_clients,
        )
        return {}

    def round_metrics(self) -> dict[str, float]:
        """``c_norm``: the L2 norm of ``c`` over all its entries after the round. Each ``c_i`` is a
        weighted mean of its client's gradients and ``c`` their mean (docs/algorithms.md 1.4), so
        ``c_norm`` stays of the order of a gradient's norm; growth from round to round is a
        diverging run."""
        if not self.c:
            return {}
        squares = torch.stack([wide(v).pow(2).sum() for v in self.c.values()])
        return {"c_norm": float(squares.sum().sqrt())}
