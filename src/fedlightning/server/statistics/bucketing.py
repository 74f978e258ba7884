"""Bucketing, a wrapper of any statistic: Karimireddy, He, Jaggi, "Byzantine-Robust Learning on
Heterogeneous Datasets via Bucketing", ICLR 2022, arXiv:2006.09365 (Algorithm 1).
docs/algorithms.md section 8.7."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict
from fedlightning.seeding import derive_seed
from fedlightning.server.functional import weighted_average
from fedlightning.server.statistics.base import (
    Statistic,
    StatisticContext,
    check_statistic,
    setup_statistic,
)
from fedlightning.server.statistics.coordinate import Median

STATISTIC = "loop.aggregator.init_args.statistic"


def bucket_indices(num_uploads: int, bucket_size: int, seed: int, index: int) -> list[list[int]]:
    """Algorithm 1's buckets of round ``index``: a random permutation ``pi`` of the ``n`` uploads,
    drawn on the CPU from ``derive_seed(seed, "bucketing", index)``, cut into ``ceil(n / s)``
    consecutive buckets of ``s`` (the last one shorter when ``s`` does not divide ``n``).

    >>> bucket_indices(5, 2, seed=0, index=0) == bucket_indices(5, 2, seed=0, index=0)
    True
    >>> [len(b) for b in bucket_indices(5, 2, seed=0, index=3)]
    [2, 2, 1]
    """
    generator = torch.Generator().manual_seed(derive_seed(seed, "bucketing", index))
    order = torch.randperm(num_uploads, generator=generator).tolist()
    return [order[start : start + bucket_size] for start in range(0, num_uploads, bucket_size)]


class Bucketing(Statistic):
    """Bucketing around the statistic ``inner``: each round the ``n`` uploads are shuffled into
    ``ceil(n / s)`` buckets of ``s`` (:func:`bucket_indices`, seeded by the run's seed and the
    round, so a resumed run draws the same buckets), each bucket is replaced by the mean of its
    uploads, and ``inner`` combines the bucket means,
    ``Aggr(y_1, ..., y_ceil(n/s))`` with ``y_b = mean_{i in bucket b} w_i``.

    Averaging ``s`` uploads shrinks the spread of honest, heterogeneous uploads by about
    ``sqrt(s)`` while a malicious upload still spoils one bucket only, so ``inner`` sees at most
    ``f`` bad points among ``ceil(n / s)``: its breakdown check (at start-up and each round) runs
    on those numbers. A bucket's mean weighs its uploads by the aggregator's weights (``uniform``:
    the paper's plain mean); ``inner`` receives every bucket with weight 1 (the paper's rule over
    bucket means). Integer entries come from each bucket's first upload. ``inner``'s declared
    state (centered clipping's center) is part of this statistic's, under ``inner``.

    Args:
        inner: the robust statistic over the bucket means (``null``: the coordinate-wise median).
        bucket_size: s >= 1 (the paper's experiments: 2; 1 is ``inner`` on a shuffled round).
    """

    def __init__(self, inner: Statistic | None = None, bucket_size: int = 2) -> None:
        require(isinstance(bucket_size, int) and bucket_size >= 1,
                f"{STATISTIC}.init_args.bucket_size", bucket_size, "an integer >= 1")  # fmt: skip
        inner = check_statistic(
            Median() if inner is None else inner, f"{STATISTIC}.init_args.inner"
        )
        require(not inner.withholds_uploads, f"{STATISTIC}.init_args.inner",
                type(inner).__name__, "a statistic that reads the uploads (a DP release over "
                "bucket means is not the release it accounts for)")  # fmt: skip
        self.inner = inner
        self.bucket_size = bucket_size
        self._name_inner()

    def _name_inner(self) -> None:
        path = f"{self.options_path}.inner"
        self.inner.named(f"{path} (over the bucket means)", f"{path}.init_args")

    def named(self, option: str, options_path: str) -> Statistic:
        super().named(option, options_path)
        self._name_inner()
        return self

    def on_setup(self, initial: StateDict) -> None:
        setup_statistic(self.inner, initial, self.parameters, self.num_clients, self.seed,
                        self.client_keys, heterogeneous=False)  # fmt: skip

    def buckets(self, count: int) -> int:
        """``ceil(count / s)``: how many bucket means ``inner`` combines."""
        return math.ceil(count / self.bucket_size)

    def _checked(self, method: str, count: int, byzantine: int) -> None:
        check = getattr(self.inner, method)
        buckets = self.buckets(count)
        try:
            check(buckets, min(byzantine, buckets))
        except ConfigurationError as error:
            raise ConfigurationError(
                f"{self.option} with bucket_size={self.bucket_size} hands its inner statistic "
                f"ceil({count}/{self.bucket_size}) = {buckets} bucket means, of which up to "
                f"{min(byzantine, buckets)} may hold a malicious upload: {error}"
            ) from None

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        self._checked("check_byzantine", per_round, byzantine)

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        self._checked("check_round_byzantine", uploads, byzantine)

    def round_metrics(self) -> dict[str, float]:
        return self.inner.round_metrics()

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        buckets = bucket_indices(len(uploads), self.bucket_size, context.seed, context.index)
        means = [
            weighted_average([uploads[i] for i in bucket], [weights[i] for i in bucket])
            for bucket in buckets
        ]
        return self.inner.combine(means, [1.0] * len(means), context)
