"""Heterogeneous clients: the ResNet10..26 and ViT-S/8..12 families, client groups and their
sub-state_dict dispatch, and FedAvg's layer-wise mean over owners (docs/algorithms.md section 2.3)."""

import pytest
import torch

from fedlightning.clients import ClientModule
from fedlightning.clients.groups import assign_groups, check_nested
from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model
from fedlightning.protocol import Upload
from fedlightning.server import FedAvg
from fedlightning.server.base import ClientKeys
from fedlightning.server.inco_pairs import inco_pairs

RESNETS = ["resnet10", "resnet14", "resnet18", "resnet22", "resnet26"]
VITS = ["vit_s8", "vit_s9", "vit_s10", "vit_s11", "vit_s12"]
NARROW_VIT = {"embed_dim": 12, "num_heads": 2}


def _keys(name, **kwargs):
    return create_model(name, num_classes=10, in_channels=1, image_size=8, **kwargs).state_dict()


@pytest.mark.parametrize(
    ("family", "kwargs"),
    [(RESNETS, {"width": 4}), (VITS, NARROW_VIT), (VITS, {**NARROW_VIT, "stem": "conv"})],
)
def test_family_members_are_key_prefixes_of_the_largest(family, kwargs):
    largest = _keys(family[-1], **kwargs)
    sizes = []
    for name in family:
        state = _keys(name, **kwargs)
        assert set(state) <= set(largest)
        assert all(value.shape == largest[key].shape for key, value in state.items())
        sizes.append(len(state))
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)


def test_resnet_blocks_per_stage_and_stems():
    blocks = {
        n: [len(getattr(create_model(n, 10, 3, 32, width=4), f"layer{s}")) for s in range(1, 5)]
        for n in RESNETS
    }
    assert blocks == {
        "resnet10": [1, 1, 1, 1], "resnet14": [1, 1, 2, 2], "resnet18": [2, 2, 2, 2],
        "resnet22": [2, 2, 3, 3], "resnet26": [3, 3, 3, 3],
    }  # fmt: skip
    big = create_model("resnet18", 10, 3, 8, width=4)  # torchvision's stem by default
    assert big.conv1.kernel_size == (7, 7) and isinstance(big.maxpool, torch.nn.MaxPool2d)
    assert create_model("resnet18", 10, 3, 64, width=4, stem="auto").conv1.kernel_size == (7, 7)
    small = create_model("resnet18", 10, 3, 32, width=4, stem="auto")
    assert small.conv1.kernel_size == (3, 3) and small.feature_dim == 32
    assert "layer4.1.conv2.weight" in small.state_dict() and "head.weight" in small.state_dict()


def test_vit_defaults_are_vit_small():
    model = create_model("vit_s8", num_classes=10, in_channels=1, image_size=8)
    assert model.embed_dim == 384 and len(model.blocks) == 8 and model.blocks[0].attn.num_heads == 6
    assert model.patch_embed.grid_size == (4, 4)
    assert create_model("vit_s9", 10, 3, 224, embed_dim=12, num_heads=2).patch_embed.patch_size == (
        16,
        16,
    )
    with pytest.raises(ConfigurationError, match="patch_size"):
        create_model("vit_s8", 10, 1, 8, patch_size=3, **NARROW_VIT)


def test_vit_conv_stem_keeps_the_token_grid_with_stride_2_convolutions():
    patch = create_model("vit_s8", 10, 1, 16, patch_size=4, **NARROW_VIT)
    conv = create_model("vit_s8", 10, 1, 16, patch_size=4, stem="conv", **NARROW_VIT)
    assert conv.patch_embed.grid_size == patch.patch_embed.grid_size == (4, 4)
    assert conv.pos_embed.shape == patch.pos_embed.shape == (1, 1 + 16, 12)
    convs = [m for m in conv.patch_embed.modules() if isinstance(m, torch.nn.Conv2d)]
    # log2(4) = 2 stride-2 3x3 convolutions widening to embed_dim, then a 1x1 one (Xiao et al.)
    assert [(c.kernel_size, c.stride, c.out_channels) for c in convs] == [
        ((3, 3), (2, 2), 6), ((3, 3), (2, 2), 12), ((1, 1), (1, 1), 12),
    ]  # fmt: skip
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in conv.modules()) == 2
    tokens = conv.patch_embed(torch.randn(3, 1, 16, 16))
    assert tokens.shape == (3, 16, 12)
    assert conv(torch.randn(3, 1, 16, 16)).shape == (3, 10)
    # the transformer is unchanged: the same keys outside the stem, so InCo pairs the same layers
    outside = {k for k in conv.state_dict() if not k.startswith("patch_embed.")}
    assert outside == {k for k in patch.state_dict() if not k.startswith("patch_embed.")}
    assert inco_pairs(conv.state_dict()) == inco_pairs(patch.state_dict())  # every rule
    with pytest.raises(ConfigurationError, match="patch_size=6.*power of two"):
        create_model("vit_s8", 10, 1, 12, patch_size=6, stem="conv", **NARROW_VIT)
    with pytest.raises(ConfigurationError, match="stem.*'patch' or 'conv'"):
        create_model("vit_s8", 10, 1, 16, stem="convolutional", **NARROW_VIT)
    with pytest.raises(ConfigurationError, match="stem='conv'.*'patch' with pretrained_path"):
        create_model("vit_s8", 10, 1, 16, stem="conv", pretrained_path="vit.pt", **NARROW_VIT)


def test_vit_pretrained_path_copies_the_first_blocks(tmp_path):
    source = create_model("vit_s12", 5, 1, 16, **NARROW_VIT)
    torch.save({"state_dict": source.state_dict()}, tmp_path / "vit.pt")
    model = create_model(
        "vit_s8", 10, 1, 32, patch_size=4, pretrained_path=str(tmp_path / "vit.pt"), **NARROW_VIT
    )
    own, src = model.state_dict(), source.state_dict()
    assert torch.equal(own["blocks.7.mlp.fc2.weight"], src["blocks.7.mlp.fc2.weight"])
    assert own["pos_embed"].shape == (1, 1 + 64, 12)  # resampled from a 4x4 to an 8x8 grid
    assert own["head.weight"].shape == (10, 12)
    with pytest.raises(ConfigurationError, match="shape"):
        create_model(
            "vit_s8", 10, 1, 16, embed_dim=24, num_heads=2, pretrained_path=str(tmp_path / "vit.pt")
        )
    with pytest.raises(ConfigurationError, match="existing local file"):
        create_model(
            "vit_s8", 10, 1, 16, pretrained_path=str(tmp_path / "missing.pt"), **NARROW_VIT
        )


@pytest.mark.parametrize(
    ("networks", "kwargs"), [(RESNETS[::-1], {"width": 4}), (["vit_s12", "vit_s8"], NARROW_VIT)]
)
def test_groups_smallest_first_and_dispatch_by_key_set(networks, kwargs):
    model = ClientModule(networks=networks, network_kwargs=kwargs, num_classes=10, image_size=8)
    assert model.groups == networks[::-1]
    assert set(model.network.state_dict()) == set(_keys(networks[0], **kwargs))  # the server model
    key_sets = model.client_key_sets(2 * len(networks))
    assert [ck.group for ck in key_sets] == [g for g in model.groups for _ in range(2)]
    server = model.network.state_dict()
    for group, keys in key_sets:
        model.load_network_state({k: v for k, v in server.items() if k in keys})
        assert model.group == group and set(model.network.state_dict()) == keys
        assert model.network(torch.randn(2, 1, 8, 8)).shape == (2, 10)
        assert {id(m) for m in model.modules()} >= {id(model.network)}
        assert sum(1 for _ in model.parameters()) == len(list(model.network.parameters()))
    with pytest.raises(ValueError, match="no client group"):
        model.load_network_state({"head.weight": server["head.weight"]})


def test_architectures_that_do_not_nest_are_refused():
    with pytest.raises(ConfigurationError, match="must nest"):
        ClientModule(networks=["resnet10", "mlp"], network_kwargs={}, num_classes=10, image_size=8)
    a = {"w": torch.zeros(2, 3)}
    b = {"w": torch.zeros(3, 3), "v": torch.zeros(1)}
    with pytest.raises(
        ConfigurationError, match=r"w has shape \(2, 3\) in small but \(3, 3\) in big"
    ):
        check_nested(["small", "big"], [a, b])
    assert assign_groups(10, 5) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    with pytest.raises(ConfigurationError, match="num_clients=3"):
        assign_groups(3, 5)


def _resnet_states(n, seed=0):
    torch.manual_seed(seed)
    return [create_model("resnet14", 10, 1, 8, width=4).state_dict() for _ in range(n)]


def test_one_group_of_resnets_is_fedavg_without_groups_bitwise():
    server, *clients = _resnet_states(4)
    uploads = [Upload(i, s, num_samples=10 * (i + 1), num_steps=1) for i, s in enumerate(clients)]
    plain, grouped = FedAvg(weighting="uniform"), FedAvg(weighting="uniform")
    plain.setup(server, 3)
    grouped.setup(server, 3, client_keys=[ClientKeys("resnet14", frozenset(server))] * 3)
    plain.aggregate(0, uploads)
    grouped.aggregate(0, uploads)
    assert grouped.global_state().keys() == plain.global_state().keys()
    assert all(torch.equal(grouped.global_state()[k], v) for k, v in plain.global_state().items())


def test_resnet_groups_get_their_sub_state_dicts_and_are_deployed_per_group():
    server = _resnet_states(1)[0]
    small = frozenset(create_model("resnet10", 10, 1, 8, width=4).state_dict())
    agg = FedAvg(weighting="uniform")
    agg.setup(
        server,
        4,
        client_keys=[ClientKeys("resnet10", small)] * 2
        + [ClientKeys("resnet14", frozenset(server))] * 2,
    )
    payloads = agg.configure_round(0, [0, 3, 1])
    assert set(payloads[0].weights) == small and payloads[0] is payloads[1]
    assert set(payloads[3].weights) == set(server)
    trained = {k: v + 1 if v.is_floating_point() else v for k, v in payloads[0].weights.items()}
    agg.aggregate(0, [Upload(0, trained, 10, 1)])
    out = agg.global_state()
    assert all(torch.equal(out[k], trained[k]) for k in small if not k.endswith("running_var"))
    assert all(torch.equal(out[k], server[k]) for k in set(server) - small)
    assert set(agg.deployables()) == {"global", "resnet10", "resnet14"}
    assert set(agg.deployables()["resnet10"]) == small
