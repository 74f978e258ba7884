import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model, list_models

# the ResNet10..26 and ViT-S families default to the papers' widths (seconds per build on a CPU);
# their defaults are exercised in test_hetero_models.py, here they are built narrow
NARROW = {"resnet": {"width": 4}, "vit_s": {"embed_dim": 12, "num_heads": 2}}


#: models built narrow by exact name; the smallest input side a model takes (smaller: a clear error)
EXACT = {"vgg16_torchvision": {"width": 8, "hidden": 64}}
MIN_SIDE = {"fml_cnn1_code": 16, "fml_cnn2_code": 18}


def _narrow(name):
    if name in EXACT:
        return EXACT[name]
    return next(
        (
            kw
            for prefix, kw in NARROW.items()
            if name.startswith(prefix) and name[len(prefix)].isdigit()
        ),
        {},
    )


@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize(("channels", "size"), [(1, 8), (1, 28), (3, 32)])
def test_every_model_builds_and_classifies(name, channels, size):
    if size < MIN_SIDE.get(name, 0):
        with pytest.raises(ConfigurationError, match=f"needs image_size >= {MIN_SIDE[name]}"):
            create_model(name, num_classes=7, in_channels=channels, image_size=size)
        return
    model = create_model(
        name, num_classes=7, in_channels=channels, image_size=size, **_narrow(name)
    )
    logits = model(torch.randn(2, channels, size, size))
    assert logits.shape == (2, 7)
    features = model.forward_features(torch.randn(2, channels, size, size))
    assert features.shape == (2, model.feature_dim)


def test_fedavg_cnn_is_two_5x5_convs_and_two_fc():
    model = create_model("cnn", num_classes=10, in_channels=1, image_size=28)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [c.kernel_size for c in convs] == [(5, 5), (5, 5)]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [
        (64 * 7 * 7, 512),
        (512, 10),
    ]


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="unknown model 'resnet9000'.*cnn"):
        create_model("resnet9000", num_classes=10)
    with pytest.raises(ConfigurationError, match="image_size >= 4"):
        create_model("cnn", num_classes=10, image_size=2)


def test_vgg16_torchvision_is_torchvision_vgg16_with_a_32x32_head():
    import torchvision

    ours = create_model("vgg16_torchvision", num_classes=10, in_channels=3, image_size=32)
    reference = torchvision.models.vgg16(weights=None, num_classes=10)
    shapes = [tuple(p.shape) for p in ours.parameters()]
    expected = [tuple(p.shape) for p in reference.parameters()]
    # identical but for the first head layer: 512 x 1 x 1 flattened instead of 7x7-pooled 25088
    assert (
        shapes[:26] == expected[:26] and shapes[26] == (4096, 512) and expected[26] == (4096, 25088)
    )
    assert shapes[27:] == expected[27:]
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in ours.modules())
    assert sum(isinstance(m, torch.nn.Dropout) for m in ours.modules()) == 2
    assert any(
        isinstance(m, torch.nn.BatchNorm2d) for m in create_model("vgg16", 10, 3, 32).modules()
    )


@pytest.mark.parametrize(
    ("name", "size", "flat"),
    [
        ("fml_cnn1_code", 32, 16 * 5 * 5),
        ("fml_cnn1_code", 28, 16 * 4 * 4),
        ("fml_cnn2_code", 32, 64 * 4 * 4),
        ("fml_cnn2_code", 28, 64 * 3 * 3),
    ],
)
def test_fml_cnns_of_the_authors_code_have_its_shapes(name, size, flat):
    model = create_model(name, num_classes=10, in_channels=1, image_size=size)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert linears[0].in_features == flat
    if name == "fml_cnn1_code":
        assert [(c.out_channels, c.kernel_size) for c in convs] == [(6, (5, 5)), (16, (5, 5))]
        assert [m.out_features for m in linears] == [120, 84, 10]
    else:
        assert [(c.out_channels, c.kernel_size) for c in convs] == [
            (32, (3, 3)),
            (64, (3, 3)),
            (64, (3, 3)),
        ]
        assert [m.out_features for m in linears] == [64, 10]


def _layer_plan(model):
    """The model's layers in forward order as ``(kind, detail)``: ``conv`` (out channels, kernel,
    padding), ``pool`` (kernel), ``fc`` (in, out); activations and flattening left out."""
    plan = []
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            plan.append(("conv", (m.out_channels, m.kernel_size, m.padding)))
        elif isinstance(m, torch.nn.MaxPool2d):
            plan.append(("pool", m.kernel_size))
        elif isinstance(m, torch.nn.Linear):
            plan.append(("fc", (m.in_features, m.out_features)))
    return plan


@pytest.mark.parametrize(("size", "side"), [(28, 7), (32, 8)])
def test_fml_cnn1_is_the_papers_text(size, side):
    # two 3x3 convolutions with 6 and 16 channels, two fully connected layers (section 1.6:
    # 'same' padding, 2x2 pooling after each convolution, hidden width 120)
    model = create_model("fml_cnn1", num_classes=10, in_channels=3, image_size=size)
    conv = lambda c: ("conv", (c, (3, 3), (1, 1)))  # noqa: E731
    assert _layer_plan(model) == [
        conv(6), ("pool", 2), conv(16), ("pool", 2), ("fc", (16 * side * side, 120)), ("fc", (120, 10)),
    ]  # fmt: skip
    assert model(torch.randn(2, 3, size, size)).shape == (2, 10)
    assert _layer_plan(create_model("fml_cnn1", 10, 1, 28, hidden=64))[-1] == ("fc", (64, 10))


@pytest.mark.parametrize(("size", "side"), [(28, 3), (32, 4), (8, 1)])
def test_fml_cnn2_is_the_papers_text(size, side):
    # three 3x3 convolutions with 128 channels and one fully connected layer
    model = create_model("fml_cnn2", num_classes=10, in_channels=1, image_size=size)
    block = [("conv", (128, (3, 3), (1, 1))), ("pool", 2)]
    assert _layer_plan(model) == [*block, *block, *block, ("fc", (128 * side * side, 10))]
    assert model.feature_dim == 128 * side * side
    with pytest.raises(ConfigurationError, match="needs image_size >= 8"):
        create_model("fml_cnn2", num_classes=10, in_channels=1, image_size=7)


def test_karimireddy_cnn_is_their_mnist_net():
    """conv3x3(32), conv3x3(64), one 2x2 pooling, fc 9216 -> 128 -> 10, with dropout (their code's
    ``codes/tasks/mnist.py``): 1,199,882 parameters at 28x28, as the PyTorch MNIST example's."""
    model = create_model("karimireddy_cnn", num_classes=10, in_channels=1, image_size=28)
    assert _layer_plan(model) == [
        ("conv", (32, (3, 3), (0, 0))), ("conv", (64, (3, 3), (0, 0))), ("pool", 2),
        ("fc", (9216, 128)), ("fc", (128, 10)),
    ]  # fmt: skip
    assert sum(p.numel() for p in model.parameters()) == 1_199_882
    assert [type(m).__name__ for m in model.modules() if "Dropout" in type(m).__name__] == [
        "Dropout2d", "Dropout",
    ]  # fmt: skip
    with pytest.raises(ConfigurationError, match="needs image_size >= 6"):
        create_model("karimireddy_cnn", num_classes=10, image_size=5)
