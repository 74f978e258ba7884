import numpy as np
import pytest

from fedlightning.data import partition as P
from fedlightning.errors import ConfigurationError

LABELS = np.random.default_rng(0).integers(0, 10, size=1200)


def _partitions(labels, n=20, seed=0):
    return {
        "iid": P.iid(labels, n, seed),
        "dirichlet": P.dirichlet(labels, n, 0.5, seed),
        "shards": P.shards(labels, n, 2, seed),
        "natural": P.natural(np.arange(len(labels)) % n),
    }


@pytest.mark.parametrize("name", P.PARTITIONS)
def test_every_sample_assigned_exactly_once(name):
    parts = _partitions(LABELS)[name]
    assigned = np.concatenate(parts)
    assert len(parts) == 20
    assert len(assigned) == len(LABELS)
    assert np.array_equal(np.sort(assigned), np.arange(len(LABELS)))


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards"])
def test_same_seed_same_partition_other_seed_differs(name):
    a, b, c = (_partitions(LABELS, seed=s)[name] for s in (3, 3, 4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_skew_grows_as_beta_shrinks():
    """Mean per-client label entropy falls monotonically as beta falls (averaged over seeds)."""
    entropies = []
    for beta in (100.0, 1.0, 0.1):
        per_seed = [
            P.label_entropy(
                P.count_table(LABELS, P.dirichlet(LABELS, 10, beta, seed, min_size=5), 10)
            ).mean()
            for seed in range(5)
        ]
        entropies.append(np.mean(per_seed))
    assert entropies[0] > entropies[1] > entropies[2]
    assert entropies[0] > 0.95 * np.log(10)  # near-uniform labels at large beta


def test_dirichlet_respects_min_size_and_refuses_impossible():
    parts = P.dirichlet(LABELS, 10, 0.1, seed=1, min_size=15)
    assert min(len(p) for p in parts) >= 15
    with pytest.raises(ConfigurationError, match="beta"):
        P.dirichlet(LABELS, 10, 0.0, seed=0)
    with pytest.raises(ConfigurationError, match="min_size"):
        P.dirichlet(LABELS, 200, 1.0, seed=0, min_size=10)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_shards_give_at_most_p_classes_per_client(p):
    labels = np.repeat(np.arange(10), 120)  # every class spans whole shards
    table = P.count_table(labels, P.shards(labels, 20, p, seed=0), 10)
    assert ((table > 0).sum(axis=1) <= p).all()
    assert table.sum() == len(labels)


def test_iid_sizes_balanced_and_count_table_sums():
    parts = P.iid(LABELS, 7, seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    table = P.count_table(LABELS, parts, 10)
    assert table.shape == (7, 10)
    assert np.array_equal(table.sum(axis=0), np.bincount(LABELS, minlength=10))


def test_natural_groups_by_client_id_and_refuses_empty_client():
    parts = P.natural([0, 1, 0, 2, 1])
    assert [p.tolist() for p in parts] == [[0, 2], [1, 4], [3]]
    with pytest.raises(ConfigurationError, match="without samples"):
        P.natural([0, 2, 2])


def test_too_many_clients_is_an_error():
    with pytest.raises(ConfigurationError, match="num_clients"):
        P.iid(LABELS[:5], 6, seed=0)


@pytest.mark.parametrize(("level", "shards"), [(1, 6), (2, 4), (3, 2)])
def test_fml_non_iid_levels_are_the_papers_shards(level, shards):
    # FML's Non-IID(1), (2), (3): 6, 4, 2 label-sorted shards a client (higher level, more skew);
    # on mnist5k's 4,000 training images (400 a digit), 5 clients
    assert P.fml_non_iid_shards(level) == shards
    labels = np.repeat(np.arange(10), 400)
    parts = P.shards(labels, 5, P.fml_non_iid_shards(level), seed=level)
    table = P.count_table(labels, parts, 10)
    assert (abs(table.sum(axis=1) - 800) <= shards).all()  # shards of 4000 / (5 * shards), +-1
    # a shard no longer than a class spans at most 2 classes
    assert ((table > 0).sum(axis=1) <= min(10, 2 * shards)).all()
    if level == 3:  # a 400-image shard is exactly one digit: at most 2 digits a client
        assert set(np.unique(table)) <= {0, 400, 800}


@pytest.mark.parametrize("level", [0, 4, "3"])
def test_fml_non_iid_level_outside_1_to_3_is_refused(level):
    with pytest.raises(ConfigurationError, match=r"non_iid=.* is not allowed: expected 1, 2 or 3"):
        P.fml_non_iid_shards(level)
