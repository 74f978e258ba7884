"""InCo aggregation (docs/algorithms.md section 2.4): cross-layer updates on hand-made tensors, layer
pairing, InCo wrapping any inner aggregator, and InCo<Method> end to end through the CLI (two
rounds, resume)."""

import math
import sys
from pathlib import Path

import pytest
import torch

from fedlightning.cli import main
from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model
from fedlightning.protocol import Upload
from fedlightning.server import Aggregator, FedAdam, FedAvg, FedCross, FedNova, InCo, Scaffold
from fedlightning.server.base import ClientKeys
from fedlightning.server.functional import owner_average
from fedlightning.server.inco import (
    CLIP,
    cross_layer_update,
    inco_apply,
    inco_pairs,
    resnet_pairs,
    vit_pairs,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pair(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(
        shape, generator=gen, dtype=torch.float64
    )


@pytest.mark.parametrize("seed", range(6))
def test_exact_is_the_projection_onto_the_half_space(seed):
    g_k, g_0 = _pair((5, 3), seed)
    g = cross_layer_update(g_k, g_0, "exact")
    # KKT of min ||g - g_k||^2 s.t. <g, g_0> >= 0: g = g_k + lam g_0, lam >= 0, lam <g, g_0> = 0
    lam = float(((g - g_k) * g_0).sum() / (g_0 * g_0).sum())
    assert torch.allclose(g, g_k + lam * g_0, atol=1e-12)
    assert lam >= 0 and float((g * g_0).sum()) >= -1e-12
    assert abs(lam * float((g * g_0).sum())) < 1e-10
    if float((g_k * g_0).sum()) >= 0:
        assert torch.equal(g, g_k)


def test_exact_matches_a_numerical_projection():
    optimize = pytest.importorskip("scipy.optimize")
    g_k, g_0 = _pair((7,), 11)
    g_0 = g_0 if float((g_k * g_0).sum()) < 0 else -g_0  # make the constraint active
    k, z = g_k.numpy(), g_0.numpy()
    result = optimize.minimize(
        lambda g: ((g - k) ** 2).sum(), k, jac=lambda g: 2 * (g - k), method="SLSQP",
        constraints=[{"type": "ineq", "fun": lambda g: g @ z, "jac": lambda g: z}], tol=1e-12,
    )  # fmt: skip
    assert result.success
    expected = torch.from_numpy(result.x)
    assert torch.allclose(cross_layer_update(g_k, g_0, "exact"), expected, atol=1e-6)


def test_official_is_per_kernel_and_clipped_like_a_naive_loop():
    g_k, g_0 = _pair((3, 2, 3, 3), 1)
    g_k, g_0 = 0.05 * g_k, 0.05 * g_0
    g_0[0, 1] = 0  # a zero kernel: theta = 0 and its direction is zero
    out = cross_layer_update(g_k.float(), g_0.float(), "official")
    assert out.dtype == torch.float32
    expected = torch.empty_like(g_k)
    for o in range(3):
        for i in range(2):
            gk, g0 = g_k[o, i], g_0[o, i]
            a, b = float((g0 * g0).sum()), float((g0 * gk).sum())
            theta = b / a if a else 0.0
            c = min(max(abs(theta), 0.0), 5.0)
            nk, n0 = math.sqrt(float((gk * gk).sum())), math.sqrt(a)
            u0 = g0 / n0 if n0 else torch.zeros_like(g0)
            expected[o, i] = ((gk / nk + c * u0) * (nk + n0) / 2).clamp(-CLIP, CLIP)
    assert torch.allclose(out.double(), expected, atol=1e-6)
    assert float(out.abs().max()) <= float(torch.tensor(CLIP))


def test_paper_variant_and_the_ablations():
    g_k, g_0 = _pair((4, 4), 2)
    theta = float((g_0 * g_k).sum() / (g_0 * g_0).sum())
    nk, n0 = g_k.norm(), g_0.norm()
    paper = (g_k / nk - theta * g_0 / n0) * (nk + n0) / 2
    assert torch.allclose(cross_layer_update(g_k, g_0, "paper"), paper)
    assert torch.allclose(cross_layer_update(g_k, g_0, "paper", normalize=False), g_k - theta * g_0)
    assert torch.allclose(
        cross_layer_update(g_k, g_0, "paper", optimize=False), (g_k / nk + g_0 / n0) * (nk + n0) / 2
    )
    assert torch.equal(
        cross_layer_update(g_k, g_0, "paper", normalize=False, optimize=False), g_k + g_0
    )
    with pytest.raises(ConfigurationError, match="variant='nope'"):
        cross_layer_update(g_k, g_0, "nope")


def test_normalised_exact_uses_the_theorem_coefficient_and_is_not_the_projection():
    g_k = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    g_0 = torch.tensor([-3.0, 4.0, 1.0], dtype=torch.float64)  # b < 0 and ||g_0|| > ||g_k||
    a, b = float(g_0 @ g_0), float(g_0 @ g_k)
    nk, n0 = g_k.norm(), g_0.norm()
    expected = (g_k / nk - (b / a) * g_0 / n0) * (nk + n0) / 2
    g = cross_layer_update(g_k, g_0, "exact", normalize=True)
    assert torch.allclose(g, expected)
    assert float(g @ g_0) == pytest.approx(b * (1 / nk - 1 / n0) * (nk + n0) / 2) and g @ g_0 < 0
    assert torch.allclose(
        cross_layer_update(g_k, -g_0, "exact", normalize=True), g_k / nk * (nk + n0) / 2
    )  # b > 0
    # the default (normalize=None) is Theorem 3.1's projection, as normalize=False
    assert torch.allclose(cross_layer_update(g_k, g_0, "exact"), g_k - (b / a) * g_0)
    assert torch.equal(
        cross_layer_update(g_k, g_0, "exact"),
        cross_layer_update(g_k, g_0, "exact", normalize=False),
    )


def test_pairing_rules_for_resnet_and_vit():
    keys = list(create_model("resnet14", 10, 1, 8, width=4).state_dict())
    assert resnet_pairs(keys) == [
        ("layer3.1.conv1.weight", "layer3.0.conv2.weight"), ("layer3.1.conv2.weight", "layer3.0.conv2.weight"),
        ("layer4.1.conv1.weight", "layer4.0.conv2.weight"), ("layer4.1.conv2.weight", "layer4.0.conv2.weight"),
    ]  # fmt: skip
    assert (
        len(resnet_pairs(list(create_model("resnet26", 10, 1, 8, width=4).state_dict())))
        == 4 * 2 * 2
    )
    vit = list(create_model("vit_s8", 10, 1, 8, embed_dim=12, num_heads=2).state_dict())
    assert vit_pairs(vit) == [
        (f"blocks.{i}.norm2.weight", f"blocks.{i}.norm1.weight") for i in range(8)
    ]
    assert resnet_pairs(vit) == [] and vit_pairs(keys) == []
    assert resnet_pairs(["backbone.layer1.1.conv1.weight", "backbone.layer1.0.conv2.weight"]) == [
        ("backbone.layer1.1.conv1.weight", "backbone.layer1.0.conv2.weight")
    ]
    state = {"deep": torch.zeros(2), "zero": torch.zeros(2), "odd": torch.zeros(3)}
    assert inco_pairs(state, pairs=[["deep", "zero"]]) == [("deep", "zero")]
    with pytest.raises(ConfigurationError, match="differ in shape"):
        inco_pairs(state, pairs=[["deep", "odd"]])


def test_inco_apply_skips_pairs_nobody_updated():
    old = {"k": torch.zeros(3), "z": torch.zeros(3), "other": torch.zeros(1)}
    new = {
        "k": torch.tensor([0.01, 0.0, 0.0]),
        "z": torch.tensor([0.0, 0.02, 0.0]),
        "other": torch.ones(1),
    }
    out = inco_apply(old, new, [("k", "z")], {"k", "z", "other"}, "paper")
    expected = cross_layer_update(new["k"], new["z"], "paper")
    assert (
        torch.allclose(out["k"], expected) and out["z"] is new["z"] and out["other"] is new["other"]
    )
    assert inco_apply(old, new, [("k", "z")], {"z"}, "paper")["k"] is new["k"]


# -- InCo wraps an inner aggregator ----------------------------------------------------------------
def _resnet_round(seed=0):
    """A ResNet14 server, clients 0-1 owning ResNet10's keys and 2-3 ResNet14's, and one round of
    uploads (client 0 and client 2) with SCAFFOLD's and FedNova's extras."""
    gen = torch.Generator().manual_seed(seed)
    server = create_model("resnet14", 10, 1, 8, width=4).state_dict()
    small = frozenset(create_model("resnet10", 10, 1, 8, width=4).state_dict())
    keys = [ClientKeys("resnet10", small)] * 2 + [ClientKeys("resnet14", frozenset(server))] * 2

    def trained(owned):
        return {
            k: v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
            for k, v in server.items()
            if k in owned
        }

    uploads = []
    for cid, owned, a in ((0, small, 2.0), (2, frozenset(server), 3.0)):
        weights = trained(owned)
        delta_c = {
            k: torch.randn(v.shape, generator=gen)
            for k, v in weights.items()
            if v.is_floating_point()
        }
        uploads.append(Upload(cid, weights, 10 + cid, 4, {"delta_c": delta_c, "a": a}))
    return server, keys, uploads


def test_default_inco_is_the_owner_mean_then_cross_layer_updates_bitwise():
    server, keys, uploads = _resnet_round()
    agg = InCo(variant="official")
    agg.setup(server, 4, client_keys=keys)
    agg.aggregate(0, uploads)
    mean = {**server, **owner_average(server, [u.weights for u in uploads])}  # uniform weights
    updated = {k for u in uploads for k in u.weights}
    expected = inco_apply(server, mean, resnet_pairs(list(server)), updated, "official")
    assert agg.global_state().keys() == expected.keys()
    assert all(torch.equal(agg.global_state()[k], v) for k, v in expected.items())
    # the deep layers of stage 3 and 4 changed, nothing else did
    changed = {k for k, v in expected.items() if not torch.equal(v, mean[k])}
    assert changed and changed <= {d for d, _ in resnet_pairs(list(server))}
    assert agg.weighting == "uniform" and agg.payload_extras == frozenset()
    assert set(agg.deployables()) == {"global", "resnet10", "resnet14"}
    assert set(agg.configure_round(1, [0])[0].weights) == keys[0].keys


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param(lambda: Scaffold(weighting="samples"), id="Scaffold"),  # default: uniform
        FedNova,
        lambda: FedAdam(server_lr=0.01),
    ],
)
def test_inco_post_processes_any_inner_aggregators_update(inner):
    server, keys, uploads = _resnet_round(seed=1)
    plain, wrapped = inner(), InCo(inner=inner(), variant="paper")
    plain.setup(server, 4, client_keys=keys)
    wrapped.setup(server, 4, client_keys=keys)
    assert wrapped.payload_extras == plain.payload_extras
    assert wrapped.required_upload_extras == plain.required_upload_extras
    assert wrapped.weighting == plain.weighting == "samples"
    plain.aggregate(0, uploads)
    wrapped.aggregate(0, uploads)
    updated = {k for u in uploads for k in u.weights}
    expected = inco_apply(server, plain.global_state(), wrapped.pairs, updated, "paper")
    assert all(torch.equal(wrapped.global_state()[k], v) for k, v in expected.items())
    inner_state, state = plain.state_dict(), wrapped.state_dict()
    assert state.keys() == {"inner", "num_clients"}  # the inner's state, under its attribute
    assert state["inner"].keys() == inner_state.keys()
    for name in set(inner_state) - {"weights", "num_clients"}:  # the inner's own state: c, m, v
        assert all(torch.equal(state["inner"][name][k], v) for k, v in inner_state[name].items())
    clone = InCo(inner=inner(), variant="paper")
    clone.load_state_dict(state)
    assert all(torch.equal(clone.global_state()[k], v) for k, v in expected.items())


def test_inco_refuses_an_inner_without_one_global_model():
    for inner in (FedCross(), FedAvg(within_groups=True)):
        with pytest.raises(ConfigurationError, match="loop.aggregator.init_args.inner"):
            InCo(inner=inner)


def test_inner_is_injected_from_yaml():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--aggregator", type=Aggregator)
    config = parser.parse_string(
        "aggregator:\n  class_path: fedlightning.server.InCo\n  init_args:\n    variant: exact\n"
        "    inner: {class_path: fedlightning.server.Scaffold, init_args: {weighting: uniform}}\n"
    )
    agg = parser.instantiate_classes(config).aggregator
    assert isinstance(agg, InCo) and isinstance(agg.inner, Scaffold) and agg.variant == "exact"
    assert agg.weighting == "uniform" and agg.payload_extras == frozenset({"c"})
    default = parser.instantiate_classes(
        parser.parse_args(["--aggregator", "fedlightning.server.InCo"])
    )
    assert type(default.aggregator.inner) is FedAvg and default.aggregator.weighting == "uniform"


INCO_METHODS = [
    [],
    ["--model.class_path", "fedlightning.clients.FedProx", "--model.init_args.mu", "0.1"],
    ["--model.class_path", "fedlightning.clients.MOON", "--model.init_args.projection_dim", "16"],
    ["--loop.aggregator.init_args.inner", "fedlightning.server.Scaffold",
     "--model.class_path", "fedlightning.clients.ScaffoldClient", "--model.init_args.optimizer", "sgd",
     "--model.init_args.lr", "0.05"],
    ["--loop.aggregator.init_args.inner", "fedlightning.server.FedNova",
     "--model.class_path", "fedlightning.clients.FedNovaClient", "--model.init_args.optimizer", "sgd",
     "--model.init_args.lr", "0.05", "--model.init_args.momentum", "0.5"],
]  # fmt: skip


@pytest.mark.parametrize(
    "args", INCO_METHODS, ids=["InCoAvg", "InCoProx", "InCoMOON", "InCoScaffold", "InCoNova"]
)
def test_inco_methods_run_two_rounds_with_groups(cli, tmp_path, args):
    rows = cli(tmp_path / "run", "--loop.rounds", "2", *args, config="inco_tiny.yaml")
    assert [int(r["round"]) for r in rows] == [1, 2]
    groups = [float(rows[-1][f"{g}/test_acc"]) for g in ("resnet10", "resnet14", "resnet18")]
    assert float(rows[-1]["group_mean_acc"]) == pytest.approx(sum(groups) / 3)
    assert float(rows[-1]["resnet18/test_acc"]) == pytest.approx(float(rows[-1]["test_acc"]))


def test_inco_resume_is_bitwise_equal(cli, tmp_path):
    cli(tmp_path / "straight", config="inco_tiny.yaml")
    cli(tmp_path / "resumed", "--loop.rounds", "1", config="inco_tiny.yaml")
    rows = cli(
        tmp_path / "resumed",
        "--ckpt_path",
        str(tmp_path / "resumed" / "last.ckpt"),
        config="inco_tiny.yaml",
    )
    assert (tmp_path / "straight" / "global.pt").read_bytes() == (
        tmp_path / "resumed" / "global.pt"
    ).read_bytes()
    assert [int(r["round"]) for r in rows] == [1, 2, 3]


def test_fedcross_refuses_client_groups(cli, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(
            tmp_path / "bad",
            "--loop.aggregator",
            "fedlightning.server.FedCross",
            config="inco_tiny.yaml",
        )
    assert exit_info.value.code == 2
    assert "FedCross's middleware models are whole models" in capsys.readouterr().err


CONFIGS = Path(__file__).parents[1] / "configs"


# the offline configs under configs/ run (and resume exactly) in test_resume_all.py
@pytest.mark.parametrize("config", ["inco_cifar10_resnet.yaml", "inco_cifar10_vit.yaml"])
def test_paper_configs_parse(capsys, config):
    sys.argv = ["fedlightning"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "experiments" / config), "--print_config"])
    assert exit_info.value.code == 0
    assert "fedlightning.server.InCo" in capsys.readouterr().out
