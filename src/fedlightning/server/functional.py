"""Server maths as pure functions over state_dicts (``dict[str, Tensor]``); no Lightning, no state.

Device-agnostic: every function computes on the device of the tensors it is given and returns
tensors there (the loop keeps the server state on its training device, docs/algorithms.md section
2.1). Floating-point entries are combined in float64 (or, on a device without float64 such as
MPS, by the compensated float32 sum of :mod:`fedlightning.server.summation`) and cast back to
their dtype, so the result does not depend on the order of accumulation more than one rounding.
Integer entries (BatchNorm's ``num_batches_tracked``) are never averaged into floats.

Owner-aware maths (docs/algorithms.md section 2.3): clients may upload sub-state_dicts (the keys of
their own architecture). :func:`owner_combine` applies a combination rule separately to each set of
keys owned by the same uploads, so one rule serves homogeneous and heterogeneous clients: when
every upload owns every key there is one such set, and the result is the rule's own, bit for bit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from fedlightning.protocol import StateDict
from fedlightning.server.summation import WeightedSum, wide, wide_dtype
from fedlightning.server.unbounded import clip_unbounded

#: float buffers that are statistics of the data, not learned weights (torch's normalisation layers)
RUNNING_STATISTICS = ("running_mean", "running_var")


def is_running_statistic(key: str) -> bool:
    """Whether ``key`` names a normalisation layer's running statistic (a float buffer)."""
    return key.rsplit(".", 1)[-1] in RUNNING_STATISTICS


def parameter_keys(state: StateDict) -> list[str]:
    """The floating-point entries of ``state`` that are parameters, in order.

    A state_dict does not say which entries are parameters; normalisation running statistics
    (``*.running_mean``, ``*.running_var``) are the float buffers of every torch model here and
    are left out, integer buffers (``num_batches_tracked``) too.
    """
    return [k for k, v in state.items() if v.is_floating_point() and not is_running_statistic(k)]


def clone_state(state: StateDict) -> StateDict:
    """A detached, contiguous copy of ``state`` on each tensor's own device (own storage per
    tensor).

    >>> state = {"w": torch.tensor([1.0, 2.0])}
    >>> copy = clone_state(state)
    >>> copy["w"].add_(1.0)
    tensor([2., 3.])
    >>> state["w"]
    tensor([1., 2.])
    """
    return {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in state.items()}


def weighted_average(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    """``sum_i (w_i / sum_j w_j) * state_i`` for floating entries, on the first state's device.

    Accumulated in float64 and rounded once to the entry's dtype; on a device without float64
    (MPS) by the compensated float32 sum of :class:`~fedlightning.server.summation.WeightedSum`,
    as exact up to that one rounding. Integer entries are taken from the first state
    (docs/algorithms.md section 2.1: taken from one client, never averaged as floats). All states
    must have the same keys and shapes.

    >>> a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    >>> b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    >>> weighted_average([a, b], [1, 3])
    {'w': tensor([2.5000, 5.0000]), 'n': tensor(3)}
    """
    if not states:
        raise ValueError("weighted_average needs at least one state_dict")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} state_dicts but {len(weights)} weights")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"weights must sum to a positive number, got {list(weights)}")
    coefficients = [float(w) / total for w in weights]
    keys = list(states[0])
    for state in states[1:]:
        if list(state) != keys:
            missing = set(keys) ^ set(state)
            raise ValueError(f"state_dicts have different keys: {sorted(missing)[:5]}")
    out: StateDict = {}
    for key in keys:
        first = states[0][key]
        if not first.is_floating_point():
            out[key] = first.detach().clone()
            continue
        acc = WeightedSum(first.shape, first.device)
        for coefficient, state in zip(coefficients, states, strict=True):
            acc.add(state[key], coefficient)
        out[key] = acc.result(first.dtype)
    return out


def uniform_average(states: Sequence[StateDict]) -> StateDict:
    """The plain mean ``(1/K) sum_i state_i`` (integer entries from the first state).

    >>> uniform_average([{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}])
    {'w': tensor([2., 4.])}
    """
    return weighted_average(states, [1.0] * len(states))


def float_keys(state: StateDict) -> list[str]:
    """Names of the floating-point entries (parameters and float buffers).

    >>> float_keys({"bn.running_mean": torch.zeros(2), "bn.num_batches_tracked": torch.tensor(0)})
    ['bn.running_mean']
    """
    return [k for k, v in state.items() if v.is_floating_point()]


def subtract(a: StateDict, b: StateDict) -> StateDict:
    """``a - b`` on the floating entries of ``a``.

    >>> a = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    >>> subtract(a, {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(2)})
    {'w': tensor([2., 4.])}
    """
    return {k: a[k] - b[k] for k in float_keys(a)}


def _stack(states: Sequence[StateDict], key: str) -> torch.Tensor:
    device = states[0][key].device
    return torch.stack([s[key].detach().to(device, wide_dtype(device)) for s in states])


def coordinate_median(states: Sequence[StateDict]) -> StateDict:
    """Coordinate-wise median (Yin et al., ICML 2018, arXiv:1803.01498, Definition 1).

    For an even number of states the mean of the two middle values is taken. Integer entries are
    taken from the first state. Unweighted: every client counts once.

    >>> states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])},
    ...           {"w": torch.tensor([100.0, -1.0])}]
    >>> coordinate_median(states)
    {'w': tensor([3., 2.])}
    >>> coordinate_median(states[:2])  # even K: the mean of the two middle values
    {'w': tensor([2., 4.])}
    """
    if not states:
        raise ValueError("coordinate_median needs at least one state_dict")
    out: StateDict = {}
    k = len(states)
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first.detach().clone()
            continue
        ordered = _stack(states, key).sort(dim=0).values
        middle = (ordered[(k - 1) // 2] + ordered[k // 2]) / 2
        out[key] = middle.to(first.dtype)
    return out


def trimmed_mean(states: Sequence[StateDict], beta: float) -> StateDict:
    """Coordinate-wise beta-trimmed mean (Yin et al., ICML 2018, arXiv:1803.01498, Definition 2).

    Per coordinate, the ``floor(beta * K)`` largest and smallest of the K values are removed and
    the rest averaged. ``beta`` in [0, 0.5) and at least one value must remain.

    >>> states = [{"w": torch.tensor([v])} for v in (1.0, 2.0, 3.0, 4.0, 100.0)]
    >>> trimmed_mean(states, 0.2)  # floor(0.2 * 5) = 1 value cut at each end: mean of 2, 3, 4
    {'w': tensor([3.])}
    """
    k = len(states)
    cut = int(beta * k)
    if not 0 <= beta < 0.5 or k - 2 * cut < 1:
        raise ValueError(
            f"trimmed_mean beta must lie in [0, 0.5) and leave a value of {k}, got {beta}"
        )
    out: StateDict = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = first.detach().clone()
            continue
        ordered = _stack(states, key).sort(dim=0).values
        out[key] = ordered[cut : k - cut].mean(dim=0).to(first.dtype)
    return out


def update_norm(state: StateDict, reference: StateDict) -> float:
    """``||state - reference||_2`` over the floating entries of ``reference`` that ``state`` has
    (a client's sub-state_dict), as one flat vector.

    >>> update_norm({"w": torch.tensor([3.0, 4.0])}, {"w": torch.zeros(2)})
    5.0
    """
    total = sum(
        float((wide(state[k]) - wide(reference[k])).pow(2).sum())
        for k in float_keys(reference)
        if k in state
    )
    return total**0.5


def clip_update(state: StateDict, reference: StateDict, max_norm: float) -> StateDict:
    """``reference + u * min(1, max_norm / ||u||)`` with ``u = state - reference`` (floating
    entries; integer entries pass through). Bounds each client's influence on the average, at
    any size of ``u`` (Inf/NaN too: :func:`~fedlightning.server.unbounded.clip_unbounded`).

    >>> clip_update({"w": torch.tensor([3.0, 4.0])}, {"w": torch.zeros(2)}, max_norm=1.0)
    {'w': tensor([0.6000, 0.8000])}
    """
    norm = update_norm(state, reference)
    if norm <= max_norm:
        return state
    if not math.isfinite(norm):  # Inf/NaN entries or an overflowing norm: its direction only
        return clip_unbounded(state, reference, max_norm)
    scale = max_norm / norm
    return {
        k: (wide(reference[k]) + (wide(v) - wide(reference[k])) * scale).to(v.dtype)
        if v.is_floating_point()
        else v
        for k, v in state.items()
    }


# -- owner-aware maths --------------------------------------------------------------------------
#: combine the owners' sub-state_dicts: ``(server sub-state, owners' sub-states, owner indices)``
Combine = Callable[[StateDict, list[StateDict], list[int]], StateDict]


def owner_groups(
    server: StateDict, states: Sequence[StateDict]
) -> dict[tuple[int, ...], list[str]]:
    """The server's keys grouped by the indices of the states that own them (in server order);
    keys nobody owns are left out."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for key in server:
        owners = tuple(i for i, s in enumerate(states) if key in s)
        if owners:
            groups.setdefault(owners, []).append(key)
    return groups


def owner_combine(server: StateDict, states: Sequence[StateDict], combine: Combine) -> StateDict:
    """``combine`` applied separately to each set of keys owned by the same states: the new values
    of the keys some state owns (in server order). Keys nobody owns are absent: merge the result
    into ``server`` (``{**server, **out}``) to keep them unchanged."""
    out: StateDict = {}
    for owners, keys in owner_groups(server, states).items():
        sub = {k: server[k] for k in keys}
        out.update(combine(sub, [{k: states[i][k] for k in keys} for i in owners], list(owners)))
    return {k: out[k] for k in server if k in out}


def clamp_running_var(state: StateDict) -> StateDict:
    """BatchNorm ``running_var`` entries clamped to >= 0 (an average of deltas can undershoot)."""
    return {k: v.clamp(min=0) if k.endswith("running_var") else v for k, v in state.items()}


def owner_average(
    server: StateDict, states: Sequence[StateDict], weights: Sequence[float] | None = None
) -> StateDict:
    """The owner-aware mean (HeteroFL/HeteroAvg rule): per key p with owners O_p,
    ``w_p + sum_{c in O_p} q_c (w_{c,p} - w_p) = sum_{c in O_p} q_c w_{c,p}`` with
    ``q_c = weight_c / sum_{O_p} weight`` (uniform by default).

    Evaluated as the owners' :func:`weighted_average`, so when every state owns every key this is
    ``weighted_average(states, weights)`` bit for bit. Integer buffers come from the first owner;
    ``running_var >= 0``; keys nobody owns are absent (see :func:`owner_combine`).

    Example:
        >>> server = {"a": torch.tensor([0.0]), "b": torch.tensor([9.0])}
        >>> owner_average(server, [{"a": torch.tensor([1.0])}, {"a": torch.tensor([3.0]),
        ...                                                      "b": torch.tensor([5.0])}])
        {'a': tensor([2.]), 'b': tensor([5.])}
    """
    weights = [1.0] * len(states) if weights is None else list(weights)
    return clamp_running_var(
        owner_combine(
            server,
            states,
            lambda _, sub, owners: weighted_average(sub, [weights[i] for i in owners]),
        )
    )


def owner_counts(
    keys: Sequence[str], key_sets: Sequence[frozenset[str]] | None, num_clients: int
) -> dict[str, int]:
    """``N_p``: how many of the ``num_clients`` clients own each key (all of them when
    ``key_sets``, one per client, is ``None``).

    >>> owner_counts(["a", "b"], [frozenset("a"), frozenset("ab"), frozenset("a")], 3)
    {'a': 3, 'b': 1}
    >>> owner_counts(["a", "b"], None, 5)
    {'a': 5, 'b': 5}
    """
    if key_sets is None:
        return dict.fromkeys(keys, num_clients)
    clients_of = Counter(key_sets)  # clients share a few key sets: count over those, not clients
    return {k: sum(n for ks, n in clients_of.items() if k in ks) for k in keys}
