"""Per-round statistics of InCo's layer pairs (the quantities of the InCo paper's Figure 9 and
Table 3: how often, and how strongly, a deep layer's server update conflicts with its stage's
layer 0; docs/algorithms.md section 2.4).

For each pair with both layers updated this round, ``g = w_new - w_old`` (the inner aggregator's
update, before InCo), ``a = <g_0, g_0>``, ``b = <g_0, g_k>`` (whole layers, Frobenius):
``theta = b / a`` and the angle ``beta = arccos(b / (||g_k|| ||g_0||))`` in degrees.

:func:`pair_products` computes ``a``, ``b`` and ``||g_k||`` on the weights' device without reading
them back; :func:`summarize` reads them (one device sync) only when the statistics are wanted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from fedlightning.protocol import StateDict
from fedlightning.server.summation import wide


def pair_products(
    old: StateDict, new: StateDict, pairs: Sequence[tuple[str, str]], updated: set[str]
) -> Tensor | None:
    """``[[a, b, ||g_k||], ...]`` (float64, float32 on a device without it) of the round's updated
    pairs, on the weights' device; ``None`` when no pair was updated."""
    rows = []
    for deep, layer0 in pairs:
        if deep not in updated or layer0 not in updated:
            continue
        g_k = (wide(new[deep]) - wide(old[deep])).flatten()
        g_0 = (wide(new[layer0]) - wide(old[layer0])).flatten()
        rows.append(torch.stack([g_0 @ g_0, g_0 @ g_k, torch.linalg.vector_norm(g_k)]))
    return torch.stack(rows) if rows else None


def summarize(products: Tensor | None) -> dict[str, float]:
    """``inco_theta_mean/min/max``, ``inco_beta_deg_mean/max`` over the pairs of
    :func:`pair_products` and ``inco_conflict_frac``, the share of pairs with ``b < 0`` (beta
    above 90 degrees); empty when no pair was updated."""
    if products is None:
        return {}
    thetas, betas, conflicts = [], [], 0
    for a, b, norm_k in products.tolist():
        norms = math.sqrt(a) * norm_k
        thetas.append(b / a if a > 0 else 0.0)
        betas.append(math.degrees(math.acos(max(-1.0, min(1.0, b / norms)))) if norms > 0 else 90.0)
        conflicts += b < 0
    return {
        "inco_theta_mean": sum(thetas) / len(thetas),
        "inco_theta_min": min(thetas),
        "inco_theta_max": max(thetas),
        "inco_beta_deg_mean": sum(betas) / len(betas),
        "inco_beta_deg_max": max(betas),
        "inco_conflict_frac": conflicts / len(thetas),
    }


def pair_statistics(
    old: StateDict, new: StateDict, pairs: Sequence[tuple[str, str]], updated: set[str]
) -> dict[str, float]:
    """:func:`summarize` of :func:`pair_products`: the statistics of one round's pairs."""
    return summarize(pair_products(old, new, pairs, updated))
