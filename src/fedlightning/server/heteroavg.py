"""HeteroAvg: layer-wise averaging across heterogeneous architectures whose parameter names nest
(InCo Aggregation: Chan et al., "Internal Cross-layer Gradients for Extending Homogeneity to
Heterogeneity in Federated Learning", ICLR 2024, arXiv:2308.11464; HeteroFL-style averaging,
Diao et al., ICLR 2021, arXiv:2010.01264). ALGORITHMS.md 2.3.

Also the heterogeneous SCAFFOLD and FedNova servers, each restricted per key to the clients that
own it, so that InCo can wrap their server update (InCoScaffold, InCoNova).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import torch

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.server.base import Aggregator, ClientKeys
from fedlightning.server.fednova import fednova_aggregate
from fedlightning.server.functional import clone_state, weighted_average

#: combine the owners' sub-state_dicts: ``(server sub-state, owners' sub-states, owner indices)``
Combine = Callable[[StateDict, list[StateDict], list[int]], StateDict]


def owner_groups(
    server: StateDict, states: Sequence[StateDict]
) -> dict[tuple[int, ...], list[str]]:
    """The server's keys grouped by the indices of the states that own them (in server order);
    keys nobody owns are left out."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for key in server:
        owners = tuple(i for i, s in enumerate(states) if key in s)
        if owners:
            groups.setdefault(owners, []).append(key)
    return groups


def layerwise_combine(
    server: StateDict, states: Sequence[StateDict], combine: Combine
) -> StateDict:
    """Apply ``combine`` separately to each set of keys owned by the same states; keys nobody owns
    keep the server's value. Running variances are clamped to >= 0 afterwards."""
    out = dict(server)
    for owners, keys in owner_groups(server, states).items():
        sub = {k: server[k] for k in keys}
        out.update(combine(sub, [{k: states[i][k] for k in keys} for i in owners], list(owners)))
    return clamp_running_var(out)


def clamp_running_var(state: StateDict) -> StateDict:
    """BatchNorm ``running_var`` entries clamped to >= 0 (an average of deltas can undershoot)."""
    return {k: v.clamp(min=0) if k.endswith("running_var") else v for k, v in state.items()}


def hetero_average(
    server: StateDict, states: Sequence[StateDict], weights: Sequence[float] | None = None
) -> StateDict:
    """HeteroAvg: per key p with sampled owners O_p,
    ``w_p + sum_{c in O_p} q_c (w_{c,p} - w_p) = sum_{c in O_p} q_c w_{c,p}``,
    ``q_c = weight_c / sum_{O_p} weight`` (uniform by default: the mean of the owners' deltas).
    Evaluated as the owners' weighted mean (float64, as FedAvg), so one group is FedAvg bit for bit.
    Unowned keys are unchanged, integer buffers come from the first owner, ``running_var >= 0``."""
    weights = [1.0] * len(states) if weights is None else list(weights)
    return layerwise_combine(
        server, states, lambda _, sub, owners: weighted_average(sub, [weights[i] for i in owners])
    )


def hetero_fednova(
    server: StateDict, states: Sequence[StateDict], a: Sequence[float], weights: Sequence[float]
) -> StateDict:
    """FedNova's normalised averaging (:func:`~fedlightning.server.fednova.fednova_aggregate`) per
    key over the clients that own it: ``p_i``, ``tau_eff`` and the a_i-weighted mean restricted to
    the owners O_p."""
    return layerwise_combine(
        server,
        states,
        lambda sub_server, sub, owners: fednova_aggregate(
            sub_server, sub, [a[i] for i in owners], [weights[i] for i in owners]
        ),
    )


def hetero_control(
    c: StateDict, delta_cs: Sequence[StateDict], owners_count: dict[str, int]
) -> StateDict:
    """SCAFFOLD's ``c_p <- c_p + (1/N_p) sum_{i in S} delta_c_{i,p}`` with ``N_p`` the number of
    clients (sampled or not) that own p, so ``c_p`` stays the mean of its owners' ``c_{i,p}``."""
    out: StateDict = {}
    for key, value in c.items():
        total = torch.zeros(value.shape, dtype=torch.float64)
        for delta in delta_cs:
            if key in delta:
                total += delta[key].detach().to("cpu", torch.float64)
        out[key] = (value.double() + total / max(owners_count.get(key, 1), 1)).to(value.dtype)
    return out


class HeteroAvg(Aggregator):
    """The HeteroAvg server (ALGORITHMS.md 2.3): keeps the largest model; sends each client the
    sub-state_dict of its architecture's keys; per key p, ``w_p += mean_{c in S owning p}
    (w_{c,p} - w_p)``; unowned keys unchanged; BN ``running_var`` clamped >= 0. With one group
    (or no client groups at all) this is FedAvg with uniform weights.

    ``deployables()``: ``"global"`` (the largest model) and one sub-model per group, named by the
    group (``resnet10`` ...), evaluated as ``<group>/test_acc`` (the paper's evaluation).

    Args:
        weighting: ``uniform`` (the paper's mean over owners) or ``samples`` (by n_i among owners).
    """

    heterogeneous: ClassVar[bool] = True

    def __init__(self, weighting: Literal["uniform", "samples"] = "uniform") -> None:
        super().__init__()
        require(
            weighting in ("uniform", "samples"),
            "aggregator.weighting",
            weighting,
            "'uniform' or 'samples'",
        )
        self.weighting = weighting
        self.weights: StateDict = {}

    def setup(
        self,
        initial: StateDict,
        num_clients: int,
        seed: int = 0,
        client_keys: Sequence[ClientKeys] | None = None,
    ) -> None:
        super().setup(initial, num_clients, seed, client_keys)
        self.weights = clone_state(initial)
        if client_keys is not None:
            require(
                len(client_keys) == num_clients,
                "client_keys",
                len(client_keys),
                f"one entry per client ({num_clients})",
            )
            for group, keys in client_keys:
                missing = sorted(keys - set(initial))
                if missing:
                    raise ConfigurationError(
                        f"client group {group} has keys {missing[:3]} that the server model lacks"
                    )

    def keys_of(self, client_id: int) -> frozenset[str] | None:
        """Client ``client_id``'s keys (``None``: the whole model)."""
        return None if self.client_keys is None else self.client_keys[client_id].keys

    def sub_state(self, state: StateDict, client_id: int) -> StateDict:
        keys = self.keys_of(client_id)
        return state if keys is None else {k: v for k, v in state.items() if k in keys}

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        cache: dict[frozenset[str] | None, Payload] = {}  # clients of one group share one payload
        out = {}
        for cid in client_ids:
            keys = self.keys_of(cid)
            if keys not in cache:
                cache[keys] = self.payload(cid)
            out[cid] = cache[keys]
        return out

    def payload(self, client_id: int) -> Payload:
        return Payload(self.sub_state(self.weights, client_id))

    def client_weights(self, uploads: Sequence[Upload]) -> list[float]:
        return [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in uploads]

    def server_update(self, uploads: Sequence[Upload]) -> StateDict:
        """The new server state from the round's uploads (InCo post-processes its deltas)."""
        return hetero_average(
            self.weights, [u.weights for u in uploads], self.client_weights(uploads)
        )

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        self.weights = self.server_update(uploads)

    def global_state(self) -> StateDict:
        return self.weights

    def deployables(self) -> dict[str, StateDict]:
        out = {"global": self.weights}
        if self.client_keys is not None:
            for group, keys in self.client_keys:
                out.setdefault(group, {k: v for k, v in self.weights.items() if k in keys})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "num_clients": self.num_clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = clone_state(state["weights"])
        self.num_clients = state["num_clients"]


class HeteroScaffold(HeteroAvg):
    """SCAFFOLD's server (ALGORITHMS.md 1.4) over heterogeneous clients: the model update is
    HeteroAvg's per-key mean over owners (weighted by n_i by default, as SCAFFOLD's), each client
    receives ``c`` restricted to its keys, and ``c_p <- c_p + (1/N_p) sum delta_c_{i,p}``
    (:func:`hetero_control`). Pair with :class:`fedlightning.clients.HeteroScaffoldClient`.

    Args:
        weighting: ``samples`` (the SCAFFOLD paper) or ``uniform``.
    """

    payload_extras: ClassVar[frozenset[str]] = frozenset({"c"})
    required_upload_extras: ClassVar[frozenset[str]] = frozenset({"delta_c"})

    def __init__(self, weighting: Literal["uniform", "samples"] = "samples") -> None:
        super().__init__(weighting)
        self.c: StateDict = {}

    def setup(
        self,
        initial: StateDict,
        num_clients: int,
        seed: int = 0,
        client_keys: Sequence[ClientKeys] | None = None,
    ) -> None:
        super().setup(initial, num_clients, seed, client_keys)
        self.c = {k: torch.zeros_like(v) for k, v in self.weights.items() if v.is_floating_point()}

    def owners_count(self) -> dict[str, int]:
        if self.client_keys is None:
            return dict.fromkeys(self.c, self.num_clients)
        return {k: sum(k in ck.keys for ck in self.client_keys) for k in self.c}

    def payload(self, client_id: int) -> Payload:
        return Payload(
            self.sub_state(self.weights, client_id), extras={"c": self.sub_state(self.c, client_id)}
        )

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        super().aggregate(round_index, uploads)
        self.c = hetero_control(self.c, [u.extras["delta_c"] for u in uploads], self.owners_count())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "c": self.c}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.c = clone_state(state["c"])


class HeteroNova(HeteroAvg):
    """FedNova's server (ALGORITHMS.md 1.5) over heterogeneous clients: per key, normalised
    averaging over its sampled owners (:func:`hetero_fednova`). Pair with
    :class:`fedlightning.clients.HeteroFedNovaClient`.

    Args:
        weighting: ``samples`` (p_i by n_i, the paper) or ``uniform``.
    """

    required_upload_extras: ClassVar[frozenset[str]] = frozenset({"a"})

    def __init__(self, weighting: Literal["uniform", "samples"] = "samples") -> None:
        super().__init__(weighting)

    def server_update(self, uploads: Sequence[Upload]) -> StateDict:
        return hetero_fednova(
            self.weights,
            [u.weights for u in uploads],
            [float(u.extras["a"]) for u in uploads],
            self.client_weights(uploads),
        )
