import pickle

import numpy as np
import pytest
import torch

from fedlightning.data import FederatedDataModule, TensorBatches
from fedlightning.errors import ConfigurationError


def _dm(**kwargs):
    dm = FederatedDataModule(**{"num_clients": 10, "partition": "dirichlet", "beta": 0.5, **kwargs})
    dm.setup()
    return dm


def test_client_train_and_val_splits_are_disjoint_and_cover_the_pool():
    dm = _dm(val_fraction=0.2)
    train = torch.cat([dm._train_idx[c] for c in range(10)])
    val = torch.cat([dm._val_idx[c] for c in range(10)])
    both = torch.cat([train, val]).sort().values
    assert torch.equal(both, torch.arange(len(dm.data.train_y)))
    assert 0.15 < len(val) / len(both) < 0.2  # floor per client
    x, y, owner = dm.client_val_data()
    assert len(x) == len(y) == len(owner) == len(val)


def test_partition_table_counts_training_samples_and_is_saved(tmp_path):
    dm = _dm()
    table = dm.partition_table()
    assert table.shape == (10, 10)
    assert [dm.client_num_samples(c) for c in range(10)] == table.sum(axis=1).tolist()
    dm.save_partition(tmp_path / "partition.csv")
    lines = (tmp_path / "partition.csv").read_text().splitlines()
    assert lines[0].startswith("client,class_0") and len(lines) == 11
    assert np.array_equal(
        np.array([list(map(int, line.split(",")[1:])) for line in lines[1:]]), table
    )


def test_seed_changes_partition_and_partition_seed_pins_it():
    a, b = _dm(seed=0), _dm(seed=1)
    assert a.partition_hash() != b.partition_hash()
    c, d = _dm(seed=0, partition_seed=7), _dm(seed=1, partition_seed=7)
    assert np.array_equal(c.partition_table(), d.partition_table())


def test_client_batches_are_reproducible_per_seed():
    dm = _dm()
    first = [y.tolist() for _, y in dm.client_train_dataloader(3, seed=11)]
    again = [y.tolist() for _, y in dm.client_train_dataloader(3, seed=11)]
    other = [y.tolist() for _, y in dm.client_train_dataloader(3, seed=12)]
    assert first == again and first != other
    assert sum(len(b) for b in first) == dm.client_num_samples(3)


def test_tensor_batches_length_and_drop_last():
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    assert len(TensorBatches(x, y, 4)) == 3 and len(TensorBatches(x, y, 4, drop_last=True)) == 2
    assert [len(b[1]) for b in TensorBatches(x, y, 4)] == [4, 4, 2]


def test_resize_and_shape_properties():
    dm = _dm(resize=16)
    assert dm.sample_shape == (1, 16, 16) and dm.in_channels == 1 and dm.image_size == 16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"partition": "natural"}, "natural.*femnist"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"batch_size": 0}, "batch_size"),
        ({"partition": "zipf"}, "unknown partition 'zipf'"),
        ({"num_clients": 0}, "num_clients"),
    ],
)
def test_bad_data_options_are_refused(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        FederatedDataModule(**kwargs)


def test_training_data_placed_on_a_device_gives_the_same_batches_and_is_not_pickled():
    dm = FederatedDataModule(dataset="digits", num_clients=4, partition="iid", batch_size=16)
    dm.setup()
    on_cpu = [(x.clone(), y.clone()) for x, y in dm.client_train_dataloader(1, seed=5)]
    assert dm.place_training_data(torch.device("meta"))  # a device other than the CPU
    placed = list(dm.client_train_dataloader(1, seed=5))
    assert all(x.device.type == "meta" and y.device.type == "meta" for x, y in placed)
    assert [x.shape for x, _ in placed] == [x.shape for x, _ in on_cpu]
    copy = pickle.loads(pickle.dumps(dm))  # Ray ships data modules to workers without it
    again = list(copy.client_train_dataloader(1, seed=5))
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for a, b in zip(again, on_cpu, strict=True)
    )
    assert dm.place_training_data(torch.device("cpu"))
    assert all(x.device.type == "cpu" for x, _ in dm.client_train_dataloader(1, seed=5))
