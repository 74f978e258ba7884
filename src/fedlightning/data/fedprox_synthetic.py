"""FedProx's synthetic(alpha, beta) federated data (``data.dataset: fedprox_synthetic``).

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. "Federated Optimization in Heterogeneous Networks."
MLSys 2020, arXiv:1812.06127, section 5.1 (and the authors' ``data/synthetic_1_1/
generate_synthetic.py``; docs/algorithms.md section 6.5).

Each device ``k`` has its own model and its own inputs:

    u_k ~ N(0, alpha),  B_k ~ N(0, beta),
    W_k ~ N(u_k, 1) (60 x 10),  b_k ~ N(u_k, 1) (10),  v_k ~ N(B_k, 1) (60),
    x ~ N(v_k, Sigma),  Sigma = diag(j^-1.2), j = 1..60,
    y = argmax softmax(W_k^T x + b_k),

``alpha`` controlling how much the devices' models differ, ``beta`` how much their inputs do. A
device holds ``floor(LogNormal(4, 2)) + 50`` samples, 90% for training and 10% for the pooled
test set, as the authors' code splits them. Decisions: the second argument of ``N(., .)`` is the
standard deviation, as the authors' code draws it (``np.random.normal(0, alpha)``; the paper's
notation reads as a variance: the two agree for 0 and 1, not for the paper's 0.5); one NumPy
generator seeded by ``data.seed`` draws everything, device after device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedlightning.data.sources import DataSplit
from fedlightning.errors import ConfigurationError, require

__all__ = ["load_fedprox_synthetic"]

DIMENSION, CLASSES = 60, 10
OPTIONS = {"alpha": 1.0, "beta": 1.0, "devices": 30}


def load_fedprox_synthetic(seed: int, options: Mapping[str, Any] | None) -> DataSplit:
    """synthetic(alpha, beta) of ``devices`` devices (``data.source_options``: ``alpha``,
    ``beta``, ``devices``; defaults 1, 1, 30); ``client_ids`` tags each training sample with its
    device, for ``partition: natural``."""
    given = dict(options or {})
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"data.source_options {unknown} is not an option of fedprox_synthetic: expected "
            f"{', '.join(OPTIONS)}"
        )
    alpha, beta, devices = (given.get(k, default) for k, default in OPTIONS.items())
    require(alpha >= 0, "data.source_options.alpha", alpha, "a number >= 0")
    require(beta >= 0, "data.source_options.beta", beta, "a number >= 0")
    require(isinstance(devices, int) and devices >= 1, "data.source_options.devices", devices,
            "an int >= 1")  # fmt: skip
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, devices).astype(np.int64) + 50
    model_means, input_means = rng.normal(0, alpha, devices), rng.normal(0, beta, devices)
    scale = np.arange(1, DIMENSION + 1, dtype=np.float64) ** -0.6  # sqrt(j^-1.2)
    train, test = [], []
    for k in range(devices):
        weights = rng.normal(model_means[k], 1, (DIMENSION, CLASSES))
        bias = rng.normal(model_means[k], 1, CLASSES)
        centre = rng.normal(input_means[k], 1, DIMENSION)
        x = centre + scale * rng.standard_normal((int(sizes[k]), DIMENSION))
        y = np.argmax(x @ weights + bias, axis=1)  # softmax keeps the argmax
        cut = int(0.9 * len(x))
        train.append((x[:cut], y[:cut], np.full(cut, k)))
        test.append((x[cut:], y[cut:]))
    return DataSplit(
        torch.as_tensor(np.concatenate([t[0] for t in train]), dtype=torch.float32),
        torch.as_tensor(np.concatenate([t[1] for t in train]), dtype=torch.int64),
        torch.as_tensor(np.concatenate([t[0] for t in test]), dtype=torch.float32),
        torch.as_tensor(np.concatenate([t[1] for t in test]), dtype=torch.int64),
        CLASSES,
        client_ids=np.concatenate([t[2] for t in train]),
    )
