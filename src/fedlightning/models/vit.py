"""timm's VisionTransformer for the ViT-S/``depth`` family of :mod:`fedlightning.models.hetero`,
its optional convolutional stem and the loading of a local pretrained checkpoint's first blocks.

A module of its own so that timm (and the Hugging Face hub client it imports) loads only when a
ViT is built, not on every ``import fedlightning``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from timm.layers import HybridEmbed, resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer_hybrid import ConvStem

from fedlightning.errors import ConfigurationError, require


class ViT(VisionTransformer):
    """timm's VisionTransformer whose ``forward_features`` is the pooled (class token)
    representation of size ``feature_dim``, followed by ``head``; state_dict keys are timm's
    (``blocks.{i}.norm1.weight`` ...)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.feature_dim = self.embed_dim

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(super().forward_features(x), pre_logits=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


def conv_stem(in_channels: int, embed_dim: int, patch_size: int) -> Callable[..., HybridEmbed]:
    """The convolutional stem of Xiao et al. ("Early Convolutions Help Transformers See Better",
    NeurIPS 2021, arXiv:2106.14881) in place of the ``patch_size`` x ``patch_size`` patchify
    convolution, as ViT's ``embed_layer`` (build the ViT with ``patch_size=1``): ``k =
    log2(patch_size)`` 3x3 stride-2 convolutions, each with BatchNorm and ReLU, whose widths double
    up to ``embed_dim`` (``embed_dim / 2**(k-1) .. embed_dim``), then a 1x1 convolution to
    ``embed_dim``. The token grid is the patchify stem's (``image_size / patch_size`` a side); the
    parameters live under ``patch_embed.backbone.*``, shared by every depth of the family
    (docs/algorithms.md section 2.4, "ViTs from scratch")."""
    k = patch_size.bit_length() - 1
    widths = tuple(embed_dim // 2 ** (k - 1 - i) for i in range(k))
    backbone = ConvStem(
        in_chans=in_channels,
        depth=k + 1,
        channels=(*widths, embed_dim),
        kernel_size=(3,) * k + (1,),
        stride=(2,) * k + (1,),
    )
    return partial(HybridEmbed, backbone=backbone, proj=False)


def load_pretrained_prefix(model: ViT, path: str | Path) -> None:
    """Copy a local checkpoint of a (deeper or equal) ViT into ``model``: blocks
    ``0 .. depth-1``, the embeddings and the final norm. ``head.*`` (the task's new classifier)
    and deeper blocks are skipped; ``pos_embed`` is resampled to the model's patch grid. A missing
    key or another shape is a ConfigurationError. Accepts a bare state_dict or one under
    ``state_dict``/``model``. Nothing is downloaded."""
    file = Path(path)
    require(file.is_file(), "network_kwargs.pretrained_path", str(path), "an existing local file")
    state = torch.load(file, map_location="cpu", weights_only=True)
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and wrapper in state and isinstance(state[wrapper], dict):
            state = state[wrapper]
    own = model.state_dict()
    loaded = {}
    for key, target in own.items():
        if key.startswith("head."):
            continue
        if key not in state:
            raise ConfigurationError(
                f"pretrained_path={str(path)!r} has no {key!r}: not a ViT of depth >= {len(model.blocks)}"
            )
        value = state[key]
        if key == "pos_embed" and value.shape != target.shape:
            value = resample_abs_pos_embed(
                value, list(model.patch_embed.grid_size), num_prefix_tokens=model.num_prefix_tokens
            )
        if value.shape != target.shape:
            raise ConfigurationError(
                f"pretrained_path={str(path)!r}: {key} has shape {tuple(value.shape)}, the model "
                f"needs {tuple(target.shape)} (check embed_dim, patch_size and in_channels)"
            )
        loaded[key] = value
    model.load_state_dict(loaded, strict=False)
