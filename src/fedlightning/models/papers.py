"""Architectures named by the seed papers: torchvision's VGG-16 shape (FedCross Table 1) and
FML's CNN1/CNN2 (FML Table 1, the authors' released ``Model.py`` shapes).

Every model follows :mod:`fedlightning.models.small`: ``features`` then ``head`` (one Linear).
"""

from __future__ import annotations

from torch import nn

from fedlightning.errors import ConfigurationError
from fedlightning.models.cifar import vgg16_features
from fedlightning.models.registry import register_model
from fedlightning.models.small import FeatureClassifier, lenet_classifier


@register_model("vgg16_torchvision")
def vgg16_torchvision(
    num_classes: int,
    in_channels: int,
    image_size: int,
    width: int = 64,
    hidden: int = 4096,
    dropout: float = 0.5,
) -> nn.Module:
    """torchvision's ``vgg16`` (configuration D, no BatchNorm) adapted to 32x32 inputs: thirteen
    3x3 convolutions with ReLU (``width`` x 1, 2, 4, 8, 8 channels), 2x2 max pooling after each
    block, then the ImageNet head ``Linear(d, hidden) -> ReLU -> Dropout -> Linear(hidden, hidden)
    -> ReLU -> Dropout`` and the classifier, ``hidden = 4096`` as published. The adaptation: at
    32x32 the features are 512 x 1 x 1, so ``d = 512`` is flattened directly where torchvision's
    adaptive 7x7 average pooling would copy that one position 49 times (``d = 25088``); 33.6M
    parameters at the defaults with 10 classes. A pooling that would shrink the map below 1x1 is
    skipped (as :func:`fedlightning.models.cifar.vgg16`). The BatchNorm variant with one Linear head
    is ``vgg16``.
    """
    if width < 1 or hidden < 1 or not 0.0 <= dropout < 1.0:
        raise ConfigurationError(
            f"vgg16_torchvision needs width >= 1, hidden >= 1 and dropout in [0, 1), got "
            f"{width}, {hidden}, {dropout}"
        )
    layers, features = vgg16_features(in_channels, image_size, width, batch_norm=False)
    layers += [
        nn.Flatten(),
        nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
    ]  # fmt: skip
    return FeatureClassifier(nn.Sequential(*layers), hidden, num_classes)


@register_model("fml_cnn1")
def fml_cnn1(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """FML's CNN1: ``conv5x5(6) -> ReLU -> pool2 -> conv5x5(16) -> ReLU -> pool2 -> 120 -> 84`` with
    unpadded convolutions (16 x 5 x 5 features at 32x32, 16 x 4 x 4 at 28x28)."""
    side = ((image_size - 4) // 2 - 4) // 2
    _check("fml_cnn1", image_size, side, 16)
    return lenet_classifier(num_classes, in_channels, side, padding=0)


@register_model("fml_cnn2")
def fml_cnn2(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """FML's CNN2: ``conv3x3(32) -> ReLU -> pool2 -> conv3x3(64) -> ReLU -> pool2 -> conv3x3(64)
    -> ReLU -> 64``, unpadded (64 x 4 x 4 features at 32x32, 64 x 3 x 3 at 28x28)."""
    side = ((image_size - 2) // 2 - 2) // 2 - 2
    _check("fml_cnn2", image_size, side, 18)
    features = nn.Sequential(
        nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * side * side, 64), nn.ReLU(),
    )  # fmt: skip
    return FeatureClassifier(features, 64, num_classes)


def _check(name: str, image_size: int, side: int, minimum: int) -> None:
    if side < 1:
        raise ConfigurationError(f"model {name!r} needs image_size >= {minimum}, got {image_size}")
