"""SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, arXiv:1910.06378 (Algorithm 1, server side, global step size 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch

from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.functional import clone_state


def scaffold_server_control(
    c: StateDict, delta_cs: Sequence[StateDict], num_clients: int
) -> StateDict:
    """``c + (1/N) * sum_i delta_c_i`` over the keys of ``c`` (a key no upload has is unchanged).

    ``N`` is the total number of clients, not the number sampled: ``c`` stays the mean of all
    clients' ``c_i`` when every ``c_i`` starts at zero.
    """
    out: StateDict = {}
    for key, value in c.items():
        total = torch.zeros(value.shape, dtype=torch.float64)
        for delta in delta_cs:
            if key in delta:
                total += delta[key].detach().to("cpu", torch.float64)
        out[key] = (value.double() + total / num_clients).to(value.dtype)
    return out


class Scaffold(FedAvg):
    """The SCAFFOLD server (ALGORITHMS.md 1.4): ``x <- sum_i p_i y_i`` (``p_i = n_i / sum n``, the
    FedAvg mean, i.e. global step size 1) and ``c <- c + (1/N) sum_{i in S} delta_c_i``.

    ``c`` starts at zero for every floating entry of the model and is sent to every sampled client
    as the payload extra ``"c"``; clients only use (and report ``delta_c`` for) the trainable
    parameters, so the entries of ``c`` for float buffers stay zero. Pair with
    :class:`fedlightning.clients.ScaffoldClient`.

    Args:
        weighting: ``samples`` (by n_i, the paper) or ``uniform`` for the model average.
    """

    payload_extras: ClassVar[frozenset[str]] = frozenset({"c"})
    required_upload_extras: ClassVar[frozenset[str]] = frozenset({"delta_c"})

    def __init__(self, weighting: Literal["samples", "uniform"] = "samples") -> None:
        super().__init__(weighting=weighting)
        self.c: StateDict = {}

    def setup(self, initial: StateDict, num_clients: int, seed: int = 0) -> None:
        super().setup(initial, num_clients, seed)
        self.c = {k: torch.zeros_like(v) for k, v in self.weights.items() if v.is_floating_point()}

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        payload = Payload(self.weights, extras={"c": self.c})
        return {cid: payload for cid in client_ids}

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        super().aggregate(round_index, uploads)
        self.c = scaffold_server_control(
            self.c, [u.extras["delta_c"] for u in uploads], self.num_clients
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "c": self.c}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.c = clone_state(state["c"])
