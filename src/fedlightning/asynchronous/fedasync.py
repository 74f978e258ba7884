"""FedAsync: asynchronous federated optimisation with staleness-weighted mixing.

Xie, Koyejo, Gupta. "Asynchronous Federated Optimization." OPT workshop, NeurIPS 2020,
arXiv:1903.03934 (Algorithm 1; docs/algorithms.md section 6.4).

At each arrival the server mixes the client's model into its own:

    w <- (1 - a_t) w + a_t w_i,   a_t = alpha * s(t - tau)

with ``t - tau`` the staleness (server updates since the client's dispatch) and ``s``:
``constant``: 1; ``polynomial``: ``(1 + staleness) ** -a``; ``hinge``: 1 when staleness <= b,
else ``1 / (a * (staleness - b) + 1)``. The mixed model reaches the run's aggregator as the one
upload of the update (``FedAvg``: the new model is that upload).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from fedlightning.asynchronous.server import AsyncServer, floating
from fedlightning.errors import require
from fedlightning.system.model import SystemModel

__all__ = ["FedAsync", "staleness_factor"]


def staleness_factor(kind: str, staleness: int, a: float, b: int) -> float:
    """s(staleness) of FedAsync (module docstring)."""
    if kind == "polynomial":
        return (1.0 + staleness) ** -a
    if kind == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    return 1.0


class FedAsync(AsyncServer):
    """Staleness-weighted asynchronous mixing (module docstring).

    Args:
        alpha: the mixing weight, in (0, 1].
        staleness: s: ``constant``, ``polynomial`` or ``hinge``.
        a: the exponent (polynomial) or slope (hinge) of s.
        b: the staleness a hinge s tolerates unweighted.
        concurrency: the most fits in flight at once.
        system: the clients' system model (default ``SystemModel()``).
    """

    def __init__(
        self,
        alpha: float = 0.6,
        staleness: Literal["constant", "polynomial", "hinge"] = "polynomial",
        a: float = 0.5,
        b: int = 4,
        concurrency: int = 10,
        system: SystemModel | None = None,
    ) -> None:
        require(0 < alpha <= 1, "FedAsync.alpha", alpha, "a weight in (0, 1]")
        require(staleness in ("constant", "polynomial", "hinge"), "FedAsync.staleness",
                staleness, "constant, polynomial or hinge")  # fmt: skip
        require(a >= 0, "FedAsync.a", a, ">= 0")
        require(b >= 0, "FedAsync.b", b, "an int >= 0")
        super().__init__(concurrency, system)
        self.alpha, self.staleness, self.a, self.b = float(alpha), staleness, float(a), b

    @property
    def buffer_size(self) -> int:
        return 1

    def server_weights(
        self, item: dict[str, Any], current: dict[str, torch.Tensor], staleness: int
    ) -> dict[str, torch.Tensor]:
        mix = self.alpha * staleness_factor(self.staleness, staleness, self.a, self.b)
        return {
            key: (1.0 - mix) * current[key] + mix * value
            if floating(value) and key in current else value
            for key, value in item["weights"].items()
        }  # fmt: skip
