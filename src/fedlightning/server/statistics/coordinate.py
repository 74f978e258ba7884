"""Statistics over the uploads' values, optionally after clipping each client's update: the
owner-aware weighted mean (FedAvg, docs/algorithms.md sections 2.1 and 2.3), the coordinate-wise
median and trimmed mean (Yin et al., ICML 2018, arXiv:1803.01498), norm bounding (Sun et al.,
arXiv:1911.07963; docs/algorithms.md section 8.5)."""

from __future__ import annotations

from collections.abc import Sequence

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import StateDict
from fedlightning.server.breakdown import require_honest_majority, require_trimmed
from fedlightning.server.functional import (
    clip_update,
    coordinate_median,
    owner_average,
    trimmed_mean,
)
from fedlightning.server.statistics.base import Statistic, StatisticContext


def _check_clip(clip_norm: float | None) -> None:
    if clip_norm is not None and not clip_norm > 0:
        raise ConfigurationError(f"clip_norm must be > 0 or null, got {clip_norm}")


class _Clipped(Statistic):
    """A statistic of the uploads after ``clip_norm`` clips each client's update
    ``u_i = w_i - w`` to ``||u_i|| <= clip_norm`` (one flat L2 norm over the client's floating
    entries, :func:`~fedlightning.server.functional.clip_update`); ``None``: as uploaded."""

    def __init__(self, clip_norm: float | None = None) -> None:
        _check_clip(clip_norm)
        self.clip_norm = clip_norm

    def clipped(self, uploads: Sequence[StateDict], model: StateDict) -> list[StateDict]:
        """The uploads with each update clipped (as uploaded without ``clip_norm``)."""
        if self.clip_norm is None:
            return list(uploads)
        return [clip_update(s, model, self.clip_norm) for s in uploads]

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        """Clipping needs an honest majority (docs/algorithms.md section 8, "Breakdown points")."""
        if byzantine and self.clip_norm is not None:
            require_honest_majority(f"{self.option} (norm clipping)", per_round, byzantine)


class Mean(_Clipped):
    """The owner-aware weighted mean: per key p with owners O_p,
    ``sum_{i in O_p} q_i w_{i,p}``, ``q_i = weights_i / sum_{O_p} weights`` (FedAvg's mean,
    docs/algorithms.md sections 2.1 and 2.3); integer buffers from the first owner,
    ``running_var >= 0``. With ``clip_norm`` each update is clipped first (norm bounding,
    section 8.5). Owner-aware; without clipping it is a plain weighted mean (SecAgg+ computes it
    from the sum, client-level DP may replace it).

    Args:
        clip_norm: if set (> 0), the largest L2 norm of a client update.
    """

    owner_aware = True

    @property
    def weighted_mean(self) -> bool:  # type: ignore[override]
        return self.clip_norm is None

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        return owner_average(context.model, self.clipped(uploads, context.model), weights)


class Median(_Clipped):
    """The coordinate-wise median (Yin et al., ICML 2018, Definition 1; the mean of the two middle
    values for an even count), unweighted; after clipping with ``clip_norm``. Needs clients that
    own the same keys and an honest majority.

    Args:
        clip_norm: if set (> 0), each update is clipped to this L2 norm first.
    """

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        if byzantine:
            require_honest_majority(f"{self.option} (the median)", per_round, byzantine)

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        return coordinate_median(self.clipped(uploads, context.model))


class TrimmedMean(_Clipped):
    """The coordinate-wise trimmed mean (Yin et al., ICML 2018, Definition 2): per coordinate the
    ``floor(trim_beta * K)`` largest and smallest of the K values are dropped and the rest
    averaged, unweighted; after clipping with ``clip_norm``. Needs clients that own the same keys
    and ``floor(trim_beta * n) >= f`` (Theorem 4 takes beta >= the malicious fraction).

    Args:
        trim_beta: the fraction trimmed at each end, in [0, 0.5).
        clip_norm: if set (> 0), each update is clipped to this L2 norm first.
    """

    def __init__(self, trim_beta: float = 0.1, clip_norm: float | None = None) -> None:
        if not 0 <= trim_beta < 0.5:
            raise ConfigurationError(f"trim_beta must lie in [0, 0.5), got {trim_beta}")
        super().__init__(clip_norm)
        self.trim_beta = trim_beta

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        if byzantine:
            option = f"{self.options_path}.trim_beta"
            require_trimmed(option, self.trim_beta, per_round, byzantine)

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        return trimmed_mean(self.clipped(uploads, context.model), self.trim_beta)
