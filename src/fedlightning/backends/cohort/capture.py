"""A round's full cohort steps, captured once as a CUDA graph and replayed (docs/algorithms.md
section 9.2).

A small model's step is a few hundred short kernels, and launching them from Python costs more
than running them. :meth:`CohortStep.full <fedlightning.backends.cohort.step.CohortStep.full>`
has static shapes, reads its batch through one static index tensor and updates the stacked
tensors in place, so on a CUDA device :class:`FullSteps` runs the round's first full steps of a
batch size eagerly (on a side stream, as torch's CUDA graph recipe warms up), captures the next
one with ``torch.cuda.graph`` and replays it for every later full step of that size, each replay
preceded by one device-side copy of that step's batch indices. A replay runs exactly the kernels the eager step
runs, so capture changes no result; dropout draws its masks from the graph-safe generator state
torch keeps for replays (runs repeat exactly; the masks are not the eager ones).

Where capture is not possible (a step that synchronises with the host, e.g. an objective that
reads ``.item()``, or an operation CUDA graphs refuse), the step runs eagerly, and the reason is
logged once per run and reason. Steps other than full ones (:meth:`CohortStep.partial`) always
run eagerly; they leave the captured graph valid (the same tensors are updated in place).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from fedlightning.backends.cohort.plan import RoundPlan
from fedlightning.backends.cohort.step import CohortStep

log = logging.getLogger("fedlightning")

#: eager full steps before the capture (torch's recipe: lazy initialisation, allocator warm-up)
WARMUP = 2


class FullSteps:
    """Runs the full steps of a round's ``plan`` (module docstring); ``capture``: try a CUDA graph
    per batch size with more than ``WARMUP + 1`` full steps, on a CUDA device."""

    def __init__(self, step: CohortStep, plan: RoundPlan, capture: bool, reasons: set[str]):
        self.step, self.plan, self.reasons = step, plan, reasons
        self.graphed = {
            size: _Graphed(rows[0].clone())
            for size, rows in plan.full_rows.items()
            if capture and rows.device.type == "cuda" and len(rows) > WARMUP + 1
        }

    def __call__(self, size: int, k: int) -> None:
        """The ``k``-th full step with batches of ``size``."""
        rows, graphed = self.plan.full_rows[size][k], self.graphed.get(size)
        if graphed is None:
            self.step.full(self.plan.batch(rows))
            return
        graphed.rows.copy_(rows)
        if graphed.graph is None and graphed.eager_steps < WARMUP:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step.full(self.plan.batch(graphed.rows))
            torch.cuda.current_stream().wait_stream(side)
            graphed.eager_steps += 1
            return
        if graphed.graph is None:
            graphed.graph = self._capture(graphed.rows)
        if graphed.graph is None:
            del self.graphed[size]  # eager from now on
            self.step.full(self.plan.batch(rows))
        else:
            graphed.graph.replay()

    def _capture(self, rows: torch.Tensor) -> torch.cuda.CUDAGraph | None:
        """The full step on the batches at ``rows`` captured (nothing runs), or ``None`` with
        the reason logged."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.step.full(self.plan.batch(rows))
        except torch.cuda.OutOfMemoryError:
            raise  # the chunk is too large (fedlightning.backends.cohort.memory)
        except RuntimeError as error:  # a host synchronisation, an operation graphs refuse
            reason = (
                str(error).strip().splitlines()[0][:200] if str(error) else type(error).__name__
            )
            if reason not in self.reasons:
                self.reasons.add(reason)
                log.warning(
                    "cohort: full steps run eagerly, a CUDA graph capture failed: %s", reason
                )
            return None
        return graph


@dataclass
class _Graphed:
    """The captured full step of one batch size: its static batch indices and graph."""

    rows: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    eager_steps: int = 0
