"""What ``fedlightning plot`` reads, checked: a run's ``metrics.csv`` and ``config.yaml``, the
output file name and the ``-c`` options file. Each mistake is a :class:`PlotInputError` naming the
file (and row, column or option) and what is expected, which the command prints in one line."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

#: the options a ``fedlightning plot -c FILE`` may set, with their defaults
PLOT_OPTIONS: dict[str, Any] = {
    "metric": "test_acc", "group_by": None, "x": "round", "title": None, "xlabel": None,
    "ylabel": None, "labels": None, "figsize": None, "output": "runs.png",
}  # fmt: skip
#: the options that take a list (the others take one text value)
LIST_OPTIONS = ("labels", "figsize")
#: ``fedlightning plot``'s figure size in inches when none is given
DEFAULT_FIGSIZE = (9.0, 4.4)


class PlotInputError(ValueError):
    """A run directory, metrics file, output name or options file ``fedlightning plot`` cannot use."""


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """Columns of ``run_dir/metrics.csv`` as float arrays (empty cells become NaN). A file that is
    not CSV text, or a cell that is not a number, is a :class:`PlotInputError` naming the row
    (1 = the first data row) and the column."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: is {run_dir} a fedlightning run directory?"
        )
    data = path.read_bytes()
    if b"\0" in data:
        raise PlotInputError(f"{path} is not a CSV text file (it holds binary data)")
    try:
        rows = list(csv.DictReader(data.decode("utf-8").splitlines()))
    except (UnicodeDecodeError, csv.Error) as error:
        raise PlotInputError(f"{path} is not a readable CSV text file ({error})") from None
    columns = list(rows[0].keys()) if rows else []
    if None in columns or any(None in row or None in row.values() for row in rows):
        raise PlotInputError(f"{path}: its rows do not have one value per header column")
    table: dict[str, np.ndarray] = {}
    for column in columns:
        values = []
        for number, row in enumerate(rows, start=1):
            cell = row[column]
            try:
                values.append(float(cell) if cell != "" else np.nan)
            except ValueError:
                raise PlotInputError(
                    f"{path} row {number}, column {column!r}: {cell[:40]!r} is not a number"
                ) from None
        table[column] = np.array(values)
    return table


def config_value(run_dir: str | Path, name: str) -> str:
    """The value of option ``name`` in ``run_dir/config.yaml``: a dotted path (``loop.seed``,
    ``model.init_args.mu`` or ``model.mu``: ``init_args`` may be left out) or a unique last part
    (``mu``). A class is named by its class name."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --group-by reads each run's config.yaml")
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise PlotInputError(
            f"{path} is not readable YAML: {' '.join(str(error).split())}"
        ) from None
    flat: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            if "class_path" in node:
                flat[prefix] = str(node["class_path"]).rsplit(".", 1)[-1]
            for key, value in node.items():
                walk(value, prefix if key == "init_args" else f"{prefix}.{key}".strip("."))
        elif prefix not in flat:
            flat[prefix] = node

    walk(config, "")
    key = ".".join(part for part in name.split(".") if part != "init_args")
    matches = sorted({k for k in flat if k == key or k.endswith("." + key)})
    if key in flat:
        matches = [key]
    if len(matches) != 1:
        found = "several options: " + ", ".join(matches) if matches else "no such option"
        raise KeyError(
            f"--group-by {name!r}: {path} has {found}; give a dotted path like loop.seed"
        )
    return str(flat[matches[0]])


def check_output(out: str | Path) -> Path:
    """``out`` if matplotlib writes its file type (by the name's extension), else an error."""
    from matplotlib.figure import Figure

    out = Path(out)
    kinds = Figure().canvas.get_supported_filetypes()
    kind = out.suffix.lstrip(".").lower()
    if kind not in kinds:
        shown = f"the file type {kind!r}" if kind else "no file type"
        raise PlotInputError(
            f"-o {str(out)!r} has {shown}: name an image file ending in one of "
            f".{', .'.join(sorted(kinds))} (e.g. compare.png)"
        )
    if out.parent != Path() and not out.parent.is_dir():
        raise PlotInputError(f"-o {str(out)!r}: the folder {str(out.parent)!r} does not exist")
    return out


def read_options(config: str | Path) -> dict[str, Any]:
    """The options in a ``-c FILE`` for ``fedlightning plot``: a YAML mapping of
    :data:`PLOT_OPTIONS` keys to text values."""
    import yaml

    path = Path(config)
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as error:
        raise PlotInputError(f"-c {str(path)!r} cannot be read: {error.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise PlotInputError(
            f"-c {str(path)!r} is not readable YAML: {' '.join(str(error).split())}"
        ) from None
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise PlotInputError(
            f"-c {str(path)!r} holds a {type(loaded).__name__}: expected a mapping of "
            f"{', '.join(PLOT_OPTIONS)} to values (e.g. 'metric: test_acc')"
        )
    unknown = sorted(set(map(str, loaded)) - set(PLOT_OPTIONS))
    if unknown:
        raise PlotInputError(
            f"-c {str(path)!r}: unknown keys {unknown}; allowed: {sorted(PLOT_OPTIONS)}"
        )
    for key, value in loaded.items():
        if key in LIST_OPTIONS and isinstance(value, list):
            if all(isinstance(v, str | int | float) for v in value):
                continue
        elif value is None or isinstance(value, str | int | float):
            continue
        expected = "a list of text values" if key in LIST_OPTIONS else "a text value"
        raise PlotInputError(
            f"-c {str(path)!r}: {key}={value!r} is not allowed: expected {expected}"
        )
    options: dict[str, Any] = {}
    for key, value in loaded.items():
        if value is None:
            options[key] = None
        elif key in LIST_OPTIONS:  # one name is a list of one
            options[key] = [str(v) for v in (value if isinstance(value, list) else [value])]
        else:
            options[key] = str(value)
    return options


def figure_size(value: Any) -> tuple[float, float]:
    """``--figsize WIDTH HEIGHT`` in inches: two numbers > 0 (:data:`DEFAULT_FIGSIZE` if None)."""
    if value is None:
        return DEFAULT_FIGSIZE
    try:
        width, height = (float(v) for v in value)
    except (TypeError, ValueError):
        width = height = float("nan")
    if not (0 < width <= 100 and 0 < height <= 100):
        raise PlotInputError(
            f"--figsize {' '.join(map(str, value)) if isinstance(value, list | tuple) else value}: "
            "expected two numbers, the width and height in inches (e.g. --figsize 6 3.5)"
        )
    return width, height
