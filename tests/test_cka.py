"""Linear CKA between clients' layer outputs (analysis/cka.py)."""

import numpy as np
import torch

from fedlightning.analysis.cka import client_cka, layer_outputs, linear_cka, plot_cka
from fedlightning.models import create_model


def test_linear_cka_identities():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=gen)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen))
    assert abs(linear_cka(x, x) - 1) < 1e-12
    assert abs(linear_cka(x, 3.0 * x @ rotation + 2.0) - 1) < 1e-10  # orthogonal, scale, shift
    assert linear_cka(x, torch.randn(50, 4, generator=gen)) < 0.5
    assert linear_cka(x, torch.ones(50, 3)) == 0.0


def test_client_cka_per_stage_and_heat_map(tmp_path):
    torch.manual_seed(0)
    models = {
        "r10": create_model("resnet10", 10, 1, 8, width=4, stem="small"),
        "r14": create_model("resnet14", 10, 1, 8, width=4, stem="small"),
    }
    x = torch.randn(16, 1, 8, 8)
    assert set(layer_outputs(models["r10"], x)) == {
        f"layer{s}{b}" for s in range(1, 5) for b in ("", ".0")
    }
    matrices = client_cka(models, x)
    assert "layer3.1" not in matrices and matrices["layer1"].shape == (2, 2)
    assert all(
        np.allclose(np.diag(m), 1) and 0 <= m.min() <= m.max() <= 1 + 1e-9
        for m in matrices.values()
    )
    stages = {k: v for k, v in matrices.items() if k.startswith("layer") and "." not in k}
    out = plot_cka(stages, list(models), tmp_path / "cka.png")
    assert out.stat().st_size > 0
