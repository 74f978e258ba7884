"""Bucketing (Karimireddy, He, Jaggi, ICLR 2022) around the median, Krum and centered clipping,
and Bulyan (El Mhamdi, Guerraoui, Rouault, ICML 2018), each recomputed in plain Python from the
papers' rules on hand-made uploads (docs/algorithms.md sections 8.7 and 8.8), with their breakdown
checks: bucketing's runs on the bucket means."""

from __future__ import annotations

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.seeding import derive_seed
from fedlightning.server import Bulyan as BulyanPreset
from fedlightning.server import FedAvg
from fedlightning.server.statistics import (
    Bucketing,
    Bulyan,
    CenteredClip,
    Krum,
    Median,
    StatisticContext,
)

MODEL = {"w": torch.tensor([0.5, -1.0, 2.0]), "n": torch.tensor(3)}
POINTS = [[1.0, 0.0, 2.0], [0.5, 0.5, 1.5], [4.0, -2.0, 0.0], [1.5, 1.0, 2.5], [9.0, 9.0, -9.0]]


def _uploads(points):
    return [{"w": torch.tensor(p), "n": torch.tensor(10 + i)} for i, p in enumerate(points)]


def _buckets(count, size, seed, index):
    """Algorithm 1's buckets: a permutation seeded by (seed, round), cut into runs of ``size``."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "bucketing", index))
    order = torch.randperm(count, generator=generator).tolist()
    return [order[i : i + size] for i in range(0, count, size)]


def _bucket_means(points, weights, buckets):
    return [
        [sum(weights[i] * points[i][c] for i in b) / sum(weights[i] for i in b) for c in range(3)]
        for b in buckets
    ]


def _sq(a, b):
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))


def test_bucketing_over_the_median_and_krum_by_hand():
    context = StatisticContext(index=3, seed=7, model=MODEL)
    buckets = _buckets(5, 2, seed=7, index=3)
    assert sorted(len(b) for b in buckets) == [1, 2, 2]
    weights = [1.0, 2.0, 3.0, 4.0, 5.0]
    means = _bucket_means(POINTS, weights, buckets)
    out = Bucketing(Median(), bucket_size=2).combine(_uploads(POINTS), weights, context)
    median = [sorted(m[c] for m in means)[1] for c in range(3)]
    torch.testing.assert_close(out["w"], torch.tensor(median))
    # Krum over the three bucket means (f = 0: one neighbour), each mean weighted 1
    scores = [min(_sq(m, o) for o in means if o is not m) for m in means]
    chosen = scores.index(min(scores))
    krum = Bucketing(Krum(), bucket_size=2).combine(_uploads(POINTS), weights, context)
    torch.testing.assert_close(krum["w"], torch.tensor(means[chosen]))
    assert int(krum["n"]) == 10 + buckets[chosen][0]  # integers from the bucket's first upload
    other_round = _buckets(5, 2, seed=7, index=4)
    assert other_round != buckets  # a new draw each round, the same on a repeat of the round
    assert Bucketing(Median()).combine(_uploads(POINTS), weights, context)["w"].tolist() == (
        out["w"].tolist()
    )


def test_bucketing_over_centered_clipping_keeps_the_inner_center_across_rounds():
    radius, iterations = 1.0, 3
    statistic = Bucketing(CenteredClip(radius=radius, iterations=iterations), bucket_size=2)
    aggregator = FedAvg(weighting="uniform", statistic=statistic)
    aggregator.setup(MODEL, num_clients=5, seed=11)
    center = [0.0, 0.0, 0.0]
    model = MODEL["w"].tolist()
    for index in range(2):
        context = StatisticContext(index=index, seed=11, model={"w": torch.tensor(model)})
        means = _bucket_means(POINTS, [1.0] * 5, _buckets(5, 2, seed=11, index=index))
        updates = [[m[c] - model[c] for c in range(3)] for m in means]
        for _ in range(iterations):  # v <- v + (1/B) sum_b (x_b - v) min(1, tau / ||x_b - v||)
            steps = []
            for x in updates:
                gap = [x[c] - center[c] for c in range(3)]
                scale = min(1.0, radius / sum(g * g for g in gap) ** 0.5)
                steps.append([g * scale for g in gap])
            center = [center[c] + sum(s[c] for s in steps) / len(steps) for c in range(3)]
        out = statistic.combine(_uploads(POINTS), [1.0] * 5, context)
        torch.testing.assert_close(out["w"], torch.tensor([model[c] + center[c] for c in range(3)]))
        model = out["w"].tolist()
    # the inner statistic's declared state is the wrapper's, under "inner"
    state = aggregator.state_dict()["statistic"]["inner"]["center"]["w"]
    torch.testing.assert_close(state, torch.tensor(center))


def test_bucketings_breakdown_check_counts_bucket_means():
    FedAvg(statistic=Bucketing(Krum(), bucket_size=2)).check_byzantine(25, 5)  # 13 > 2*5 + 2
    with pytest.raises(ConfigurationError, match=r"ceil\(20/2\) = 10 bucket means.*n > 2f \+ 2"):
        FedAvg(statistic=Bucketing(Krum(), bucket_size=2)).check_byzantine(20, 5)
    with pytest.raises(ConfigurationError, match="statistic.init_args.bucket_size=0"):
        Bucketing(Median(), bucket_size=0)


def _bulyan_by_hand(points, f):
    n, dim = len(points), len(points[0])
    theta, keep = n - 2 * f, n - 4 * f
    remaining, chosen = list(range(n)), []
    for _ in range(theta):  # Krum over the uploads not chosen yet
        neighbours = max(len(remaining) - f - 2, 1)
        scores = [
            sum(sorted(_sq(points[i], points[j]) for j in remaining if j != i)[:neighbours])
            for i in remaining
        ]
        chosen.append(remaining.pop(scores.index(min(scores))))
    out = []
    for c in range(dim):
        values = [points[i][c] for i in chosen]
        ordered = sorted(values)
        median = (ordered[(theta - 1) // 2] + ordered[theta // 2]) / 2
        nearest = sorted(range(theta), key=lambda k: (abs(values[k] - median), k))[:keep]
        out.append(sum(values[k] for k in nearest) / keep)
    return out, chosen


def test_bulyan_by_hand():
    points = [*POINTS, [0.8, 0.2, 1.0], [1.2, -0.4, 1.8], [-7.0, 5.0, 30.0], [1.1, 0.1, 2.2]]
    expected, chosen = _bulyan_by_hand(points, f=1)  # n = 9 >= 4f + 3: theta 7, beta 5
    out = Bulyan(byzantine=1).combine(_uploads(points), [1.0] * 9, StatisticContext(0, 0, MODEL))
    torch.testing.assert_close(out["w"], torch.tensor(expected))
    assert int(out["n"]) == 10 + chosen[0]  # integers from the first chosen upload
    assert 4 not in chosen and 7 not in chosen  # the two outliers are not chosen
    with pytest.raises(ConfigurationError, match=r"n >= 4f \+ 3"):
        Bulyan(byzantine=2).check_byzantine(9, 2)  # 4f + 3 = 11
    preset = BulyanPreset()
    preset.check_byzantine(7, 1)
    with pytest.raises(
        ConfigurationError, match=r"loop.aggregator=Bulyan cannot tolerate.*4f \+ 3"
    ):
        preset.check_byzantine(6, 1)
