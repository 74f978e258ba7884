"""Clustered FL (Sattler et al., IEEE TNNLS 2021, arXiv:1910.01991, Algorithms 1 and 2) recomputed
by hand from the paper's equations on hand-made tensors: the split criteria (eps1, eps2, gamma_max),
the optimal bipartition against a brute force over every bipartition, the authors' complete
linkage where it differs, the cluster models and the declared membership over two rounds, and the
planted clusters of a federation recovered through the loop."""

import itertools
import math

import pytest
import torch

from clustered_data import NET, planted
from fedlightning import FederatedLoop
from fedlightning.clients import ClientModule
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload
from fedlightning.server import ClusteredFL
from fedlightning.server.cfl_maths import (
    complete_linkage_bipartition,
    cosine_matrix,
    cross_similarity,
    single_linkage_bipartition,
)

T = torch.float64


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _best_cross(vectors):
    """min over every bipartition of the largest cross-cosine, by brute force."""
    n = len(vectors)
    best = math.inf
    for r in range(1, n):
        for first in itertools.combinations(range(n), r):
            second = [j for j in range(n) if j not in first]
            best = min(best, max(_cos(vectors[i], vectors[j]) for i in first for j in second))
    return best


def test_the_optimal_bipartition_minimises_the_largest_cross_similarity():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        n = int(torch.randint(2, 8, (1,), generator=gen))
        updates = torch.randn(n, 4, generator=gen, dtype=T)
        similarity = cosine_matrix(updates)
        by_hand = [[_cos(a, b) for b in updates.tolist()] for a in updates.tolist()]
        torch.testing.assert_close(similarity, torch.tensor(by_hand, dtype=T), rtol=0, atol=1e-12)
        split = single_linkage_bipartition(similarity)
        assert sorted(split[0] + split[1]) == list(range(n)) and 0 in split[0]
        assert cross_similarity(similarity, split) == pytest.approx(_best_cross(updates.tolist()))


def test_complete_linkage_is_the_authors_code_and_differs_from_single_on_a_chain():
    """a-b 0.9, b-c 0.85, c-d 0.3, all else 0: single linkage chains {a, b, c} | {d}; complete
    linkage merges a, b, then c, d (their least similar pair, 0.3, beats {a, b}-c's 0)."""
    s = torch.zeros(4, 4, dtype=T)
    for (i, j), value in {(0, 1): 0.9, (1, 2): 0.85, (2, 3): 0.3}.items():
        s[i, j] = s[j, i] = value
    s.fill_diagonal_(1.0)
    assert single_linkage_bipartition(s) == ([0, 1, 2], [3])
    assert complete_linkage_bipartition(s) == ([0, 1], [2, 3])


def _uploads(weights, sizes, clients=None):
    clients = range(len(weights)) if clients is None else clients
    return [
        Upload(
            c,
            {"w": torch.tensor(w, dtype=T), "bn.running_mean": torch.tensor([float(c)], dtype=T)},
            n,
            1,
        )  # fmt: skip
        for c, w, n in zip(clients, weights, sizes, strict=True)
    ]


def _agg(**options):
    agg = ClusteredFL(**{"eps1": 0.4, "eps2": 0.5, **options})
    agg.setup({"w": torch.zeros(2, dtype=T), "bn.running_mean": torch.zeros(1, dtype=T)}, 4)
    return agg


ROUND0 = [(1.0, 0.1), (1.0, -0.1), (-1.0, 0.1), (-1.0, -0.1)]
SIZES = [1, 3, 2, 2]


def test_two_rounds_by_hand_split_then_separate_models():
    """Round 0: the sample-weighted mean update (0, -0.025) is below eps1, the largest update
    (1.005) above eps2: the clients split by their updates' directions, {0, 1} | {2, 3}, and each
    half takes its own members' weighted mean. Round 1: each cluster averages its own."""
    agg = _agg()
    assert agg.membership == [0, 0, 0, 0] and len(agg.models) == 1
    agg.aggregate(0, _uploads(ROUND0, SIZES))
    assert agg.membership == [0, 0, 1, 1]
    assert agg.models[0]["w"].tolist() == pytest.approx([1.0, (0.1 - 0.3) / 4], abs=1e-15)
    assert agg.models[1]["w"].tolist() == pytest.approx([-1.0, 0.0], abs=1e-15)
    assert agg.models[1]["bn.running_mean"].tolist() == [2.5]  # buffers: the members' mean
    metrics = agg.round_metrics()
    assert metrics["cfl_clusters"] == 2.0
    assert metrics["cfl_mean_update_norm_0"] == pytest.approx(0.025, abs=1e-15)
    assert metrics["cfl_max_update_norm_0"] == pytest.approx(math.sqrt(1.01), abs=1e-15)
    assert set(agg.deployables()) == {"global", "cluster_0", "cluster_1"}
    agg.aggregate(1, _uploads([(2.0, 0.0), (2.0, 0.2), (0.0, 0.0), (-4.0, 0.0)], SIZES))
    assert agg.membership == [0, 0, 1, 1]  # cluster 0's mean update is 1.01: no split
    assert agg.models[0]["w"].tolist() == pytest.approx([2.0, 0.15], abs=1e-15)
    assert agg.models[1]["w"].tolist() == pytest.approx([-2.0, 0.0], abs=1e-15)


@pytest.mark.parametrize(
    "options",
    [
        {"gamma_max": 0.999},
        {"warmup_rounds": 1},
        {"min_cluster_size": 5},
        {"eps1": 0.02},
        {"eps2": 1.1},
    ],  # fmt: skip
    ids=["separation below gamma_max", "warm-up", "too small", "mean above eps1", "max below eps2"],
)
def test_each_criterion_can_hold_the_split_back(options):
    """sqrt((1 - alpha_cross^max) / 2) = sqrt((1 + 0.9802) / 2) = 0.995 < 0.999; the others as
    named."""
    agg = _agg(**options)
    agg.aggregate(0, _uploads(ROUND0, SIZES))
    assert agg.membership == [0, 0, 0, 0]
    expected = [sum(n * w[i] for n, w in zip(SIZES, ROUND0, strict=True)) / 8 for i in range(2)]
    assert agg.models[0]["w"].tolist() == pytest.approx(expected, abs=1e-15)


def test_a_cluster_is_tested_only_when_all_its_members_uploaded():
    agg = _agg()
    agg.aggregate(0, _uploads(ROUND0[:3], SIZES[:3]))  # client 3 did not upload
    assert agg.membership == [0, 0, 0, 0] and len(agg.models) == 1


def test_uniform_weighting_is_the_authors_code():
    agg = _agg(weighting="uniform", eps1=0.01)
    agg.aggregate(0, _uploads(ROUND0, SIZES))  # the uniform mean update is 0: split
    assert agg.membership == [0, 0, 1, 1]
    assert agg.models[0]["w"].tolist() == pytest.approx([1.0, 0.0], abs=1e-15)


def test_the_loop_recovers_planted_clusters(tmp_path):
    """Half the clients see shifted labels; with every client every round the first split
    (after a two-round warm-up) separates the two halves, and clusters of 4 split no further."""
    torch.manual_seed(0)
    aggregator = ClusteredFL(eps1=100.0, eps2=1e-6, warmup_rounds=2, min_cluster_size=5)
    loop = FederatedLoop(rounds=4, clients_per_round=8, local_epochs=2, aggregator=aggregator,
                         run_dir=str(tmp_path), progress_bar=False, plots=False)  # fmt: skip
    loop.fit(ClientModule(**NET), datamodule=planted())
    membership = loop.aggregator.membership
    assert membership == [0] * 4 + [1] * 4
    assert loop.history[-1]["cfl_clusters"] == 2.0
    assert {"cluster_0/test_acc", "cluster_1/test_acc"} <= set(loop.history[-1])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ClusteredFL(eps1=0.0), r"eps1=0.0 .*> 0"),
        (lambda: ClusteredFL(eps2=-1.0), r"eps2=-1.0 .*> 0"),
        (lambda: ClusteredFL(linkage="average"), r"linkage='average' .*single or complete"),
        (lambda: ClusteredFL(gamma_max=1.0), r"gamma_max=1.0 .*\[0, 1\)"),
        (lambda: ClusteredFL(min_cluster_size=1), r"min_cluster_size=1 .*>= 2"),
        (lambda: ClusteredFL(warmup_rounds=-1), r"warmup_rounds=-1"),
        (lambda: ClusteredFL(weighting="sizes"), r"weighting='sizes'"),
    ],
)
def test_bad_options_are_refused_in_one_line(make, message):
    with pytest.raises(ConfigurationError, match=message) as error:
        make()
    assert "\n" not in str(error.value)
