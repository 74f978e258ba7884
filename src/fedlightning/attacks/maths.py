"""The attacks' maths as pure functions over state_dicts (docs/algorithms.md section 8.1).

An update is ``u_i = w_i - w`` with ``w`` the weights client i received (its payload, restricted
to the keys it uploads). Every function acts on the floating entries (trainable parameters and
BatchNorm running statistics: the attacker controls the whole upload) and returns the integer
entries (``num_batches_tracked``) as uploaded. Arithmetic runs in the server's wide dtype
(float64 where the device has it) and is cast back to each entry's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import torch

from fedlightning.protocol import StateDict
from fedlightning.server.summation import wide


def rescale_update(upload: StateDict, reference: StateDict, coefficient: float) -> StateDict:
    """``w + c (w_i - w)``: sign flipping is ``c = -s``, scaling (model replacement) ``c = gamma``.

    >>> rescale_update({"w": torch.tensor([3.0, 1.0])}, {"w": torch.tensor([1.0, 1.0])}, -4.0)
    {'w': tensor([-7.,  1.])}
    """
    return {
        k: (wide(reference[k]) + coefficient * (wide(v) - wide(reference[k]))).to(v.dtype)
        if v.is_floating_point()
        else v
        for k, v in upload.items()
    }


def gaussian_upload(
    upload: StateDict, reference: StateDict, sigma: float, generator: torch.Generator
) -> StateDict:
    """``w + N(0, sigma^2 I)``: the upload replaced by noise around the weights received. The
    noise is drawn in float64 on the CPU from ``generator``, entry by entry in the upload's key
    order, then moved to each entry's device: the same numbers on every device and backend.

    >>> g = torch.Generator().manual_seed(0)
    >>> out = gaussian_upload({"w": torch.ones(3)}, {"w": torch.zeros(3)}, 0.0, g)
    >>> out["w"].tolist()  # sigma = 0: the weights received
    [0.0, 0.0, 0.0]
    """
    out: StateDict = {}
    for key, value in upload.items():
        if not value.is_floating_point():
            out[key] = value
            continue
        noise = torch.randn(value.shape, generator=generator, dtype=torch.float64)
        base = wide(reference[key])
        out[key] = (base + sigma * noise.to(base.device, base.dtype)).to(value.dtype)
    return out


def alie_z(num_uploads: int, num_malicious: int, variant: str = "all") -> float:
    """The z of "a little is enough" (Baruch, Baruch, Goldberg, NeurIPS 2019, arXiv:1902.06156,
    Algorithm 3): with ``s = floor(n/2 + 1) - m`` the honest "supporters" the attackers need for
    a majority, ``z = Phi^-1((n - s) / n)``, the largest deviation (in standard deviations) that
    still has ``s`` honest values farther from the mean. A malicious majority (``s <= 0``) needs no
    supporters; z is then taken at ``s = 1``.

    >>> round(alie_z(50, 12), 4)  # s = 14: Phi^-1(36 / 50)
    0.5828
    >>> alie_z(2, 1)  # s = 1: Phi^-1(1 / 2)
    0.0

    ``variant="honest"`` is the reference code of Karimireddy, He and Jaggi (ICLR 2022,
    arXiv:2006.09365) for the same s: ``z = Phi^-1((n - m - s) / (n - m))``, a quantile of the
    ``n - m`` honest workers (0 where no honest worker is left beyond the supporters).

    >>> round(alie_z(20, 4), 3), round(alie_z(20, 4, "honest"), 3)  # s = 7
    (0.385, 0.157)
    """
    if not 1 <= num_malicious <= num_uploads:
        raise ValueError(f"ALIE needs 1 <= m <= n, got m={num_malicious}, n={num_uploads}")
    supporters = max(math.floor(num_uploads / 2 + 1) - num_malicious, 1)
    if variant == "honest":
        honest = num_uploads - num_malicious
        if honest - supporters <= 0:
            return 0.0
        return NormalDist().inv_cdf((honest - supporters) / honest)
    return NormalDist().inv_cdf((num_uploads - supporters) / num_uploads)


def alie_update(updates: Sequence[StateDict], z: float, space: str = "gradient") -> StateDict:
    """The malicious update of ALIE per coordinate of the floating entries, with ``mu`` and
    ``sigma`` the mean and the sample standard deviation (``n - 1`` in the denominator; 0 for a
    single update) of ``updates`` ``u_j = w_j - w`` over those that own each key (an owner-aware
    statistic), in the wide dtype:

    - ``space="gradient"``: the attackers send ``mu_g - z sigma_g`` of the pseudo-gradients
      ``g_j = w - w_j = -u_j`` (the reference code's direction: its workers send gradients and
      the server steps ``x - lr * aggregate``); as an update that is ``mu + z sigma``;
    - ``space="update"``: ``mu - z sigma`` of the updates themselves.

    >>> two = [{"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0])}]  # mu 2, sigma sqrt(2)
    >>> alie_update(two, 1.0), alie_update(two, 1.0, "update")
    ({'w': tensor([3.4142], dtype=torch.float64)}, {'w': tensor([0.5858], dtype=torch.float64)})
    """
    if space not in ("gradient", "update"):
        raise ValueError(f"ALIE's space is 'gradient' or 'update', got {space!r}")
    sign = 1.0 if space == "gradient" else -1.0
    out: StateDict = {}
    for key in dict.fromkeys(k for u in updates for k in u):
        owned = [u[key] for u in updates if key in u]
        if not owned[0].is_floating_point():
            continue
        stacked = torch.stack([wide(t) for t in owned])
        std = stacked.std(dim=0) if len(owned) > 1 else torch.zeros_like(stacked[0])
        out[key] = stacked.mean(dim=0) + sign * z * std
    return out


def mean_update(updates: Sequence[StateDict]) -> StateDict:
    """The per-coordinate mean of the floating entries of ``updates`` over those that own each
    key (owner-aware), in the wide dtype; empty for no update.

    >>> mean_update([{"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0]), "v": torch.ones(1)}])
    {'w': tensor([2.], dtype=torch.float64), 'v': tensor([1.], dtype=torch.float64)}
    """
    out: StateDict = {}
    for key in dict.fromkeys(k for u in updates for k in u):
        owned = [wide(u[key]) for u in updates if key in u]
        if owned[0].is_floating_point():
            out[key] = torch.stack(owned).mean(dim=0)
    return out


def flip_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``y -> C - 1 - y``: each class swapped with its mirror (0 <-> C-1, 1 <-> C-2, ...).

    >>> flip_labels(torch.tensor([0, 3, 9]), 10)
    tensor([9, 6, 0])
    """
    return num_classes - 1 - labels
