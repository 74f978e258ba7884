"""The Byzantine-robust aggregators (docs/algorithms.md section 8) on hand-made tensors, each
against a hand computation: Krum's scores and choice, Multi-Krum's selection, the smoothed
Weiszfeld iteration and its fixed point, centered clipping's iteration and its center across
rounds, norm bounding; owner-aware where the rule allows, refused where not."""

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import ClientKeys, Upload
from fedlightning.server import CenteredClipping, GeometricMedian, Krum, MultiKrum, NormBound
from fedlightning.server.robust_maths import (
    centered_clip,
    flat_floats,
    krum_neighbours,
    krum_scores,
    krum_select,
    pairwise_sq_distances,
    weiszfeld,
)

#: five clients on a line: three honest near 1, two outliers near 10
LINE = [0.0, 1.0, 2.0, 10.0, 11.0]


def _uploads(rows, samples=None):
    samples = samples or [10] * len(rows)
    return [
        Upload(i, {"w": torch.tensor(r), "n": torch.tensor(100 + i)}, num_samples=s, num_steps=1)
        for i, (r, s) in enumerate(zip(rows, samples, strict=True))
    ]


def _server(agg, dim=2, num_clients=5):
    agg.setup({"w": torch.zeros(dim), "n": torch.tensor(0)}, num_clients=num_clients)
    return agg


def test_krum_scores_by_hand():
    # n = 5, f = 1: each score sums the n - f - 2 = 2 nearest squared distances
    distances = pairwise_sq_distances(torch.tensor([[x] for x in LINE]))
    assert krum_neighbours(5, 1) == 2
    scores = krum_scores(distances, 2)
    # 0: 1 + 4; 1: 1 + 1; 2: 1 + 4; 10: 1 + 64; 11: 1 + 81
    assert scores.tolist() == [5.0, 2.0, 5.0, 65.0, 82.0]
    assert krum_select(scores, 1) == [1]
    assert krum_select(scores, 3) == [1, 0, 2]  # equal scores 5, 5 in index order


def test_krum_takes_the_chosen_upload_whole():
    agg = _server(Krum(byzantine=1))
    agg.aggregate(0, _uploads([[x, -x] for x in LINE]))
    state = agg.global_state()
    assert state["w"].tolist() == [1.0, -1.0]
    assert state["n"].item() == 101  # the chosen client's integer buffer, not the first one's


def test_multi_krum_averages_the_best_scores():
    agg = _server(MultiKrum(byzantine=1, selected=3))
    agg.aggregate(0, _uploads([[x, 0.0] for x in LINE]))
    assert agg.global_state()["w"].tolist() == [1.0, 0.0]  # mean of 0, 1, 2
    default = _server(MultiKrum(byzantine=1))  # m = n - f = 4: clients 1, 0, 2 and 10 (65)
    default.aggregate(0, _uploads([[x, 0.0] for x in LINE]))
    assert default.global_state()["w"][0].item() == pytest.approx((0 + 1 + 2 + 10) / 4)


def test_krum_adopts_the_attacks_f_and_refuses_beyond_its_breakdown_point():
    agg = Krum()
    agg.check_byzantine(per_round=11, byzantine=4)  # 11 > 2 * 4 + 2
    assert agg.statistic.assumed_byzantine == 4
    with pytest.raises(ConfigurationError, match=r"n > 2f \+ 2") as refused:
        Krum().check_byzantine(per_round=10, byzantine=4)
    assert "loop.attack" in str(refused.value) and "n=10" in str(refused.value)
    with pytest.raises(ConfigurationError, match="loop.aggregator.init_args.byzantine=2"):
        Krum(byzantine=2).check_byzantine(per_round=20, byzantine=3)
    with pytest.raises(ConfigurationError, match="loop.aggregator.init_args.selected=9"):
        MultiKrum(selected=9).check_byzantine(per_round=10, byzantine=2)
    with pytest.raises(ConfigurationError, match="loop.aggregator.init_args.byzantine"):
        Krum(byzantine=-1)


def test_weiszfeld_one_step_by_hand():
    # points 0, 1, 5, uniform: z0 = 2; distances 2, 1, 3 -> beta ∝ (1/2, 1, 1/3) = (3, 6, 2) / 11
    points = torch.tensor([[0.0], [1.0], [5.0]], dtype=torch.float64)
    beta, iterations = weiszfeld(points, torch.ones(3, dtype=torch.float64), 1e-6, 1, 0.0)
    assert iterations == 1
    torch.testing.assert_close(beta, torch.tensor([3.0, 6.0, 2.0], dtype=torch.float64) / 11)
    assert float(beta @ points[:, 0]) == pytest.approx(16 / 11)


def test_weiszfeld_reaches_the_geometric_median():
    # a triangle with an angle >= 120 degrees at the origin: the median is that vertex
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.1]], dtype=torch.float64)
    beta, _ = weiszfeld(points, torch.ones(3, dtype=torch.float64), 1e-9, 1000, 1e-15)
    torch.testing.assert_close(beta @ points, torch.zeros(2, dtype=torch.float64), atol=1e-6,
                               rtol=0)  # fmt: skip
    # weights: a point holding more than half of the weight is the weighted median
    heavy, _ = weiszfeld(points[:2], torch.tensor([3.0, 1.0]).double(), 1e-9, 1000, 1e-15)
    assert float((heavy @ points[:2])[0]) == pytest.approx(0.0, abs=1e-6)


def test_weiszfeld_stops_by_its_rule():
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], dtype=torch.float64)
    alphas = torch.ones(4, dtype=torch.float64)
    beta, iterations = weiszfeld(points, alphas, 1e-6, 500, 1e-14)
    assert 1 < iterations < 500
    z = beta @ points
    # the fixed point: z = sum_i beta_i x_i with beta_i ∝ 1 / ||z - x_i||
    weights = 1 / (points - z).norm(dim=1)
    torch.testing.assert_close((weights / weights.sum()) @ points, z, atol=1e-6, rtol=0)
    _, capped = weiszfeld(points, alphas, 1e-6, 3, 0.0)
    assert capped == 3


def test_geometric_median_aggregator_resists_an_outlier():
    agg = _server(GeometricMedian(weighting="uniform", smoothing=1e-9, tol=1e-12, max_iter=1000),
                  dim=1)  # fmt: skip
    agg.aggregate(0, _uploads([[0.0], [1.0], [2.0], [3.0], [100.0]]))
    assert agg.global_state()["w"].item() == pytest.approx(2.0, abs=1e-5)  # the 1-D median
    assert agg.round_metrics()["weiszfeld_iterations"] > 1


def test_centered_clipping_iteration_by_hand():
    updates = [{"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.6, 0.8])}]
    # v0 = 0: both clipped to (0.6, 0.8) -> v1 = (0.6, 0.8); then (3,4) - v1 = (2.4, 3.2) has norm
    # 4 and is clipped to (0.6, 0.8), (0.6, 0.8) - v1 = 0 -> v2 = v1 + (0.6, 0.8) / 2 = (0.9, 1.2)
    one = centered_clip(updates, {"w": torch.zeros(2)}, 1.0, 1)
    two = centered_clip(updates, {"w": torch.zeros(2)}, 1.0, 2)
    torch.testing.assert_close(one["w"], torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(two["w"], torch.tensor([0.9, 1.2]))


def test_centered_clipping_keeps_its_center_across_rounds():
    agg = _server(CenteredClipping(radius=1.0), num_clients=2)
    agg.aggregate(0, _uploads([[3.0, 4.0], [0.6, 0.8]]))
    torch.testing.assert_close(agg.global_state()["w"], torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(agg.statistic.center["w"], torch.tensor([0.6, 0.8]))
    # the same updates again, now clipped around the center (0.6, 0.8): v = (0.9, 1.2)
    agg.aggregate(1, _uploads([[3.6, 4.8], [1.2, 1.6]]))
    torch.testing.assert_close(agg.global_state()["w"], torch.tensor([1.5, 2.0]))
    torch.testing.assert_close(agg.statistic.center["w"], torch.tensor([0.9, 1.2]))
    assert "statistic.center" in agg.declared_states()
    clone = _server(CenteredClipping(radius=1.0), num_clients=2)
    clone.load_state_dict(agg.state_dict())
    torch.testing.assert_close(clone.statistic.center["w"], agg.statistic.center["w"])


def test_norm_bound_clips_each_update_before_the_mean():
    agg = _server(NormBound(max_norm=1.0), num_clients=2)
    agg.aggregate(0, _uploads([[30.0, 40.0], [0.3, 0.4]], samples=[1, 3]))
    # (30, 40) clipped to (0.6, 0.8); sample-weighted: (0.6, 0.8) / 4 + 3 (0.3, 0.4) / 4
    torch.testing.assert_close(agg.global_state()["w"], torch.tensor([0.375, 0.5]))


HETERO = {"a": torch.zeros(2), "b": torch.zeros(1)}
KEYS = [ClientKeys("small", frozenset({"a"})), ClientKeys("big", frozenset(HETERO))]


def _hetero_uploads():
    return [
        Upload(0, {"a": torch.tensor([3.0, 4.0])}, num_samples=1, num_steps=1),
        Upload(1, {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([2.0])}, 1, 1),
    ]


def test_norm_bound_and_centered_clipping_are_owner_aware():
    bound = NormBound(max_norm=1.0)
    bound.setup(HETERO, 2, client_keys=KEYS)
    bound.aggregate(0, _hetero_uploads())
    # client 0's norm is over its own key a: (3, 4) -> (0.6, 0.8); client 1's over a and b:
    # ||(0, 0, 2)|| = 2 -> (0, 0, 1); a averages both owners, b its one owner
    torch.testing.assert_close(bound.global_state()["a"], torch.tensor([0.3, 0.4]))
    torch.testing.assert_close(bound.global_state()["b"], torch.tensor([1.0]))
    clipping = CenteredClipping(radius=1.0)
    clipping.setup(HETERO, 2, client_keys=KEYS)
    clipping.aggregate(0, _hetero_uploads())
    torch.testing.assert_close(clipping.global_state()["a"], torch.tensor([0.3, 0.4]))
    torch.testing.assert_close(clipping.global_state()["b"], torch.tensor([1.0]))


@pytest.mark.parametrize("cls", [Krum, MultiKrum, GeometricMedian])
def test_rules_on_whole_uploads_refuse_heterogeneous_clients(cls):
    with pytest.raises(ConfigurationError, match=f"loop.aggregator={cls.__name__} compares whole"):
        cls().setup(HETERO, 2, client_keys=KEYS)


def test_the_rules_cover_batchnorm_statistics():
    """An attacker's running_var counts like any entry: Krum leaves it out with the rest of the
    upload, the geometric median down-weights it, and a result is never negative."""
    rows = [1.0, 1.1, 0.9, 1.05, -50.0]  # client 4 uploads a poisoned running_var
    uploads = [
        Upload(i, {"w": torch.tensor([v]), "bn.running_var": torch.tensor([v])}, 10, 1)
        for i, v in enumerate(rows)
    ]
    initial = {"w": torch.zeros(1), "bn.running_var": torch.ones(1)}
    for agg in (Krum(byzantine=1), GeometricMedian(), CenteredClipping(radius=0.5)):
        agg.setup(initial, 5, parameters=["w"])
        agg.aggregate(0, uploads)
        assert 0.5 < agg.global_state()["bn.running_var"].item() < 1.2, type(agg).__name__
    assert flat_floats(uploads_states := [u.weights for u in uploads]).shape == (5, 2)
    assert uploads_states[4]["bn.running_var"].item() == -50.0  # inputs untouched
