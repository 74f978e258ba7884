"""The ranges the differential-privacy options are held to, and their one-line refusals
(docs/algorithms.md section 7.4, "Bounded options").

Each range keeps the arithmetic that follows finite: the accountants (7.3), the noise
``z C`` and the adaptive clipping norm (7.1). A value outside it is refused when the option is
constructed, naming the option, the value and the range.
"""

from __future__ import annotations

import math

from fedlightning.errors import require

#: noise multipliers z the accountants evaluate: at 0.3 one release without subsampling already
#: spends epsilon 19 at delta 1e-5, and below it the tight accountants' cost grows as 1/z^2
#: (PLD: tens of seconds an evaluation at 0.1; Opacus's PRV runs out of memory or returns inf);
#: 1e6 is the largest z Opacus's own calibration tries, where every accountant's epsilon is at its
#: floor (at 1e300, z^2 overflows in every accountant)
NOISE_RANGE = (0.3, 1e6)
#: clipping norms C (given, or adapted: 7.1): z C stays far inside float32's range
CLIP_RANGE = (1e-9, 1e9)
#: clip_learning_rate eta_C of adaptive clipping: Andrew et al. use 0.2; at 10 a round where the
#: unclipped fraction misses its target by 0.5 moves C by e^5 already
CLIP_LEARNING_RATE_MAX = 10.0


def in_range(value: float, bounds: tuple[float, float]) -> bool:
    """``low <= value <= high`` for a finite ``value``."""
    return math.isfinite(value) and bounds[0] <= value <= bounds[1]


def require_noise_multiplier(option: str, value: float) -> None:
    """Refuse a noise multiplier outside :data:`NOISE_RANGE`."""
    low, high = NOISE_RANGE
    require(in_range(value, NOISE_RANGE), option, value,
            f"a number in [{low:g}, {high:g}] (the range the accountants evaluate; 0 adds no "
            "noise: no privacy)")  # fmt: skip


def require_clip_norm(option: str, value: float) -> None:
    """Refuse a clipping norm outside :data:`CLIP_RANGE`."""
    require(in_range(value, CLIP_RANGE), option, value,
            f"a number in [{CLIP_RANGE[0]:g}, {CLIP_RANGE[1]:g}]")  # fmt: skip


def require_clip_learning_rate(option: str, value: float) -> None:
    """Refuse an adaptive clipping learning rate outside ``(0, CLIP_LEARNING_RATE_MAX]``."""
    require(math.isfinite(value) and 0 < value <= CLIP_LEARNING_RATE_MAX, option, value,
            f"a number in (0, {CLIP_LEARNING_RATE_MAX:g}] (Andrew et al. use 0.2)")  # fmt: skip


def require_delta(option: str, value: float, population: int, unit: str) -> None:
    """Refuse ``delta >= 1 / population``: a mechanism that publishes each of ``population``
    units (clients or training samples, ``unit``) with probability delta is (0, delta)-DP, so
    such a delta allows releasing one of them outright (docs/algorithms.md section 7.4)."""
    bound = 1 / max(population, 1)
    require(0 < value < bound, option, value,
            f"a number in (0, 1/{population} = {bound:.4g}), below 1 over the {population} "
            f"{unit} (a larger delta allows publishing one of them outright: no meaningful "
            "guarantee)")  # fmt: skip
