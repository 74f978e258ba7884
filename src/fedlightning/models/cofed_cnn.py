"""CoFED's random CNN family: Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task
learning via co-training", arXiv:2202.08603 (Table 1; docs/algorithms.md section 3).

Every CoFED participant owns a differently shaped network; the family is drawn from a seed so that a
run's architectures are reproducible and each participant gets its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import nn

from fedlightning.errors import ConfigurationError
from fedlightning.models.registry import register_model
from fedlightning.models.small import FeatureClassifier

#: the channel widths a random CoFED CNN draws its layers' widths from (paper Table 1)
COFED_WIDTHS = (20, 24, 32, 40, 48, 56, 80, 96)


def draw_cofed_widths(seed: int, replace: bool = True) -> tuple[int, ...]:
    """The conv widths of the random CoFED CNN of ``seed``.

    depth ~ U{2, 3}; the widths are ``depth`` values drawn uniformly from :data:`COFED_WIDTHS`,
    with replacement (default: the authors' code; the paper's Table 1 has a "32, 32" network) or
    without (``replace=False``: every layer strictly wider than the previous one), sorted
    ascending, so the network never narrows with depth.
    """
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(2, 4))
    return tuple(sorted(int(w) for w in rng.choice(COFED_WIDTHS, size=depth, replace=replace)))


@register_model("cofed_cnn")
def cofed_cnn(
    num_classes: int,
    in_channels: int,
    image_size: int,
    seed: int = 0,
    widths: Sequence[int] | None = None,
) -> nn.Module:
    """A CoFED CNN: per width ``w_l``, ``conv3x3(w_l, padding 1) -> BatchNorm -> ReLU``, with a
    2x2 max-pool after each of the first two blocks, then global average pooling and
    ``Linear(w_last, num_classes)``.

    ``widths`` (2 or 3 ascending values) fixes the architecture; otherwise it is drawn from ``seed``
    by :func:`draw_cofed_widths`. ``feature_dim`` is the last width.
    """
    if widths is None:
        widths = draw_cofed_widths(seed)
    widths = [int(w) for w in widths]
    if len(widths) not in (2, 3) or any(w < 1 for w in widths) or widths != sorted(widths):
        raise ConfigurationError(
            f"cofed_cnn widths={widths} is not allowed: expected 2 or 3 positive widths in ascending order"
        )
    if image_size < 4:
        raise ConfigurationError(
            f"model 'cofed_cnn' needs image_size >= 4 (two 2x2 poolings), got {image_size}"
        )
    layers: list[nn.Module] = []
    previous = in_channels
    for depth, width in enumerate(widths):
        layers += [nn.Conv2d(previous, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        if depth < 2:
            layers.append(nn.MaxPool2d(2))
        previous = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    model = FeatureClassifier(nn.Sequential(*layers), previous, num_classes)
    model.widths = tuple(widths)
    return model
