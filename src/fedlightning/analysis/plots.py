"""Plots of a run directory: learning curves, the partition heat map, and runs overlaid.

Matplotlib with the non-interactive Agg backend, so plotting works on machines without a display.
Axes carry readable labels (:mod:`fedlightning.analysis.labels`: ``Round``, ``Test accuracy``,
``Communication (MB)``, ``ε (δ = 1e-05)``) and titles name the algorithm, the data set and the
partition. The file type follows the name's suffix: ``.pdf``, ``.svg`` and ``.eps`` are vector
files whose text stays text (TrueType fonts in PDF/PS, as publishers ask; no Type 3 fonts).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedlightning.analysis.axes_layout import (
    fitted_title,
    legend_below,
    place_legend,
    round_axis,
)
from fedlightning.analysis.labels import axis, describe_run, label
from fedlightning.analysis.run_inputs import PlotInputError, config_value, read_metrics

#: matplotlib settings of every file written here: text as text in vector files
VECTOR_TEXT = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}
#: options whose value is a class: a legend shows the class name alone
CLASS_OPTIONS = ("aggregator", "model", "backend", "attack", "inner")
#: how a legend writes a few options' names
SYMBOLS = {"beta": "β", "alpha": "α", "mu": "μ"}


def figure(figsize: tuple[float, float]):
    """A matplotlib Figure drawn by Agg, outside pyplot's global state (nothing to close), with a
    fixed layout: cheaper to draw than ``tight_layout`` (about 0.4 s instead of 1 s a plot)."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def save(fig, out: str | Path, dpi: int = 110, **kwargs) -> Path:
    """Write ``fig`` to ``out`` in the file type of its suffix, text as text in vector files."""
    import matplotlib

    with matplotlib.rc_context(VECTOR_TEXT):
        fig.savefig(out, dpi=dpi, **kwargs)
    return Path(out)


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write :func:`curves_figure` to ``out`` (default ``run_dir/curves.png``; PDF/SVG by the
    suffix)."""
    return save(
        curves_figure(run_dir), Path(out) if out is not None else Path(run_dir) / "curves.png"
    )


def curves_figure(run_dir: str | Path):
    """Test accuracy and loss of the global model at each evaluated round (``curves.png``), and,
    when the run logged communication, test accuracy against the cumulative megabytes sent and
    received (docs/algorithms.md section 6), with the ``rounds_to_target`` round marked. The title
    names the algorithm, the data set and the partition (from ``config.yaml``).

    Rows of rounds that were not evaluated (``eval_every`` > 1) carry no metric and are skipped;
    the legends sit below the axes so they never cover a line."""
    metrics = read_metrics(run_dir)
    traffic = "comm_sent_total" in metrics and "test_acc" in metrics
    fig = figure((15, 4.2) if traffic else (10, 4.2))
    axes = list(fig.subplots(1, 3 if traffic else 2))
    acc_ax, loss_ax = axes[0], axes[1]
    rounds = metrics.get("round", np.arange(1, 1 + len(next(iter(metrics.values()), []))))
    for key in sorted(metrics):
        ax = (
            acc_ax
            if key.endswith("acc")
            else loss_ax
            if key in ("test_loss", "train_loss")
            else None
        )
        evaluated = np.isfinite(metrics[key])
        if ax is not None and evaluated.any():
            ax.plot(rounds[evaluated], metrics[key][evaluated], marker=".", label=label(key))
    acc_ax.set(ylabel="Accuracy", title="Accuracy")
    loss_ax.set(ylabel="Loss", title="Loss")
    for ax in (acc_ax, loss_ax):
        round_axis(ax, rounds)
    reached = metrics.get("rounds_to_target", np.array([np.nan]))
    reached = reached[~np.isnan(reached)]
    if len(reached):
        acc_ax.axvline(
            reached[0], linestyle=":", color="grey", label=f"Target at round {int(reached[0])}"
        )
    if traffic:
        evaluated = np.isfinite(metrics["test_acc"])
        megabytes = (metrics["comm_sent_total"] + metrics["comm_received_total"]) / 1e6
        axes[2].plot(
            megabytes[evaluated], metrics["test_acc"][evaluated], marker=".", label="Test accuracy"
        )
        axes[2].set(
            xlabel="Communication (MB, sent + received)", ylabel="Test accuracy",
            title="Accuracy vs communication",
        )  # fmt: skip
    for ax in axes:
        ax.grid(alpha=0.3)
        legend_below(ax)
    description = describe_run(run_dir)
    fig.suptitle(description.title() if description else Path(run_dir).name)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.86, bottom=0.26, wspace=0.22)
    return fig


def plot_partition(
    table: np.ndarray, out: str | Path, title: str = "Partition", max_rows: int = 100
) -> Path:
    """The clients x classes heat map and label-entropy histogram
    (:func:`fedlightning.analysis.partition_map.plot_partition`)."""
    from fedlightning.analysis.partition_map import plot_partition as draw

    return draw(table, out, title=title, max_rows=max_rows)


def legend_name(option: str, value: str) -> str:
    """How a legend names the runs whose ``option`` has ``value``: a class by its name
    (``FedAvgM``), a number with the option's name (``β = 0.1``, ``seed = 2``)."""
    last = option.rsplit(".", 1)[-1]
    if last in CLASS_OPTIONS:
        return value
    return f"{SYMBOLS.get(last, last)} = {value}"


def group_runs(run_dirs: Sequence[str | Path], group_by: str | None) -> dict[str, list[Path]]:
    """Runs by the value of ``group_by``, named by :func:`legend_name`; without ``group_by`` each
    run is its own group, named by its algorithm where those differ, else by its directory."""
    run_dirs = list(map(Path, run_dirs))
    if group_by is None:
        described = [describe_run(run_dir) for run_dir in run_dirs]
        names = [d.algorithm if d else "" for d in described]
        if "" in names or len(set(names)) < len(names):
            names = [run_dir.name for run_dir in run_dirs]
        return {name: [run_dir] for name, run_dir in zip(names, run_dirs, strict=True)}
    groups: dict[str, list[Path]] = {}
    for run_dir in run_dirs:
        groups.setdefault(legend_name(group_by, config_value(run_dir, group_by)), []).append(
            run_dir
        )
    return groups


def default_title(run_dirs: Sequence[Path], spread: bool, over: str = "runs") -> str:
    """What the runs have in common: their algorithm where it is one, the data set, partition and
    clients where those are one; ``mean ± std over runs`` when lines average several runs
    (``over``: what they are, e.g. ``seeds 0, 1, 2``)."""
    described = [describe_run(run_dir) for run_dir in run_dirs]
    parts = []
    if all(described):
        algorithms = {d.algorithm for d in described}
        settings = {d.setting() for d in described}
        parts = [
            *(algorithms if len(algorithms) == 1 else []),
            *(settings if len(settings) == 1 else []),
        ]
    title = " · ".join(parts)
    if not spread:
        return title
    return f"{title} (mean ± std over {over})" if title else f"Mean ± std over {over}"


def plot_runs(
    run_dirs: Sequence[str | Path],
    metric: str = "test_acc",
    out: str | Path = "runs.png",
    group_by: str | None = None,
    **options: Any,
) -> Path:
    """Write :func:`runs_figure` (``options``: its ``x``, ``title``, ``xlabel``, ``ylabel``,
    ``labels``, ``figsize``) to ``out`` (PNG, or PDF/SVG by the suffix)."""
    return save(runs_figure(run_dirs, metric, group_by, **options), out)


def runs_figure(
    run_dirs: Sequence[str | Path],
    metric: str = "test_acc",
    group_by: str | None = None,
    x: str = "round",
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    labels: Sequence[str] | None = None,
    figsize: tuple[float, float] = (9.0, 4.4),
):
    """Overlay ``metric`` against ``x`` (``round`` or any metrics.csv column, e.g. a communication
    count, drawn in MB) for several runs. With ``group_by``, runs with the same value of that
    option (e.g. ``loop.aggregator``) form one line: the mean over the runs (seeds) at the x
    values all of them evaluated, and a band of +- one standard deviation (ddof=1) around it.
    ``xlabel``, ``ylabel`` and ``title`` replace the readable defaults; ``labels`` names the lines
    (one per run, or per group with ``group_by``, in order); ``figsize`` is in inches."""
    groups = group_runs(run_dirs, group_by)
    if labels is not None and len(labels) != len(groups):
        raise PlotInputError(
            f"--labels gives {len(labels)} name(s) for {len(groups)} line(s) "
            f"({', '.join(groups)}): give one per line, in that order"
        )
    fig = figure(tuple(figsize))
    ax = fig.subplots()
    sizes = []
    for index, (name, members) in enumerate(groups.items()):
        common, curves, last = _shared_points(name, members, metric, x)
        (x_label, x_scale), (y_label, y_scale) = axis(x, last), axis(metric, last)
        xs = np.array(common) * x_scale
        values = np.array([[c[v] for v in common] for c in curves]) * y_scale
        mean = values.mean(axis=0)
        shown = labels[index] if labels is not None else name
        if labels is None and len(members) > 1:
            shown = f"{name} (n = {len(members)})"
        (line,) = ax.plot(xs, mean, marker=".", label=shown)
        if len(members) > 1:
            std = values.std(axis=0, ddof=1)
            ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        sizes.append(len(members))
    run_paths = [Path(r) for r in run_dirs]
    if title is None:
        title = fitted_title(default_title(run_paths, max(sizes) > 1), float(figsize[0]))
    ax.set(ylabel=ylabel or y_label, title=title)
    if x == "round":
        round_axis(ax, np.concatenate([read_metrics(r)[x] for r in run_paths]), xlabel or x_label)
    else:
        ax.set_xlabel(xlabel or x_label)
    ax.grid(alpha=0.3)
    fig.set_layout_engine("constrained")  # room for the legend outside the axes
    place_legend(ax, float(figsize[0]))
    return fig


def _shared_points(
    name: str, members: Sequence[Path], metric: str, x: str
) -> tuple[list[float], list[dict[float, float]], dict[str, np.ndarray]]:
    """``(common, curves, last)`` of one line of :func:`runs_figure`: the ``x`` values at which
    every run of ``members`` has a finite ``metric``, each run's ``{x: metric}`` and the last
    run's metrics (for the axes' labels and scales)."""
    curves = []
    for run_dir in members:
        metrics = read_metrics(run_dir)
        for column in (metric, x):
            if column not in metrics:
                raise KeyError(
                    f"metric {column!r} not in {run_dir}/metrics.csv: "
                    f"choose one of {sorted(metrics)}"
                )
        keep = np.isfinite(metrics[metric]) & np.isfinite(metrics[x])
        curves.append(dict(zip(metrics[x][keep], metrics[metric][keep], strict=True)))
    common = sorted(set.intersection(*(set(c) for c in curves)))
    if not common:  # an empty line would be drawn: say why instead
        raise PlotInputError(
            f"{name}: no {x} at which {', '.join(str(m) for m in members)} all have a "
            f"{metric} value, so there is nothing to draw (compare runs evaluated at the same "
            "rounds, e.g. with the same eval_every)"
            if len(members) > 1
            else f"{members[0]}/metrics.csv has no row with both {metric} and {x}"
        )
    return common, curves, metrics
