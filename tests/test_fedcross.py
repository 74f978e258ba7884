"""FedCross (docs/algorithms.md 2.2): formulas on hand-made tensors, the aggregator, and end to end."""

import math
import re

import pytest
import torch

from fedlightning import ClientModule, FederatedDataModule, FederatedLoop
from fedlightning.clients import FedProx
from fedlightning.errors import ConfigurationError
from fedlightning.protocol import Upload
from fedlightning.server import FedCross
from fedlightning.server.base import ClientKeys
from fedlightning.server.fedcross import (
    cross_mix,
    dynamic_alpha,
    parameter_keys,
    propeller_collaborators,
    select_collaborators,
    similarity_matrix,
)


def _model(w, b=0.0, mean=0.0, var=1.0, steps=0):
    """A one-layer 'model' with BatchNorm-like buffers."""
    return {
        "fc.weight": torch.tensor(w, dtype=torch.float32),
        "fc.bias": torch.tensor([b], dtype=torch.float32),
        "bn.running_mean": torch.tensor([mean]),
        "bn.running_var": torch.tensor([var]),
        "bn.num_batches_tracked": torch.tensor(steps),
    }


def _uploads(models, agg, round_index=0, num_samples=None):
    """Uploads for the clients of ``agg``'s last configure_round, model i trained to ``models[i]``."""
    out = []
    for cid, i in agg._assignment.items():
        if models[i] is not None:
            n = 10 if num_samples is None else num_samples[i]
            out.append(Upload(cid, models[i], num_samples=n, num_steps=1, model_index=i))
    return out


# -- collaborator selection -------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 5, 10])
def test_in_order_pairs_every_other_model_exactly_once_in_k_minus_1_rounds(k):
    sim = torch.zeros(k, k)
    for start in (0, 7):
        seen = {i: [] for i in range(k)}
        for r in range(start, start + k - 1):
            collaborators = select_collaborators(sim, r, "in_order")
            assert collaborators == [(i + (r % (k - 1)) + 1) % k for i in range(k)]
            for i, c in enumerate(collaborators):
                seen[i].append(c)
        for i in range(k):
            assert sorted(seen[i]) == [j for j in range(k) if j != i]


def test_similarity_selection_ignores_the_diagonal_and_breaks_ties_low():
    sim = torch.tensor(
        [
            [-5.0, 0.2, 0.7, 0.2],
            [0.2, 9.0, 0.4, 0.9],
            [0.7, 0.4, 1.0, 0.4],
            [0.2, 0.9, 0.4, 1.0],
        ]
    )
    assert select_collaborators(sim, 0, "lowest_similarity") == [1, 0, 1, 0]
    assert select_collaborators(sim, 0, "highest_similarity") == [2, 3, 0, 1]
    assert select_collaborators(sim, 3, "lowest_similarity") == [1, 0, 1, 0]  # round plays no part


def test_similarity_selection_never_picks_i_even_with_infinite_values():
    inf = float("inf")
    assert select_collaborators(torch.full((3, 3), inf), 0, "lowest_similarity") == [1, 0, 0]
    assert select_collaborators(torch.full((3, 3), -inf), 0, "highest_similarity") == [1, 0, 0]
    sim = torch.tensor([[5.0, inf, 3.0], [-inf, 0.0, inf], [inf, -inf, 0.0]])
    assert select_collaborators(sim, 0, "lowest_similarity") == [2, 0, 1]
    assert select_collaborators(sim, 0, "highest_similarity") == [1, 2, 0]


def test_selection_refuses_bad_input():
    with pytest.raises(ValueError, match="K x K"):
        select_collaborators(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError, match="at least 2"):
        select_collaborators(torch.zeros(1, 1), 0)
    with pytest.raises(ValueError, match="strategy"):
        select_collaborators(torch.zeros(3, 3), 0, "random")


def test_propellers_are_the_in_order_collaborator_and_the_next_one_skipping_i():
    for k in (3, 4, 6):
        for r in range(2 * k):
            o = r % (k - 1) + 1
            pairs = propeller_collaborators(k, r)
            for i, (p1, p2) in enumerate(pairs):
                assert (
                    p1 == (i + o) % k == select_collaborators(torch.zeros(k, k), r, "in_order")[i]
                )
                expected = (i + o + 1) % k
                assert p2 == (expected if expected != i else (i + 1) % k)
                assert i not in (p1, p2) and p1 != p2
    assert propeller_collaborators(2, 5) == [(1, 1), (0, 0)]


# -- similarity -------------------------------------------------------------------------------------
def test_cosine_similarity_over_parameters_only():
    a, b, c = _model([[1.0, 0.0]], b=0.0), _model([[1.0, 1.0]], b=0.0), _model([[0.0, 0.0]], b=-2.0)
    b["bn.running_var"] = torch.tensor([1e6])  # statistics are not parameters: no effect
    assert parameter_keys(a) == ["fc.weight", "fc.bias"]
    sim = similarity_matrix([a, b, c], "cosine")
    expected = torch.tensor(
        [[1.0, 1 / math.sqrt(2), 0.0], [1 / math.sqrt(2), 1.0, 0.0], [0.0, 0.0, 1.0]]
    )
    assert sim.dtype == torch.float64 and torch.allclose(sim, expected.double())


def test_layerwise_similarity_sums_each_layers_cosine():
    def two_layers(w1, b1, w2):
        return {
            "l1.weight": torch.tensor(w1),
            "l1.bias": torch.tensor(b1),
            "l2.weight": torch.tensor(w2),
        }

    x = two_layers([1.0, 0.0], [0.0], [3.0, 4.0])
    y = two_layers([1.0, 1.0], [0.0], [-3.0, -4.0])
    sim = similarity_matrix([x, y], "layerwise")
    # layer 1: cos((1,0,0),(1,1,0)) = 1/sqrt(2); layer 2: cos((3,4),(-3,-4)) = -1
    assert torch.allclose(sim[0, 1], torch.tensor(1 / math.sqrt(2) - 1, dtype=torch.float64))
    assert torch.allclose(sim.diagonal(), torch.full((2,), 2.0, dtype=torch.float64))
    whole = similarity_matrix([x, y], "cosine")[0, 1]  # (1,0,0,3,4).(1,1,0,-3,-4) = 1 - 25
    assert torch.isclose(
        whole, torch.tensor(-24 / (math.sqrt(26) * math.sqrt(27)), dtype=torch.float64)
    )


def test_zero_norm_model_has_zero_similarity():
    sim = similarity_matrix([_model([[0.0, 0.0]]), _model([[1.0, 2.0]], b=1.0)])
    assert sim[0, 1] == 0 and sim[0, 0] == 0 and sim[1, 1] == pytest.approx(1.0)


# -- cross mix --------------------------------------------------------------------------------------
def test_cross_mix_mixes_params_and_bn_statistics_and_keeps_own_integer_buffers():
    own = _model([[1.0, 2.0]], b=1.0, mean=0.0, var=1.0, steps=5)
    other = _model([[3.0, 6.0]], b=-1.0, mean=2.0, var=3.0, steps=9)
    mixed = cross_mix(own, [other], alpha=0.75)
    assert torch.allclose(mixed["fc.weight"], torch.tensor([[1.5, 3.0]]))
    assert torch.allclose(mixed["fc.bias"], torch.tensor([0.5]))
    assert torch.allclose(mixed["bn.running_mean"], torch.tensor([0.5]))
    assert torch.allclose(mixed["bn.running_var"], torch.tensor([1.5]))
    assert (
        mixed["bn.num_batches_tracked"].dtype == torch.int64
        and mixed["bn.num_batches_tracked"].item() == 5
    )
    assert mixed["fc.weight"].dtype == torch.float32
    # propellers: (1 - alpha) / 2 to each of two collaborators
    third = _model([[5.0, 10.0]], b=3.0, mean=4.0, var=5.0, steps=1)
    mixed = cross_mix(own, [other, third], alpha=0.5)
    assert torch.allclose(mixed["fc.weight"], torch.tensor([[0.5 + 0.75 + 1.25, 1.0 + 1.5 + 2.5]]))
    assert mixed["bn.num_batches_tracked"].item() == 5


def test_dynamic_alpha_ramps_to_the_target_and_stays():
    assert dynamic_alpha(0, 0.5, 0.005, 0.99) == 0.5
    assert dynamic_alpha(50, 0.5, 0.005, 0.99) == pytest.approx(0.75)
    assert dynamic_alpha(98, 0.5, 0.005, 0.99) == pytest.approx(0.99)
    assert dynamic_alpha(500, 0.5, 0.005, 0.99) == 0.99
    kwargs = dict(alpha=0.9, propeller_rounds=3, dynamic_alpha_rounds=(3, 10), alpha_start=0.6)
    agg = FedCross(**kwargs, alpha_step=0.1, alpha_ramp="range_start")
    assert [agg.uses_propellers(r) for r in range(5)] == [True, True, True, False, False]
    expected = [0.9, 0.9, 0.9, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9]  # ramp restarts at its range
    assert [agg.alpha_at(r) for r in range(11)] == pytest.approx(expected)
    # the default: the spec's ramp in the absolute round, continuous over the schedule
    absolute = FedCross(**kwargs, alpha_step=0.05)
    expected = [0.9, 0.9, 0.9, 0.75, 0.8, 0.85, 0.9, 0.9, 0.9, 0.9, 0.9]  # 0.6 + r * 0.05
    assert [absolute.alpha_at(r) for r in range(11)] == pytest.approx(expected)
    whole = FedCross(alpha=0.99, dynamic_alpha_rounds=(0, 1000))
    assert [whole.alpha_at(r) for r in (0, 50, 97, 98, 400)] == pytest.approx(
        [0.5, 0.75, 0.985, 0.99, 0.99]
    )


# -- the aggregator ---------------------------------------------------------------------------------
def test_each_sampled_client_gets_a_distinct_middleware_model_from_a_private_shuffle():
    agg = FedCross()
    agg.setup(_model([[0.0, 0.0]]), num_clients=20, seed=3)
    clients = [7, 2, 11, 5, 0]
    rng_before = torch.get_rng_state()
    payloads = agg.configure_round(0, clients)
    assert torch.equal(rng_before, torch.get_rng_state())  # the global RNG is never used
    assert agg.k == 5 and set(payloads) == set(clients)
    assert sorted(p.model_index for p in payloads.values()) == [0, 1, 2, 3, 4]
    agg.models = [_model([[float(i), 0.0]]) for i in range(5)]
    assignments = []
    for r in range(6):
        payloads = agg.configure_round(r, clients)
        for p in payloads.values():
            assert p.weights is agg.models[p.model_index]
        assignments.append({c: p.model_index for c, p in payloads.items()})
    assert len({tuple(sorted(a.items())) for a in assignments}) > 1  # the shuffle changes per round
    again = FedCross()
    again.setup(_model([[0.0, 0.0]]), num_clients=20, seed=3)
    again.configure_round(0, clients)
    assert {c: p.model_index for c, p in again.configure_round(5, clients).items()} == assignments[
        5
    ]


def test_number_of_models_must_match_the_clients_per_round():
    agg = FedCross(num_models=3)
    agg.setup(_model([[0.0, 0.0]]), num_clients=10)
    with pytest.raises(ConfigurationError, match="num_models=3 but 4 clients.*clients_per_round"):
        agg.configure_round(0, [0, 1, 2, 3])
    agg = FedCross()
    agg.setup(_model([[0.0, 0.0]]), num_clients=10)
    with pytest.raises(ConfigurationError, match="num_models"):
        agg.configure_round(0, [4])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 1.0}, r"alpha=1\.0 is not allowed: expected a number in \[0\.5, 1\.0\)"),
        ({"alpha": 0.49}, r"alpha=0\.49 is not allowed"),
        ({"alpha": -1}, r"alpha=-1 is not allowed"),
        ({"selection": "random"}, r"selection='random'.*lowest_similarity"),
        ({"similarity": "l2"}, r"similarity='l2'.*cosine, layerwise"),
        ({"num_models": 1}, r"num_models=1.*>= 2"),
        ({"first_stage_bound": -1}, r"first_stage_bound=-1"),
        ({"propeller_rounds": -2}, r"propeller_rounds=-2"),
        ({"dynamic_alpha_rounds": (5, 5)}, r"dynamic_alpha_rounds=\[5, 5\].*0 <= a < b"),
        ({"alpha": 0.9, "alpha_start": 0.95}, r"alpha_start=0\.95.*\[0\.5, alpha=0\.9\]"),
        ({"alpha_step": 0}, r"alpha_step=0"),
    ],
)
def test_options_are_validated(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        FedCross(**kwargs)


def test_cross_aggregation_is_synchronous_and_the_global_model_is_the_mean():
    agg = FedCross(alpha=0.75, selection="in_order")
    agg.setup(_model([[0.0, 0.0]]), num_clients=3)
    agg.configure_round(1, [0, 1, 2])
    trained = [
        _model([[1.0, 0.0]], steps=1),
        _model([[0.0, 2.0]], steps=2),
        _model([[4.0, 4.0]], steps=3),
    ]
    agg.aggregate(1, _uploads(trained, agg))
    # round 1, K 3: co(i) = (i + 2) mod 3 = [2, 0, 1], all from the pre-cross trained models
    expected = [[[1.75, 1.0]], [[0.25, 1.5]], [[3.0, 3.5]]]
    for i in range(3):
        assert torch.allclose(agg.models[i]["fc.weight"], torch.tensor(expected[i]))
        assert agg.models[i]["bn.num_batches_tracked"].item() == i + 1
    assert torch.allclose(agg.global_state()["fc.weight"], torch.tensor([[5 / 3, 2.0]]))
    assert set(agg.deployables()) == {"global"}


def test_lowest_and_highest_similarity_pick_the_hand_computed_partner():
    trained = [_model([[1.0, 0.0]]), _model([[1.0, 0.1]]), _model([[0.0, 1.0]])]
    picks = {}
    for selection in ("lowest_similarity", "highest_similarity"):
        agg = FedCross(alpha=0.5, selection=selection)
        agg.setup(_model([[0.0, 0.0]]), num_clients=3)
        agg.configure_round(0, [0, 1, 2])
        agg.aggregate(0, _uploads(trained, agg))
        picks[selection] = agg.models
    # lowest: 0 <-> 2, 1 <-> 2, 2 <-> 0 ; highest: 0 <-> 1, 1 <-> 0, 2 <-> 1
    assert torch.allclose(picks["lowest_similarity"][0]["fc.weight"], torch.tensor([[0.5, 0.5]]))
    assert torch.allclose(picks["lowest_similarity"][1]["fc.weight"], torch.tensor([[0.5, 0.55]]))
    assert torch.allclose(picks["lowest_similarity"][2]["fc.weight"], torch.tensor([[0.5, 0.5]]))
    assert torch.allclose(picks["highest_similarity"][0]["fc.weight"], torch.tensor([[1.0, 0.05]]))
    assert torch.allclose(picks["highest_similarity"][2]["fc.weight"], torch.tensor([[0.5, 0.55]]))


def test_failed_clients_keep_their_model_and_are_nobodys_collaborator():
    agg = FedCross(alpha=0.5, selection="lowest_similarity")
    agg.setup(_model([[0.0, 0.0]]), num_clients=3)
    agg.configure_round(0, [0, 1, 2])
    before = agg.models[1]
    trained = [_model([[1.0, 0.0]]), None, _model([[0.0, 1.0]])]
    agg.aggregate(0, _uploads(trained, agg))
    assert agg.models[1] is before
    assert torch.allclose(agg.models[0]["fc.weight"], torch.tensor([[0.5, 0.5]]))
    assert torch.allclose(agg.models[2]["fc.weight"], torch.tensor([[0.5, 0.5]]))
    agg.configure_round(1, [0, 1, 2])
    only = [None, _model([[2.0, 2.0]]), None]
    agg.aggregate(
        1, _uploads(only, agg)
    )  # one survivor: no collaborator, it keeps its trained weights
    assert torch.equal(agg.models[1]["fc.weight"], torch.tensor([[2.0, 2.0]]))


def test_propeller_round_mixes_two_collaborators_and_warmup_is_fedavg():
    agg = FedCross(alpha=0.5, first_stage_bound=1, propeller_rounds=2)
    agg.setup(_model([[0.0, 0.0]]), num_clients=4)
    agg.configure_round(0, [0, 1, 2, 3])
    trained = [_model([[float(i), 0.0]]) for i in range(4)]
    agg.aggregate(0, _uploads(trained, agg, num_samples=[10, 10, 10, 30]))
    mean = (0 * 10 + 1 * 10 + 2 * 10 + 3 * 30) / 60
    assert all(torch.allclose(m["fc.weight"], torch.tensor([[mean, 0.0]])) for m in agg.models)
    agg.configure_round(1, [0, 1, 2, 3])
    agg.aggregate(1, _uploads(trained, agg))
    # round 1, K 4: o = 2, p1 = i + 2, p2 = i + 3 (mod 4)
    for i in range(4):
        expected = 0.5 * i + 0.25 * ((i + 2) % 4) + 0.25 * ((i + 3) % 4)
        assert agg.models[i]["fc.weight"][0, 0].item() == pytest.approx(expected)


def test_state_round_trips_and_a_mismatched_k_is_refused():
    agg = FedCross(alpha=0.5, evaluate_middleware=True)
    agg.setup(_model([[0.0, 0.0]]), num_clients=3)
    agg.configure_round(0, [0, 1, 2])
    agg.aggregate(
        0, _uploads([_model([[1.0, 0.0]]), _model([[1.0, 1.0]]), _model([[0.0, 3.0]])], agg)
    )
    clone = FedCross(alpha=0.5, evaluate_middleware=True)
    clone.setup(_model([[0.0, 0.0]]), num_clients=3)
    clone.load_state_dict(agg.state_dict())
    assert clone.k == 3 and set(clone.deployables()) == {
        "global",
        "middleware_0",
        "middleware_1",
        "middleware_2",
    }
    for name, state in agg.deployables().items():
        assert all(
            torch.equal(state[key], value) for key, value in clone.deployables()[name].items()
        )
    with pytest.raises(ConfigurationError, match="resume with the same num_models"):
        FedCross(num_models=4).load_state_dict(agg.state_dict())


def test_heterogeneous_client_groups_are_refused_and_one_group_is_fine():
    server = _model([[0.0, 0.0]])
    whole, head = frozenset(server), frozenset({"fc.weight", "fc.bias"})
    with pytest.raises(ConfigurationError, match="FedCross's middleware models are whole models"):
        FedCross().setup(server, 2, client_keys=[ClientKeys("a", head), ClientKeys("b", whole)])
    agg = FedCross(alpha=0.5)
    agg.setup(server, 2, client_keys=[ClientKeys("net", whole)] * 2)
    agg.configure_round(0, [0, 1])
    agg.aggregate(0, _uploads([_model([[1.0, 0.0]]), _model([[3.0, 0.0]])], agg))
    assert set(agg.deployables()) == {"global", "net"}
    assert agg.global_state()["fc.weight"].tolist() == [[2.0, 0.0]]


# -- end to end -------------------------------------------------------------------------------------
class RecordsDispatch:
    """Mixin: remembers each fit's ``(client_id, model_index, starting weights)``."""

    seen: list[tuple[int, int, dict]] = []

    def begin_client(self, client_id, payload, state):
        super().begin_client(client_id, payload, state)
        weights = {k: v.clone() for k, v in self.network.state_dict().items()}
        RecordsDispatch.seen.append((client_id, payload.model_index, weights))


class RecordingClient(RecordsDispatch, ClientModule):
    pass


class RecordingProx(RecordsDispatch, FedProx):
    """FedProx's anchor is the payload, so it is pulled towards its own middleware model."""


@pytest.mark.parametrize("objective", [RecordingClient, RecordingProx])
def test_loop_dispatches_one_distinct_middleware_model_per_client(tmp_path, objective):
    dm = FederatedDataModule(
        dataset="synthetic",
        num_samples=240,
        num_test=60,
        num_classes=3,
        sample_shape=(6,),
        num_clients=6,
        partition="iid",
    )
    agg = FedCross(alpha=0.5)
    loop = FederatedLoop(
        rounds=2, clients_per_round=3, aggregator=agg, run_dir=str(tmp_path), progress_bar=False
    )
    RecordsDispatch.seen = []
    dispatched = []

    def configure_round(round_index, client_ids, inner=agg.configure_round):
        payloads = inner(round_index, client_ids)
        dispatched.extend((c, p.model_index, dict(p.weights)) for c, p in payloads.items())
        return payloads

    agg.configure_round = configure_round
    model = objective(network="mlp", num_classes=3, in_channels=6, image_size=1, lr=0.1)
    metrics = loop.fit(model, datamodule=dm)
    indices = [i for _, i, _ in RecordsDispatch.seen]
    assert sorted(indices[:3]) == [0, 1, 2] and sorted(indices[3:]) == [0, 1, 2]
    sent = {(c, i): w for c, i, w in dispatched}
    for client, index, weights in RecordsDispatch.seen:  # each fit starts from its middleware model
        assert all(torch.equal(weights[k], sent[(client, index)][k]) for k in weights)
    models = agg.models
    mean = {k: sum(m[k].double() for m in models) / 3 for k in models[0]}
    assert all(torch.allclose(agg.global_state()[k].double(), v) for k, v in mean.items())
    assert 0.0 <= metrics["test_acc"] <= 1.0


def test_resume_through_the_cli_is_bitwise_equal(cli, tmp_path):
    cli(tmp_path / "straight", config="fedcross_tiny.yaml")
    cli(tmp_path / "resumed", "--loop.rounds", "2", config="fedcross_tiny.yaml")
    ckpt = tmp_path / "resumed" / "last.ckpt"
    rows = cli(tmp_path / "resumed", "--ckpt_path", str(ckpt), config="fedcross_tiny.yaml")
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    assert "middleware_3/test_acc" in rows[-1]
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()
    straight = torch.load(tmp_path / "straight" / "last.ckpt", weights_only=True)["aggregator"]
    resumed = torch.load(ckpt, weights_only=True)["aggregator"]
    assert len(straight["models"]) == len(resumed["models"]) == 4
    for a, b in zip(straight["models"], resumed["models"], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--loop.aggregator.init_args.alpha", "1.0"], r"FedCross alpha=1\.0 is not allowed"),
        (["--loop.aggregator.init_args.num_models", "3"], r"FedCross num_models=3 but 4 clients"),
    ],
)
def test_cli_configuration_errors(cli, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        cli(tmp_path / "bad", *args, config="fedcross_tiny.yaml")
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "bad" / "last.ckpt").exists()


def test_independent_initialisations_of_the_middleware_models(tmp_path):
    from fedlightning.clients import ClientModule
    from fedlightning.loop.initial_states import independent_states
    from objective_helpers import SYNTHETIC, synthetic_run

    model = ClientModule(**SYNTHETIC)
    rng = torch.get_rng_state()
    states = independent_states(model, 3, seed=5)
    assert torch.equal(torch.get_rng_state(), rng)  # the run's random stream is untouched
    again = independent_states(model, 3, seed=5)
    for a, b in zip(states, again, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)  # a pure function of (seed, i)
    first = "features.1.weight"
    assert not torch.equal(states[0][first], states[1][first])
    assert not torch.equal(states[1][first], states[2][first])

    agg = FedCross(independent_init=True)
    loop = synthetic_run(
        ClientModule(**SYNTHETIC), agg, rounds=1, tmp_path=tmp_path / "run", seed=5
    )
    assert agg.initial_states_needed(2) == 2 and FedCross().initial_states_needed(2) == 0
    # round 0 dispatched the two independent states: the trained models started from them
    assert len(agg.models) == 2 and not torch.equal(agg.models[0][first], agg.models[1][first])
    assert loop.history[-1]["comm_sent_bytes"] > 0


def test_independent_init_global_model_before_round_0_is_the_mean_of_the_k_states():
    # docs/algorithms.md section 2.2: the deployable global model is always the uniform mean of
    # the middleware models, so with independent initialisations it is their mean before round 0
    initial = {"w": torch.zeros(3), "n": torch.tensor(0)}
    states = [
        {"w": torch.tensor([1.0, 2.0, 3.0]) * (i + 1), "n": torch.tensor(0)} for i in range(3)
    ]
    agg = FedCross(independent_init=True)
    agg.setup(initial, num_clients=6)
    assert torch.equal(agg.global_state()["w"], initial["w"])  # no states yet: the loop's model
    agg.set_initial_states(states)
    assert torch.equal(agg.global_state()["w"], torch.tensor([2.0, 4.0, 6.0]))


def test_independent_init_through_the_cli(cli, tmp_path):
    rows = cli(
        tmp_path, "--loop.aggregator.independent_init", "true", "--loop.aggregator.alpha_ramp",
        "range_start", config="fedcross_tiny.yaml",
    )  # fmt: skip
    assert len(rows) == 4 and float(rows[-1]["test_acc"]) > 0.2
    with pytest.raises(SystemExit) as exit_info:
        cli(
            tmp_path / "bad",
            "--loop.aggregator.alpha_ramp",
            "sideways",
            config="fedcross_tiny.yaml",
        )
    assert exit_info.value.code == 2
