"""FedCross's options checked at construction (docs/algorithms.md section 3): one line naming the
option, its value and what is allowed."""

from __future__ import annotations

from typing import Any

from fedlightning.errors import require
from fedlightning.server.fedcross_maths import MEASURES, SELECTIONS


def check_fedcross_options(
    alpha: float, selection: str, similarity: str, num_models: int | None, first_stage_bound: int,
    propeller_rounds: int, dynamic_alpha_rounds: Any, alpha_start: float, alpha_step: float,
    alpha_ramp: str,
) -> tuple[int, int] | None:  # fmt: skip
    """Refuse a FedCross option out of range; ``dynamic_alpha_rounds`` as a tuple (or None)."""
    _require(0.5 <= alpha < 1.0, "alpha", alpha, "a number in [0.5, 1.0)")
    _require(selection in SELECTIONS, "selection", selection, f"one of {', '.join(SELECTIONS)}")
    _require(similarity in MEASURES, "similarity", similarity, f"one of {', '.join(MEASURES)}")
    _require(
        num_models is None or num_models >= 2,
        "num_models",
        num_models,
        "null or an integer >= 2",
    )
    _require(first_stage_bound >= 0, "first_stage_bound", first_stage_bound, "an integer >= 0")
    _require(propeller_rounds >= 0, "propeller_rounds", propeller_rounds, "an integer >= 0")
    if dynamic_alpha_rounds is not None:
        dynamic_alpha_rounds = tuple(dynamic_alpha_rounds)
        _require(
            len(dynamic_alpha_rounds) == 2 and 0 <= dynamic_alpha_rounds[0] < dynamic_alpha_rounds[1],
            "dynamic_alpha_rounds", list(dynamic_alpha_rounds), "null or [a, b] with 0 <= a < b",
        )  # fmt: skip
    _require(
        0.5 <= alpha_start <= alpha,
        "alpha_start",
        alpha_start,
        f"a number in [0.5, alpha={alpha}]",
    )
    _require(alpha_step > 0, "alpha_step", alpha_step, "a number > 0")
    _require(
        alpha_ramp in ("absolute", "range_start"),
        "alpha_ramp", alpha_ramp, "'absolute' or 'range_start'",
    )  # fmt: skip
    return dynamic_alpha_rounds


def _require(ok: bool, option: str, value: Any, allowed: str) -> None:
    require(ok, f"FedCross {option}", value, allowed)
