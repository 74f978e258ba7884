"""FedNova: Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020, arXiv:2007.07481 (equation 6, normalised averaging).
docs/algorithms.md section 1.5."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fedlightning.protocol import StateDict
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.functional import is_running_statistic, owner_combine, weighted_average
from fedlightning.server.round import ServerRound


def fednova_aggregate(
    global_state: StateDict,
    states: Sequence[StateDict],
    a: Sequence[float],
    weights: Sequence[float],
) -> StateDict:
    """Normalised averaging: with ``p_i = w_i / sum_j w_j``, ``d_i = (x - x_i) / a_i`` and
    ``tau_eff = sum_i p_i a_i``, the new model is ``x - tau_eff * sum_i p_i d_i``.

    Written as one affine combination, ``x_new = c_0 x + sum_i c_i x_i`` with
    ``c_i = p_i tau_eff / a_i`` and ``c_0 = 1 - sum_i c_i``, and evaluated by
    :func:`~fedlightning.server.functional.weighted_average` (float64 accumulation). When every
    ``a_i`` is equal, ``tau_eff = a_i``, ``c_i = p_i`` and ``c_0 = 0`` hold exactly, so the result
    is bit for bit the FedAvg mean. Integer buffers come from the first client state.

    Normalisation running statistics (``*.running_mean``, ``*.running_var``) are not SGD iterates:
    they take the FedAvg mean ``sum_i p_i x_i``. Otherwise ``c_0 <= 0`` (Cauchy-Schwarz:
    ``tau_eff sum_i p_i / a_i >= 1``) would extrapolate them, and ``running_var`` could turn
    negative (NaN in the global model's BatchNorm).
    """
    if len(states) != len(a) or len(states) != len(weights):
        raise ValueError(f"{len(states)} states, {len(a)} factors a_i and {len(weights)} weights")
    if any(not ai > 0 for ai in a):
        raise ValueError(f"every a_i must be > 0, got {list(a)}")
    total = float(sum(weights))
    if all(ai == a[0] for ai in a):
        tau_eff = float(a[0])  # the exact value of the mean below, so that c_i = p_i exactly
    else:
        tau_eff = sum(w * ai for w, ai in zip(weights, a, strict=True)) / total
    coefficients = [w * (tau_eff / ai) for w, ai in zip(weights, a, strict=True)]
    rest = total - sum(coefficients)  # the global model's coefficient, times total
    if rest == 0:
        return weighted_average(states, coefficients)
    out = weighted_average([*states, global_state], [*coefficients, rest])
    statistics = [k for k in global_state if is_running_statistic(k)]
    if statistics:
        out.update(weighted_average([{k: s[k] for k in statistics} for s in states], weights))
    return out


class FedNova(FedAvg):
    """The FedNova server (docs/algorithms.md section 1.5): ``p_i = n_i / sum_S n_j``,
    ``tau_eff = sum_i p_i a_i``, ``x <- x - tau_eff * sum_i p_i (x - x_i) / a_i``, with each
    client's ``a_i`` read from its upload extra ``"a"``; per key over the clients that own it
    (p_i, tau_eff and the sum restricted to the owners, :func:`fednova_aggregate` on each set of
    keys with the same owners).

    Written on the :meth:`server_update` hook: the normalised step applies to the trainable
    parameters; buffers (BatchNorm running statistics, counters) take the FedAvg mean, as
    :func:`fednova_aggregate` does for running statistics. With equal ``a_i`` (equal step counts,
    no momentum) this is exactly FedAvg. Pair with :class:`fedlightning.clients.FedNovaClient`
    (``served_objectives``).

    Args:
        weighting: ``samples`` (p_i by n_i, the paper) or ``uniform``.
        within_groups: one model per client group; see :class:`FedAvg`.
    """

    served_objectives = frozenset({"FedNovaClient"})
    required_upload_extras: frozenset[str] = frozenset({"a"})

    def __init__(
        self, weighting: Literal["samples", "uniform"] = "samples", within_groups: bool = False
    ) -> None:
        super().__init__(weighting=weighting, within_groups=within_groups)

    def server_update(self, server_round: ServerRound) -> StateDict:
        """Normalised averaging of the parameter keys the uploads own (buffers take the mean)."""
        uploads = server_round.uploads
        a = [float(u.extras["a"]) for u in uploads]
        weights = self.client_weights(uploads)
        return owner_combine(
            {k: self.weights[k] for k in server_round.parameter_keys},
            [u.weights for u in uploads],
            lambda server, states, owners: fednova_aggregate(
                server, states, [a[i] for i in owners], [weights[i] for i in owners]
            ),
        )
