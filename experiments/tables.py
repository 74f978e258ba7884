"""Table cells and scope lines shared by the experiment scripts (run as ``python
experiments/NAME.py``, which puts this folder on ``sys.path``)."""

from __future__ import annotations

import statistics


def mean_std(values: list[float], decimals: int = 2) -> str:
    """An accuracy cell in percent: ``mean ± sample std`` over seeds, the value alone for one seed
    (one seed measures no spread: ``± 0.00`` would claim one)."""
    if len(values) == 1:
        return f"{100 * values[0]:.{decimals}f}"
    mean, std = 100 * statistics.fmean(values), 100 * statistics.stdev(values)
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def over_seeds(seeds: list[int]) -> str:
    """What a cell is over ``seeds``, for a table's title."""
    if len(seeds) == 1:
        return f"seed {seeds[0]} only (each cell its value; one seed measures no spread)"
    return f"mean ± std over seeds {', '.join(map(str, seeds))}"


def smoke_test_line(rounds: int, table_rounds: int) -> str | None:
    """``None`` at the table's scale; with fewer ``rounds`` than the table's ``table_rounds``, the
    line that says the output is a smoke test, not a comparison."""
    if rounds >= table_rounds:
        return None
    return (
        f"SMOKE TEST: {rounds} of the table's {table_rounds} rounds. The numbers show that the "
        "script runs; they say nothing about how the methods compare."
    )
