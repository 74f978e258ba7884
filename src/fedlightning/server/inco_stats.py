"""Per-round statistics of InCo's layer pairs (the quantities of the InCo paper's Figure 9 and
Table 3: how often, and how strongly, a deep layer's server update conflicts with its stage's
layer 0; docs/algorithms.md section 2.4).

For each pair with both layers updated this round, ``g = w_new - w_old`` (the inner aggregator's
update, before InCo), ``a = <g_0, g_0>``, ``b = <g_0, g_k>`` (whole layers, Frobenius):
``theta = b / a`` and the angle ``beta = arccos(b / (||g_k|| ||g_0||))`` in degrees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedlightning.protocol import StateDict


def pair_statistics(
    old: StateDict, new: StateDict, pairs: Sequence[tuple[str, str]], updated: set[str]
) -> dict[str, float]:
    """``inco_theta_mean/min/max``, ``inco_beta_deg_mean/max`` over the round's pairs and
    ``inco_conflict_frac``, the share of pairs with ``b < 0`` (beta above 90 degrees); empty when
    no pair was updated."""
    thetas, betas, conflicts = [], [], 0
    for deep, layer0 in pairs:
        if deep not in updated or layer0 not in updated:
            continue
        g_k = (new[deep].double() - old[deep].double()).flatten()
        g_0 = (new[layer0].double() - old[layer0].double()).flatten()
        a, b = float(g_0 @ g_0), float(g_0 @ g_k)
        norms = math.sqrt(a) * float(torch.linalg.vector_norm(g_k))
        thetas.append(b / a if a > 0 else 0.0)
        betas.append(math.degrees(math.acos(max(-1.0, min(1.0, b / norms)))) if norms > 0 else 90.0)
        conflicts += b < 0
    if not thetas:
        return {}
    return {
        "inco_theta_mean": sum(thetas) / len(thetas),
        "inco_theta_min": min(thetas),
        "inco_theta_max": max(thetas),
        "inco_beta_deg_mean": sum(betas) / len(betas),
        "inco_beta_deg_max": max(betas),
        "inco_conflict_frac": conflicts / len(thetas),
    }
