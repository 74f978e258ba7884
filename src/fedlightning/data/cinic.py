"""CINIC-10 from its folder layout (Darlow et al. 2018, arXiv:1810.03505): ``root/train``,
``root/valid`` and ``root/test``, each with one folder of 32x32 PNG images per class (``airplane``
... ``truck``), as the released archive unpacks. Nothing downloads (docs/algorithms.md section 4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlightning.data.sources import DataSplit, standardised
from fedlightning.errors import ConfigurationError

CINIC10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip


def _read_split(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    images, labels = [], []
    for label, name in enumerate(CINIC10_CLASSES):
        for path in sorted((folder / name).glob("*.png")):
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
            if pixels.shape != (32, 32, 3):
                raise ConfigurationError(f"CINIC-10 image {path} is {pixels.shape}, not 32x32 RGB")
            images.append(pixels)
            labels.append(label)
    if not images:
        raise ConfigurationError(f"no CINIC-10 images under {folder}")
    x = np.stack(images).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    return x, np.asarray(labels, dtype=np.int64)


def load_cinic10(root: str | Path, include_valid: bool = False) -> DataSplit:
    """CINIC-10 as float ``(n, 3, 32, 32)`` tensors standardised with the training statistics:
    the training pool from ``root/train`` (plus ``root/valid`` with ``include_valid``), the global
    test set from ``root/test``; labels in :data:`CINIC10_CLASSES` order (the archive's
    alphabetical folder order)."""
    root = Path(root)
    missing = [s for s in ("train", "test") if not (root / s).is_dir()]
    if missing:
        raise ConfigurationError(
            f"CINIC-10 not found under root={str(root)!r}: expected the folders train/ and test/ "
            f"(missing: {', '.join(missing)}) with one sub-folder of PNGs per class"
        )
    train_x, train_y = _read_split(root / "train")
    if include_valid and (root / "valid").is_dir():
        valid_x, valid_y = _read_split(root / "valid")
        train_x, train_y = np.concatenate([train_x, valid_x]), np.concatenate([train_y, valid_y])
    test_x, test_y = _read_split(root / "test")
    return standardised(train_x, train_y, test_x, test_y, num_classes=10)
