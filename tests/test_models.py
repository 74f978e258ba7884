import pytest
import torch

from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model, list_models

# the ResNet10..26 and ViT-S families default to the papers' widths (seconds per build on a CPU);
# their defaults are exercised in test_hetero_models.py, here they are built narrow
NARROW = {"resnet": {"width": 4}, "vit_s": {"embed_dim": 12, "num_heads": 2}}


def _narrow(name):
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
