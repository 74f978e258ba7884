import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload
from fedlightning.server import FedAvg
from fedlightning.server.base import ClientKeys
from fedlightning.server.functional import owner_average, weighted_average


def _state(w, b, steps):
    return {
        "w": torch.tensor(w),
        "bn.running_mean": torch.tensor(b),
        "bn.num_batches_tracked": torch.tensor(steps),
    }


def _uploads():
    return [
        Upload(0, _state([[1.0, 2.0], [3.0, 4.0]], [0.5], 7), num_samples=10, num_steps=3),
        Upload(1, _state([[5.0, 6.0], [7.0, 8.0]], [1.5], 9), num_samples=30, num_steps=9),
    ]


def test_fedavg_is_the_sample_weighted_mean_with_integer_buffers_untouched():
    agg = FedAvg()
    agg.setup(_state([[0.0, 0.0], [0.0, 0.0]], [0.0], 0), num_clients=2)
    agg.aggregate(0, _uploads())
    out = agg.global_state()
    # hand-computed: 0.25 * first + 0.75 * second
    assert torch.allclose(out["w"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert torch.allclose(out["bn.running_mean"], torch.tensor([1.25]))
    assert out["bn.num_batches_tracked"].dtype == torch.int64
    assert out["bn.num_batches_tracked"].item() == 7  # taken from the first upload, not averaged


def test_fedavg_uniform_weighting():
    agg = FedAvg(weighting="uniform")
    agg.setup(_state([[0.0, 0.0], [0.0, 0.0]], [0.0], 0), num_clients=2)
    agg.aggregate(0, _uploads())
    assert torch.allclose(agg.global_state()["w"], torch.tensor([[3.0, 4.0], [5.0, 6.0]]))


def test_every_client_gets_the_global_model_and_state_round_trips():
    agg = FedAvg()
    agg.setup(_state([[1.0, 1.0], [1.0, 1.0]], [0.0], 0), num_clients=5)
    payloads = agg.configure_round(0, [3, 1])
    assert set(payloads) == {3, 1}
    assert all(torch.equal(p.weights["w"], torch.ones(2, 2)) for p in payloads.values())
    agg.aggregate(0, _uploads())
    clone = FedAvg()
    clone.load_state_dict(agg.state_dict())
    assert all(torch.equal(clone.global_state()[k], v) for k, v in agg.global_state().items())


def test_weighted_average_refuses_mismatched_keys_and_bad_weights():
    a, b = {"w": torch.ones(2)}, {"v": torch.ones(2)}
    with pytest.raises(ValueError, match="different keys"):
        weighted_average([a, b], [1, 1])
    with pytest.raises(ValueError, match="positive"):
        weighted_average([a, a], [0, 0])


def test_weighting_is_validated():
    with pytest.raises(ValueError, match="weighting.*'samples' or 'uniform'.*'sizes'"):
        FedAvg(weighting="sizes")


# -- owner-aware maths (docs/algorithms.md section 2.3) -----------------------------------------
def _random_states(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "conv.weight": torch.randn(4, 3, 3, 3, generator=gen),
            "bn.running_var": torch.rand(4, generator=gen),
            "bn.num_batches_tracked": torch.tensor(i),
            "fc.weight": torch.randn(5, 4, generator=gen, dtype=torch.float64),
        }
        for i in range(n)
    ]


def test_owner_average_of_full_states_is_weighted_average_bitwise():
    server, *states = _random_states(4)
    weights = [3.0, 7.0, 11.0]
    expected = weighted_average(states, weights)
    out = owner_average(server, states, weights)
    assert list(out) == list(expected)
    assert all(torch.equal(out[k], v) and out[k].dtype == v.dtype for k, v in expected.items())


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
@pytest.mark.parametrize("groups", [None, "one"])
def test_fedavg_without_groups_or_with_one_group_is_todays_weighted_mean_bitwise(weighting, groups):
    server, *states = _random_states(4, seed=1)
    uploads = [Upload(i, s, num_samples=5 + 7 * i, num_steps=1) for i, s in enumerate(states)]
    client_keys = None if groups is None else [ClientKeys("all", frozenset(server))] * 3
    agg = FedAvg(weighting=weighting)
    agg.setup(server, 3, client_keys=client_keys)
    agg.aggregate(0, uploads)
    expected = weighted_average(states, agg.client_weights(uploads))
    assert all(torch.equal(agg.global_state()[k], v) for k, v in expected.items())
    assert agg.global_state().keys() == expected.keys()


def test_fedavg_means_each_key_over_its_owners_and_keeps_unowned_keys():
    server = {
        "a": torch.tensor([1.0, 1.0]),
        "b": torch.tensor([0.0]),
        "c": torch.tensor([5.0]),
        "bn.running_var": torch.tensor([0.1]),
    }
    small = {"a": torch.tensor([3.0, 1.0]), "bn.running_var": torch.tensor([-0.5])}
    big = {
        "a": torch.tensor([5.0, 3.0]),
        "b": torch.tensor([4.0]),
        "bn.running_var": torch.tensor([0.2]),
    }
    averaged = owner_average(server, [small, big])
    assert "c" not in averaged  # nobody owns c this round
    assert averaged["a"].tolist() == [4.0, 2.0]  # 1 + mean(2, 4), 1 + mean(0, 2)
    assert averaged["b"].tolist() == [4.0]  # only the big client owns b
    assert averaged["bn.running_var"].tolist() == [0.0]  # mean(-0.5, 0.2) < 0, clamped
    keys = [ClientKeys("small", frozenset(small)), ClientKeys("big", frozenset(big))]
    agg = FedAvg(weighting="samples")
    agg.setup(server, 2, client_keys=keys)
    agg.aggregate(0, [Upload(0, small, 10, 1), Upload(1, big, 30, 1)])
    out = agg.global_state()
    assert out["a"].tolist() == [4.5, 2.5]  # 0.25 * small + 0.75 * big
    assert out["b"].tolist() == [4.0] and out["c"].tolist() == [5.0]
    assert list(out) == list(server)


def _nested():
    """Group A's keys are a subset of group B's; clients 0, 1 in A, 2, 3 in B."""
    server = {"shared": torch.tensor([0.0, 0.0]), "deep": torch.tensor([1.0]), "n": torch.tensor(0)}
    a, b = frozenset({"shared", "n"}), frozenset(server)
    return server, [ClientKeys("A", a)] * 2 + [ClientKeys("B", b)] * 2


def test_payloads_hold_each_groups_keys_and_deployables_name_the_groups():
    server, keys = _nested()
    agg = FedAvg()
    agg.setup(server, 4, client_keys=keys)
    payloads = agg.configure_round(0, [0, 3, 1])
    assert set(payloads[0].weights) == {"shared", "n"} and payloads[0] is payloads[1]
    assert set(payloads[3].weights) == set(server)
    assert set(agg.deployables()) == {"global", "A", "B"}
    assert set(agg.deployables()["A"]) == {"shared", "n"}
    with pytest.raises(ConfigurationError, match="server model lacks"):
        FedAvg().setup({"a": torch.zeros(1)}, 1, client_keys=[ClientKeys("x", frozenset({"b"}))])
    with pytest.raises(ConfigurationError, match="one entry per client"):
        FedAvg().setup(server, 3, client_keys=keys)


def test_within_groups_keeps_one_model_per_group_and_never_mixes_shared_keys():
    server, keys = _nested()
    agg = FedAvg(weighting="uniform", within_groups=True)
    agg.setup(server, 4, client_keys=keys)
    payloads = agg.configure_round(0, [0, 1, 2, 3])
    assert payloads[0] is payloads[1] and set(payloads[0].weights) == {"shared", "n"}
    assert set(payloads[2].weights) == set(server)
    uploads = [
        Upload(0, {"shared": torch.tensor([2.0, 0.0]), "n": torch.tensor(3)}, 1, 1),
        Upload(1, {"shared": torch.tensor([4.0, 2.0]), "n": torch.tensor(4)}, 1, 1),
        Upload(2, {"shared": torch.tensor([-10.0, 10.0]), "deep": torch.tensor([3.0]), "n": torch.tensor(5)}, 1, 1),
    ]  # fmt: skip
    agg.aggregate(0, uploads)
    models = agg.deployables()
    assert set(models) == {"global", "A", "B"}
    assert models["A"]["shared"].tolist() == [3.0, 1.0]  # A's two clients only, not B's
    assert models["B"]["shared"].tolist() == [-10.0, 10.0] and models["B"]["deep"].tolist() == [3.0]
    assert models["A"]["n"].item() == 3 and models["B"]["n"].item() == 5
    assert set(models["A"]) == {"shared", "n"}
    assert set(models["global"]) == set(server)  # the group with the most keys
    assert agg.configure_round(1, [1])[1].weights["shared"].tolist() == [3.0, 1.0]
    clone = FedAvg(weighting="uniform", within_groups=True)
    clone.setup(server, 4, client_keys=keys)
    clone.load_state_dict(agg.state_dict())
    for group, model in clone.deployables().items():
        assert all(torch.equal(model[k], v) for k, v in models[group].items())
    agg.aggregate(1, uploads[1:2])  # a round where group B has no upload: its model is kept
    assert agg.deployables()["B"]["shared"].tolist() == [-10.0, 10.0]
    assert agg.deployables()["A"]["shared"].tolist() == [4.0, 2.0]


def test_within_groups_without_groups_is_plain_fedavg():
    agg = FedAvg(within_groups=True)
    agg.setup(_state([[0.0, 0.0], [0.0, 0.0]], [0.0], 0), num_clients=2)
    agg.aggregate(0, _uploads())
    assert torch.allclose(agg.global_state()["w"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert set(agg.deployables()) == {"global"}
