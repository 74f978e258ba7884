"""Clustered FL's maths as pure functions: Sattler, Müller, Samek, "Clustered Federated Learning:
Model-Agnostic Distributed Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2021,
arXiv:1910.01991 (Algorithm 1's criteria, Algorithm 2's optimal bipartition). docs/algorithms.md
section 2.10."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from fedlightning.protocol import StateDict
from fedlightning.server.summation import wide

Linkage = Literal["single", "complete"]
Bipartition = tuple[list[int], list[int]]


def update_vectors(states: Sequence[StateDict], model: StateDict, keys: Sequence[str]) -> Tensor:
    """The clients' updates ``Delta theta_i = theta_i - theta`` over ``keys`` (the trainable
    parameters, in order), flattened into the rows of one float64 matrix."""
    rows = [torch.cat([(wide(s[k]) - wide(model[k])).flatten() for k in keys]) for s in states]
    return torch.stack(rows)


def cosine_matrix(updates: Tensor) -> Tensor:
    """``alpha_ij = <Delta_i, Delta_j> / (||Delta_i|| ||Delta_j||)``; a zero update has no
    direction: its similarities are 0."""
    norms = updates.norm(dim=1)
    unit = updates / torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(1)
    return unit @ unit.T


def mean_update_norm(updates: Tensor, weights: Sequence[float]) -> float:
    """``|| sum_i (q_i / sum_j q_j) Delta_i ||`` (the paper's ``q_i = |D_i|``): small when the
    cluster's federation is near a stationary point of its joint objective."""
    q = torch.tensor(weights, dtype=updates.dtype, device=updates.device)
    return float(((q / q.sum()).unsqueeze(1) * updates).sum(dim=0).norm())


def _groups(parent: list[int]) -> list[list[int]]:
    """The groups of a union-find forest, each sorted, ordered by their smallest member."""

    groups: dict[int, list[int]] = {}
    for i in range(len(parent)):
        groups.setdefault(_groups_root(parent, i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def single_linkage_bipartition(similarity: Tensor) -> Bipartition:
    """Algorithm 2 (optimal bipartition): join the pairs in order of decreasing similarity (ties:
    the smaller ``(i, j)`` first) until two groups remain. This minimises the largest similarity
    across the two groups over all bipartitions (the cut of a maximum spanning tree's weakest
    edge). The group holding client 0 comes first."""
    size = similarity.shape[0]
    pairs = sorted(
        ((i, j) for i in range(size) for j in range(i + 1, size)),
        key=lambda p: -float(similarity[p[0], p[1]]),
    )
    parent, count = list(range(size)), size
    for i, j in pairs:
        if count == 2:
            break
        ri, rj = _groups_root(parent, i), _groups_root(parent, j)
        if ri != rj:
            parent[ri], count = rj, count - 1
    first, second = _groups(parent)
    return first, second


def _groups_root(parent: list[int], i: int) -> int:
    """The root of ``i`` in a union-find forest."""
    while parent[i] != i:
        i = parent[i]
    return i


def complete_linkage_bipartition(similarity: Tensor) -> Bipartition:
    """The authors' code's split (agglomerative clustering on ``-alpha`` with complete linkage,
    two clusters): repeatedly merge the two groups whose least similar pair is the most similar
    (ties: the groups with the smaller members first) until two remain. The group holding client
    0 comes first."""
    groups = [[i] for i in range(similarity.shape[0])]
    while len(groups) > 2:
        best = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                link = float(similarity[groups[a]][:, groups[b]].min())
                if best is None or link > best[0]:
                    best = (link, a, b)
        _, a, b = best  # type: ignore[misc]
        groups[a] = sorted(groups[a] + groups.pop(b))
    first, second = sorted(groups, key=lambda g: g[0])
    return first, second


def bipartition(similarity: Tensor, linkage: Linkage) -> Bipartition:
    """The two groups of the clients whose pairwise similarities are ``similarity``."""
    if linkage == "single":
        return single_linkage_bipartition(similarity)
    return complete_linkage_bipartition(similarity)


def cross_similarity(similarity: Tensor, split: Bipartition) -> float:
    """``alpha_cross^max = max_{i in c1, j in c2} alpha_ij``."""
    first, second = split
    return float(similarity[first][:, second].max())
