"""Seeded distributions of a client's system profile (docs/algorithms.md section 6.3).

Each draws ``n`` values at once from a ``torch.Generator`` (float64, on the CPU, so the same seed
gives the same bits on every machine): the system model draws one value per client for speed,
bandwidth and latency from a generator seeded by ``(seed, "system", quantity)`` only.

- :class:`Constant`: ``x = value``.
- :class:`LogNormal`: ``x = median * exp(sigma * Z)``, ``Z ~ N(0, 1)``.
- :class:`Exponential`: ``x = -mean * log(U)``, ``U ~ U(0, 1]``.
- :class:`Pareto`: ``x = scale * U ** (-1 / shape)``, ``U ~ U(0, 1]`` (Pareto type I: ``x >=
  scale``, heavy-tailed; its mean is infinite for ``shape <= 1``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedlightning.errors import require
from fedlightning.recorded_args import RecordsInitArgs

__all__ = ["Constant", "Distribution", "Exponential", "LogNormal", "Pareto"]


class Distribution(RecordsInitArgs):
    """A positive quantity drawn per client (``class_path``/``init_args`` in a config)."""

    def sample(self, generator: torch.Generator, n: int) -> Tensor:
        """``n`` independent draws (float64)."""
        raise NotImplementedError

    def lower_bound(self) -> float:
        """The smallest value a draw can take (the infimum)."""
        return 0.0


def _uniform_open_at_zero(generator: torch.Generator, n: int) -> Tensor:
    """``U ~ U(0, 1]``: ``1 - torch.rand`` (``torch.rand`` draws from ``[0, 1)``), so ``log(U)``
    and ``U ** -k`` stay finite."""
    return 1.0 - torch.rand(n, generator=generator, dtype=torch.float64)


class Constant(Distribution):
    """Every client gets ``value``."""

    def __init__(self, value: float) -> None:
        require(value >= 0 and math.isfinite(value), "Constant.value", value, "a finite >= 0")
        self.value = float(value)

    def sample(self, generator: torch.Generator, n: int) -> Tensor:
        return torch.full((n,), self.value, dtype=torch.float64)

    def lower_bound(self) -> float:
        return self.value


class LogNormal(Distribution):
    """``median * exp(sigma * Z)``: the median is ``median``, ``sigma`` the spread of ``log x``."""

    def __init__(self, median: float, sigma: float = 1.0) -> None:
        require(median > 0 and math.isfinite(median), "LogNormal.median", median, "a finite > 0")
        require(sigma >= 0 and math.isfinite(sigma), "LogNormal.sigma", sigma, "a finite >= 0")
        self.median, self.sigma = float(median), float(sigma)

    def sample(self, generator: torch.Generator, n: int) -> Tensor:
        z = torch.randn(n, generator=generator, dtype=torch.float64)
        return self.median * torch.exp(self.sigma * z)


class Exponential(Distribution):
    """``-mean * log(U)``: mean ``mean``."""

    def __init__(self, mean: float) -> None:
        require(mean > 0 and math.isfinite(mean), "Exponential.mean", mean, "a finite > 0")
        self.mean = float(mean)

    def sample(self, generator: torch.Generator, n: int) -> Tensor:
        return -self.mean * torch.log(_uniform_open_at_zero(generator, n))


class Pareto(Distribution):
    """``scale * U ** (-1 / shape)``: at least ``scale``, tail index ``shape``."""

    def __init__(self, scale: float, shape: float = 1.5) -> None:
        require(scale > 0 and math.isfinite(scale), "Pareto.scale", scale, "a finite > 0")
        require(shape > 0 and math.isfinite(shape), "Pareto.shape", shape, "a finite > 0")
        self.scale, self.shape = float(scale), float(shape)

    def sample(self, generator: torch.Generator, n: int) -> Tensor:
        return self.scale * _uniform_open_at_zero(generator, n) ** (-1.0 / self.shape)

    def lower_bound(self) -> float:
        return self.scale
