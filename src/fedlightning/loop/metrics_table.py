"""``metrics.csv``: one row per evaluated round, its columns in reading order.

Lightning's CSVLogger sorts its columns alphabetically (``round`` came 7th, after the failure and
communication counts); this table puts ``round`` first, then the test metrics, validation,
training, failures, time and targets, communication, privacy, and the aggregator's and attack's
own columns (:func:`column_order`). The header is one function of the keys, so a resumed run,
which rewrites its rows up to the checkpoint and then appends, writes the same header as an
uninterrupted one. A key first seen in a later row rewrites the file with the wider header, as
CSVLogger does.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path

#: column groups in reading order: a key joins the first group one of whose prefixes it has
#: (``<group>/test_acc`` columns of heterogeneous runs are test metrics)
_GROUPS: tuple[tuple[str, ...], ...] = (
    ("round",),
    (
        "test_acc",
        "test_loss",
        "test_",
        "group_mean_acc",
        "personal_acc",
        "personal_acc_weighted",
        "personal_acc_std",
        "personal_acc_min",
        "personal_acc_worst10",
        "personal_clients",
        "adaptor_acc",
    ),
    ("val_acc", "val_acc_weighted", "val_acc_std", "val_acc_min", "val_acc_worst10", "val_"),
    ("train_loss", "train_", "personal_train_loss"),
    ("clients_failed", "clients_rejected", "malicious_uploads"),
    ("round_time_s", "rounds_to_target", "time_to_target_s"),
    ("comm_sent_bytes", "comm_received_bytes", "comm_sent_total", "comm_received_total", "comm_"),
    ("dp_",),
)


def _rank(key: str) -> tuple[int, bool, int, str]:
    """Where ``key`` goes: its group; a group's plain columns before its per-architecture ones
    (``resnet10/test_acc``); its place among the group's named prefixes; then by name."""
    name = key.rsplit("/", 1)[-1]
    for group, prefixes in enumerate(_GROUPS):
        for place, prefix in enumerate(prefixes):
            if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
                return group, "/" in key, place, key
    return len(_GROUPS), False, 0, key


def column_order(keys: Iterable[str]) -> list[str]:
    """The keys of ``metrics.csv`` in reading order (module docstring); any other key (an
    aggregator's or attack's round metric) comes last, alphabetically."""
    return sorted(set(keys), key=_rank)


class MetricsTable:
    """Writes ``run_dir/metrics.csv`` row by row, flushed after each row (a killed run keeps every
    row it logged)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "metrics.csv"
        self.rows: list[dict[str, float]] = []
        self.header: list[str] = []

    def start(self, history: Iterable[Mapping[str, float]]) -> None:
        """Begin the file with ``history``, the rows a resumed run keeps (none for a new run)."""
        self.rows = [dict(row) for row in history]
        self.header = column_order(k for row in self.rows for k in row)
        if self.rows:  # no file before the first row, as before any result
            self._write_all()

    def add(self, row: Mapping[str, float]) -> None:
        """Append one evaluated round's row (rewriting the file if it brings a new column)."""
        self.rows.append(dict(row))
        if set(row) <= set(self.header):
            with self.path.open("a", newline="") as handle:
                csv.DictWriter(handle, fieldnames=self.header).writerow(row)
            return
        self.header = column_order([*self.header, *row])
        self._write_all()

    def _write_all(self) -> None:
        with self.path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.header)
            writer.writeheader()
            writer.writerows(self.rows)
