"""Clipping an update of unbounded size: one holding Inf or NaN, or too large for its norm to be
represented (docs/algorithms.md section 8, "Outliers of any size"). Norm clipping
(``reference + u * min(1, c / ||u||)``, :func:`fedlightning.server.functional.clip_update`) keeps
the update's direction and bounds its length; with ``||u|| = Inf`` that formula is ``Inf * 0``.

- An update with Inf entries is the limit of updates growing along them: its direction is
  ``sign(u)`` on the infinite entries, 0 elsewhere, normalised.
- A finite update whose norm overflows has the direction of ``u / max|u|``, whose norm does not.
- An update with NaN has no direction: it is clipped to no update (the reference), the one
  point within every radius that says nothing about it.
"""

from __future__ import annotations

from torch import Tensor

from fedlightning.protocol import StateDict
from fedlightning.server.summation import wide


def clip_unbounded(state: StateDict, reference: StateDict, max_norm: float) -> StateDict:
    """``state`` with its update ``u = state - reference`` (floating entries) replaced by
    ``max_norm`` along its direction (module docstring), for an update whose norm is not a finite
    number; integer entries pass through.

    >>> import torch
    >>> out = clip_unbounded({"w": torch.tensor([float("inf"), 1.0, -float("inf")])},
    ...                      {"w": torch.zeros(3)}, max_norm=2.0)
    >>> [round(x, 4) for x in out["w"].tolist()]
    [1.4142, 0.0, -1.4142]
    >>> clip_unbounded({"w": torch.tensor([float("nan"), 1.0])}, {"w": torch.ones(2)}, 2.0)["w"]
    tensor([1., 1.])
    """
    updates = {k: wide(v) - wide(reference[k]) for k, v in state.items() if v.is_floating_point()}
    if any(bool(u.isnan().any()) for u in updates.values()):
        directions = {k: u.zero_() for k, u in updates.items()}
    else:
        directions = _directions(updates)
    length = sum(float(d.pow(2).sum()) for d in directions.values()) ** 0.5
    scale = max_norm / length if length > 0 else 0.0
    return {
        k: (wide(reference[k]) + directions[k] * scale).to(v.dtype) if k in directions else v
        for k, v in state.items()
    }


def _directions(updates: dict[str, Tensor]) -> dict[str, Tensor]:
    """The updates scaled to a largest entry of 1: ``sign(u)`` on the infinite entries (0
    elsewhere) when there are any, ``u / max|u|`` otherwise."""
    peak = max((float(u.abs().max()) for u in updates.values() if u.numel()), default=0.0)
    if peak == float("inf"):
        return {k: u.sign() * u.isinf() for k, u in updates.items()}
    if peak == 0.0:
        return updates
    return {k: u / peak for k, u in updates.items()}
