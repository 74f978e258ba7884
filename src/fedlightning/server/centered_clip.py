"""Centered clipping: Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
Optimization", ICML 2021, arXiv:2012.10333 (section 4, eq. (CC)). docs/algorithms.md section 8.4."""

from __future__ import annotations

from collections.abc import Sequence

from fedlightning.errors import require
from fedlightning.protocol import StateDict, Upload
from fedlightning.server.functional import clamp_running_var
from fedlightning.server.robust import RobustAggregator
from fedlightning.server.robust_maths import centered_clip
from fedlightning.server.summation import wide


class CenteredClipping(RobustAggregator):
    """Centered clipping of the client updates around the last round's aggregate update.

    With ``x_i = w_i - w`` client i's update and ``v`` the center (the aggregate update of the
    previous round, zero at first: the paper's ``v_{t-1}``, with the clients' model updates in the
    role of the workers' momenta), ``iterations`` times
    ``v <- v + (1/n) sum_i (x_i - v) min(1, radius / ||x_i - v||)``; then ``w <- w + v`` and the
    center keeps ``v``. Unweighted, as in the paper. Owner-aware: ``||x_i - v||`` is over client
    i's own keys and each key averages over its owners, so heterogeneous clients are served
    (docs/algorithms.md section 2.3). The update covers every floating entry (BatchNorm statistics
    too); ``running_var`` is clamped to ``>= 0``, integer buffers come from the first owner.

    State: ``center`` (``v``, zero like every floating entry), declared with ``add_state``.

    Args:
        radius: tau > 0, the clipping radius around the center (in the norm of a whole update).
        iterations: L >= 1, clipping iterations per round (the paper uses 1).
    """

    owner_aware = True

    def __init__(self, radius: float = 1.0, iterations: int = 1) -> None:
        require(radius > 0, "loop.aggregator.init_args.radius", radius, "a number > 0")
        require(iterations >= 1, "loop.aggregator.init_args.iterations", iterations,
                "an integer >= 1")  # fmt: skip
        super().__init__(weighting="uniform")
        self.radius = radius
        self.iterations = iterations
        self.center: StateDict = {}
        self.add_state("center", "floating")

    def average(self, uploads: Sequence[Upload]) -> StateDict:
        """``w + v`` for every key some upload owns (integer buffers: the first owner's); the
        center becomes ``v``."""
        w, states = self.weights, [u.weights for u in uploads]
        updates = [
            {k: wide(v) - wide(w[k]) for k, v in s.items() if v.is_floating_point()} for s in states
        ]
        center = {k: wide(v) for k, v in self.center.items()}
        v = centered_clip(updates, center, self.radius, self.iterations)
        out: StateDict = {}
        for key, value in w.items():
            owner = next((s for s in states if key in s), None)
            if owner is None:
                continue
            floating = value.is_floating_point()
            out[key] = (wide(value) + v[key]).to(value.dtype) if floating else owner[key].clone()
        self.center = {k: v[k].to(c.dtype) for k, c in self.center.items()}
        return clamp_running_var(out)
