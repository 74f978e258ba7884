"""The server update hook and declared state (docs/algorithms.md section 2.6), by hand on tiny
state_dicts: what ``server_update`` receives (:class:`ServerRound`), how its answer is merged
(parameters from the hook, buffers from the mean, unowned keys unchanged), which keys are
parameters (the model's, the heuristic only without one), and ``add_state``'s allocation,
``state_dict`` and checked ``load_state_dict``."""

import pytest
import torch

from fedlightning.clients import ClientModule
from fedlightning.errors import ConfigurationError, PluginError
from fedlightning.protocol import Upload
from fedlightning.server import FedAdam, FedAvg, FedAvgM, FedNova, InCo, Scaffold
from fedlightning.server.base import ClientKeys
from fedlightning.server.functional import parameter_keys
from fedlightning.server.statistics import StatisticContext

T = torch.float64


def _initial():
    return {
        "w": torch.tensor([1.0, 2.0], dtype=T),
        "scale": torch.tensor(
            [1.0], dtype=T
        ),  # a float buffer the name heuristic takes for a weight
        "bn.running_var": torch.tensor([1.0], dtype=T),
        "n": torch.tensor(0),
        "deep": torch.tensor([5.0], dtype=T),
    }


SMALL = frozenset({"w", "scale", "bn.running_var", "n"})
KEYS = [ClientKeys("small", SMALL), ClientKeys("big", frozenset(_initial()))]
PARAMETERS = frozenset({"w", "deep"})


def _uploads():
    """Client 0 (small) and client 1 (big): mean w (2, 4), scale 3, running_var 2, n 3."""
    small = {"w": torch.tensor([1.0, 3.0], dtype=T), "scale": torch.tensor([2.0], dtype=T),
             "bn.running_var": torch.tensor([1.0], dtype=T), "n": torch.tensor(3)}  # fmt: skip
    big = {"w": torch.tensor([3.0, 5.0], dtype=T), "scale": torch.tensor([4.0], dtype=T),
           "bn.running_var": torch.tensor([3.0], dtype=T), "n": torch.tensor(4),
           "deep": torch.tensor([7.0], dtype=T)}  # fmt: skip
    return [Upload(0, small, 1, 1), Upload(1, big, 1, 1)]


class PlusOne(FedAvg):
    """Returns mean + 1 for every key of the mean (buffers included) and records the round."""

    def server_update(self, server_round):
        self.seen = server_round
        return {k: v + 1 for k, v in server_round.mean.items()}


def test_the_hook_receives_the_round_and_buffers_take_the_mean():
    agg = PlusOne(weighting="uniform")
    agg.setup(_initial(), 2, client_keys=KEYS, parameters=PARAMETERS)
    agg.aggregate(0, _uploads()[:1])  # only the small client: nobody owns "deep"
    seen = agg.seen
    assert seen.index == 0 and seen.parameters == PARAMETERS and len(seen.uploads) == 1
    assert seen.parameter_keys == ("w",) and seen.buffer_keys == ("scale", "bn.running_var", "n")
    assert dict(seen.owners) == dict.fromkeys(SMALL, 1)
    out = agg.weights
    assert out["w"].tolist() == [2.0, 4.0]  # the hook's value for a parameter
    assert out["scale"].item() == 2.0 and out["bn.running_var"].item() == 1.0  # the mean
    assert out["n"].item() == 3 and out["deep"].item() == 5.0  # first owner's; unowned unchanged
    agg.aggregate(1, _uploads())
    assert agg.seen.owners["deep"] == 1 and agg.seen.owners["w"] == 2
    assert agg.weights["w"].tolist() == [3.0, 5.0] and agg.weights["deep"].item() == 8.0
    assert agg.weights["scale"].item() == 3.0 and agg.weights["bn.running_var"].item() == 2.0


def test_updates_buffers_lets_the_hook_write_buffers_too():
    class PlusOneEverywhere(PlusOne):
        updates_buffers = True

    agg = PlusOneEverywhere(weighting="uniform")
    agg.setup(_initial(), 2, client_keys=KEYS, parameters=PARAMETERS)
    agg.aggregate(0, _uploads())
    assert agg.weights["scale"].item() == 4.0 and agg.weights["bn.running_var"].item() == 3.0
    assert agg.weights["n"].item() == 4


def test_without_a_model_the_parameters_are_the_name_heuristic():
    agg = FedAvg()
    agg.setup(_initial(), 2)
    assert agg.parameters == frozenset(parameter_keys(_initial())) == {"w", "scale", "deep"}
    with pytest.raises(ConfigurationError, match=r"parameters \['nope'\] are not keys"):
        agg.setup(_initial(), 2, parameters={"w", "nope"})


def test_within_groups_names_parameters_and_uploads_in_its_key_space():
    agg = PlusOne(within_groups=True)
    agg.setup(_initial(), 2, client_keys=KEYS, parameters=PARAMETERS)
    assert agg.parameters == {"small/w", "big/w", "big/deep"}
    agg.aggregate(0, _uploads())
    assert set(agg.seen.uploads[0].weights) == {f"small/{k}" for k in SMALL}
    assert agg.seen.parameter_keys == ("small/w", "big/w", "big/deep")
    assert agg.group_models()["small"]["w"].tolist() == [2.0, 4.0]  # its own upload + 1


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (lambda r: {"deep": torch.zeros(1, dtype=T)},
         r"PlusOne.server_update \(round 1\) returned 'deep', which no upload owns"),
        (lambda r: {"w": torch.zeros(2)},
         r"returned 'w' as a torch.Tensor of dtype torch.float32, shape \(2,\), on cpu, but the "
         r"server state holds a torch.Tensor of dtype torch.float64, shape \(2,\), on cpu"),
        (lambda r: {"w": torch.zeros(3, dtype=T)}, r"returned 'w' as .* shape \(3,\)"),
        (lambda r: {"w": torch.zeros(2, dtype=T).numpy()},
         r"returned 'w' as a numpy.ndarray of dtype numpy.float64, shape \(2,\), but the "
         r"server state holds a torch.Tensor of dtype torch.float64"),
        (lambda r: {"w": torch.zeros(2, dtype=T, device="meta")},
         r"returned 'w' as a torch.Tensor of dtype torch.float64, shape \(2,\), on meta, but"),
        (lambda r: [torch.zeros(2, dtype=T)],
         r"returned a builtins.list: expected a dict of tensors keyed like server_round.mean"),
    ],
    ids=["unowned key", "dtype", "shape", "numpy", "device", "not a dict"],
)  # fmt: skip
def test_a_hook_that_returns_what_the_state_cannot_hold_is_a_plugin_error(update, message):
    """Named with the aggregator, the round and the key, what came (numpy's dtype written apart
    from torch's) and what was expected; the server state is untouched."""
    agg = PlusOne()
    agg.setup(_initial(), 2, client_keys=KEYS, parameters=PARAMETERS)
    before = {k: v.clone() for k, v in agg.weights.items()}
    agg.server_update = update
    with pytest.raises(PluginError, match=message):
        agg.aggregate(0, _uploads()[:1])
    assert all(torch.equal(agg.weights[k], v) for k, v in before.items())


def test_scaffold_updates_c_in_the_hook_only():
    agg = Scaffold()
    agg.setup(_initial(), 2, client_keys=KEYS, parameters=PARAMETERS)
    uploads = [
        Upload(u.client_id, u.weights, 1, 1, {"delta_c": {"w": torch.ones(2, dtype=T)}})
        for u in _uploads()
    ]
    context = StatisticContext(0, 0, agg.weights)
    mean = agg.statistic.combine([u.weights for u in uploads], [1.0, 1.0], context)
    assert mean and not agg.c["w"].any()  # the mean has no side effect
    agg.aggregate(0, uploads)
    assert agg.c["w"].tolist() == [1.0, 1.0]  # (1/N_w) sum_i delta_c = 2 / 2


# -- declared state -------------------------------------------------------------------------------
class Declared(FedAvg):
    def __init__(self):
        super().__init__()
        self.add_state("copy", "model")
        self.add_state("zeros", "parameters")
        self.add_state("filled", "floating", fill=0.5)
        self.add_state("custom", lambda initial, parameters: {"k": initial["w"] * 2})


def test_declared_state_is_built_on_the_device_of_the_initial_state():
    agg = Declared()
    assert agg.zeros == {} and agg.copy == {}  # until setup
    agg.setup({k: v.to("meta") for k, v in _initial().items()}, 2, parameters=PARAMETERS)
    assert list(agg.zeros) == ["w", "deep"] and list(agg.copy) == list(_initial())
    assert list(agg.filled) == ["w", "scale", "bn.running_var", "deep"]
    assert {t.device.type for s in (agg.copy, agg.zeros, agg.filled, agg.custom)
            for t in s.values()} == {"meta"}  # fmt: skip
    agg.setup(_initial(), 2, parameters=PARAMETERS)  # values, on the CPU
    assert agg.filled["scale"].item() == 0.5 and agg.zeros["w"].tolist() == [0.0, 0.0]
    assert agg.custom["k"].tolist() == [2.0, 4.0] and agg.copy["w"] is not agg.weights["w"]
    assert set(agg.state_dict()) == {"weights", "copy", "zeros", "filled", "custom", "num_clients"}
    assert agg.declared_states() == {
        "weights": "a copy of the initial server model",
        "copy": "a copy of the initial server model",
        "zeros": "0.0 like each trainable parameter",
        "filled": "0.5 like each floating entry",
        "custom": "built by Declared.__init__.<locals>.<lambda>",
    }


def test_built_in_checkpoint_entries_keep_their_names():
    """Checkpoints (and the cross-resume matrix) read these names; a wrapper holds its inner's
    state under ``inner``."""
    expected = {
        FedAvg: {"weights"}, FedAvgM: {"weights", "momentum"}, FedAdam: {"weights", "m", "v"},
        Scaffold: {"weights", "c"}, FedNova: {"weights"}, InCo: {"inner.weights"},
    }  # fmt: skip
    for cls, names in expected.items():
        assert set(cls().declared_states()) == names, cls.__name__
        top = {name.split(".")[0] for name in names}
        assert set(cls().state_dict()) == top | {"num_clients"}, cls.__name__


@pytest.mark.parametrize(
    ("name", "init", "fill", "message"),
    [
        ("weights", "model", 0.0, "'weights' is already declared"),
        ("num_clients", "model", 0.0, "must be a public identifier"),
        ("_hidden", "model", 0.0, "must be a public identifier"),
        ("x", "zeros", 0.0, "init must be one of model, parameters, floating, a callable"),
        ("x", [0.0], 0.0, "a number, None, a tensor, \\[\\] or \\{\\}, got \\[0.0\\]"),
        ("x", {"a": 1.0}, 0.0, "got \\{'a': 1.0\\}"),
        ("x", "model", 1.0, "fill applies to 'parameters' and 'floating'"),
        ("x", 0, 1.0, "fill applies to 'parameters' and 'floating'"),
    ],
)
def test_add_state_refuses_a_bad_declaration(name, init, fill, message):
    with pytest.raises(ValueError, match=message):
        FedAvg().add_state(name, init, fill=fill)


def _momentum_state():
    agg = FedAvgM()
    agg.setup(_initial(), 2, parameters=PARAMETERS)
    return agg.state_dict()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda s: s.pop("momentum"),
         r"FedAvgM state momentum \(declared: 0.0 like each trainable parameter\) is missing"),
        (lambda s: s["momentum"].pop("deep"), r"FedAvgM state momentum\['deep'\] is missing"),
        (lambda s: s["momentum"].update(scale=torch.zeros(1, dtype=T)),
         r"FedAvgM state momentum\['scale'\] is not a key of the declared state"),
        (lambda s: s["weights"].update(w=torch.zeros(3, dtype=T)),
         r"FedAvgM state weights\['w'\] is float64 \(3,\) on cpu, declared float64 \(2,\)"),
    ],
    ids=["state", "missing key", "extra key", "shape"],
)  # fmt: skip
def test_load_state_dict_checks_the_declaration(corrupt, message):
    state = _momentum_state()
    corrupt(state)
    agg = FedAvgM()
    agg.setup(_initial(), 2, parameters=PARAMETERS)
    with pytest.raises(ConfigurationError, match=message):
        agg.load_state_dict(state)


def test_a_fitting_state_loads_into_copies():
    state = _momentum_state()
    agg = FedAvgM()
    agg.setup(_initial(), 2, parameters=PARAMETERS)
    agg.load_state_dict(state)
    assert all(torch.equal(agg.momentum[k], v) for k, v in state["momentum"].items())
    assert agg.momentum["w"] is not state["momentum"]["w"]


# -- which keys are parameters: the model says ----------------------------------------------------
class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = torch.nn.Linear(4, 4)
        self.decode = torch.nn.Linear(4, 4)
        self.decode.weight = self.encode.weight  # tied: two state_dict keys, one parameter
        self.norm = torch.nn.BatchNorm1d(4)
        self.frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, x):
        return self.decode(self.norm(self.encode(x)))


def test_the_model_names_its_trainable_parameters():
    model = ClientModule(network=_Tied(), num_classes=4)
    assert model.server_parameter_names() == {
        "encode.weight", "encode.bias", "decode.weight", "decode.bias", "norm.weight", "norm.bias",
    }  # fmt: skip
    hetero = ClientModule(networks=["resnet14", "resnet10"], network_kwargs={"width": 4},
                          num_classes=3, in_channels=1, image_size=8)  # fmt: skip
    largest = hetero.create_network("resnet14")
    assert hetero.server_parameter_names() == {n for n, _ in largest.named_parameters()}
