"""CoFED's report: one row per participant (local, CoFED and relative accuracy, pseudo labels),
the participants x classes pseudo-label counts, the summary (means over participants) and the
files of the run directory (docs/algorithms.md section 3).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedlightning.analysis.cofed_plot import plot_relative_accuracy
from fedlightning.cofed.participant_base import Participant
from fedlightning.cofed.tasks import CoFEDData, Tasks


@dataclass
class CoFEDResult:
    """What a run reports: one row per participant, the participants x classes pseudo-label counts
    and the summary (means over participants)."""

    participants: list[dict[str, Any]]
    pseudo_label_counts: np.ndarray
    summary: dict[str, Any]


def report(
    data: CoFEDData,
    models: list[Participant],
    pseudo: list[tuple[np.ndarray, np.ndarray]],
    local_acc: list[float],
    cofed_acc: list[float],
    seconds: float,
) -> CoFEDResult:
    """The run's rows and summary; the relative accuracy is ``cofed_acc / local_acc`` (NaN where
    ``local_acc`` is 0), the pseudo-label accuracy counts the public samples of known class."""
    rows = []
    counts = np.zeros((len(models), data.num_classes), dtype=np.int64)
    hits = []  # per participant: is each pseudo label with a known true class right?
    for i, (t, model, (idx, labels)) in enumerate(zip(data.tasks, models, pseudo, strict=True)):
        counts[i] = np.bincount(labels, minlength=data.num_classes)
        truth = data.public_y[idx]
        hits.append(truth[truth >= 0] == labels[truth >= 0])
        rows.append(
            {
                "participant": i,
                "model": model.description,
                "label_space": " ".join(str(c) for c in t.label_space),
                "num_train": len(t.train_y),
                "num_test": len(t.test_y),
                "local_acc": local_acc[i],
                "cofed_acc": cofed_acc[i],
                "relative_acc": cofed_acc[i] / local_acc[i] if local_acc[i] > 0 else float("nan"),
                "pseudo_labels": len(idx),
                "pseudo_label_acc": _mean(hits[-1]),
            }
        )
    relative = np.array([r["relative_acc"] for r in rows], dtype=np.float64)
    summary = {
        "participants": len(rows),
        "public_size": len(data.public_y),
        "mean_local_acc": float(np.nanmean(local_acc)),
        "mean_cofed_acc": float(np.nanmean(cofed_acc)),
        "mean_relative_acc": float(np.nanmean(relative)),
        "min_relative_acc": float(np.nanmin(relative)),
        "max_relative_acc": float(np.nanmax(relative)),
        "improved": int((relative > 1).sum()),
        "pseudo_labels": int(counts.sum()),
        "pseudo_label_acc": _mean(np.concatenate(hits)),
        "seconds": seconds,
    }
    return CoFEDResult(rows, counts, summary)


def report_title(tasks: Tasks, count: int) -> str:
    """The figure's title: ``CoFED · digits, non-IID label spaces, 10 participants`` (the data set
    and how label spaces are drawn, where the tasks say)."""
    distribution = getattr(tasks, "distribution", None)
    parts = [
        getattr(tasks, "dataset", None),
        {"iid": "IID label spaces", "noniid": "non-IID label spaces"}.get(distribution),
        f"{count} participants",
    ]
    return "CoFED · " + ", ".join(p for p in parts if p)


def write_report(
    run: Path, data: CoFEDData, models: list[Participant], result: CoFEDResult, title: str
) -> None:
    """participants.csv, pseudo_labels.csv, partition.csv, summary.json, relative_accuracy.png
    and, after a learning-rate search, lr_search.csv (one row per participant and candidate)."""
    rows, counts = result.participants, result.pseudo_label_counts
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "participants.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _write_table(run / "pseudo_labels.csv", counts, [f"class_{c}" for c in range(counts.shape[1])])
    _write_table(
        run / "partition.csv",
        data.partition,
        [f"class_{c}" for c in range(data.partition.shape[1])],
    )
    (run / "summary.json").write_text(
        json.dumps({**result.summary, "class_names": list(data.class_names)}, indent=2) + "\n"
    )
    plot_relative_accuracy([r["relative_acc"] for r in rows], run / "relative_accuracy.png", title)
    searched = [c.row(i) for i, m in enumerate(models) for c in m.search_log]
    if searched:
        with open(run / "lr_search.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(searched[0]))
            writer.writeheader()
            writer.writerows(searched)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else float("nan")


def _write_table(path: Path, table: np.ndarray, columns: list[str]) -> None:
    lines = ["participant," + ",".join(columns)]
    lines += [f"{i}," + ",".join(str(int(v)) for v in row) for i, row in enumerate(table)]
    path.write_text("\n".join(lines) + "\n")
