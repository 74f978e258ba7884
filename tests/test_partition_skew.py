"""The personalized-FL partitions (quantity skew, exactly k classes per client) and each client's
own test split that follows its label distribution (issue 39 item 5), against independent
recomputations of their definitions (docs/algorithms.md section 4)."""

import numpy as np
import pytest
import torch

from fedlightning.data import FederatedDataModule
from fedlightning.data.ragged import Ragged
from fedlightning.data.skew import pathological, quantity_skew
from fedlightning.data.val_split import holdout, stratified_holdout
from fedlightning.errors import ConfigurationError
from fedlightning.seeding import derive_seed

LABELS = np.random.default_rng(1).integers(0, 10, size=3000)


def _covers_once(parts, n):
    assigned = np.concatenate(list(parts))
    return np.array_equal(np.sort(assigned), np.arange(n))


@pytest.mark.parametrize(("distribution", "skew"), [("lognormal", 1.0), ("powerlaw", 1.5)])
def test_quantity_skew_sizes_are_the_seeded_draw_split_by_largest_remainder(distribution, skew):
    parts = quantity_skew(LABELS, 30, seed=4, distribution=distribution, skew=skew, min_size=7)
    assert _covers_once(parts, len(LABELS))
    rng = np.random.default_rng(4)  # the definition, recomputed with plain NumPy
    if distribution == "lognormal":
        w = rng.lognormal(0.0, skew, size=30)
    else:
        w = rng.pareto(skew, size=30) + 1.0
    rest = len(LABELS) - 30 * 7
    exact = rest * w / w.sum()
    sizes = np.floor(exact).astype(int)
    missing = rest - sizes.sum()
    for i in sorted(range(30), key=lambda i: (-(exact[i] - sizes[i]), i))[:missing]:
        sizes[i] += 1
    assert parts.sizes().tolist() == (sizes + 7).tolist()
    again = quantity_skew(LABELS, 30, seed=4, distribution=distribution, skew=skew, min_size=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_quantity_skew_grows_with_sigma_and_keeps_labels_iid():
    """Log-normal sigma is the spread of log sizes; the labels stay IID (every big client sees
    every class in about the pool's proportions)."""
    labels = np.random.default_rng(0).integers(0, 10, size=200_000)
    spread = []
    for sigma in (0.3, 1.0):
        parts = quantity_skew(labels, 400, seed=0, skew=sigma, min_size=0)
        spread.append(np.log(parts.sizes()).std())
    assert spread[0] == pytest.approx(0.3, abs=0.05) and spread[1] == pytest.approx(1.0, abs=0.1)
    big = max(parts, key=len)
    shares = np.bincount(labels[big], minlength=10) / len(big)
    assert np.abs(shares - 0.1).max() < 0.02


@pytest.mark.parametrize(("clients", "k"), [(20, 2), (7, 3), (5, 2), (3, 10), (10, 1)])
def test_pathological_gives_every_client_exactly_k_classes(clients, k):
    parts = pathological(LABELS, clients, k, seed=2)
    assert _covers_once(parts, len(LABELS))
    classes = [set(LABELS[p].tolist()) for p in parts]
    assert all(len(c) == k for c in classes)
    holders = np.bincount([c for s in classes for c in s], minlength=10)
    assert holders.max() - holders.min() <= 1  # every class held as evenly as possible
    for c in range(10):  # a class's samples split evenly among its holders
        shares = [
            int((LABELS[p] == c).sum()) for p, s in zip(parts, classes, strict=True) if c in s
        ]
        assert max(shares) - min(shares) <= 1


def test_pathological_refuses_what_it_cannot_give():
    with pytest.raises(ConfigurationError, match="data.classes_per_client"):
        pathological(LABELS, 10, 11, seed=0)
    with pytest.raises(ConfigurationError, match="some class would have no client"):
        pathological(LABELS, 4, 2, seed=0)
    with pytest.raises(ConfigurationError, match="class 0 has 1 samples for its"):
        pathological(np.array([0, 1, 1, 1]), 2, 2, seed=0)


def test_stratified_holdout_follows_each_clients_label_distribution():
    parts = pathological(LABELS, 20, 3, seed=0)
    train, test = stratified_holdout(parts, LABELS, 0.25, seed=5)
    for c in range(20):
        own, kept, held = parts[c], train[c], test[c]
        assert np.array_equal(np.sort(np.concatenate([kept, held])), np.sort(own))
        for k in range(10):
            n = int((LABELS[own] == k).sum())
            assert int((LABELS[held] == k).sum()) == int(np.floor(n * 0.25 + 0.5))
    # which samples: the first of each class in the client's seeded shuffle
    generator = torch.Generator().manual_seed(derive_seed(5, "test-split", 3))
    order = parts[3][torch.randperm(len(parts[3]), generator=generator).numpy()]
    expected = []
    for k in range(10):
        of_k = order[LABELS[order] == k]
        expected += of_k[: int(np.floor(len(of_k) * 0.25 + 0.5))].tolist()
    assert sorted(expected) == test[3].tolist()


def test_stratified_holdout_refuses_a_client_left_without_training_samples():
    parts = Ragged.from_parts([np.arange(10), np.array([10])])
    with pytest.raises(ConfigurationError, match="client 1 has 1 samples"):
        stratified_holdout(parts, np.zeros(11, np.int64), 0.5, seed=0)


def _data(**kwargs):
    return FederatedDataModule(dataset="digits", num_clients=10, seed=3, **kwargs)


def test_the_client_test_split_is_off_by_default_and_moves_nothing_when_off():
    """Without ``client_test_fraction`` the training and validation rows are exactly the
    partition's holdout, as before the option existed."""
    dm = _data(partition="dirichlet")
    dm.setup()
    from fedlightning.data import partition as P

    parts = P.dirichlet(dm.data.train_y.numpy(), 10, 0.5, 3)
    train, val = holdout(parts, 0.1, 3)
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(dm._train_idx, train, strict=True))
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(dm._val_idx, val, strict=True))
    assert not dm.has_client_test
    with pytest.raises(ConfigurationError, match="data.client_test_fraction"):
        dm.client_test_data()


def test_the_datamodule_holds_out_each_clients_test_split_before_validation():
    dm = _data(partition="pathological", classes_per_client=2, client_test_fraction=0.2)
    dm.setup()
    labels = dm.data.train_y.numpy()
    for c in range(10):
        train, val = dm._train_idx[c].numpy(), dm._val_idx[c].numpy()
        _, y, owner = dm.client_test_data([c])
        assert set(y.tolist()) == set(labels[train].tolist()) and len(set(y.tolist())) == 2
        assert (owner == c).all()
        rows = set(dm._client_test_idx[c].tolist())
        assert not rows & set(train.tolist()) and not rows & set(val.tolist())
    x, y, owner = dm.client_test_data()
    assert len(y) == len(owner) == sum(len(p) for p in dm._client_test_idx)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(client_test_fraction=1.0), "client_test_fraction must lie in"),
        (dict(partition="quantity", quantity_skew=0.0), "data.quantity_skew"),
        (dict(partition="pathological", classes_per_client=0), "data.classes_per_client"),
    ],
)
def test_bad_options_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        dm = _data(**kwargs)
        dm.setup()
