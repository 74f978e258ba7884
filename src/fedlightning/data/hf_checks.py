"""Checks of a Hugging Face data set's image and label columns (:mod:`fedlightning.data.hf_source`).

Data that would train to garbage, or fail deep inside numpy or PIL, is refused at load with one
:class:`~fedlightning.errors.ConfigurationError` naming the data set and split (``where``), the
row and the column: a missing image or label (None), an image column of text or other non-numbers,
an image file PIL cannot decode (named by its path when the data set keeps one, e.g. an image
folder), images of different shapes, fractional (or NaN) labels.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedlightning.errors import ConfigurationError


def check_images(values: Sequence[Any], column: str, where: str) -> list[np.ndarray]:
    """``values`` (decoded images, or nested lists of numbers) as arrays of one shape and a numeric
    dtype; the first bad sample is refused naming its row."""
    arrays, first_shape = [], None
    for row, value in enumerate(values):
        at = f"{where}, row {row}, column {column!r}"
        if value is None:
            raise ConfigurationError(f"{at} has no image (None): remove the row or fill it in")
        try:
            array = np.asarray(value)
        except ValueError:
            if not isinstance(value, list | tuple):
                raise  # an image that failed to decode: undecodable_image finds the file
            raise ConfigurationError(f"{at} is a ragged list: not an image or array") from None
        if array.dtype.kind not in "biuf":
            raise ConfigurationError(
                f"{at} holds {type(value).__name__} {_shown(value)}, not an image or numbers: "
                "set data.source_options.image_column to the column of images"
            )
        if first_shape is None:
            first_shape = array.shape
        elif array.shape != first_shape:
            raise ConfigurationError(
                f"{at} has shape {array.shape} but row 0 has {first_shape}: resize them first "
                "(every image of a data set must have one size)"
            )
        arrays.append(array)
    if not arrays:
        raise ConfigurationError(f"{where}, column {column!r} holds no samples")
    return arrays


def undecodable_image(dataset: Any, column: str, where: str, error: BaseException) -> Exception:
    """The error for an image column that could not be decoded as a whole (``error``): the first
    row whose file PIL cannot open, named with its path if it has one."""
    from PIL import Image

    try:
        import datasets

        raw = dataset.cast_column(column, datasets.Image(decode=False)).with_format(None)[column]
    except Exception:  # noqa: BLE001 (not an Image column: say what failed, without a row)
        return ConfigurationError(
            f"{where}, column {column!r} cannot be read: {type(error).__name__}: {error}"
        )
    for row, value in enumerate(raw):
        if value is None:
            return ConfigurationError(f"{where}, row {row}, column {column!r} has no image (None)")
        path, data = value.get("path"), value.get("bytes")
        try:
            with Image.open(io.BytesIO(data) if data is not None else path) as image:
                image.load()
        except Exception as bad:  # noqa: BLE001 (PIL: UnidentifiedImageError, OSError, SyntaxError...)
            file = f" (file {path!r})" if path else ""
            reason = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "(its bytes)", str(bad))
            return ConfigurationError(
                f"{where}, row {row}, column {column!r}{file} is not a readable image: "
                f"{type(bad).__name__}: {' '.join(reason.split())[:120]}"
            )
    return ConfigurationError(
        f"{where}, column {column!r} cannot be decoded: {type(error).__name__}: {error}"
    )


def check_labels(values: Sequence[Any], column: str, where: str) -> np.ndarray:
    """``values`` as an array of integers (whole-number floats included) or of class names; a
    missing, fractional or non-finite label is refused naming its row."""
    for row, value in enumerate(values):
        if value is None:
            raise ConfigurationError(f"{where}, row {row}, column {column!r} has no label (None)")
    array = np.asarray(values)
    if array.dtype.kind == "f":
        whole = np.isfinite(array) & (array == np.round(array))
        if not whole.all():
            row = int(np.flatnonzero(~whole)[0])
            raise ConfigurationError(
                f"{where}, row {row}, column {column!r} holds the label {array[row]!r}: labels must "
                "be whole numbers, class names or a ClassLabel (fractional labels are not classes)"
            )
        array = array.astype(np.int64)
    return array


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
