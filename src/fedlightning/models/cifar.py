"""CIFAR-sized convolutional networks: ResNet-20 and VGG-16 (the FedCross paper's larger models).

Both follow :mod:`fedlightning.models.small`: ``features`` (input -> flat representation of size
``feature_dim``) then ``head`` (one Linear classifier). A ``width`` option scales every layer so
that CPU tests stay small; the defaults are the published sizes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedlightning.errors import ConfigurationError
from fedlightning.models.registry import register_model
from fedlightning.models.small import FeatureClassifier


class ZeroPadShortcut(nn.Module):
    """Option A shortcut (He et al. 2016, section 4.2): subsample by ``stride`` and zero-pad the
    extra channels; parameter-free."""

    def __init__(self, extra_channels: int, stride: int) -> None:
        super().__init__()
        self.before = extra_channels // 2
        self.after = extra_channels - self.before
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, :: self.stride, :: self.stride], (0, 0, 0, 0, self.before, self.after))


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection (torchvision's BasicBlock layout)."""

    def __init__(
        self, in_planes: int, planes: int, stride: int, shortcut: Literal["A", "B"]
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        if stride == 1 and in_planes == planes:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "A":
            self.shortcut = ZeroPadShortcut(planes - in_planes, stride)
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


@register_model("resnet20")
def resnet20(
    num_classes: int,
    in_channels: int,
    image_size: int,
    width: int = 16,
    shortcut: Literal["A", "B"] = "A",
) -> nn.Module:
    """ResNet-20 for CIFAR (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016,
    arXiv:1512.03385, section 4.2): a 3x3 conv stem, three stages of three basic blocks with
    ``width``, ``2*width``, ``4*width`` channels (16/32/64 published; stride 2 at the start of stages
    2 and 3), global average pooling and the classifier; 0.27M parameters at ``width=16``.

    ``shortcut="A"`` (the paper's CIFAR choice, default): parameter-free subsample + zero-pad
    shortcuts where the shape changes; ``"B"``: 1x1 conv + BN projections there. Any image size
    works (global pooling).
    """
    if width < 1:
        raise ConfigurationError(f"resnet20 width must be >= 1, got {width}")
    if shortcut not in ("A", "B"):
        raise ConfigurationError(f"resnet20 shortcut must be 'A' or 'B', got {shortcut!r}")
    stages: list[tuple[str, nn.Module]] = [
        (
            "stem",
            nn.Sequential(
                nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
            ),
        )
    ]
    in_planes = width
    for stage, planes in enumerate((width, 2 * width, 4 * width), start=1):
        blocks = []
        for block in range(3):
            stride = 2 if stage > 1 and block == 0 else 1
            blocks.append(BasicBlock(in_planes, planes, stride, shortcut))
            in_planes = planes
        stages.append((f"layer{stage}", nn.Sequential(*blocks)))
    stages += [("pool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten())]
    model = FeatureClassifier(nn.Sequential(OrderedDict(stages)), in_planes, num_classes)
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return model


#: VGG-16 (configuration D of Simonyan & Zisserman): conv widths, "M" = 2x2 max pooling
VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


@register_model("vgg16")
def vgg16(
    num_classes: int, in_channels: int, image_size: int, width: int = 64, batch_norm: bool = True
) -> nn.Module:
    """VGG-16 for 32x32 inputs (Simonyan & Zisserman, ICLR 2015, arXiv:1409.1556, configuration D):
    thirteen 3x3 convolutions in five blocks (``width`` x 1, 2, 4, 8, 8 channels; 64..512
    published), each conv followed by BatchNorm (``batch_norm=True``, the usual CIFAR adaptation and
    the default) and ReLU, 2x2 max pooling after each block, then one Linear classifier on the
    flattened features (512 at 32x32) instead of the ImageNet 4096-4096 head; 14.7M parameters at
    ``width=64``.

    A pooling that would shrink the feature map below 1x1 is skipped, so 8x8 (digits) and 28x28
    inputs work; at 32x32 the network is unchanged.
    """
    if width < 1:
        raise ConfigurationError(f"vgg16 width must be >= 1, got {width}")
    layers, features = vgg16_features(in_channels, image_size, width, batch_norm)
    return FeatureClassifier(nn.Sequential(*layers, nn.Flatten()), features, num_classes)


def vgg16_features(
    in_channels: int, image_size: int, width: int, batch_norm: bool
) -> tuple[list[nn.Module], int]:
    """VGG-16's convolutional stack (configuration D: ``width`` x 1, 2, 4, 8, 8 channels, each 3x3
    conv followed by BatchNorm if ``batch_norm`` and ReLU, 2x2 max pooling after each block; a
    pooling that would shrink the map below 1x1 is skipped) and its flattened output size."""
    layers: list[nn.Module] = []
    channels, side = in_channels, image_size
    for item in VGG16:
        if item == "M":
            if side >= 2:
                layers.append(nn.MaxPool2d(2))
                side //= 2
            continue
        out = max(1, item * width // 64)
        layers.append(nn.Conv2d(channels, out, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out))
        layers.append(nn.ReLU())
        channels = out
    return layers, channels * side * side
