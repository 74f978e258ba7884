"""FedCross's maths as pure functions over state_dicts (docs/algorithms.md section 2.2), tested on
hand-made tensors: :func:`similarity_matrix`, :func:`select_collaborators`,
:func:`propeller_collaborators`, :func:`cross_mix` and :func:`dynamic_alpha`.
:class:`fedlightning.server.fedcross.FedCross` holds the middleware models and applies the schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from fedlightning.protocol import StateDict
from fedlightning.server.functional import parameter_keys, weighted_average
from fedlightning.server.summation import wide_dtype

Selection = Literal["lowest_similarity", "highest_similarity", "in_order"]
SimilarityMeasure = Literal["cosine", "layerwise"]
SELECTIONS = ("lowest_similarity", "highest_similarity", "in_order")
MEASURES = ("cosine", "layerwise")


def layer_groups(keys: Sequence[str]) -> list[list[str]]:
    """``keys`` grouped by owning module (``conv1.weight`` and ``conv1.bias`` form one layer), in
    order of first appearance."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(key.rsplit(".", 1)[0] if "." in key else "", []).append(key)
    return list(groups.values())


def _gram(states: Sequence[StateDict], keys: Sequence[str]) -> Tensor:
    """``G[i, j] = <flat_i, flat_j>`` over ``keys`` in float64 (float32 on a device without it),
    one key at a time (memory K x |key|), on the first state's device."""
    gram = _zeros(states, keys)
    device, dtype = gram.device, gram.dtype
    for key in keys:
        rows = torch.stack([s[key].detach().reshape(-1).to(device, dtype) for s in states])
        gram += rows @ rows.T
    return gram


def _zeros(states: Sequence[StateDict], keys: Sequence[str]) -> Tensor:
    """A K x K zero matrix in the wide dtype of the states' device."""
    device = states[0][keys[0]].device if keys else torch.device("cpu")
    return torch.zeros(len(states), len(states), dtype=wide_dtype(device), device=device)


def _cosine_from_gram(gram: Tensor) -> Tensor:
    norms = gram.diagonal().clamp_min(0).sqrt()
    denominator = torch.outer(norms, norms)
    # a zero-norm model has no direction: its cosine with anything is taken as 0
    return torch.where(
        denominator > 0, gram / denominator.clamp_min(torch.finfo(gram.dtype).tiny), 0.0
    )


def similarity_matrix(
    states: Sequence[StateDict],
    measure: SimilarityMeasure = "cosine",
    keys: Sequence[str] | None = None,
) -> Tensor:
    """The K x K (float64, symmetric) similarity of the models ``states``, on their device (float32
    on a device without float64).

    ``cosine``: ``<X, Y> / (||X|| ||Y||)`` of the models flattened over ``keys`` (the paper's
    equation (5) with the product of norms). ``layerwise`` (the authors' code): the sum over layers of
    the cosine of each layer's flattened (weight, bias) pair, so it lies in ``[-L, L]`` for L layers.
    ``keys`` defaults to :func:`parameter_keys` of the first state.
    """
    if measure not in MEASURES:
        raise ValueError(f"similarity measure must be one of {MEASURES}, got {measure!r}")
    if not states:
        raise ValueError("similarity_matrix needs at least one state_dict")
    keys = parameter_keys(states[0]) if keys is None else list(keys)
    if measure == "cosine":
        return _cosine_from_gram(_gram(states, keys))
    total = _zeros(states, keys)
    for group in layer_groups(keys):
        total += _cosine_from_gram(_gram(states, group))
    return total


def select_collaborators(
    similarity: Tensor, round: int, strategy: Selection = "lowest_similarity"
) -> list[int]:
    """The collaborator ``co(i) != i`` of each of the K trained models (docs/algorithms.md
    section 2.2 step 3).

    ``in_order``: ``co(i) = (i + (round mod (K-1)) + 1) mod K`` (the similarity values are not used,
    only K), so over K-1 consecutive rounds every other model is i's collaborator exactly once.
    ``highest_similarity`` / ``lowest_similarity``: ``argmax`` / ``argmin`` over ``j != i`` of
    ``similarity[i, j]``; ties go to the smallest j.

    Example:
        >>> sim = torch.tensor([[1.0, 0.9, 0.1], [0.9, 1.0, 0.5], [0.1, 0.5, 1.0]])
        >>> select_collaborators(sim, 0, "lowest_similarity")
        [2, 2, 0]
        >>> select_collaborators(sim, 0, "highest_similarity")
        [1, 0, 1]
        >>> select_collaborators(sim, 1, "in_order")
        [2, 0, 1]
    """
    if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a K x K matrix, got shape {tuple(similarity.shape)}")
    k = similarity.shape[0]
    if k < 2:
        raise ValueError(f"collaborators need at least 2 models, got {k}")
    if strategy == "in_order":
        offset = round % (k - 1) + 1
        return [(i + offset) % k for i in range(k)]
    if strategy not in SELECTIONS:
        raise ValueError(f"strategy must be one of {SELECTIONS}, got {strategy!r}")
    # i is left out by position, not by an infinite diagonal, so co(i) != i even when a row holds
    # +-inf; the index into row i without its diagonal maps back as j = t + (t >= i). Computed on
    # the similarity's device; only the K indices are read back.
    values = similarity.detach()
    eye = torch.eye(k, dtype=torch.bool, device=values.device)
    others = values[~eye].reshape(k, k - 1)
    t = others.argmax(dim=1) if strategy == "highest_similarity" else others.argmin(dim=1)
    return (t + (t >= torch.arange(k, device=t.device)).long()).tolist()


def propeller_collaborators(num_models: int, round: int) -> list[tuple[int, int]]:
    """The two in-order propeller models ``(p1(i), p2(i))`` of each model i (paper 3.2.4).

    ``p1(i) = (i + o) mod K`` and ``p2(i) = (i + o + 1) mod K`` with ``o = (round mod (K-1)) + 1``,
    skipping i itself: ``p1`` is the in-order collaborator and ``p2`` the next model after it in the
    ring of the others. With K = 2 both are the one other model.
    """
    if num_models < 2:
        raise ValueError(f"propeller models need at least 2 models, got {num_models}")
    offset = round % (num_models - 1)
    pairs = []
    for i in range(num_models):
        others = [(i + 1 + t) % num_models for t in range(num_models - 1)]
        pairs.append((others[offset], others[(offset + 1) % (num_models - 1)]))
    return pairs


def cross_mix(own: StateDict, collaborators: Sequence[StateDict], alpha: float) -> StateDict:
    """``alpha * own + (1 - alpha) * mean(collaborators)`` (step 4; propellers pass two).

    Float entries, BatchNorm running statistics included, are mixed like parameters (a BN layer's
    statistics then stay consistent with its mixed weights); integer entries (``num_batches_tracked``)
    are ``own``'s. Computed in float64, cast back to each entry's dtype.

    Example:
        >>> mixed = cross_mix({"w": torch.tensor([1.0])}, [{"w": torch.tensor([3.0])}], alpha=0.75)
        >>> mixed["w"]
        tensor([1.5000])
    """
    if not collaborators:
        raise ValueError("cross_mix needs at least one collaborator")
    share = (1.0 - alpha) / len(collaborators)
    return weighted_average([own, *collaborators], [alpha] + [share] * len(collaborators))


def dynamic_alpha(step: int, alpha_start: float, alpha_step: float, alpha_max: float) -> float:
    """The dynamic-alpha ramp ``min(alpha_max, alpha_start + step * alpha_step)``.

    Example:
        >>> dynamic_alpha(10, 0.5, 0.005, 0.99), dynamic_alpha(1000, 0.5, 0.005, 0.99)
        (0.55, 0.99)
    """
    return min(alpha_max, alpha_start + step * alpha_step)
