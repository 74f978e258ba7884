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
        "--data.shards_per_client", "2", "--loop.rounds", "1", "--loop.clients_per_round", "5",
        "--loop.local_epochs", "1", "--loop.plots", "false",
    )  # fmt: skip
    assert float(rows[-1]["test_acc"]) > 0.3
    table = np.loadtxt(tmp_path / "partition.csv", delimiter=",", skiprows=1, dtype=np.int64)
    counts = table[:, 1:]  # the training part of each client (val_fraction 0.1 held out)
    assert 0.85 * 4000 <= counts.sum() <= 4000
    # FML's Non-IID(3): 2 label-sorted shards of 400, each exactly one digit of mnist5k
    assert ((counts > 0).sum(axis=1) <= 2).all() and (counts.max(axis=1) >= 300).all()


def _leaf_writers(tmp_path, sizes):
    """Writers w0.. with ``sizes[k]`` training samples and 2 test samples each."""
    for k, n in enumerate(sizes):
        _leaf_file(tmp_path / "train" / f"{k}.json", [f"w{k}"], n, label_offset=k)
        _leaf_file(tmp_path / "test" / f"{k}.json", [f"w{k}"], 2, label_offset=k)


def test_femnist_writer_filters(tmp_path):
    _leaf_writers(tmp_path, [3, 10, 6, 12])  # totals with the 2 test samples: 5, 12, 8, 14
    split = load_source("femnist", root=tmp_path, writer_min_samples=8)
    assert len(split.train_y) == 10 + 6 + 12 and len(split.test_y) == 3 * 2  # w0 dropped
    assert np.bincount(split.client_ids).tolist() == [10, 6, 12]  # renumbered in writer order
    top = load_source("femnist", root=tmp_path, writer_top_k=2)
    assert np.bincount(top.client_ids).tolist() == [10, 12] and len(top.test_y) == 4
    with pytest.raises(ConfigurationError, match="writer_min_samples=100"):
        load_source("femnist", root=tmp_path, writer_min_samples=100)


def test_femnist_per_writer_split_through_the_cli(cli, tmp_path):
    data = tmp_path / "leaf"
    _leaf_writers(data, [18, 8, 28, 38])  # totals 20, 10, 30, 40
    split = load_source("femnist", root=data, writer_top_k=3, writer_test_fraction=0.6, seed=0)
    # each writer's 20/30/40 samples split anew: floor(0.6 n) to test, the rest to train
    assert (
        np.bincount(split.client_ids).tolist() == [8, 12, 16] and len(split.test_y) == 12 + 18 + 24
    )
    again = load_source("femnist", root=data, writer_top_k=3, writer_test_fraction=0.6, seed=0)
    assert torch.equal(split.train_x, again.train_x)
    rows = cli(
        tmp_path / "run", "--data.dataset", "femnist", "--data.root", str(data), "--data.partition", "natural",
        "--data.num_clients", "3", "--data.writer_top_k", "3", "--data.writer_test_fraction", "0.6",
        "--model.init_args.network", "mlp", "--loop.rounds", "1", "--loop.clients_per_round", "3",
        "--loop.plots", "false",
    )  # fmt: skip
    assert len(rows) == 1 and 0.0 <= float(rows[0]["test_acc"]) <= 1.0
    with pytest.raises(ConfigurationError, match="writer_test_fraction"):
        FederatedDataModule(dataset="femnist", writer_test_fraction=1.0)


def test_cinic10_from_its_folder_layout(tmp_path):
    from PIL import Image

    from fedlightning.data.cinic import CINIC10_CLASSES

    rng = np.random.default_rng(0)
    for split, per_class in (("train", 2), ("valid", 1), ("test", 1)):
        for name in CINIC10_CLASSES:
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{split}-{name}-{i}.png")
    split = load_source("cinic10", root=tmp_path)
    assert split.train_x.shape == (20, 3, 32, 32) and split.test_x.shape == (10, 3, 32, 32)
    assert split.train_y.tolist() == [c for c in range(10) for _ in range(2)]
    assert split.num_classes == 10
    first = np.asarray(
        Image.open(tmp_path / "train" / "airplane" / "train-airplane-0.png"), np.float32
    )
    # standardisation per channel is affine: the first image's pixel order is kept
    assert np.corrcoef(split.train_x[0, 0].flatten().numpy(), first[..., 0].flatten())[0, 1] > 0.999
    from fedlightning.data.cinic import load_cinic10

    assert load_cinic10(tmp_path, include_valid=True).train_x.shape[0] == 30
    with pytest.raises(ConfigurationError, match="CINIC-10 not found"):
        load_source("cinic10", root=tmp_path / "nowhere")
