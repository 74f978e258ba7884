"""InCo as the paper words it: layer 0 chosen by shape within the stage, the ViT code's update
divided by E, and the per-round theta/beta statistics."""

from __future__ import annotations

import math

import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model
from fedlightning.protocol import Upload
from fedlightning.server import FedAvg, InCo
from fedlightning.server.inco import inco_apply, inco_pairs, resnet_pairs
from fedlightning.server.inco_stats import pair_statistics


def test_paper_layer0_differs_from_the_code_only_in_stage_1():
    state = create_model("resnet18", 10, 1, 8, width=4).state_dict()
    code = inco_pairs(state, "resnet", layer0="code")
    paper = inco_pairs(state, "resnet", layer0="paper")
    assert code == resnet_pairs(list(state))
    # stage 1 keeps the width in block 0, so its first 3x3 conv (conv1) has the deep layers'
    # shape: it is layer 0, and block 0's conv2 becomes a layer k the code leaves unpaired
    assert set(paper) - set(code) == {
        ("layer1.0.conv2.weight", "layer1.0.conv1.weight"),
        ("layer1.1.conv1.weight", "layer1.0.conv1.weight"),
        ("layer1.1.conv2.weight", "layer1.0.conv1.weight"),
    }
    assert set(code) - set(paper) == {p for p in code if p[0].startswith("layer1.")}
    vit = create_model("vit_s8", 10, 1, 8, embed_dim=12, num_heads=2).state_dict()
    assert inco_pairs(vit, "vit", layer0="paper") == inco_pairs(vit, "vit", layer0="code")
    with pytest.raises(ConfigurationError, match="aggregator.layer0"):
        InCo(layer0="middle")


def _round(scale=0.01, seed=0):
    server = create_model("resnet18", 10, 1, 8, width=4).state_dict()
    gen = torch.Generator().manual_seed(seed)
    uploads = [
        Upload(c, {k: v + scale * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in server.items()}, 10, 3)
        for c in range(2)
    ]  # fmt: skip
    return server, uploads


def test_update_divisor_divides_the_inner_update_before_inco():
    server, uploads = _round()
    plain, divided = (
        FedAvg(weighting="uniform"),
        InCo(update_divisor=4.0, variant="paper", layer0="code"),
    )
    plain.setup(server, 2)
    divided.setup(server, 2)
    plain.aggregate(0, uploads)
    divided.aggregate(0, uploads)
    scaled = {
        k: (v.double() + (plain.weights[k].double() - v.double()) / 4).to(v.dtype) if v.is_floating_point() else v
        for k, v in server.items()
    }  # fmt: skip
    expected = inco_apply(server, scaled, divided.pairs, set(server), "paper")
    assert all(
        torch.allclose(divided.global_state()[k].double(), v.double(), atol=1e-7)
        for k, v in expected.items()
    )
    assert torch.allclose(divided.global_state()["head.weight"] - server["head.weight"], (plain.weights["head.weight"] - server["head.weight"]) / 4, atol=1e-7)  # fmt: skip
    with pytest.raises(ConfigurationError, match="update_divisor"):
        InCo(update_divisor=0)


def test_theta_beta_statistics_by_hand():
    old = {"k": torch.zeros(2), "z": torch.zeros(2), "k2": torch.zeros(2), "z2": torch.zeros(2)}
    new = {"k": torch.tensor([1.0, 1.0]), "z": torch.tensor([2.0, 0.0]), "k2": torch.tensor([-1.0, 0.0]), "z2": torch.tensor([1.0, 0.0])}  # fmt: skip
    stats = pair_statistics(old, new, [("k", "z"), ("k2", "z2")], set(old))
    # pair 1: a = 4, b = 2, theta 0.5, beta 45 degrees; pair 2: a = 1, b = -1, theta -1, beta 180
    assert stats["inco_theta_mean"] == pytest.approx(-0.25)
    assert stats["inco_theta_min"] == pytest.approx(-1.0) and stats[
        "inco_theta_max"
    ] == pytest.approx(0.5)
    assert stats["inco_beta_deg_mean"] == pytest.approx((45 + 180) / 2)
    assert stats["inco_conflict_frac"] == 0.5
    assert pair_statistics(old, new, [("k", "z")], {"k"}) == {}
    assert math.isclose(
        pair_statistics(old, new, [("k", "z")], set(old))["inco_beta_deg_max"], 45.0
    )


def test_inco_options_and_statistics_through_the_cli(cli, tmp_path):
    rows = cli(
        tmp_path, "--loop.rounds", "2", "--loop.aggregator.init_args.layer0", "code",
        "--loop.aggregator.init_args.update_divisor", "2", config="inco_tiny.yaml",
    )  # fmt: skip
    for row in rows:
        assert 0.0 <= float(row["inco_conflict_frac"]) <= 1.0
        assert 0.0 <= float(row["inco_beta_deg_mean"]) <= 180.0
        assert (
            float(row["inco_theta_min"])
            <= float(row["inco_theta_mean"])
            <= float(row["inco_theta_max"])
        )


BASELINES = ["fedavg", "fedprox", "scaffold", "fednova", "moon"]


@pytest.mark.parametrize("method", BASELINES)
def test_within_group_baseline_configs_run(cli, tmp_path, method):
    from pathlib import Path

    config = (
        Path(__file__).parents[1] / "configs" / "inco_baselines" / f"{method}_within_groups.yaml"
    )
    rows = cli(
        tmp_path, "--loop.rounds", "1", "--loop.clients_per_round", "5", "--loop.local_epochs", "1",
        "--loop.plots", "false", "--data.num_clients", "10", config=str(config),
    )  # fmt: skip
    groups = [
        float(rows[-1][f"{g}/test_acc"])
        for g in ("resnet10", "resnet14", "resnet18", "resnet22", "resnet26")
    ]
    assert float(rows[-1]["group_mean_acc"]) == pytest.approx(sum(groups) / 5)
