"""CoFED's maths and task construction on hand-made inputs (no training)."""

import numpy as np
import pytest
import torch

from fedlightning.cofed import (
    CIFAR100_SUPERCLASSES,
    DIGIT_GROUPS,
    LabelSpaceTasks,
    class_balanced_weights,
    label_space_tasks,
    vote,
    vote_scores,
)
from fedlightning.cofed.tasks import BUILTIN_SUPERCLASSES, CIFAR100_CLASSES
from fedlightning.data import load_source
from fedlightning.errors import ConfigurationError
from fedlightning.models import create_model
from fedlightning.models.cofed_cnn import COFED_WIDTHS, draw_cofed_widths

# -- vote -------------------------------------------------------------------------------------------
# Three participants, four public samples, classes 0..2.
SPACES = [[0, 1], [1, 2], [0, 1, 2]]
PROBS = [
    np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.5, 0.5]]),  # top1-top2: .8 .2 .6 0
    np.array([[0.3, 0.7], [0.1, 0.9], [0.8, 0.2], [0.45, 0.55]]),  # .4 .8 .6 .1
    np.array([[0.7, 0.2, 0.1], [0.2, 0.1, 0.7], [0.1, 0.8, 0.1], [0.1, 0.2, 0.7]]),  # .5 .5 .7 .5
]
# With margin 0.3 the votes are: s0: P0->0, P1->2, P2->0; s1: P1->2, P2->2; s2: all ->1; s3: P2->2.
# owners(0) = {P0, P2}, owners(1) = {P0, P1, P2}, owners(2) = {P1, P2}.


def _lists(result):
    return [(idx.tolist(), labels.tolist()) for idx, labels in result]


def test_vote_scores_by_hand():
    expected = np.array([[2 / 2, 0, 1 / 2], [0, 0, 2 / 2], [0, 3 / 3, 0], [0, 0, 1 / 2]])
    np.testing.assert_allclose(vote_scores(PROBS, SPACES, margin=0.3), expected)


def test_vote_alpha_threshold_is_strict_and_drops_contradictions():
    # alpha 0.3: S_0 = {s0}, S_1 = {s2}, S_2 = {s0, s1, s3}. P2 owns 0 and 2, so s0 (in S_0 and S_2)
    # is contradictory for it and dropped; P1 owns only 2 of them and keeps s0 as class 2.
    assert _lists(vote(PROBS, SPACES, alpha=0.3, margin=0.3)) == [
        ([0, 2], [0, 1]),
        ([0, 1, 2, 3], [2, 2, 1, 2]),
        ([1, 2, 3], [2, 1, 2]),
    ]
    # alpha 0.5: scores of exactly 0.5 no longer pass, S_2 = {s1}, so P2 keeps s0 as class 0.
    assert _lists(vote(PROBS, SPACES, alpha=0.5, margin=0.3)) == [
        ([0, 2], [0, 1]),
        ([1, 2], [2, 1]),
        ([0, 1, 2], [0, 2, 1]),
    ]
    assert all(len(idx) == 0 for idx, _ in vote(PROBS, SPACES, alpha=1.0))


def test_vote_margin_zero_lets_every_participant_vote_its_top1():
    # P0 now votes 0 on s1 (0.6) and on the tie s3 (first column); P1 votes 2 on s3. Scores:
    # s1: c0 1/2, c2 2/2; s3: c0 1/2, c2 2/2 -> S_0 = {s0, s1, s3}, S_2 = {s0, s1, s3}.
    assert _lists(vote(PROBS, SPACES, alpha=0.3, margin=0.0)) == [
        ([0, 1, 2, 3], [0, 0, 1, 0]),
        ([0, 1, 2, 3], [2, 2, 1, 2]),
        ([2], [1]),
    ]


def test_vote_credibility_weights():
    # w = (1, 1, 3): owners weigh c0 4, c1 5, c2 4; s0: c0 4/4, c2 1/4; s1: c2 4/4; s2: c1 5/5;
    # s3: c2 3/4 -> S_0 = {s0}, S_1 = {s2}, S_2 = {s1, s3}.
    np.testing.assert_allclose(
        vote_scores(PROBS, SPACES, margin=0.3, weights=[1, 1, 3]),
        [[1, 0, 0.25], [0, 0, 1], [0, 1, 0], [0, 0, 0.75]],
    )
    assert _lists(vote(PROBS, SPACES, alpha=0.3, margin=0.3, weights=[1, 1, 3])) == [
        ([0, 2], [0, 1]),
        ([1, 2, 3], [2, 1, 2]),
        ([0, 1, 2, 3], [0, 2, 1, 2]),
    ]


def test_single_class_participant_abstains_but_counts_as_owner():
    probs = [*PROBS, np.ones((4, 1))]
    spaces = [*SPACES, [2]]
    # owners(2) grows to 3 while its votes stay: s0 1/3, s1 2/3, s3 1/3
    np.testing.assert_allclose(
        vote_scores(probs, spaces, margin=0.3)[:, 2], [1 / 3, 2 / 3, 0, 1 / 3]
    )
    assert _lists(vote(probs, spaces, alpha=0.3))[3] == ([0, 1, 3], [2, 2, 2])
    assert _lists(vote(probs, spaces, alpha=0.4))[3] == ([1], [2])


def test_vote_accepts_torch_and_ignores_unowned_classes():
    torch_probs = [torch.as_tensor(p, dtype=torch.float32) for p in PROBS]
    assert _lists(vote(torch_probs, SPACES)) == _lists(vote(PROBS, SPACES))
    scores = vote_scores(PROBS, [[0, 1], [1, 5], [0, 1, 5]], margin=0.3)
    assert scores.shape == (4, 6) and not scores[:, [2, 3, 4]].any()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 1.5}, r"alpha=1.5 is not allowed: expected a number in \[0, 1\]"),
        ({"margin": -0.1}, r"margin=-0.1 is not allowed"),
        ({"weights": [1, 1]}, r"expected 3 finite numbers >= 0"),
        ({"weights": [1, -1, 1]}, r"weights=\[1.0, -1.0, 1.0\] is not allowed: expected 3 finite"),
        ({"weights": [1, float("inf"), 1]}, r"expected 3 finite numbers >= 0"),
        ({"weights": [1, float("nan"), 1]}, r"expected 3 finite numbers >= 0"),
    ],
)
def test_vote_rejects_bad_options(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        vote(PROBS, SPACES, **kwargs)


def test_vote_rejects_mismatched_shapes():
    with pytest.raises(ConfigurationError, match="participant 1.*do not match"):
        vote([PROBS[0], PROBS[1][:3]], SPACES[:2])
    with pytest.raises(ConfigurationError, match="distinct class ids"):
        vote(PROBS[:1], [[1, 1]])


def test_class_balanced_weights_are_inverse_frequency_normalised_to_one():
    labels = np.array([0] * 4 + [1] * 2 + [2])
    np.testing.assert_allclose(class_balanced_weights(labels, 4), [1 / 4, 2 / 4, 1, 1])


# -- tasks ------------------------------------------------------------------------------------------
def test_cifar100_superclass_table_matches_the_coarse_labels():
    # CIFAR-100's coarse label of each fine label 0..99 (the data set's own coarse_labels)
    coarse = [
        4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
        6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
        5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
        10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
        16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
    ]  # fmt: skip
    table, names = BUILTIN_SUPERCLASSES["cifar100"]
    assert table.tolist() == coarse
    assert len(CIFAR100_CLASSES) == len(set(CIFAR100_CLASSES)) == 100
    assert len(names) == 20 and all(len(v) == 5 for v in CIFAR100_SUPERCLASSES.values())
    assert CIFAR100_CLASSES[:3] == ("apple", "aquarium_fish", "baby") and names[19] == "vehicles_2"


def test_digit_groups_are_five_disjoint_pairs():
    table, names = BUILTIN_SUPERCLASSES["digits"]
    assert sorted(d for pair in DIGIT_GROUPS.values() for d in pair) == list(range(10))
    assert names == tuple(DIGIT_GROUPS) and np.bincount(table).tolist() == [2] * 5


# 4 superclasses of 5 subclasses, 40 samples per subclass
FINE = np.repeat(np.arange(20), 40)
SUPER = np.arange(20) // 5


def _subclasses_used(indices, c):
    fine = FINE[indices]
    return np.bincount(fine[SUPER[fine] == c], minlength=20)[SUPER == c]


def test_iid_tasks_spread_each_superclass_evenly_over_its_subclasses():
    tasks = label_space_tasks(FINE, SUPER, 6, (2, 3), 12, "iid", seed=0)
    assert len(tasks) == 6
    for space, idx in tasks:
        assert 2 <= len(space) <= 3 and np.all(np.diff(space) > 0)
        assert np.bincount(SUPER[FINE[idx]], minlength=4)[space].tolist() == [12] * len(space)
        for c in space:
            per_sub = _subclasses_used(idx, c)
            assert (per_sub > 0).all()
            assert per_sub.max() - per_sub.min() <= 1  # 12 over 5: 3, 3, 2, 2, 2
    every = np.concatenate([idx for _, idx in tasks])
    assert len(np.unique(every)) == len(every)  # disjoint across participants


@pytest.mark.parametrize("m", [1, 2])
def test_noniid_tasks_draw_each_superclass_from_m_subclasses(m):
    tasks = label_space_tasks(FINE, SUPER, 6, (2, 3), 12, "noniid", noniid_subclasses=[m], seed=0)
    for space, idx in tasks:
        for c in space:
            per_sub = _subclasses_used(idx, c)
            assert (per_sub > 0).sum() == m and per_sub.sum() == 12
    mixed = label_space_tasks(
        FINE, SUPER, 12, (4, 4), 10, "noniid", noniid_subclasses=[1, 2], seed=0
    )
    used = {int((_subclasses_used(idx, c) > 0).sum()) for space, idx in mixed for c in space}
    assert used == {1, 2}


def test_tasks_are_a_pure_function_of_the_seed():
    a, b, c = (label_space_tasks(FINE, SUPER, 5, (2, 3), 8, "noniid", seed=s) for s in (1, 1, 2))

    def same(x, y):
        return all(np.array_equal(p[k], q[k]) for p, q in zip(x, y, strict=True) for k in (0, 1))

    assert same(a, b) and not same(a, c)


def test_tasks_refuse_impossible_requests():
    with pytest.raises(ConfigurationError, match="lower samples_per_class=50"):
        label_space_tasks(FINE, SUPER, 10, (4, 4), 50, "noniid", seed=0)
    with pytest.raises(ConfigurationError, match=r"classes_per_participant=\[2, 5\]"):
        label_space_tasks(FINE, SUPER, 2, (2, 5), 5, "iid", seed=0)


def test_digits_tasks_test_sets_and_holdout_public_set():
    assert LabelSpaceTasks().noniid_subclasses == [1, 2]  # the paper's "1 (or 2)" by default
    data = LabelSpaceTasks(
        num_participants=5, samples_per_class=10, distribution="noniid", noniid_subclasses=[1]
    ).build(seed=3)
    source = load_source("digits")
    group = BUILTIN_SUPERCLASSES["digits"][0]
    test_groups = group[source.test_y.numpy()]
    assert data.num_classes == 5 and data.sample_shape == (1, 8, 8)
    for row, task in zip(data.partition, data.tasks, strict=True):
        assert len(task.test_y) == np.isin(test_groups, task.label_space).sum()  # all test samples
        assert set(task.test_y.tolist()) == set(task.label_space.tolist())
        assert np.bincount(task.train_y, minlength=5)[task.label_space].tolist() == [10] * len(
            task.label_space
        )
        # non-IID with one subclass: each owned group's training digits are a single digit
        assert (row > 0).sum() == len(task.label_space)
    used = data.partition.sum()
    assert len(data.public_y) == len(source.train_y) - used
    assert set(data.public_y.tolist()) == set(range(5))
    iid = LabelSpaceTasks(num_participants=5, samples_per_class=10, distribution="iid").build(
        seed=3
    )
    assert all(
        (row > 0).sum() == 2 * len(t.label_space)
        for row, t in zip(iid.partition, iid.tasks, strict=True)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"classes_per_participant": (1, 3)},
            r"tasks.classes_per_participant=\[1, 3\] is not allowed",
        ),
        (
            {"dataset": "synthetic"},
            r"tasks.label_level='superclass'.*built-in one \(cifar100, digits\)",
        ),
        (
            {"public": "imagenet"},
            r"tasks.public='imagenet' is not allowed: expected 'holdout' or one of",
        ),
        ({"distribution": "skewed"}, r"tasks.distribution='skewed'.*'iid' or 'noniid'"),
        ({"noniid_subclasses": [0]}, r"tasks.noniid_subclasses=\[0\]"),
    ],
)
def test_label_space_tasks_validate_options(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        LabelSpaceTasks(**kwargs)


def test_public_size_larger_than_the_holdout_is_refused():
    with pytest.raises(ConfigurationError, match="public_size=5000 exceeds the"):
        LabelSpaceTasks(public_size=5000).build(seed=0)


# -- random CNN -------------------------------------------------------------------------------------
def test_random_cnn_widths_are_sorted_draws_from_the_paper_set():
    draws = [draw_cofed_widths(seed) for seed in range(200)]
    assert {len(w) for w in draws} == {2, 3}
    for widths in draws:
        assert list(widths) == sorted(widths) and set(widths) <= set(COFED_WIDTHS)
    assert len(set(draws)) > 50  # the family really varies
    # with replacement (the authors' code; Table 1 has "32, 32"): repeated widths occur
    assert any(len(set(w)) < len(w) for w in draws)
    for widths in (draw_cofed_widths(seed, replace=False) for seed in range(200)):
        assert list(widths) == sorted(set(widths))


@pytest.mark.parametrize("widths", [(24, 80), (20, 48, 96)])
@pytest.mark.parametrize(("channels", "size"), [(1, 8), (3, 32)])
def test_random_cnn_layers_and_shapes(widths, channels, size):
    model = create_model(
        "cofed_cnn", num_classes=6, in_channels=channels, image_size=size, widths=widths
    )
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(w, (3, 3)) for w in widths]
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == len(widths)
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in model.modules()) == 2
    assert model(torch.randn(5, channels, size, size)).shape == (5, 6)
    assert model.forward_features(torch.randn(5, channels, size, size)).shape == (5, widths[-1])


def test_random_cnn_draw_follows_the_seed_and_rejects_bad_widths():
    model = create_model("cofed_cnn", num_classes=3, image_size=8, seed=11)
    assert model.widths == draw_cofed_widths(11)
    with pytest.raises(ConfigurationError, match="ascending order"):
        create_model("cofed_cnn", num_classes=3, image_size=8, widths=[48, 20])


def test_update_training_has_its_own_batch_size(monkeypatch):
    import fedlightning.cofed.torch_participants as participants_module
    from fedlightning.cofed.participants import Recipe, TorchParticipants

    sizes = []
    real = participants_module.TensorBatches

    def spy(x, y, batch_size, **kwargs):
        sizes.append(batch_size)
        return real(x, y, batch_size, **kwargs)

    monkeypatch.setattr(participants_module, "TensorBatches", spy)
    recipe = Recipe(optimizer="sgd", lr=0.01, batch_size=50, epochs=1, update_batch_size=1000)
    assert str(recipe) == "sgd lr 0.01 B 50+1000 E 1+1"
    participant = TorchParticipants(recipes=[recipe], accelerator="cpu").build(
        0, 3, (1, 8, 8), seed=0
    )
    x, y = torch.randn(60, 1, 8, 8), np.arange(60) % 3
    participant.fit(x, y, seed=0)
    participant.update(x, y, seed=1)
    assert sizes == [50, 1000]
    with pytest.raises(ConfigurationError, match="recipe.update_batch_size=0"):
        Recipe(update_batch_size=0)
