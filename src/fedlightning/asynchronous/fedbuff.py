"""FedBuff: buffered asynchronous aggregation.

Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba. "Federated Learning with Buffered
Asynchronous Aggregation." AISTATS 2022, arXiv:2106.06639 (Algorithm 1; docs/algorithms.md
section 6.4).

The server keeps a buffer of arrived client updates; after ``K`` arrivals it applies

    w <- w + eta_g * sum_i p_i * s(tau_i) * (w_i - w_i^recv),   s(tau) = 1 / sqrt(1 + tau)

where ``w_i^recv`` is the model client ``i`` trained from, ``tau_i`` its staleness (server
updates since its dispatch) and ``p_i`` the run aggregator's weights (``FedAvg(weighting:
uniform)``: ``1/K``, the paper's mean). Each arrival reaches the aggregator as the upload
``w + eta_g * s(tau_i) * (w_i - w_i^recv)``: FedAvg's mean of them is the update above, and any
server optimizer or statistic of the run's aggregator acts on it as in a synchronous round.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedlightning.asynchronous.server import AsyncServer, floating
from fedlightning.errors import require
from fedlightning.system.model import SystemModel

__all__ = ["FedBuff"]


class FedBuff(AsyncServer):
    """Buffered asynchronous aggregation (module docstring).

    Args:
        buffer_size: K, the arrivals of one server update (at most ``concurrency``).
        concurrency: the most fits in flight at once.
        server_lr: eta_g.
        system: the clients' system model (default ``SystemModel()``).
    """

    def __init__(
        self,
        buffer_size: int = 10,
        concurrency: int = 10,
        server_lr: float = 1.0,
        system: SystemModel | None = None,
    ) -> None:
        require(buffer_size >= 1, "FedBuff.buffer_size", buffer_size, "an int >= 1")
        require(server_lr > 0 and math.isfinite(server_lr), "FedBuff.server_lr", server_lr, "> 0")
        super().__init__(concurrency, system)
        self.size, self.server_lr = buffer_size, float(server_lr)

    @property
    def buffer_size(self) -> int:
        return self.size

    def server_weights(
        self, item: dict[str, Any], current: dict[str, torch.Tensor], staleness: int
    ) -> dict[str, torch.Tensor]:
        scale = self.server_lr / math.sqrt(1.0 + staleness)
        received, trained = item["received"], item["weights"]
        return {
            key: current[key] + scale * (value - received[key].to(value.device))
            if floating(value) and key in current else value
            for key, value in trained.items()
        }  # fmt: skip
