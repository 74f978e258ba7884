"""timm's VisionTransformer for the ViT-S/``depth`` family of :mod:`fedlightning.models.hetero`
and the loading of a local pretrained checkpoint's first blocks.

A module of its own so that timm (and the Hugging Face hub client it imports) loads only when a
ViT is built, not on every ``import fedlightning``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer

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
