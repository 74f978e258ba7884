"""LEAF FEMNIST from its json files: each writer a natural client, writers selected by sample count
(docs/algorithms.md section 4); :func:`load_leaf` is the ``femnist`` source of
:func:`fedlightning.data.sources.load_source`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedlightning.data.sources import DataSplit, standardised
from fedlightning.data.validation import finite_inputs, integer_labels, labels_in_range
from fedlightning.data.writers import select_writers, split_per_writer
from fedlightning.errors import ConfigurationError


def load_leaf(
    root: str | Path,
    min_samples: int = 0,
    top_k: int | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
) -> DataSplit:
    """LEAF FEMNIST json (Caldas et al. 2018, arXiv:1812.01097): ``root/train/*.json``, ``root/test/*.json``.

    Each file holds ``{"users": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}``.
    Training samples keep their writer as natural client id (the kept writers numbered in sorted
    order); the global test set is the union of the kept writers' test samples. Images are
    1x28x28, 62 classes.

    Writers (:mod:`fedlightning.data.writers`): only those with at least ``min_samples`` samples
    (train and test files counted together), then the ``top_k`` with the most. With
    ``test_fraction``, each kept writer's samples from both files are pooled and split anew,
    ``floor(n_w * test_fraction)`` to the test set (CoFED: top 100 writers, 0.6).
    """
    root = Path(root)
    train_files = sorted((root / "train").glob("*.json"))
    test_files = sorted((root / "test").glob("*.json"))
    if not train_files or not test_files:
        raise ConfigurationError(
            f"LEAF json not found under root={str(root)!r}: expected root/train/*.json and "
            "root/test/*.json as written by LEAF's preprocess.sh (e.g. data/femnist/data)"
        )
    train_users, train_x, train_y = _read_leaf(train_files)
    test_users, test_x, test_y = _read_leaf(test_files)
    for split, labels in (("train", train_y), ("test", test_y)):
        if len(labels) == 0:
            raise ConfigurationError(
                f"the LEAF {split} files under {str(root / split)!r} hold no samples: expected "
                "at least one user with images"
            )
    names = sorted(set(train_users) | set(test_users))
    index = {w: k for k, w in enumerate(names)}
    train_w = np.array([index[u] for u in train_users], dtype=np.int64)
    test_w = np.array([index[u] for u in test_users], dtype=np.int64)
    train_x, train_y, train_w, test_x, test_y = _kept_writers(
        (train_x, train_y, train_w),
        (test_x, test_y, test_w),
        min_samples,
        top_k,
        test_fraction,
        seed,
    )
    clients = np.unique(train_w)
    split = standardised(train_x, train_y, test_x, test_y, num_classes=62)
    split.client_ids = np.searchsorted(clients, train_w).astype(np.int64)
    return split


def _read_leaf(files: Sequence[Path]) -> tuple[list[str], np.ndarray, np.ndarray]:
    users: list[str] = []
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for path in files:
        try:
            blob = json.loads(path.read_text())
            for user in blob["users"]:
                record = blob["user_data"][user]
                x = np.asarray(record["x"], dtype=np.float32).reshape(-1, 1, 28, 28)
                where = f"LEAF json {str(path)!r}, user {user!r}"
                y = integer_labels(record["y"], where)
                finite_inputs(x, where)
                labels_in_range(torch.as_tensor(y), 62, where + " (FEMNIST)")
                if len(x) != len(y):
                    raise ValueError(f"user {user!r} has {len(x)} images but {len(y)} labels")
                users.extend([user] * len(y))
                xs.append(x)
                ys.append(y)
        except ConfigurationError:
            raise
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ConfigurationError(
                f"malformed LEAF json {str(path)!r}: {err!r}; expected keys 'users' and "
                "'user_data' with per-user 'x' (784 floats per image) and 'y'"
            ) from err
    labels = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= 62):
        raise ConfigurationError(
            f"LEAF labels must lie in [0, 62) for FEMNIST, got range [{labels.min()}, {labels.max()}]"
        )
    return users, np.concatenate(xs) if xs else np.zeros((0, 1, 28, 28), np.float32), labels


def _kept_writers(
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray, np.ndarray],
    min_samples: int,
    top_k: int | None,
    test_fraction: float | None,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The kept writers' samples (:mod:`fedlightning.data.writers`): ``train`` and ``test`` are
    ``(x, y, writer)``; returns ``train_x, train_y, train_w, test_x, test_y``, each writer's
    samples split anew into train/test with ``test_fraction``, else as the files split them."""
    (train_x, train_y, train_w), (test_x, test_y, test_w) = train, test
    kept = select_writers(np.concatenate([train_w, test_w]), min_samples, top_k)
    if not len(kept):
        raise ConfigurationError(
            f"no FEMNIST writer has writer_min_samples={min_samples} samples: lower it"
        )
    if test_fraction is not None:
        x, y = np.concatenate([train_x, test_x]), np.concatenate([train_y, test_y])
        w = np.concatenate([train_w, test_w])
        keep = np.isin(w, kept)
        x, y, w = x[keep], y[keep], w[keep]
        train_rows, test_rows = split_per_writer(w, test_fraction, seed)
        return x[train_rows], y[train_rows], w[train_rows], x[test_rows], y[test_rows]
    keep_train, keep_test = np.isin(train_w, kept), np.isin(test_w, kept)
    return (
        train_x[keep_train], train_y[keep_train], train_w[keep_train],
        test_x[keep_test], test_y[keep_test],
    )  # fmt: skip
