"""Client-level differential privacy as pure functions over state_dicts (docs/algorithms.md section
7.1): per-client clipping, the noised sum over a fixed denominator, the adaptive clipping norm.

DP-FedAvg: McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent Language
Models", ICLR 2018, arXiv:1710.06963 (Algorithm 1, the fixed-denominator estimator). Adaptive
clipping: Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with Adaptive
Clipping", NeurIPS 2021, arXiv:1905.03871 (Algorithm 1 and Theorem 1).

Computed on the device of the server state, in :func:`~fedlightning.server.summation.wide` dtype
(float64 where the device has it), the noise drawn there from a generator the caller seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedlightning.privacy.bounds import CLIP_RANGE
from fedlightning.protocol import StateDict
from fedlightning.server.functional import clamp_running_var
from fedlightning.server.summation import wide, wide_dtype


def client_update(state: StateDict, server: StateDict) -> StateDict:
    """``u_i = w_i - w`` over the floating entries of the client's (sub-)state_dict ``state``
    (parameters and float buffers such as BatchNorm's running statistics: all a client uploads
    that the server averages), in wide dtype."""
    return {k: wide(v) - wide(server[k]) for k, v in state.items() if v.is_floating_point()}


def flat_norm(update: StateDict) -> Tensor:
    """``||u||_2`` over every entry of ``update`` as one flat vector (a 0-d wide tensor).

    >>> float(flat_norm({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}))
    5.0
    """
    squares = [v.square().sum() for v in update.values()]
    return torch.stack(squares).sum().sqrt() if squares else torch.zeros((), dtype=torch.float64)


def clipped_sum(
    server: StateDict, states: Sequence[StateDict], clip_norm: float
) -> tuple[StateDict, Tensor]:
    """``(sum_i u_i min(1, C / ||u_i||), sum_i [||u_i|| <= C])``: each client's update clipped to
    L2 norm ``C`` as one vector over the keys it owns, summed per key (keys no state owns are
    absent), and the number of updates that were not clipped (a 0-d tensor; the clipped count of
    adaptive clipping, Andrew et al. Algorithm 1).

    >>> server = {"w": torch.zeros(2)}
    >>> total, unclipped = clipped_sum(server, [{"w": torch.tensor([3.0, 4.0])},   # norm 5: halved
    ...                                         {"w": torch.tensor([0.5, 0.5])}], clip_norm=2.5)
    >>> total["w"].tolist(), int(unclipped)
    ([2.0, 2.5], 1)
    """
    total: StateDict = {}
    device = next(iter(server.values())).device
    unclipped = torch.zeros((), dtype=wide_dtype(device), device=device)
    for state in states:
        update = client_update(state, server)
        norm = flat_norm(update).to(device)
        unclipped = unclipped + (norm <= clip_norm).to(unclipped.dtype)
        factor = torch.clamp(clip_norm / norm, max=1.0)  # norm 0: inf, clamped to 1
        for key, value in update.items():
            scaled = value * factor.to(value.dtype)
            total[key] = total[key] + scaled if key in total else scaled
    return total, unclipped


def noised_mean(
    server: StateDict,
    total: Mapping[str, Tensor],
    noise_std: float,
    denominators: Mapping[str, float],
    generator: torch.Generator,
) -> StateDict:
    """The fixed-denominator estimate of the mean (McMahan et al., ICLR 2018, Algorithm 1):
    ``w_p + (S_p + N(0, noise_std^2 I)) / D_p`` for every floating key p of ``server``, with
    ``S_p`` the clipped sum (``total``, 0 for a key no sampled client owns) and ``D_p`` its fixed
    denominator (``q N_p``: the expected number of sampled owners). Every floating key is noised,
    owned this round or not: which keys change must not reveal who was sampled.

    Integer entries (``num_batches_tracked``) keep the server's value: a count a client uploads is
    not bounded by the clipping, so it never reaches the model. ``running_var >= 0`` after the
    noise (post-processing). The noise is drawn in ``server``'s key order from ``generator``, on
    the server's device.
    """
    out: StateDict = {}
    for key, value in server.items():
        if not value.is_floating_point():
            out[key] = value
            continue
        base = wide(value)
        noise = (
            torch.randn(value.shape, generator=generator, device=value.device, dtype=base.dtype)
            * noise_std
        )
        summed = total[key] + noise if key in total else noise
        out[key] = (base + summed / denominators[key]).to(value.dtype)
    return clamp_running_var(out)


def update_noise_multiplier(noise_multiplier: float, count_noise_std: float) -> float:
    """``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``: the noise multiplier of the update sum when the
    clipped count is released too (Andrew et al., NeurIPS 2021, Theorem 1): the two Gaussian
    releases, the update sum (sensitivity ``C``, noise ``z_Delta C``) and the count of
    ``b_i - 1/2`` (sensitivity 1/2, noise ``sigma_b``), compose to one Gaussian mechanism with
    noise multiplier ``z``. Needs ``2 sigma_b > z``.

    >>> round(update_noise_multiplier(1.0, 10.0), 6)  # (1 - 1/400)^(-1/2)
    1.001252
    """
    if not 2 * count_noise_std > noise_multiplier:
        raise ValueError(
            f"the clipped count's noise std {count_noise_std} must exceed half the noise "
            f"multiplier {noise_multiplier}"
        )
    return (noise_multiplier**-2 - (2 * count_noise_std) ** -2) ** -0.5


def adaptive_clip_norm(
    clip_norm: float,
    unclipped: float,
    participants: int,
    count_noise: float,
    expected_clients: float,
    target_quantile: float,
    learning_rate: float,
) -> tuple[float, float]:
    """``(C', b~)``: the geometric update of the clipping norm towards the ``target_quantile``
    (gamma) of the update norms (Andrew et al., NeurIPS 2021, Algorithm 1):
    ``b~ = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2`` with ``b_i = [||u_i|| <= C]`` over the
    round's ``participants``, ``m`` the expected number of clients (a fixed denominator, as for the
    update) and ``count_noise`` the drawn ``N(0, sigma_b^2)``; then
    ``C' = C exp(-eta_C (b~ - gamma))``, held (in log space) in
    :data:`~fedlightning.privacy.bounds.CLIP_RANGE`, the range a given clipping norm may take, so
    that no noise draw can overflow it to inf or underflow it to 0 (post-processing of the released
    count: the privacy is unchanged; docs/algorithms.md section 7.1).

    >>> c, b = adaptive_clip_norm(1.0, unclipped=10, participants=10, count_noise=0.0,
    ...                           expected_clients=10, target_quantile=0.5, learning_rate=0.2)
    >>> round(b, 3), round(c, 4)  # every update unclipped: C shrinks by exp(-0.1)
    (1.0, 0.9048)
    >>> adaptive_clip_norm(1.0, 0, 10, -1e9, 10, 0.5, 10.0)[0]  # an absurd draw: held at the top
    1000000000.0
    """
    fraction = (unclipped - participants / 2 + count_noise) / expected_clients + 0.5
    low, high = CLIP_RANGE
    step = -learning_rate * (fraction - target_quantile)
    log_norm = math.log(clip_norm) + step
    if log_norm >= math.log(high):
        return high, fraction
    if log_norm <= math.log(low):
        return low, fraction
    return clip_norm * math.exp(step), fraction
