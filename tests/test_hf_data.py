"""Hugging Face data sets on disk as a data source, and Flower Datasets' partitioners by name.

Each test writes a tiny data set itself (``Dataset.from_dict(...).save_to_disk(...)``, parquet,
an image folder); nothing downloads. Flower tests are skipped when flwr-datasets is missing.
"""

import warnings

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from fedlightning import FederatedDataModule  # noqa: E402
from fedlightning.errors import ConfigurationError  # noqa: E402

CLASSES, WRITERS = 4, 6


def tiny(n: int, seed: int) -> dict:
    """Class-dependent 8x8 uint8 images: class c is bright in row band c (learnable)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % CLASSES
    images = rng.integers(0, 60, size=(n, 8, 8), dtype=np.uint8)
    for i, c in enumerate(labels):
        images[i, 2 * c : 2 * c + 2] += 180
    return {
        "pixels": [img.tolist() for img in images],
        "digit": labels.tolist(),
        "writer_id": [f"w{i % WRITERS}" for i in range(n)],
    }


@pytest.fixture
def on_disk(tmp_path):
    path = tmp_path / "tiny_hf"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(tiny(240, 0)),
            "test": datasets.Dataset.from_dict(tiny(80, 1)),
        }
    ).save_to_disk(str(path))
    return path


OPTIONS = '{"image_column": "pixels", "label_column": "digit", "client_column": "writer_id"}'


def test_save_to_disk_folder_trains_through_fit(cli, tmp_path, on_disk):
    rows = cli(
        tmp_path / "run", "--data.dataset", "huggingface", "--data.root", str(on_disk),
        "--data.source_options", OPTIONS, "--data.partition", "natural",
        "--data.num_clients", str(WRITERS), "--loop.clients_per_round", "3",
        "--loop.rounds", "3", "--loop.plots", "false",
    )  # fmt: skip
    assert float(rows[-1]["test_acc"]) > 0.6  # chance is 0.25
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "num_classes: 4" in config and "in_channels: 1" in config
    classifier = list(torch.load(tmp_path / "run" / "global.pt", weights_only=True).values())[-1]
    assert classifier.shape == (CLASSES,)  # the model was built with the data's 4 classes


def test_columns_splits_and_client_ids(on_disk):
    dm = FederatedDataModule(
        dataset="huggingface", root=str(on_disk), num_clients=WRITERS, partition="natural",
        source_options={"image_column": "pixels", "label_column": "digit",
                        "client_column": "writer_id"},
    )  # fmt: skip
    dm.setup()
    data = dm.data
    assert data.train_x.shape == (240, 1, 8, 8) and data.test_x.shape == (80, 1, 8, 8)
    assert data.num_classes == CLASSES and sorted(set(data.train_y.tolist())) == [0, 1, 2, 3]
    assert abs(float(data.train_x.mean())) < 1e-4  # standardised with training statistics
    table = dm.partition_table()
    assert table.shape == (WRITERS, CLASSES) and table.sum() == 240 - WRITERS * 4  # val 10 %


def test_parquet_without_test_split_uses_test_fraction(tmp_path):
    file = tmp_path / "train.parquet"
    datasets.Dataset.from_dict(tiny(200, 2)).rename_column("pixels", "image").to_parquet(str(file))
    dm = FederatedDataModule(
        dataset="huggingface", root=str(file), num_clients=4, partition="iid",
        source_options={"label_column": "digit", "test_fraction": 0.25},
    )  # fmt: skip
    assert len(dm.data.test_y) == 50 and len(dm.data.train_y) == 150
    assert np.bincount(dm.data.test_y.numpy()).tolist() == [12, 13, 12, 13] or sorted(
        np.bincount(dm.data.test_y.numpy()).tolist()
    ) == [12, 12, 13, 13]  # stratified


def test_imagefolder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("test", 2)):
        for name in ("cat", "dog"):
            folder = tmp_path / "imgs" / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    dm = FederatedDataModule(
        dataset="huggingface", root=str(tmp_path / "imgs"), num_clients=2, partition="iid",
        val_fraction=0.0, source_options={"format": "imagefolder"},
    )  # fmt: skip
    assert dm.data.train_x.shape == (12, 3, 8, 8) and dm.data.test_x.shape == (4, 3, 8, 8)
    assert dm.num_classes == 2 and (dm.in_channels, dm.image_size) == (3, 8)


def test_bad_options_are_named(on_disk, tmp_path):
    with pytest.raises(ConfigurationError, match="image_column='nope' is not a column"):
        _ = FederatedDataModule(
            dataset="huggingface", root=str(on_disk), source_options={"image_column": "nope"}
        ).data
    with pytest.raises(ConfigurationError, match="unknown keys"):
        _ = FederatedDataModule(
            dataset="huggingface", root=str(on_disk), source_options={"colour": 1}
        ).data
    with pytest.raises(ConfigurationError, match="does not exist"):
        _ = FederatedDataModule(dataset="huggingface", root=str(tmp_path / "missing")).data


FLOWER = ["flwr.iid", "flwr.dirichlet", "flwr.pathological", "flwr.shard", "flwr.natural_id"]
FLOWER_OPTIONS = {
    "flwr.dirichlet": {"alpha": 0.5, "min_partition_size": 5},
    "flwr.pathological": {"num_classes_per_partition": 2},
    "flwr.shard": {"num_shards_per_partition": 2},
}


@pytest.mark.parametrize("name", FLOWER)
def test_flower_partitioners_by_name(on_disk, name):
    pytest.importorskip("flwr_datasets")

    def partitioned() -> FederatedDataModule:
        dm = FederatedDataModule(
            dataset="huggingface", root=str(on_disk), num_clients=WRITERS, partition=name,
            partition_options=FLOWER_OPTIONS.get(name), val_fraction=0.0, seed=3,
            source_options={"image_column": "pixels", "label_column": "digit",
                            "client_column": "writer_id"},
        )  # fmt: skip
        dm.setup()
        return dm

    dm = partitioned()
    table = dm.partition_table()
    assert table.shape == (WRITERS, CLASSES) and (table.sum(axis=1) > 0).all()
    parts = [set(idx.tolist()) for idx in dm._train_idx]
    assert sum(map(len, parts)) == len(set().union(*parts))  # disjoint
    if name == "flwr.pathological":
        assert ((table > 0).sum(axis=1) <= 2).all()
    if name == "flwr.natural_id":
        writers = np.array(tiny(240, 0)["writer_id"])
        assert all(len(set(writers[list(p)])) == 1 for p in parts)
    assert partitioned().partition_hash() == dm.partition_hash()  # seeded from the run


def test_flower_options_are_checked(on_disk):
    pytest.importorskip("flwr_datasets")
    dm = FederatedDataModule(
        dataset="huggingface", root=str(on_disk), partition="flwr.dirichlet",
        partition_options={"beta": 0.5},
        source_options={"image_column": "pixels", "label_column": "digit"},
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="not arguments of DirichletPartitioner"):
        dm.setup()


def test_flower_shard_partitioner_leaks_no_pyarrow_deprecation(on_disk):
    """ShardPartitioner sorts with pyarrow, whose FutureWarning about SortOptions' null_placement
    a user cannot act on: it is filtered around Flower's partitioning, other warnings pass."""
    pytest.importorskip("flwr_datasets")
    from fedlightning.data.flower import _quiet_pyarrow_sort

    dm = FederatedDataModule(
        dataset="huggingface", root=str(on_disk), num_clients=WRITERS, partition="flwr.shard",
        partition_options=FLOWER_OPTIONS["flwr.shard"], val_fraction=0.0, seed=3,
        source_options={"image_column": "pixels", "label_column": "digit"},
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.setup()
    assert not [w for w in caught if "null_placement" in str(w.message)]
    assert sum(len(idx) for idx in dm._train_idx) == 240
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _quiet_pyarrow_sort():
            for message, category in [
                ("Specifying null_placement in SortOptions is deprecated", FutureWarning),
                ("Specifying null_placement in SortOptions is deprecated", UserWarning),
                ("another deprecation", FutureWarning),
            ]:
                warnings.warn(message, category, stacklevel=1)
    assert [(w.category, str(w.message)) for w in caught] == [
        (UserWarning, "Specifying null_placement in SortOptions is deprecated"),
        (FutureWarning, "another deprecation"),
    ]
