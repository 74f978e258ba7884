"""Table cells shared by the experiment scripts (run as ``python experiments/NAME.py``, which puts
this folder on ``sys.path``)."""

from __future__ import annotations

import statistics


def mean_std(values: list[float]) -> str:
    """An accuracy cell in percent: ``mean ± sample std`` over seeds, the value alone for one seed."""
    if len(values) == 1:
        return f"{100 * values[0]:.2f}"
    return f"{100 * statistics.fmean(values):.2f} ± {100 * statistics.stdev(values):.2f}"
