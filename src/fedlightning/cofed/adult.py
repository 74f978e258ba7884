"""The UCI Adult census data from a local ``adult.data``/``adult.test`` pair (CoFED's tabular
experiment; Cao et al., arXiv:2202.08603; docs/algorithms.md section 3). Nothing downloads.

The UCI format: comma-separated rows of 15 fields (6 numeric, 8 categorical, then the label
``<=50K``/``>50K``; ``adult.test`` writes the label with a trailing dot and starts with a
``|1x3 Cross validator`` line), ``?`` for a missing value, blank lines allowed. Numeric columns
are kept as floats; each categorical column is one-hot encoded over the categories seen in
``adult.data`` (``?`` is a category of its own; a test-only category encodes as all zeros).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlightning.errors import ConfigurationError

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country",
)  # fmt: skip
NUMERIC = frozenset(
    {"age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"}
)


def read_adult_file(path: Path) -> tuple[list[list[str]], np.ndarray]:
    """The rows (14 fields as strings) and the labels (1 for ``>50K``) of one UCI file."""
    rows, labels = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("|"):
            continue
        fields = [f.strip() for f in line.split(",")]
        label = fields[-1].rstrip(".")
        if len(fields) != 15 or label not in ("<=50K", ">50K"):
            raise ConfigurationError(
                f"{path}:{number} is not a UCI Adult row (15 comma-separated fields ending in "
                f"<=50K or >50K): {line[:80]!r}"
            )
        rows.append(fields[:14])
        labels.append(int(label == ">50K"))
    if not rows:
        raise ConfigurationError(f"{path} holds no UCI Adult rows")
    return rows, np.asarray(labels, dtype=np.int64)


def load_adult(root: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(train_x, train_y, test_x, test_y)`` from ``root/adult.data`` and ``root/adult.test``,
    float32 features: the 6 numeric columns, then one-hot blocks in column order."""
    root = Path(root)
    paths = [root / "adult.data", root / "adult.test"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigurationError(
            f"tasks.dataset='adult' needs the UCI files {missing} (tasks.root={str(root)!r}); "
            "nothing downloads at run time"
        )
    (train_rows, train_y), (test_rows, test_y) = (read_adult_file(p) for p in paths)
    categories = {
        j: sorted({row[j] for row in train_rows})
        for j, name in enumerate(COLUMNS)
        if name not in NUMERIC
    }

    def encode(rows: list[list[str]]) -> np.ndarray:
        numeric_cols = [j for j, name in enumerate(COLUMNS) if name in NUMERIC]
        try:
            numeric = np.array([[float(r[j]) for j in numeric_cols] for r in rows], np.float32)
        except ValueError as error:
            raise ConfigurationError(
                f"a numeric Adult column holds a non-number: {error}"
            ) from error
        blocks = [numeric]
        for j, values in categories.items():
            index = {v: k for k, v in enumerate(values)}
            block = np.zeros((len(rows), len(values)), np.float32)
            for i, row in enumerate(rows):
                if row[j] in index:
                    block[i, index[row[j]]] = 1.0
            blocks.append(block)
        return np.concatenate(blocks, axis=1)

    return encode(train_rows), train_y, encode(test_rows), test_y
