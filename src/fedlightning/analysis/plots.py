"""Plots of a run directory: learning curves, the partition heat map, and runs overlaid.

Matplotlib with the non-interactive Agg backend, so plotting works on machines without a display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedlightning.analysis.run_inputs import (
    PLOT_OPTIONS,
    PlotInputError,
    check_output,
    config_value,
    read_metrics,
    read_options,
)


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on first use: importing fedlightning does
    not import matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_pyplot = pyplot  # the name analysis.cka imports


def figure(figsize: tuple[float, float]):
    """A matplotlib Figure drawn by Agg, outside pyplot's global state (nothing to close), with a
    fixed layout: cheaper to draw than ``tight_layout`` (about 0.4 s instead of 1 s a plot)."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def integer_axis(axis) -> None:
    """Ticks at integers only (rounds, clients, classes are counts)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def round_axis(ax, rounds: np.ndarray, label: str = "round") -> None:
    """Integer ticks over the evaluated rounds, with limits that never fall inside a round
    (one evaluated round no longer spans 1.9-2.1)."""
    rounds = rounds[np.isfinite(rounds)]
    ax.set_xlabel(label)
    if rounds.size == 0:
        return
    low, high = float(rounds.min()), float(rounds.max())
    if label == "round":
        integer_axis(ax.xaxis)
        if len(np.unique(rounds)) <= 12:
            ax.set_xticks(np.unique(rounds))
        pad = max(0.5, 0.03 * (high - low))
        ax.set_xlim(low - pad, high + pad)


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Test accuracy and loss of the global model at each evaluated round (``curves.png``), and,
    when the run logged communication, test accuracy against the cumulative megabytes sent and
    received (docs/algorithms.md section 6), with the ``rounds_to_target`` round marked.

    Rows of rounds that were not evaluated (``eval_every`` > 1) carry no metric and are skipped;
    the legends sit below the axes so they never cover a line."""
    metrics = read_metrics(run_dir)
    out = Path(out) if out is not None else Path(run_dir) / "curves.png"
    traffic = "comm_sent_total" in metrics and "test_acc" in metrics
    fig = figure((15, 4.0) if traffic else (10, 4.0))
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
        if ax is None:
            continue
        evaluated = np.isfinite(metrics[key])
        if evaluated.any():
            ax.plot(rounds[evaluated], metrics[key][evaluated], marker=".", label=key)
    acc_ax.set(ylabel="accuracy", title=f"{Path(run_dir).name}: accuracy")
    loss_ax.set(ylabel="loss", title="loss")
    for ax in (acc_ax, loss_ax):
        round_axis(ax, rounds)
    reached = metrics.get("rounds_to_target", np.array([np.nan]))
    reached = reached[~np.isnan(reached)]
    if len(reached):
        acc_ax.axvline(
            reached[0], linestyle=":", color="grey", label=f"target at {int(reached[0])}"
        )
    if traffic:
        evaluated = np.isfinite(metrics["test_acc"])
        megabytes = (metrics["comm_sent_total"] + metrics["comm_received_total"]) / 1e6
        axes[2].plot(
            megabytes[evaluated], metrics["test_acc"][evaluated], marker=".", label="test_acc"
        )
        axes[2].set(
            xlabel="cumulative communication (MB, sent + received)",
            ylabel="accuracy",
            title="accuracy vs communication",
        )
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:  # in the strip reserved below the axes, never over a line
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3, frameon=False)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.92, bottom=0.26, wspace=0.22)
    fig.savefig(out, dpi=110)
    return out


def plot_partition(
    table: np.ndarray, out: str | Path, title: str = "partition", max_rows: int = 100
) -> Path:
    """The clients x classes heat map and label-entropy histogram
    (:func:`fedlightning.analysis.partition_map.plot_partition`)."""
    from fedlightning.analysis.partition_map import plot_partition as draw

    return draw(table, out, title=title, max_rows=max_rows)


def group_runs(run_dirs: Sequence[str | Path], group_by: str | None) -> dict[str, list[Path]]:
    """Runs by the value of ``group_by`` (each run its own group when ``group_by`` is None)."""
    groups: dict[str, list[Path]] = {}
    for run_dir in map(Path, run_dirs):
        label = (
            run_dir.name if group_by is None else f"{group_by}={config_value(run_dir, group_by)}"
        )
        groups.setdefault(label, []).append(run_dir)
    return groups


def plot_runs(
    run_dirs: Sequence[str | Path],
    metric: str = "test_acc",
    out: str | Path = "runs.png",
    group_by: str | None = None,
    x: str = "round",
    title: str | None = None,
) -> Path:
    """Overlay ``metric`` against ``x`` (``round`` or any metrics.csv column, e.g. a communication
    count) for several runs. With ``group_by``, runs with the same value of that option (e.g.
    ``loop.aggregator``) form one line: the mean over the runs (seeds) at the x values all of
    them evaluated, and a band of +- one standard deviation (ddof=1) around it."""
    groups = group_runs(run_dirs, group_by)
    fig = figure((9, 4.4))
    ax = fig.subplots()
    sizes = []
    for label, members in groups.items():
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
                f"{label}: no {x} at which {', '.join(str(m) for m in members)} all have a "
                f"{metric} value, so there is nothing to draw (compare runs evaluated at the same "
                "rounds, e.g. with the same eval_every)"
                if len(members) > 1
                else f"{members[0]}/metrics.csv has no row with both {metric} and {x}"
            )
        xs = np.array(common)
        values = np.array([[c[v] for v in common] for c in curves])
        mean = values.mean(axis=0)
        name = label if len(members) == 1 else f"{label} (n={len(members)})"
        (line,) = ax.plot(xs, mean, marker=".", label=name)
        if len(members) > 1:
            std = values.std(axis=0, ddof=1)
            ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        sizes.append(len(members))
    if title is None:
        spread = " (mean ± std over runs)" if max(sizes) > 1 else ""
        title = f"{metric} per {x}{spread}"
    ax.set(ylabel=metric, title=title)
    if x == "round":
        round_axis(ax, np.concatenate([read_metrics(r)[x] for r in map(Path, run_dirs)]))
    else:
        ax.set_xlabel(x)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)  # right of the axes
    fig.subplots_adjust(left=0.09, right=0.66, top=0.9, bottom=0.12)
    fig.savefig(out, dpi=110)
    return Path(out)


def plot_command(argv: Sequence[str]) -> Path:
    """``fedlightning plot RUN_DIR [RUN_DIR ...] [--metric M] [--group-by NAME] [-o FILE.png]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="fedlightning plot",
        description="Overlay a metric of several runs: one line per run directory, or with "
        "--group-by one mean +- std band per value of a config option (e.g. over seeds).",
    )
    parser.add_argument("run_dirs", nargs="+", help="run directories (each with a metrics.csv)")
    parser.add_argument(
        "-c", "--config", help="a YAML file whose keys are these options (metric, group_by, ...)"
    )
    parser.add_argument("--metric", default=None, help="a metrics.csv column (default: test_acc)")
    parser.add_argument(
        "--group-by", default=None, help="a config.yaml option: runs with the same value form one "
        "mean +- std band (e.g. loop.aggregator, model.init_args.mu)",
    )  # fmt: skip
    parser.add_argument("--x", default=None, help="the x axis: round (default) or a column")
    parser.add_argument("--title", default=None, help="the plot title")
    parser.add_argument("-o", "--output", default=None, help="the PNG (default: runs.png)")
    args = parser.parse_args(list(argv))
    options = dict(PLOT_OPTIONS)
    try:
        if args.config:
            options.update(read_options(args.config))
        options.update({k: v for k, v in vars(args).items() if k in options and v is not None})
        out = plot_runs(
            args.run_dirs, options["metric"], check_output(options["output"]),
            options["group_by"], options["x"], options["title"],
        )  # fmt: skip
    except (FileNotFoundError, KeyError, PlotInputError) as err:
        parser.error(str(err).strip("'\""))
    print(f"wrote {out}")
    return out
