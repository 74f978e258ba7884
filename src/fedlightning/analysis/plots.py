"""Plots of a run directory: learning curves, the partition heat map, and runs overlaid.

Matplotlib with the non-interactive Agg backend, so plotting works on machines without a display.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """Columns of ``run_dir/metrics.csv`` as float arrays (empty cells become NaN)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: is {run_dir} a fedlightning run directory?"
        )
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    columns = rows[0].keys() if rows else []
    return {
        c: np.array([float(r[c]) if r[c] not in ("", None) else np.nan for r in rows])
        for c in columns
    }


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Test accuracy and loss of the global model per round (``curves.png`` by default), and, when
    the run logged communication, test accuracy against the cumulative megabytes sent and received
    (docs/algorithms.md section 6), with the ``rounds_to_target`` round marked."""
    plt = _pyplot()
    metrics = read_metrics(run_dir)
    out = Path(out) if out is not None else Path(run_dir) / "curves.png"
    traffic = "comm_sent_total" in metrics and "test_acc" in metrics
    fig, axes = plt.subplots(1, 3 if traffic else 2, figsize=(15 if traffic else 10, 3.8))
    acc_ax, loss_ax = axes[0], axes[1]
    rounds = metrics.get("round", np.arange(1, 1 + len(next(iter(metrics.values()), []))))
    for key in sorted(metrics):
        if key.endswith("acc"):
            acc_ax.plot(rounds, metrics[key], marker=".", label=key)
        elif key.endswith("_loss") and key in ("test_loss", "train_loss"):
            loss_ax.plot(rounds, metrics[key], marker=".", label=key)
    acc_ax.set(xlabel="round", ylabel="accuracy", title=f"{Path(run_dir).name}: accuracy")
    loss_ax.set(xlabel="round", ylabel="loss", title="loss")
    reached = metrics.get("rounds_to_target", np.array([np.nan]))
    reached = reached[~np.isnan(reached)]
    if len(reached):
        acc_ax.axvline(
            reached[0], linestyle=":", color="grey", label=f"target at {int(reached[0])}"
        )
    if traffic:
        megabytes = (metrics["comm_sent_total"] + metrics["comm_received_total"]) / 1e6
        axes[2].plot(megabytes, metrics["test_acc"], marker=".", label="test_acc")
        axes[2].set(
            xlabel="cumulative communication (MB, sent + received)",
            ylabel="accuracy",
            title="accuracy vs communication",
        )
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_partition(table: np.ndarray, out: str | Path, title: str = "partition") -> Path:
    """A clients x classes heat map of sample counts."""
    plt = _pyplot()
    table = np.asarray(table)
    fig, ax = plt.subplots(
        figsize=(max(4.0, 0.35 * table.shape[1] + 2), max(3.0, 0.22 * table.shape[0] + 1.5))
    )
    image = ax.imshow(table, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set(xlabel="class", ylabel="client", title=title)
    fig.colorbar(image, ax=ax, label="samples")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def plot_runs(
    run_dirs: Sequence[str | Path], metric: str = "test_acc", out: str | Path = "runs.png"
) -> Path:
    """Overlay ``metric`` per round for several runs; the legend names each run by its folder."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for run_dir in run_dirs:
        metrics = read_metrics(run_dir)
        if metric not in metrics:
            raise KeyError(
                f"metric {metric!r} not in {run_dir}/metrics.csv: choose one of {sorted(metrics)}"
            )
        ax.plot(metrics["round"], metrics[metric], marker=".", label=Path(run_dir).name)
    ax.set(xlabel="round", ylabel=metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def plot_command(argv: Sequence[str]) -> Path:
    """``fedlightning plot RUN_DIR [RUN_DIR ...] --metric test_acc -o FILE.png``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="fedlightning plot",
        description="Overlay a metric of several runs, one line per run directory.",
    )
    parser.add_argument("run_dirs", nargs="+", help="run directories (each with a metrics.csv)")
    parser.add_argument(
        "--metric", default="test_acc", help="a metrics.csv column (default: test_acc)"
    )
    parser.add_argument(
        "-o", "--output", default="runs.png", help="the PNG to write (default: runs.png)"
    )
    args = parser.parse_args(list(argv))
    try:
        out = plot_runs(args.run_dirs, args.metric, args.output)
    except (FileNotFoundError, KeyError) as err:
        parser.error(str(err).strip("'\""))
    print(f"wrote {out}")
    return out
