"""Robust FedAvg options on hand-made updates with one poisoned client."""

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload
from fedlightning.server import FedAvg
from fedlightning.server.base import ClientKeys
from fedlightning.server.functional import clip_update, coordinate_median, trimmed_mean, update_norm

HONEST = [[1.0, 2.0], [2.0, 3.0], [3.0, 4.0], [4.0, 5.0]]
OUTLIER = [1000.0, -1000.0]


def _uploads(rows):
    return [
        Upload(i, {"w": torch.tensor(r), "n": torch.tensor(i)}, num_samples=10, num_steps=1)
        for i, r in enumerate(rows)
    ]


def _fedavg(**kwargs):
    agg = FedAvg(**kwargs)
    agg.setup({"w": torch.zeros(2), "n": torch.tensor(0)}, num_clients=5)
    return agg


def test_median_ignores_one_outlier():
    agg = _fedavg(aggregation="median")
    agg.aggregate(0, _uploads([*HONEST, OUTLIER]))
    # sorted columns: [1,2,3,4,1000] -> 3 ; [-1000,2,3,4,5] -> 3
    assert torch.equal(agg.global_state()["w"], torch.tensor([3.0, 3.0]))
    even = coordinate_median([{"w": torch.tensor([v])} for v in (1.0, 2.0, 10.0, 4.0)])
    assert even["w"].item() == 3.0  # mean of the two middle values 2 and 4


def test_trimmed_mean_drops_the_extremes():
    agg = _fedavg(aggregation="trimmed_mean", trim_beta=0.2)  # floor(0.2 * 5) = 1 trimmed per end
    agg.aggregate(0, _uploads([*HONEST, OUTLIER]))
    # column 0: drop 1 and 1000 -> mean(2,3,4) = 3 ; column 1: drop -1000 and 5 -> mean(2,3,4) = 3
    assert torch.allclose(agg.global_state()["w"], torch.tensor([3.0, 3.0]))
    assert agg.global_state()["n"].item() == 0  # integer entry from the first upload
    with pytest.raises(ValueError, match="beta"):
        trimmed_mean([{"w": torch.ones(1)}] * 2, 0.5)


def test_plain_mean_is_dragged_by_the_outlier():
    agg = _fedavg()
    agg.aggregate(0, _uploads([*HONEST, OUTLIER]))
    assert agg.global_state()["w"][0] > 100


def test_clipping_bounds_each_update_norm():
    reference = {"w": torch.zeros(2)}
    clipped = clip_update({"w": torch.tensor([30.0, 40.0])}, reference, max_norm=5.0)
    assert torch.allclose(clipped["w"], torch.tensor([3.0, 4.0]))
    small = {"w": torch.tensor([0.3, 0.4])}
    assert clip_update(small, reference, 5.0) is small
    agg = _fedavg(clip_norm=1.0)
    agg.aggregate(0, _uploads([[0.6, 0.8], OUTLIER]))
    # outlier clipped to norm 1 along (1, -1)/sqrt(2): mean of (0.6, 0.8) and (0.7071, -0.7071)
    expected = (torch.tensor([0.6, 0.8]) + torch.tensor([1.0, -1.0]) / 2**0.5) / 2
    assert torch.allclose(agg.global_state()["w"], expected, atol=1e-6)
    assert update_norm({"w": torch.tensor([3.0, 4.0])}, reference) == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"aggregation": "mode"}, "aggregation must be one of mean, median, trimmed_mean"),
        ({"trim_beta": 0.5}, r"trim_beta must lie in \[0, 0.5\)"),
        ({"clip_norm": 0.0}, "clip_norm must be > 0"),
    ],
)
def test_robust_options_are_validated(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        FedAvg(**kwargs)


@pytest.mark.parametrize("aggregation", ["median", "trimmed_mean"])
def test_robust_statistics_refuse_clients_owning_different_keys(aggregation):
    server = {"w": torch.zeros(2), "n": torch.tensor(0)}
    keys = [ClientKeys("small", frozenset({"w"})), ClientKeys("big", frozenset(server))]
    with pytest.raises(ConfigurationError, match="loop.aggregator.init_args.aggregation"):
        FedAvg(aggregation=aggregation).setup(server, 2, client_keys=keys)
    agg = FedAvg(aggregation=aggregation)  # one group: homogeneous
    agg.setup(server, 2, client_keys=[ClientKeys("big", frozenset(server))] * 2)
    agg.aggregate(0, _uploads([[1.0, 2.0], [3.0, 4.0]]))
    assert agg.global_state()["w"].tolist() == [2.0, 3.0]
