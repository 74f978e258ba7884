"""A cohort's batches for one round, drawn once: row indices into the round's data on the device
(docs/algorithms.md section 9.2).

Each client's batches are those of its sequential fit: its loader
(:func:`~fedlightning.attacks.labels.training_batches`, seeded from ``(seed, "fit", round,
client)``) draws each pass's shuffle (:meth:`~fedlightning.data.loader.TensorBatches.batch_rows`),
passes follow one another until ``local_epochs`` passes or ``local_steps`` steps. :meth:`RoundPlan.
build` draws them all before the first step, concatenates the clients' samples into one tensor on
the device (``x``, ``y``) and turns each step into row indices into it:

- a *full* step (every client has a batch, all of one size; the common case) is one ``[C, B]``
  index tensor, sliced from ``full_rows[B]`` (the full steps of batch size ``B``), which goes to
  the device once per round: the step's batches are one gather there, with no host work and no
  synchronisation;
- any other step (a client out of batches, a shorter last batch) lists its active clients by
  batch size, each group with its ``[G, B]`` rows (the general path, as many vmaps as sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Group:
    """The clients (cohort positions, ``index`` on the device) that take a step with batches of
    one size, and their batches' ``rows`` (``[len(index), B]`` on the device)."""

    index: Tensor
    rows: Tensor


@dataclass
class PlanStep:
    """One step of the round: ``full`` (an index into ``RoundPlan.full_rows[size]``), or
    ``groups`` with ``active`` (bool ``[C]`` on the device: the clients that take this step)."""

    full: int | None = None
    size: int = 0
    groups: list[Group] = field(default_factory=list)
    active: Tensor | None = None


@dataclass
class RoundPlan:
    """Every batch of a cohort's round (module docstring). ``num_steps[c]``: client ``c``'s
    optimizer steps."""

    x: Tensor
    y: Tensor
    full_rows: dict[int, Tensor]  #: per batch size ``B``: ``[full steps, C, B]`` on the device
    steps: list[PlanStep]
    num_steps: list[int]

    @classmethod
    def build(
        cls,
        loaders: Sequence[Any],
        epochs: int,
        max_steps: int | None,
        device: torch.device,
        budgets: Sequence[int | None] | None = None,
    ) -> RoundPlan:
        """The plan of clients whose loaders are ``loaders`` (one per cohort position), for
        ``epochs`` passes or exactly ``max_steps`` steps, each client stopping after its step
        budget (``budgets``, its job's ``max_steps``) if it has one."""
        rows, offset = [], 0
        budgets = budgets if budgets is not None else [None] * len(loaders)
        for loader, budget in zip(loaders, budgets, strict=True):
            batches = _client_batches(loader, epochs, max_steps)
            batches = batches if budget is None else batches[:budget]
            rows.append([batch + offset for batch in batches])
            offset += len(loader.y)
        x = torch.cat([loader.x for loader in loaders]).to(device)
        y = torch.cat([loader.y for loader in loaders]).to(device)
        full: dict[int, list[Tensor]] = {}
        steps = []
        for s in range(max(map(len, rows), default=0)):
            active = [c for c, batches in enumerate(rows) if s < len(batches)]
            sizes = {len(rows[c][s]) for c in active}
            if len(active) == len(rows) and len(sizes) == 1:
                size = sizes.pop()
                steps.append(PlanStep(full=len(full.setdefault(size, [])), size=size))
                full[size].append(torch.stack([batches[s] for batches in rows]))
                continue
            by_size: dict[int, list[int]] = {}
            for c in active:
                by_size.setdefault(len(rows[c][s]), []).append(c)
            groups = [
                Group(torch.tensor(g, device=device),
                      torch.stack([rows[c][s] for c in g]).to(device))
                for g in by_size.values()
            ]  # fmt: skip
            mask = torch.zeros(len(rows), dtype=torch.bool)
            mask[active] = True
            steps.append(PlanStep(groups=groups, active=mask.to(device)))
        full_rows = {size: torch.stack(ks).to(device) for size, ks in full.items()}
        return cls(x, y, full_rows, steps, [len(batches) for batches in rows])

    def batch(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """The batches at ``rows`` (``[G, B]``): ``([G, B, ...], [G, B])``, one gather each."""
        return self.x[rows], self.y[rows]


def _client_batches(loader: Any, epochs: int, max_steps: int | None) -> list[Tensor]:
    """A client's batches (row indices into its loader's ``x``) in its sequential fit's order:
    ``epochs`` passes, or passes until exactly ``max_steps`` steps (none if it has no batch)."""
    batches: list[Tensor] = []
    passes = 0
    while (max_steps is None and passes < epochs) or (
        max_steps is not None and len(batches) < max_steps
    ):
        passes += 1
        drawn = loader.batch_rows()
        if not drawn:
            break
        batches.extend(drawn)
    return batches if max_steps is None else batches[:max_steps]
