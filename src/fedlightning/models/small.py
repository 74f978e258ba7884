"""Small models for digits/MNIST/CIFAR-sized inputs: MLP, LeNet-5 and the FedAvg CNN.

Every model here is ``features`` (input -> flat representation of size ``feature_dim``) followed by
``head`` (a Linear classifier), so objectives that need the representation (MOON) can reach it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedlightning.errors import ConfigurationError
from fedlightning.models.registry import register_model


class FeatureClassifier(nn.Module):
    """``head(features(x))`` with the representation size exposed as ``feature_dim``."""

    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.feature_dim = feature_dim
        self.head = nn.Linear(feature_dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@register_model("mlp")
def mlp(
    num_classes: int, in_channels: int, image_size: int, hidden: Sequence[int] = (200, 200)
) -> nn.Module:
    """Multi-layer perceptron on flattened inputs (the FedAvg paper's 2NN with ``hidden=(200, 200)``)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_channels * image_size * image_size
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return FeatureClassifier(nn.Sequential(*layers), width, num_classes)


@register_model("lenet5")
def lenet5(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """LeNet-5 (LeCun et al. 1998): conv5x5(6) -> pool -> conv5x5(16) -> pool -> 120 -> 84.

    Both convolutions are padded by 2 so that 8x8 inputs work; a 28x28 input gives 16x7x7 features.
    """
    side = image_size // 2 // 2
    _check_side("lenet5", image_size, side)
    return lenet_classifier(num_classes, in_channels, side, padding=2)


def lenet_classifier(num_classes: int, in_channels: int, side: int, padding: int) -> nn.Module:
    """The LeNet-5 stack: ``conv5x5(6) -> ReLU -> pool2 -> conv5x5(16) -> ReLU -> pool2 -> 120 ->
    84`` with both convolutions padded by ``padding``, whose last feature map is ``side x side``
    (serves ``lenet5`` and ``fml_cnn1_code``, FML's CNN1 as the authors' code builds it, which
    differ only in the padding)."""
    features = nn.Sequential(
        nn.Conv2d(in_channels, 6, 5, padding=padding), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, padding=padding), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * side * side, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
    )  # fmt: skip
    return FeatureClassifier(features, 84, num_classes)


@register_model("cnn")
def cnn(
    num_classes: int,
    in_channels: int,
    image_size: int,
    width: int = 32,
    hidden: int = 512,
    batch_norm: bool = False,
) -> nn.Module:
    """The FedAvg CNN (McMahan et al. 2017, arXiv:1602.05629, section 3): two 5x5 convolutions
    (``width`` and ``2*width`` channels, 'same' padding) each followed by 2x2 max pooling, a fully
    connected layer of ``hidden`` units with ReLU, and the classifier. ``batch_norm``: a
    BatchNorm layer after each convolution and after the hidden layer, before its ReLU (the
    pattern of FedBN's CNN, Li et al. 2021, arXiv:2102.07623, appendix)."""
    side = image_size // 2 // 2
    _check_side("cnn", image_size, side)

    def norm(kind: type[nn.Module], size: int) -> list[nn.Module]:
        return [kind(size)] if batch_norm else []

    features = nn.Sequential(
        nn.Conv2d(in_channels, width, 5, padding=2), *norm(nn.BatchNorm2d, width), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 5, padding=2), *norm(nn.BatchNorm2d, 2 * width), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * side * side, hidden), *norm(nn.BatchNorm1d, hidden), nn.ReLU(),
    )  # fmt: skip
    return FeatureClassifier(features, hidden, num_classes)


def _check_side(name: str, image_size: int, side: int) -> None:
    if side < 1:
        raise ConfigurationError(
            f"model {name!r} needs image_size >= 4 (two 2x2 poolings), got {image_size}"
        )
