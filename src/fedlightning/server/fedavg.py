"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv:1602.05629 (Algorithm 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.server.base import Aggregator
from fedlightning.server.functional import clone_state, weighted_average


class FedAvg(Aggregator):
    """Federated averaging of the uploaded models.

    ``w <- sum_{i in S} p_i w_i`` with ``p_i = n_i / sum_{j in S} n_j`` (``weighting="samples"``) or
    ``p_i = 1/|S|`` (``weighting="uniform"``). Integer buffers are taken from the first upload.
    Every sampled client receives the same global model.

    Args:
        weighting: ``samples`` (by n_i, the paper) or ``uniform``.
    """

    def __init__(self, weighting: Literal["samples", "uniform"] = "samples") -> None:
        super().__init__()
        if weighting not in ("samples", "uniform"):
            raise ConfigurationError(
                f"FedAvg weighting must be 'samples' or 'uniform', got {weighting!r}"
            )
        self.weighting = weighting
        self.weights: StateDict = {}

    def setup(self, initial: StateDict, num_clients: int, seed: int = 0) -> None:
        super().setup(initial, num_clients, seed)
        self.weights = clone_state(initial)

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        payload = Payload(self.weights)
        return {cid: payload for cid in client_ids}

    def client_weights(self, uploads: Sequence[Upload]) -> list[float]:
        """p_i before normalisation: n_i or 1."""
        return [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in uploads]

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        self.weights = weighted_average([u.weights for u in uploads], self.client_weights(uploads))

    def global_state(self) -> StateDict:
        return self.weights

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "num_clients": self.num_clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = clone_state(state["weights"])
        self.num_clients = state["num_clients"]
