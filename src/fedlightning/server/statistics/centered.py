"""Centered clipping as a statistic: Karimireddy, He, Jaggi, "Learning from History for Byzantine
Robust Optimization", ICML 2021, arXiv:2012.10333 (section 4, eq. (CC)). docs/algorithms.md
section 8.4."""

from __future__ import annotations

from collections.abc import Sequence

from fedlightning.errors import require
from fedlightning.protocol import StateDict
from fedlightning.server.functional import clamp_running_var
from fedlightning.server.robust_maths import centered_clip
from fedlightning.server.statistics.base import Statistic, StatisticContext
from fedlightning.server.summation import wide

STATISTIC = "loop.aggregator.init_args.statistic.init_args"


def check_clipping_options(path: str, radius: float, iterations: int) -> None:
    """Refuse centered clipping's options in one line naming the option under ``path``."""
    require(radius > 0, f"{path}.radius", radius, "a number > 0")
    require(iterations >= 1, f"{path}.iterations", iterations, "an integer >= 1")


class CenteredClip(Statistic):
    """Centered clipping of the client updates around the last round's aggregate update.

    With ``x_i = w_i - w`` client i's update and ``v`` the center (the aggregate update of the
    previous round, zero at first: the paper's ``v_{t-1}``), ``iterations`` times
    ``v <- v + (1/n) sum_i (x_i - v) min(1, radius / ||x_i - v||)``; the result is ``w + v`` and
    the center keeps ``v``. Unweighted, as in the paper. Owner-aware: ``||x_i - v||`` is over
    client i's own keys and each key averages over its owners (docs/algorithms.md section 2.3).
    The update covers every floating entry (BatchNorm statistics too); ``running_var`` is clamped
    to ``>= 0``, integer buffers come from the first owner. Needs an honest majority.

    State: ``center`` (``v``, zero like every floating entry), declared with ``add_state``:
    checkpointed, restored on resume and by an undone round.

    Args:
        radius: tau > 0, the clipping radius around the center (in the norm of a whole update).
        iterations: L >= 1, clipping iterations per round (the paper uses 1).
    """

    needs_honest_majority = True

    owner_aware = True

    def __init__(self, radius: float = 1.0, iterations: int = 1) -> None:
        check_clipping_options(STATISTIC, radius, iterations)
        self.radius = radius
        self.iterations = iterations
        self.center: StateDict = {}
        self.add_state("center", "floating")

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        """``w + v`` for every key some upload owns (integer buffers: the first owner's); the
        center becomes ``v``."""
        w = context.model
        updates = [
            {k: wide(v) - wide(w[k]) for k, v in s.items() if v.is_floating_point()}
            for s in uploads
        ]
        center = {k: wide(v) for k, v in self.center.items()}
        v = centered_clip(updates, center, self.radius, self.iterations)
        out: StateDict = {}
        for key, value in w.items():
            owner = next((s for s in uploads if key in s), None)
            if owner is None:
                continue
            floating = value.is_floating_point()
            out[key] = (wide(value) + v[key]).to(value.dtype) if floating else owner[key].clone()
        self.center = {k: v[k].to(c.dtype) for k, c in self.center.items()}
        return clamp_running_var(out)
