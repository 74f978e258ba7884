import json
import struct

import numpy as np
import pytest
import torch

from fedlightning.data import FederatedDataModule, load_source
from fedlightning.data.sources import TORCHVISION_SOURCES
from fedlightning.errors import ConfigurationError


def test_digits_is_embedded_and_standardised():
    split = load_source("digits")
    assert split.train_x.shape == (1437, 1, 8, 8) and split.test_x.shape == (360, 1, 8, 8)
    assert split.num_classes == 10
    assert abs(float(split.train_x.mean())) < 1e-4
    assert torch.equal(load_source("digits").test_y, split.test_y)  # fixed test set


def test_synthetic_shape_classes_and_seed():
    a = load_source(
        "synthetic", seed=1, num_samples=300, num_test=50, num_classes=5, sample_shape=(3, 4, 4)
    )
    b = load_source(
        "synthetic", seed=1, num_samples=300, num_test=50, num_classes=5, sample_shape=(3, 4, 4)
    )
    assert a.train_x.shape == (300, 3, 4, 4) and a.test_x.shape == (50, 3, 4, 4)
    assert torch.equal(a.train_x, b.train_x)
    assert sorted(a.train_y.unique().tolist()) == [0, 1, 2, 3, 4]
    # class structure: nearest class mean on the training set classifies the test set well
    means = torch.stack([a.train_x[a.train_y == c].mean(0) for c in range(5)]).flatten(1)
    pred = torch.cdist(a.test_x.flatten(1), means).argmin(1)
    assert (pred == a.test_y).float().mean() > 0.9


def test_unknown_data_set_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="unknown data set 'imagenet'.*digits"):
        FederatedDataModule(dataset="imagenet")


@pytest.mark.parametrize("name", TORCHVISION_SOURCES)
def test_missing_torchvision_files_say_where_to_put_them(name, tmp_path):
    with pytest.raises(ConfigurationError, match=rf"{name}.*not found under root.*download: true"):
        load_source(name, root=tmp_path)


def _write_idx(path, array):
    dims = array.shape
    code = 0x08  # unsigned byte
    with open(path, "wb") as handle:
        handle.write(struct.pack(">HBB", 0, code, len(dims)))
        handle.write(struct.pack(">" + "I" * len(dims), *dims))
        handle.write(array.astype(np.uint8).tobytes())


def test_mnist_loads_from_a_local_folder(tmp_path):
    """The real torchvision path on tiny MNIST-format files written here (no network)."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 40), ("t10k", 10)):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, size=(n, 28, 28)))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    split = load_source("mnist", root=tmp_path)
    assert split.train_x.shape == (40, 1, 28, 28) and split.test_x.shape == (10, 1, 28, 28)
    assert split.num_classes == 10 and split.train_y.tolist()[:3] == [0, 1, 2]


def _leaf_file(path, users, per_user, label_offset=0):
    data = {
        "users": users,
        "num_samples": [per_user] * len(users),
        "user_data": {
            u: {"x": np.random.default_rng(k).random((per_user, 784)).tolist(),
                "y": [(k + label_offset + i) % 62 for i in range(per_user)]}
            for k, u in enumerate(users)
        },
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_leaf_femnist_natural_partition_by_writer(tmp_path):
    _leaf_file(tmp_path / "train" / "a.json", ["w1", "w0"], 12)
    _leaf_file(tmp_path / "train" / "b.json", ["w2"], 12)
    _leaf_file(tmp_path / "test" / "a.json", ["w1", "w0", "w2"], 3)
    dm = FederatedDataModule(
        dataset="femnist", root=str(tmp_path), partition="natural", num_clients=3, val_fraction=0.25
    )
    dm.setup()
    assert dm.num_classes == 62 and dm.sample_shape == (1, 28, 28)
    assert [dm.client_num_samples(c) for c in range(3)] == [9, 9, 9]
    assert len(dm.test_dataloader().y) == 9
    # writers are numbered in sorted order: client 0 is w0, the second user of a.json
    assert dm.partition_table()[0].sum() == 9


def test_malformed_leaf_json_names_the_file(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    (tmp_path / "train" / "bad.json").write_text('{"users": ["u"]}')
    (tmp_path / "test" / "t.json").write_text('{"users": [], "user_data": {}}')
    with pytest.raises(ConfigurationError, match="malformed LEAF json.*bad.json"):
        load_source("femnist", root=tmp_path)
    with pytest.raises(ConfigurationError, match="LEAF json not found"):
        load_source("femnist", root=tmp_path / "nowhere")


def test_mnist5k_is_real_offline_mnist():
    split = load_source("mnist5k")
    assert split.train_x.shape == (4000, 1, 28, 28) and split.test_x.shape == (1000, 1, 28, 28)
    assert torch.bincount(split.train_y).tolist() == [400] * 10  # stratified 80/20 of 500 a class
    assert torch.bincount(split.test_y).tolist() == [100] * 10
    assert abs(float(split.train_x.mean())) < 1e-4
    assert torch.equal(load_source("mnist5k").test_x, split.test_x)  # fixed test set
    # real digits: a nearest-class-mean classifier is far above chance (10%)
    means = torch.stack([split.train_x[split.train_y == c].mean(0) for c in range(10)]).flatten(1)
    pred = torch.cdist(split.test_x.flatten(1), means).argmin(1)
    assert (pred == split.test_y).float().mean() > 0.7


def test_mnist5k_non_iid_3_shards_through_the_cli(cli, tmp_path):
    rows = cli(
        tmp_path, "--data.dataset", "mnist5k", "--data.num_clients", "5", "--data.partition", "shards",
        "--data.shards_per_client", "3", "--loop.rounds", "1", "--loop.clients_per_round", "5",
        "--loop.local_epochs", "1", "--loop.plots", "false",
    )  # fmt: skip
    assert float(rows[-1]["test_acc"]) > 0.3
    table = np.loadtxt(tmp_path / "partition.csv", delimiter=",", skiprows=1, dtype=np.int64)
    counts = table[:, 1:]  # the training part of each client (val_fraction 0.1 held out)
    assert 0.85 * 4000 <= counts.sum() <= 4000
    # FML's Non-IID(3): 3 label-sorted shards of 800 each; a shard spans at most 2 classes
    assert ((counts > 0).sum(axis=1) <= 6).all() and (counts.max(axis=1) >= 200).all()
