"""Linear CKA between clients' layer outputs (Kornblith et al., "Similarity of Neural Network
Representations Revisited", ICML 2019, arXiv:1905.00414), as used by InCo Aggregation (Chan et al.,
ICLR 2024, arXiv:2308.11464, section 3.1) to show that shallow layers of heterogeneous clients are
more alike than deep ones.

Usage: ``matrices = client_cka({"client 0": net0, "client 1": net1, ...}, x_test)`` then
``plot_cka(matrices, list(names), "cka.png")``: one clients x clients heat map per stage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from fedlightning.analysis.plots import save

#: the modules whose outputs are compared: ResNet stages and their blocks, ViT blocks
DEFAULT_LAYERS = r"(.*\.)?(layer\d+(\.\d+)?|blocks\.\d+)"


def linear_cka(x: Tensor, y: Tensor) -> float:
    """``||Y_c^T X_c||_F^2 / (||X_c^T X_c||_F ||Y_c^T Y_c||_F)`` for ``x`` (n, p) and ``y`` (n, q)
    with column-centred ``X_c``, ``Y_c`` (float64). 1 for identical representations; invariant to
    orthogonal transforms and isotropic scaling; 0 when either is constant."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y need the same number of rows, got {x.shape[0]} and {y.shape[0]}")
    xc = x.reshape(len(x), -1).double()
    yc = y.reshape(len(y), -1).double()
    xc, yc = xc - xc.mean(0), yc - yc.mean(0)
    denominator = torch.linalg.norm(xc.T @ xc) * torch.linalg.norm(yc.T @ yc)
    if denominator == 0:
        return 0.0
    return float(torch.linalg.norm(yc.T @ xc) ** 2 / denominator)


@torch.no_grad()
def layer_outputs(model: nn.Module, x: Tensor, pattern: str = DEFAULT_LAYERS) -> dict[str, Tensor]:
    """The output of every submodule whose name fully matches ``pattern``, flattened per sample,
    for one forward pass of ``x`` in eval mode (the model's mode is restored)."""
    outputs: dict[str, Tensor] = {}
    hooks = [
        module.register_forward_hook(
            lambda _m, _i, out, name=name: outputs.__setitem__(name, out.flatten(1))
        )
        for name, module in model.named_modules()
        if name and re.fullmatch(pattern, name)
    ]
    training = model.training
    try:
        model.eval()
        model(x)
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    return outputs


def client_cka(
    models: Mapping[str, nn.Module], x: Tensor, pattern: str = DEFAULT_LAYERS
) -> dict[str, np.ndarray]:
    """Per layer present in every model, the (clients x clients) matrix of linear CKA between the
    clients' outputs on the batch ``x``."""
    outputs = [layer_outputs(m, x, pattern) for m in models.values()]
    shared = [name for name in outputs[0] if all(name in o for o in outputs)]
    result = {}
    for name in shared:
        k = len(outputs)
        matrix = np.ones((k, k))
        for i in range(k):
            for j in range(i + 1, k):
                matrix[i, j] = matrix[j, i] = linear_cka(outputs[i][name], outputs[j][name])
        result[name] = matrix
    return result


def plot_cka(matrices: Mapping[str, np.ndarray], names: Sequence[str], out: str | Path) -> Path:
    """One heat map per layer (CKA in [0, 1]), the models on both axes, side by side: the model
    names label the rows of the first panel only and the columns of every panel (slanted), so no
    label runs into a neighbouring panel; constrained layout makes room for them."""
    from matplotlib.figure import Figure

    layers = list(matrices)
    fig = Figure(figsize=(2.6 * len(layers) + 1.6, 3.2), layout="constrained")
    axes = fig.subplots(1, len(layers), squeeze=False, sharey=True)[0]
    for index, (ax, layer) in enumerate(zip(axes, layers, strict=True)):
        image = ax.imshow(matrices[layer], vmin=0, vmax=1, cmap="viridis")
        ax.set_title(layer)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        if index == 0:  # shared: the other panels show no row labels
            ax.set_yticks(range(len(names)), names, fontsize=7)
    fig.colorbar(image, ax=list(axes), label="Linear CKA", shrink=0.8)
    return save(fig, out, dpi=130)
