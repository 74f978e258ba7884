"""The ``huggingface`` data source: a Hugging Face ``datasets`` data set already on disk.

``root`` (or ``source_options.path``) is one of:

- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (read with
  ``datasets.load_from_disk``);
- a ``.parquet`` or ``.arrow`` file, or a folder of them (``load_dataset("parquet"|"arrow",
  data_files=...)``; files named ``*test*`` form the test split);
- an image folder (``load_dataset("imagefolder", data_dir=...)``: ``train/<class>/*.png``,
  ``test/<class>/*.png``), with ``source_options.format: imagefolder``.

The columns are configurable (``image_column``, ``label_column``, ``client_column``; by default the
first of ``image``/``img``/``pixels`` and of ``label``/``labels``/``character``/``fine_label`` the
data set has). ``client_column`` (e.g. FEMNIST's ``writer_id``) gives each training sample its
natural user, for ``partition: natural`` or ``flwr.natural_id``. The test split is
``test_split`` (default ``test``); without one, a stratified ``test_fraction`` of the training
split, drawn with a fixed seed. Images become float tensors ``(n, C, H, W)`` standardised per
channel with the training statistics, as the other sources. Nothing is downloaded: paths are
local, and ``HF_DATASETS_OFFLINE=1`` is set while reading. Needs ``pip install 'fedlightning[hf]'``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fedlightning.data.hf_checks import check_images, check_labels, undecodable_image
from fedlightning.data.sources import DataSplit, standardised
from fedlightning.errors import ConfigurationError

FORMATS = ("auto", "disk", "parquet", "arrow", "imagefolder")
OPTIONS = (
    "path", "format", "image_column", "label_column", "client_column", "train_split",
    "test_split", "test_fraction",
)  # fmt: skip
IMAGE_COLUMNS = ("image", "img", "pixels", "pixel_values", "x")
LABEL_COLUMNS = ("label", "labels", "character", "fine_label", "y")


def _datasets():
    try:
        import datasets
    except ImportError as error:
        raise ConfigurationError(
            "data.dataset='huggingface' needs the datasets package: pip install 'fedlightning[hf]'"
        ) from error
    return datasets


@contextmanager
def _offline():
    previous = os.environ.get("HF_DATASETS_OFFLINE")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HF_DATASETS_OFFLINE", None)
        else:
            os.environ["HF_DATASETS_OFFLINE"] = previous


def _format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.is_dir() and any(
        (path / name).is_file() for name in ("dataset_dict.json", "state.json", "dataset_info.json")
    ):
        return "disk"
    for suffix in ("parquet", "arrow"):
        if path.suffix == f".{suffix}" or (path.is_dir() and any(path.rglob(f"*.{suffix}"))):
            return suffix
    raise ConfigurationError(
        f"data.root={str(path)!r} is neither a save_to_disk folder nor .parquet/.arrow files: set "
        f"data.source_options.format to one of {', '.join(FORMATS)} (imagefolder for class folders)"
    )


def read_splits(path: Path, fmt: str) -> dict[str, Any]:
    """The data set's splits by name (a single ``Dataset`` becomes ``{"train": ...}``)."""
    datasets = _datasets()
    if not path.exists():
        raise ConfigurationError(
            f"data.root={str(path)!r} does not exist: point it at a save_to_disk folder, "
            "parquet/arrow files or an image folder (nothing is downloaded)"
        )
    fmt = _format(path, fmt)
    with _offline():
        if fmt == "disk":
            loaded = datasets.load_from_disk(str(path))
        elif fmt == "imagefolder":
            loaded = datasets.load_dataset("imagefolder", data_dir=str(path))
        else:
            files = [path] if path.is_file() else sorted(path.rglob(f"*.{fmt}"))
            test = [str(f) for f in files if "test" in f.name]
            data_files = {"train": [str(f) for f in files if "test" not in f.name]}
            if test:
                data_files["test"] = test
            loaded = datasets.load_dataset(fmt, data_files=data_files)
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}
    return dict(loaded)


def _column(dataset: Any, given: str | None, candidates: tuple[str, ...], option: str) -> str:
    names = dataset.column_names
    if given is not None:
        if given not in names:
            raise ConfigurationError(
                f"data.source_options.{option}={given!r} is not a column: the data set has {names}"
            )
        return given
    for name in candidates:
        if name in names:
            return name
    raise ConfigurationError(
        f"no {option.removesuffix('_column')} column among {names}: set data.source_options.{option}"
    )


def _images(dataset: Any, column: str, where: str) -> np.ndarray:
    """``(n, C, H, W)`` (or ``(n, d)`` for vectors) as float32; uint8 pixels scaled to [0, 1].
    A sample that is missing, not an image or array of numbers, an undecodable image file, or of
    another shape than the first is refused naming ``where`` (the data set and split), the row
    and the column (:func:`fedlightning.data.hf_checks.check_images`)."""
    try:  # images are decoded while the column is read
        arrays = check_images(dataset.with_format(None)[column], column, where)
    except ConfigurationError:
        raise
    except Exception as error:  # noqa: BLE001 (PIL raises several kinds for a bad image file)
        raise undecodable_image(dataset, column, where, error) from None
    x = np.stack(arrays)
    scale = 255.0 if x.dtype == np.uint8 else 1.0
    x = x.astype(np.float32) / scale
    if x.ndim == 3:  # (n, H, W): one channel
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
        x = x.transpose(0, 3, 1, 2)  # (n, H, W, C) -> (n, C, H, W)
    return x


def load_huggingface(root: str | Path, options: dict[str, Any] | None = None) -> DataSplit:
    """Load a local Hugging Face data set (see the module docstring for ``options``)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"data.source_options has unknown keys {unknown}: allowed are {', '.join(OPTIONS)}"
        )
    fmt = options.get("format", "auto")
    if fmt not in FORMATS:
        raise ConfigurationError(
            f"data.source_options.format={fmt!r}: choose one of {', '.join(FORMATS)}"
        )
    splits = read_splits(Path(options.get("path") or root), fmt)
    train_name = options.get("train_split", "train")
    if train_name not in splits:
        raise ConfigurationError(
            f"data.source_options.train_split={train_name!r}: the splits are {sorted(splits)}"
        )
    train = splits[train_name]
    image = _column(train, options.get("image_column"), IMAGE_COLUMNS, "image_column")
    label = _column(train, options.get("label_column"), LABEL_COLUMNS, "label_column")
    client = options.get("client_column")
    if client is not None:
        _column(train, client, (), "client_column")
    root_text = f"data.root={str(options.get('path') or root)!r}"
    train_at = f"{root_text} split {train_name!r}"
    check_labels(train.with_format(None)[label], label, train_at)  # before any encoding
    test_name = options.get("test_split", "test")
    if test_name in splits:
        test = splits[test_name]
        test_at = f"{root_text} split {test_name!r}"
    else:
        fraction = float(options.get("test_fraction", 0.2))
        if not 0 < fraction < 1:
            raise ConfigurationError(
                f"no {test_name!r} split and data.source_options.test_fraction={fraction}: "
                "give a fraction in (0, 1) or name the test split (test_split)"
            )
        parts = train.class_encode_column(label) if _needs_encoding(train, label) else train
        parts = parts.train_test_split(test_size=fraction, seed=0, stratify_by_column=label)
        train, test = parts["train"], parts["test"]
        train_at, test_at = (f"{train_at} ({part} part by test_fraction)" for part in parts)
    train_y, classes = _labels(train, label, train_at)
    test_y, _ = _labels(test, label, test_at, classes)
    split = standardised(
        _images(train, image, train_at), train_y, _images(test, image, test_at), test_y,
        num_classes=len(classes),
    )  # fmt: skip
    if client is not None:
        ids = np.asarray(train.with_format(None)[client])
        _, split.client_ids = np.unique(ids, return_inverse=True)
    return split


def _needs_encoding(dataset: Any, label: str) -> bool:
    return type(dataset.features[label]).__name__ != "ClassLabel"


def _labels(dataset: Any, column: str, where: str, classes: np.ndarray | None = None):
    """Labels as ``0..K-1``: ClassLabel and integer labels keep their values (K = max + 1 or the
    ClassLabel's size; whole-number floats count as integers); other labels (strings) are
    numbered in sorted order. A missing or fractional label is refused naming the row
    (:func:`fedlightning.data.hf_checks.check_labels`)."""
    values = check_labels(dataset.with_format(None)[column], column, where)
    feature = dataset.features[column]
    if classes is None:
        if type(feature).__name__ == "ClassLabel":
            classes = np.arange(feature.num_classes)
        elif np.issubdtype(values.dtype, np.integer):
            classes = np.arange(int(values.max()) + 1)
        else:
            classes = np.unique(values)
    if np.issubdtype(values.dtype, np.integer):
        bad = np.flatnonzero((values < 0) | (values >= len(classes)))
        if len(bad):
            raise ConfigurationError(
                f"{where}, column {column!r}: label column {column!r} has values outside "
                f"0..{len(classes) - 1} (row {bad[0]}: {values[bad[0]]})"
            )
        return values.astype(np.int64), classes
    lookup = {value: i for i, value in enumerate(classes)}
    missing = sorted(set(values.tolist()) - set(lookup))
    if missing:
        raise ConfigurationError(
            f"{where}, column {column!r}: test labels {missing[:5]} do not occur in the training split"
        )
    return np.array([lookup[v] for v in values.tolist()], dtype=np.int64), classes
