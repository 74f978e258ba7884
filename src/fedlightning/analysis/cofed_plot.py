"""CoFED's figure: each participant's accuracy after co-training relative to its local accuracy
(the shape of the paper's Figure 2; docs/algorithms.md section 3)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

GAIN, LOSS = "tab:blue", "tab:red"


def relative_accuracy_figure(relative: Sequence[float], title: str | None = None):
    """Bars of ``cofed_acc / local_acc`` per participant, drawn from 1 (no change): up and blue
    where co-training helped, down and red where it hurt, as the legend says, with the mean as a
    line. The y axis spans the values (with a margin), not 0 to the top, so differences of a few
    percent show; every participant has its tick, labelled by its index."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    values = np.asarray(relative, dtype=np.float64)
    count = len(values)
    fig = Figure(figsize=(min(max(6.0, 0.2 * count + 2.5), 24.0), 3.6), layout="constrained")
    ax = fig.add_subplot()
    positions = np.arange(count)
    shown = np.nan_to_num(values, nan=1.0)
    ax.bar(positions, shown - 1.0, bottom=1.0, width=0.8,
           color=np.where(shown >= 1.0, GAIN, LOSS))  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.8)
    mean = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    mean_line = ax.axhline(mean, color="tab:green", linestyle="--", linewidth=1.2)
    finite = values[np.isfinite(values)]
    low, high = (min(finite.min(), 1.0), max(finite.max(), 1.0)) if finite.size else (0.9, 1.1)
    margin = max(0.1 * (high - low), 0.01)
    ax.set_ylim(low - margin, high + margin)
    ax.set_xlim(-0.6, count - 0.4)
    crowded = count > 20  # two-digit labels side by side would touch: upright
    ax.set_xticks(positions, [str(i) for i in positions], fontsize=7 if crowded else 9,
                  rotation=90 if crowded else 0)  # fmt: skip
    ax.set_xlabel("Participant")
    ax.set_ylabel("Relative accuracy\n(CoFED / local)")
    ax.set_title(title or f"CoFED · {count} participants")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(
        [Patch(color=GAIN), Patch(color=LOSS), mean_line],
        [f"improved ({int((values > 1).sum())})", f"worse than local ({int((values < 1).sum())})",
         f"mean {mean:.3f}"],
        loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8,
    )  # fmt: skip
    return fig


def plot_relative_accuracy(
    relative: Sequence[float], path: str | Path, title: str | None = None
) -> Path:
    """Write :func:`relative_accuracy_figure` to ``path`` (PNG, or PDF/SVG by the suffix)."""
    from fedlightning.analysis.plots import save

    return save(relative_accuracy_figure(relative, title), path, dpi=120)
