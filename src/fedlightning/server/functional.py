"""Server maths as pure functions over state_dicts (``dict[str, Tensor]``); no Lightning, no state.

Floating-point entries are combined in float64 and cast back to their dtype, so the result does not
depend on the order of accumulation more than one rounding. Integer entries (BatchNorm's
``num_batches_tracked``) are never averaged into floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedlightning.protocol import StateDict

#: float buffers that are statistics of the data, not learned weights (torch's normalisation layers)
RUNNING_STATISTICS = ("running_mean", "running_var")


def clone_state(state: StateDict) -> StateDict:
    """A detached, contiguous CPU copy of ``state`` (own storage per tensor).

    >>> state = {"w": torch.tensor([1.0, 2.0])}
    >>> copy = clone_state(state)
    >>> copy["w"].add_(1.0)
    tensor([2., 3.])
    >>> state["w"]
    tensor([1., 2.])
    """
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}


def weighted_average(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    """``sum_i (w_i / sum_j w_j) * state_i`` for floating entries.

    Integer entries are taken from the first state (ALGORITHMS.md 2.1: taken from one client,
    never averaged as floats). All states must have the same keys and shapes.

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
            out[key] = first.detach().to("cpu", copy=True)
            continue
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for coefficient, state in zip(coefficients, states, strict=True):
            acc.add_(state[key].detach().to("cpu", torch.float64), alpha=coefficient)
        out[key] = acc.to(first.dtype)
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
    return torch.stack([s[key].detach().to("cpu", torch.float64) for s in states])


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
            out[key] = first.detach().to("cpu", copy=True)
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
            out[key] = first.detach().to("cpu", copy=True)
            continue
        ordered = _stack(states, key).sort(dim=0).values
        out[key] = ordered[cut : k - cut].mean(dim=0).to(first.dtype)
    return out


def update_norm(state: StateDict, reference: StateDict) -> float:
    """``||state - reference||_2`` over all floating entries, as one flat vector.

    >>> update_norm({"w": torch.tensor([3.0, 4.0])}, {"w": torch.zeros(2)})
    5.0
    """
    total = sum(
        float((state[k].double() - reference[k].double()).pow(2).sum())
        for k in float_keys(reference)
    )
    return total**0.5


def clip_update(state: StateDict, reference: StateDict, max_norm: float) -> StateDict:
    """``reference + u * min(1, max_norm / ||u||)`` with ``u = state - reference`` (floating
    entries; integer entries pass through). Bounds each client's influence on the average.

    >>> clip_update({"w": torch.tensor([3.0, 4.0])}, {"w": torch.zeros(2)}, max_norm=1.0)
    {'w': tensor([0.6000, 0.8000])}
    """
    norm = update_norm(state, reference)
    if norm <= max_norm:
        return state
    scale = max_norm / norm
    return {
        k: (reference[k].double() + (v.double() - reference[k].double()) * scale).to(v.dtype)
        if v.is_floating_point()
        else v
        for k, v in state.items()
    }
