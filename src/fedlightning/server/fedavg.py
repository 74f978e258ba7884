"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017, arXiv:1602.05629 (Algorithm 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Payload, StateDict, Upload
from fedlightning.server.base import Aggregator
from fedlightning.server.functional import (
    clip_update,
    clone_state,
    coordinate_median,
    trimmed_mean,
    weighted_average,
)

AGGREGATIONS = ("mean", "median", "trimmed_mean")


class FedAvg(Aggregator):
    """Federated averaging of the uploaded models.

    ``w <- sum_{i in S} p_i w_i`` with ``p_i = n_i / sum_{j in S} n_j`` (``weighting="samples"``) or
    ``p_i = 1/|S|`` (``weighting="uniform"``). Integer buffers are taken from the first upload.
    Every sampled client receives the same global model.

    Robust options (for uploads that may hold outliers): ``clip_norm`` first clips each client's
    update ``u_i = w_i - w`` to ``||u_i|| <= clip_norm`` (one flat L2 norm over all floating
    entries); ``aggregation`` then replaces the weighted mean by the coordinate-wise ``median`` or
    the coordinate-wise ``trimmed_mean`` that drops the ``floor(trim_beta * K)`` largest and
    smallest values (Yin et al., ICML 2018, arXiv:1803.01498). Both robust statistics are
    unweighted: a client counts once whatever its n_i.

    Args:
        weighting: ``samples`` (by n_i, the paper) or ``uniform``.
        aggregation: ``mean`` (FedAvg), ``median`` or ``trimmed_mean``.
        trim_beta: fraction trimmed at each end by ``trimmed_mean``, in [0, 0.5).
        clip_norm: if set (> 0), the largest L2 norm of a client update.
    """

    def __init__(
        self,
        weighting: Literal["samples", "uniform"] = "samples",
        aggregation: Literal["mean", "median", "trimmed_mean"] = "mean",
        trim_beta: float = 0.1,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__()
        if weighting not in ("samples", "uniform"):
            raise ConfigurationError(
                f"FedAvg weighting must be 'samples' or 'uniform', got {weighting!r}"
            )
        if aggregation not in AGGREGATIONS:
            raise ConfigurationError(
                f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}"
            )
        if not 0 <= trim_beta < 0.5:
            raise ConfigurationError(f"trim_beta must lie in [0, 0.5), got {trim_beta}")
        if clip_norm is not None and not clip_norm > 0:
            raise ConfigurationError(f"clip_norm must be > 0 or null, got {clip_norm}")
        self.weighting = weighting
        self.aggregation = aggregation
        self.trim_beta = trim_beta
        self.clip_norm = clip_norm
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

    def combine(self, uploads: Sequence[Upload]) -> StateDict:
        """The aggregated state_dict of ``uploads`` under the configured clipping and statistic."""
        states = [u.weights for u in uploads]
        if self.clip_norm is not None:
            states = [clip_update(s, self.weights, self.clip_norm) for s in states]
        if self.aggregation == "median":
            return coordinate_median(states)
        if self.aggregation == "trimmed_mean":
            return trimmed_mean(states, self.trim_beta)
        return weighted_average(states, self.client_weights(uploads))

    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        self.weights = self.combine(uploads)

    def global_state(self) -> StateDict:
        return self.weights

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "num_clients": self.num_clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = clone_state(state["weights"])
        self.num_clients = state["num_clients"]
