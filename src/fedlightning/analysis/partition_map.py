"""The partition heat map: clients x classes, readable and bounded in size for 10 to 10,000+ clients.

Up to ``max_rows`` clients get one row each, in client order. Beyond that the clients are sorted
(by dominant class, then by that class's share) and binned into ``max_rows`` rows of consecutive
sorted clients; a row shows the bin's mean label distribution (fractions of each client's samples),
so the picture keeps its meaning however many clients there are. A second panel is the histogram
of each client's normalised label entropy ``H(p_i) / log C`` (0: one class, 1: uniform), the
usual summary of label skew. The figure has a fixed size, so pixels and memory do not grow with
the number of clients.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FIGSIZE = (10.0, 4.6)  # inches; at DPI 110 the PNG is at most 1100 x 506 pixels
DPI = 110


def label_entropy(table: np.ndarray) -> np.ndarray:
    """Per-client normalised label entropy ``-sum_c p_ic log p_ic / log C`` (0 for empty clients)."""
    table = np.asarray(table, dtype=np.float64)
    totals = table.sum(axis=1, keepdims=True)
    p = np.divide(table, totals, out=np.zeros_like(table), where=totals > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), 0.0)
    classes = max(table.shape[1], 2)
    return -terms.sum(axis=1) / np.log(classes)


def binned_rows(table: np.ndarray, max_rows: int) -> tuple[np.ndarray, int]:
    """The rows to draw and the number of clients per row (1 when not binned).

    Not binned: the raw counts in client order. Binned: clients sorted by (dominant class, its
    share) and split into ``max_rows`` consecutive groups; each row is the group's mean label
    distribution."""
    table = np.asarray(table, dtype=np.float64)
    clients = table.shape[0]
    if clients <= max_rows:
        return table, 1
    totals = table.sum(axis=1, keepdims=True)
    p = np.divide(table, totals, out=np.zeros_like(table), where=totals > 0)
    dominant = p.argmax(axis=1)
    order = np.lexsort((-p[np.arange(clients), dominant], dominant))
    per_row = int(np.ceil(clients / max_rows))
    groups = [order[i : i + per_row] for i in range(0, clients, per_row)]
    return np.stack([p[g].mean(axis=0) for g in groups]), per_row


def partition_figure(table: np.ndarray, title: str = "Partition", max_rows: int = 100):
    """The figure: the heat map (left) and the label-entropy histogram (right) of a clients x
    classes table of sample counts (a Figure outside pyplot: nothing to close)."""
    from fedlightning.analysis.axes_layout import integer_axis
    from fedlightning.analysis.plots import figure

    table = np.asarray(table)
    clients, classes = table.shape
    rows, per_row = binned_rows(table, max_rows)
    fig = figure(FIGSIZE)
    heat_ax, hist_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    # the image spans client ranks 0..clients-1 whatever the binning, so the ticks are clients
    image = heat_ax.imshow(
        rows, aspect="auto", cmap="viridis", interpolation="nearest",
        extent=(-0.5, classes - 0.5, clients - 0.5, -0.5),
    )  # fmt: skip
    if per_row == 1:
        ylabel, colour = "Client", "Samples"
    else:
        ylabel = f"Clients sorted by dominant class ({per_row} per row)"
        colour = "Mean fraction of a client's samples"
    heat_ax.set(
        xlabel="Class", ylabel=ylabel, title=f"{title}: {clients} clients × {classes} classes"
    )
    integer_axis(heat_ax.xaxis)
    integer_axis(heat_ax.yaxis)
    fig.colorbar(image, ax=heat_ax, label=colour)
    entropy = label_entropy(table)
    hist_ax.hist(entropy, bins=np.linspace(0, 1, 21), color="tab:blue", edgecolor="white")
    hist_ax.set(
        xlabel="Label entropy H(p) / log C", ylabel="Clients", title="Label skew", xlim=(0, 1)
    )
    integer_axis(hist_ax.yaxis)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.12, wspace=0.3)
    return fig


def plot_partition(
    table: np.ndarray, out: str | Path, title: str = "Partition", max_rows: int = 100
) -> Path:
    """Write :func:`partition_figure` to ``out`` (a PNG of at most 1100 x 506 pixels)."""
    from fedlightning.analysis.plots import save

    return save(partition_figure(table, title, max_rows), out, dpi=DPI)
