"""Model families for heterogeneous clients whose parameter names nest: ResNet10/14/18/22/26 and
ViT-S/8..12 (InCo Aggregation: Chan et al., "Internal Cross-layer Gradients for Extending
Homogeneity to Heterogeneity in Federated Learning", ICLR 2024, arXiv:2308.11464, section 5).

A smaller member of a family has a subset of the largest member's state_dict keys with the same
shapes (ResNets are stage-prefixes of ResNet26, ViT-S/d is the depth-prefix of ViT-S/12), so that
HeteroAvg can average every parameter over the clients that own it. Every model follows
:mod:`fedlightning.models.small`: ``forward_features`` (input -> flat representation of size
``feature_dim``) then ``head`` (one Linear classifier).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock

from fedlightning.errors import require
from fedlightning.models.registry import register_model

#: blocks per stage of each ResNet depth (InCo's ResNet10..26)
RESNET_BLOCKS: dict[int, tuple[int, int, int, int]] = {
    10: (1, 1, 1, 1),
    14: (1, 1, 2, 2),
    18: (2, 2, 2, 2),
    22: (2, 2, 3, 3),
    26: (3, 3, 3, 3),
}
#: ViT-S depths offered as ``vit_s8`` .. ``vit_s12``
VIT_DEPTHS = (8, 9, 10, 11, 12)


class HeteroResNet(nn.Module):
    """A torchvision-layout ResNet of BasicBlocks: ``conv1, bn1, [maxpool], layer1..layer4`` with
    ``width * (1, 2, 4, 8)`` channels (stride 2 at the start of stages 2-4), global average pooling
    and the classifier ``head``. Parameter names are torchvision's (``layer{s}.{j}.conv1.weight``)
    so that InCo's stage pairing rule finds them; the classifier is called ``head`` as in every
    registered model here.

    Args:
        blocks: blocks per stage.
        stem: ``imagenet`` (7x7 stride-2 conv + 3x3 stride-2 max pooling, the paper) or ``small``
            (3x3 stride-1 conv, no pooling: for 8-32 pixel inputs).
    """

    def __init__(
        self,
        blocks: tuple[int, int, int, int],
        num_classes: int,
        in_channels: int,
        width: int = 64,
        stem: Literal["imagenet", "small"] = "imagenet",
    ) -> None:
        super().__init__()
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(3, stride=2, padding=1)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        in_planes = width
        for stage, count in enumerate(blocks):
            planes = width * 2**stage
            layers = []
            for j in range(count):
                stride = 2 if stage > 0 and j == 0 else 1
                downsample = None
                if stride != 1 or in_planes != planes:
                    downsample = nn.Sequential(
                        nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                        nn.BatchNorm2d(planes),
                    )
                layers.append(BasicBlock(in_planes, planes, stride, downsample))
                in_planes = planes
            self.add_module(f"layer{stage + 1}", nn.Sequential(*layers))
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.feature_dim = in_planes
        self.head = nn.Linear(in_planes, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in range(1, 5):
            x = getattr(self, f"layer{stage}")(x)
        return self.pool(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


def _resnet(depth: int):
    def build(
        num_classes: int,
        in_channels: int,
        image_size: int,
        width: int = 64,
        stem: Literal["imagenet", "small", "auto"] = "imagenet",
    ) -> nn.Module:
        require(width >= 1, f"resnet{depth} width", width, "an integer >= 1 (64 in the paper)")
        require(
            stem in ("imagenet", "small", "auto"),
            f"resnet{depth} stem",
            stem,
            "'imagenet', 'small' or 'auto'",
        )
        if stem == "auto":
            stem = "imagenet" if image_size >= 64 else "small"
        return HeteroResNet(RESNET_BLOCKS[depth], num_classes, in_channels, width, stem)

    build.__name__ = f"resnet{depth}"
    build.__doc__ = (
        f"ResNet{depth} of InCo (blocks per stage {list(RESNET_BLOCKS[depth])}, torchvision "
        "BasicBlock, widths ``width * (1, 2, 4, 8)``; 64 in the paper). ``stem``: ``imagenet`` "
        "(torchvision's, default; works down to 8x8 inputs), ``small`` (3x3 stride 1, no pooling: "
        "better for 8-32 pixel inputs) or ``auto`` (``imagenet`` from 64 pixels, else ``small``)."
    )
    return register_model(f"resnet{depth}")(build)


for _depth in RESNET_BLOCKS:
    _resnet(_depth)


def _check_vit(
    depth: int,
    image_size: int,
    patch_size: int,
    embed_dim: int,
    num_heads: int,
    stem: str,
    pretrained_path: str | None,
) -> None:
    """One line naming the first bad ``vit_s{depth}`` argument and what is allowed."""
    require(
        1 <= patch_size <= image_size and image_size % patch_size == 0,
        f"vit_s{depth} patch_size", patch_size, f"a divisor of image_size={image_size}",
    )  # fmt: skip
    require(
        embed_dim >= 1 and num_heads >= 1 and embed_dim % num_heads == 0,
        f"vit_s{depth} embed_dim", embed_dim, f"a positive multiple of num_heads={num_heads}",
    )  # fmt: skip
    require(stem in ("patch", "conv"), f"vit_s{depth} stem", stem, "'patch' or 'conv'")
    require(
        stem == "patch" or pretrained_path is None, f"vit_s{depth} stem", stem,
        "'patch' with pretrained_path (a pretrained ViT has a patchify stem)",
    )  # fmt: skip
    if stem == "conv":
        stride_2_convs = patch_size.bit_length() - 1
        require(
            patch_size >= 2 and patch_size == 2**stride_2_convs
            and embed_dim % 2 ** (stride_2_convs - 1) == 0,
            f"vit_s{depth} patch_size", patch_size,
            f"a power of two >= 2 with embed_dim={embed_dim} divisible by patch_size / 2 "
            "(stem 'conv': one stride-2 convolution per halving)",
        )  # fmt: skip


def _vit(depth: int):
    def build(
        num_classes: int,
        in_channels: int,
        image_size: int,
        patch_size: int | None = None,
        embed_dim: int = 384,
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        pretrained_path: str | None = None,
        stem: Literal["patch", "conv"] = "patch",
    ) -> nn.Module:
        if patch_size is None:
            patch_size = 16 if image_size >= 112 else max(1, image_size // 4)
        _check_vit(depth, image_size, patch_size, embed_dim, num_heads, stem, pretrained_path)
        from fedlightning.models.vit import ViT, conv_stem, load_pretrained_prefix  # timm on use

        if stem == "conv":  # the stem makes the patch grid; the transformer sees 1x1 "patches"
            embed = {"patch_size": 1, "embed_layer": conv_stem(in_channels, embed_dim, patch_size)}
        else:
            embed = {"patch_size": patch_size}
        model = ViT(
            img_size=image_size, in_chans=in_channels, num_classes=num_classes,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, **embed,
        )  # fmt: skip
        if pretrained_path is not None:
            load_pretrained_prefix(model, pretrained_path)
        return model

    build.__name__ = f"vit_s{depth}"
    build.__doc__ = (
        f"ViT-S/{depth}: timm's vit_small_patch16_224 layout (embed 384, 6 heads) with {depth} "
        "blocks and a new head. ``patch_size=None`` takes 16 for inputs of 112 pixels or more and "
        "``image_size // 4`` (a 4x4 patch grid) below. ``pretrained_path``: a local checkpoint "
        "whose first blocks are copied (:func:`fedlightning.models.vit.load_pretrained_prefix`). "
        "``stem``: ``patch`` (ViT's patchify convolution) or ``conv`` (Xiao et al.'s "
        "convolutional stem with the same token grid, :func:`fedlightning.models.vit.conv_stem`; "
        "``patch_size`` a power of two)."
    )
    return register_model(f"vit_s{depth}")(build)


for _depth in VIT_DEPTHS:
    _vit(_depth)
