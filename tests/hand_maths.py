"""What the personalized objectives' by-hand tests share: float64 hand-made tensors, the
softmax cross-entropy's analytic gradient on a linear layer, and a small pathological federation
with client test splits."""

import torch

from fedlightning import FederatedDataModule

T = torch.float64


def t(*values):
    """A float64 tensor of ``values``."""
    return torch.tensor(values, dtype=T)


def ce_grad(weight, bias, x, y):
    """d mean CE(x W^T + b, y) / d (W, b), by the softmax's analytic gradient."""
    probs = torch.softmax(x @ weight.T + bias, dim=1)
    residual = (probs - torch.eye(weight.shape[0], dtype=T)[y]) / len(y)
    return residual.T @ x, residual.sum(0)


def pathological(**kwargs):
    """6 clients of 2 of 3 synthetic classes each, a quarter of each one's samples its test split."""
    options = dict(dataset="synthetic", num_samples=300, num_test=60, num_classes=3,
                   sample_shape=(6,), num_clients=6, partition="pathological",
                   classes_per_client=2, client_test_fraction=0.25, batch_size=8, seed=0)  # fmt: skip
    return FederatedDataModule(**{**options, **kwargs})
