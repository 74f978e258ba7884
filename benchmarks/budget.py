"""A wall-clock budget the GPU benchmarks share out: each part runs while its share lasts and says
what it left out, so that a whole set finishes inside one device lease."""

from __future__ import annotations

import time


class Budget:
    """``seconds`` from now (``None``: unlimited)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()

    def left(self) -> float:
        """Seconds left (infinite without a budget)."""
        if self.seconds is None:
            return float("inf")
        return self.seconds - (time.perf_counter() - self.start)

    def allows(self, predicted: float) -> bool:
        """Whether work predicted to take ``predicted`` seconds fits in what is left."""
        return predicted <= self.left()

    def share(self, fraction: float) -> Budget:
        """A budget of ``fraction`` of what is left, from now."""
        return Budget(None if self.seconds is None else max(0.0, self.left() * fraction))
