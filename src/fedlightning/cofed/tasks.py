"""CoFED's heterogeneous tasks: each participant its own label space, IID or sub-class non-IID.
Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (docs/algorithms.md section 3, "Tasks"; section 4).

:func:`label_space_tasks` is the pure partition; :class:`LabelSpaceTasks` is the config object that
loads a source, partitions it and assembles the public set.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedlightning.data.sources import SOURCES, load_source
from fedlightning.errors import ConfigurationError, require
from fedlightning.seeding import derive_seed

#: CIFAR-100's 20 superclasses and their 5 fine classes each (Krizhevsky 2009, the data set's
#: definition); superclass ids follow this (alphabetical) order, as in the data set's coarse labels.
CIFAR100_SUPERCLASSES: dict[str, tuple[str, ...]] = {
    "aquatic_mammals": ("beaver", "dolphin", "otter", "seal", "whale"),
    "fish": ("aquarium_fish", "flatfish", "ray", "shark", "trout"),
    "flowers": ("orchid", "poppy", "rose", "sunflower", "tulip"),
    "food_containers": ("bottle", "bowl", "can", "cup", "plate"),
    "fruit_and_vegetables": ("apple", "mushroom", "orange", "pear", "sweet_pepper"),
    "household_electrical_devices": ("clock", "keyboard", "lamp", "telephone", "television"),
    "household_furniture": ("bed", "chair", "couch", "table", "wardrobe"),
    "insects": ("bee", "beetle", "butterfly", "caterpillar", "cockroach"),
    "large_carnivores": ("bear", "leopard", "lion", "tiger", "wolf"),
    "large_man-made_outdoor_things": ("bridge", "castle", "house", "road", "skyscraper"),
    "large_natural_outdoor_scenes": ("cloud", "forest", "mountain", "plain", "sea"),
    "large_omnivores_and_herbivores": ("camel", "cattle", "chimpanzee", "elephant", "kangaroo"),
    "medium_mammals": ("fox", "porcupine", "possum", "raccoon", "skunk"),
    "non-insect_invertebrates": ("crab", "lobster", "snail", "spider", "worm"),
    "people": ("baby", "boy", "girl", "man", "woman"),
    "reptiles": ("crocodile", "dinosaur", "lizard", "snake", "turtle"),
    "small_mammals": ("hamster", "mouse", "rabbit", "shrew", "squirrel"),
    "trees": ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"),
    "vehicles_1": ("bicycle", "bus", "motorcycle", "pickup_truck", "train"),
    "vehicles_2": ("lawn_mower", "rocket", "streetcar", "tank", "tractor"),
}
#: fine class names in label order (alphabetical, as CIFAR-100's fine labels and torchvision)
CIFAR100_CLASSES: tuple[str, ...] = tuple(
    sorted(name for names in CIFAR100_SUPERCLASSES.values() for name in names)
)

#: Superclass-like groups for the 10 digits: pairs that share strokes and are the digits' most
#: frequent confusions (1/7 a vertical stroke with a head, 4/9 a closed or open top loop on a stem,
#: 3/8 two stacked right bowls, 0/6 a closed lower loop, 2/5 a top bar and a lower curve). Like a
#: CIFAR-100 superclass, a group's members are related but not interchangeable, so a participant
#: that saw one digit of a group (non-IID) must learn the other from someone else.
DIGIT_GROUPS: dict[str, tuple[int, int]] = {
    "0/6": (0, 6),
    "1/7": (1, 7),
    "2/5": (2, 5),
    "3/8": (3, 8),
    "4/9": (4, 9),
}


def group_table(
    groups: Sequence[Sequence[int | str]], classes: Sequence[str] | None = None
) -> np.ndarray:
    """``table[fine] = group index`` from groups of fine class ids (or names found in ``classes``)."""
    index = {name: k for k, name in enumerate(classes or ())}
    members = [[index[m] if isinstance(m, str) else int(m) for m in group] for group in groups]
    table = np.full(sum(len(m) for m in members), -1, dtype=np.int64)
    for g, group in enumerate(members):
        table[group] = g
    return table


#: built-in fine -> superclass tables
BUILTIN_SUPERCLASSES: dict[str, tuple[np.ndarray, tuple[str, ...]]] = {
    "cifar100": (
        group_table(list(CIFAR100_SUPERCLASSES.values()), CIFAR100_CLASSES),
        tuple(CIFAR100_SUPERCLASSES),
    ),
    "digits": (group_table(list(DIGIT_GROUPS.values())), tuple(DIGIT_GROUPS)),
}


@dataclass
class ParticipantTask:
    """One participant's task: its label space (global class ids, ascending) and its data.

    Labels are global class ids; a participant's model outputs columns in ``label_space`` order,
    so its local label of global class c is ``label_space.searchsorted(c)``.
    """

    label_space: np.ndarray
    train_x: torch.Tensor
    train_y: np.ndarray
    test_x: torch.Tensor
    test_y: np.ndarray

    def local(self, labels: np.ndarray) -> np.ndarray:
        """Global class ids -> column indices in this participant's label space."""
        return np.searchsorted(self.label_space, labels)


@dataclass
class CoFEDData:
    """Everything a CoFED run needs: the tasks and the unlabeled public set.

    ``public_y`` holds the public samples' true global class when it is known (a held-out part of
    the same source) and -1 otherwise; it is only used to report pseudo-label accuracy.
    ``partition`` is the participants x source-classes table of local training counts.
    """

    tasks: list[ParticipantTask]
    public_x: torch.Tensor
    public_y: np.ndarray
    num_classes: int
    class_names: tuple[str, ...]
    partition: np.ndarray

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.public_x.shape[1:])


class Tasks(ABC):
    """Builds a CoFED run's tasks and public set (the config group ``tasks``)."""

    @abstractmethod
    def build(self, seed: int) -> CoFEDData:
        """The tasks of a run, a pure function of the options and ``seed``."""


def label_space_tasks(
    labels: np.ndarray,
    superclass_of: np.ndarray,
    num_participants: int,
    classes_per_participant: tuple[int, int],
    samples_per_class: int,
    distribution: Literal["iid", "noniid"] = "iid",
    noniid_subclasses: Sequence[int] = (1, 2),
    seed: int = 0,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per participant ``(label_space, indices)``: its superclasses and its training samples.

    ``superclass_of[f]`` is the superclass of fine class f (the identity for plain classes). In
    participant order, each draws ``k ~ U{lo..hi}`` of the superclasses present in ``labels``
    (uniformly, without replacement) and, for each superclass c, ``samples_per_class`` samples:

    - ``iid``: spread evenly over all of c's subclasses (``n // m`` each; the ``n mod m`` extra
      samples go to randomly chosen subclasses);
    - ``noniid``: from ``m`` subclasses only, m drawn uniformly from ``noniid_subclasses`` (the
      paper uses 1, or 2), chosen uniformly among the subclasses with enough samples left and
      split evenly as above.

    Samples are drawn without replacement from a seeded shuffle of each fine class, so participants'
    data never overlap. The samples nobody drew are left for a held-out public set.
    """
    require(distribution in ("iid", "noniid"), "distribution", distribution, "'iid' or 'noniid'")
    require(num_participants >= 1, "num_participants", num_participants, "an integer >= 1")
    require(samples_per_class >= 1, "samples_per_class", samples_per_class, "an integer >= 1")
    labels = np.asarray(labels, dtype=np.int64)
    superclass_of = np.asarray(superclass_of, dtype=np.int64)
    lo, hi = classes_per_participant
    rng = np.random.default_rng(seed)
    fine_present = np.unique(labels)
    if fine_present.max() >= len(superclass_of) or superclass_of[fine_present].min() < 0:
        raise ConfigurationError(
            f"the superclass table covers {len(superclass_of)} classes, which does not map every "
            f"label in the data (labels up to {fine_present.max()})"
        )
    subclasses = {
        int(c): [int(f) for f in fine_present if superclass_of[f] == c]
        for c in np.unique(superclass_of[fine_present])
    }
    groups = np.array(sorted(subclasses), dtype=np.int64)
    if not 1 <= lo <= hi <= len(groups):
        raise ConfigurationError(
            f"classes_per_participant={[lo, hi]} is not allowed: expected 1 <= min <= max <= "
            f"{len(groups)} (the number of {'super' if len(groups) < len(fine_present) else ''}classes)"
        )
    pools = {int(f): list(rng.permutation(np.flatnonzero(labels == f))) for f in fine_present}
    tasks = []
    for i in range(num_participants):
        space = np.sort(rng.choice(groups, size=int(rng.integers(lo, hi + 1)), replace=False))
        taken: list[int] = []
        for c in space:
            subs = subclasses[int(c)]
            if distribution == "noniid":
                m = min(int(rng.choice(noniid_subclasses)), len(subs))
                need = -(-samples_per_class // m)
                candidates = [f for f in subs if len(pools[f]) >= need] or subs
                subs = [
                    int(f)
                    for f in rng.choice(candidates, size=min(m, len(candidates)), replace=False)
                ]
            counts = np.full(len(subs), samples_per_class // len(subs))
            counts[rng.choice(len(subs), size=samples_per_class % len(subs), replace=False)] += 1
            for f, n in zip(subs, counts, strict=True):
                if len(pools[f]) < n:
                    raise ConfigurationError(
                        f"participant {i} needs {n} more samples of class {f}, only {len(pools[f])} "
                        f"are left: lower samples_per_class={samples_per_class} or num_participants="
                        f"{num_participants}"
                    )
                taken += pools[f][:n]
                del pools[f][:n]
        tasks.append((space, np.sort(np.asarray(taken, dtype=np.int64))))
    return tasks


class LabelSpaceTasks(Tasks):
    """Image tasks with their own label spaces, the paper's CIFAR-100 setting on any source.

    Each participant gets ``classes_per_participant`` superclasses (or classes), ``samples_per_class``
    training samples of each (see :func:`label_space_tasks`), and as test set every test sample of
    its superclasses. The public set is the training pool's undrawn samples (``public: holdout``)
    or another source's training set (e.g. ``cifar10`` for CIFAR-100 tasks), optionally subsampled
    to ``public_size``. Labels are superclass ids (``label_level: superclass``) or the source's own
    classes (``class``: every class its own group, where IID and non-IID coincide).

    Args:
        dataset: a data source (see ``fedlightning.data.SOURCES``).
        root: folder of torchvision/LEAF files.
        download: let torchvision fetch missing files.
        num_participants: number of participants N.
        classes_per_participant: ``[min, max]`` superclasses per participant (inclusive; min >= 2).
        label_level: ``superclass`` or ``class``.
        superclass_table: fine -> superclass ids; default the built-in table of ``cifar100``
            (its 20 superclasses) or ``digits`` (5 groups of 2 digits, see ``DIGIT_GROUPS``).
        distribution: ``iid`` or ``noniid`` (sub-class skew).
        noniid_subclasses: the numbers of subclasses a non-IID superclass is drawn from (default
            [1, 2]: "1 (or 2)" subclasses, as the paper says).
        samples_per_class: training samples per participant and superclass.
        public: ``holdout`` or the name of the source whose training set is the public set.
        public_size: subsample the public set to this many samples (null: all).
    """

    def __init__(
        self,
        dataset: str = "digits",
        root: str = "data",
        download: bool = False,
        num_participants: int = 10,
        classes_per_participant: tuple[int, int] = (2, 3),
        label_level: Literal["superclass", "class"] = "superclass",
        superclass_table: list[int] | None = None,
        distribution: Literal["iid", "noniid"] = "noniid",
        noniid_subclasses: list[int] | None = None,
        samples_per_class: int = 20,
        public: str = "holdout",
        public_size: int | None = None,
    ) -> None:
        noniid_subclasses = [1, 2] if noniid_subclasses is None else list(noniid_subclasses)
        require(dataset in SOURCES, "tasks.dataset", dataset, f"one of {', '.join(SOURCES)}")
        require(
            num_participants >= 1, "tasks.num_participants", num_participants, "an integer >= 1"
        )
        require(
            len(classes_per_participant) == 2 and 2 <= classes_per_participant[0] <= classes_per_participant[1],
            "tasks.classes_per_participant", list(classes_per_participant),
            "[min, max] with 2 <= min <= max (a classifier needs two classes)",
        )  # fmt: skip
        require(
            label_level in ("superclass", "class"),
            "tasks.label_level",
            label_level,
            "'superclass' or 'class'",
        )
        require(
            label_level == "class" or superclass_table is not None or dataset in BUILTIN_SUPERCLASSES,
            "tasks.label_level", label_level,
            f"'class', or 'superclass' with a superclass_table or a data set with a built-in one "
            f"({', '.join(BUILTIN_SUPERCLASSES)})",
        )  # fmt: skip
        require(
            distribution in ("iid", "noniid"),
            "tasks.distribution",
            distribution,
            "'iid' or 'noniid'",
        )
        require(
            len(noniid_subclasses) > 0 and all(m >= 1 for m in noniid_subclasses),
            "tasks.noniid_subclasses", noniid_subclasses, "a non-empty list of integers >= 1",
        )  # fmt: skip
        require(
            samples_per_class >= 1, "tasks.samples_per_class", samples_per_class, "an integer >= 1"
        )
        require(
            public in ("holdout", *SOURCES),
            "tasks.public",
            public,
            f"'holdout' or one of {', '.join(SOURCES)}",
        )
        require(
            public_size is None or public_size >= 1,
            "tasks.public_size",
            public_size,
            "null or an integer >= 1",
        )
        self.dataset = dataset
        self.root = root
        self.download = download
        self.num_participants = num_participants
        self.classes_per_participant = (
            int(classes_per_participant[0]),
            int(classes_per_participant[1]),
        )
        self.label_level = label_level
        self.superclass_table = superclass_table
        self.distribution = distribution
        self.noniid_subclasses = noniid_subclasses
        self.samples_per_class = samples_per_class
        self.public = public
        self.public_size = public_size

    def groups(self, num_source_classes: int) -> tuple[np.ndarray, tuple[str, ...]]:
        """The fine -> global class table and the global class names."""
        if self.label_level == "class":
            return np.arange(num_source_classes), tuple(str(c) for c in range(num_source_classes))
        if self.superclass_table is not None:
            table = np.asarray(self.superclass_table, dtype=np.int64)
            return table, tuple(str(c) for c in range(int(table.max()) + 1))
        return BUILTIN_SUPERCLASSES[self.dataset]

    def build(self, seed: int) -> CoFEDData:
        source = load_source(self.dataset, root=self.root, download=self.download, seed=seed)
        table, names = self.groups(source.num_classes)
        fine = source.train_y.numpy()
        drawn = label_space_tasks(
            fine, table, self.num_participants, self.classes_per_participant,
            self.samples_per_class, self.distribution, self.noniid_subclasses, seed,
        )  # fmt: skip
        test_fine = source.test_y.numpy()
        tasks = []
        for space, idx in drawn:
            test_idx = np.flatnonzero(np.isin(table[test_fine], space))
            tasks.append(
                ParticipantTask(
                    space,
                    source.train_x[idx],
                    table[fine[idx]],
                    source.test_x[test_idx],
                    table[test_fine[test_idx]],
                )
            )
        partition = np.stack(
            [np.bincount(fine[idx], minlength=source.num_classes) for _, idx in drawn]
        )
        if self.public == "holdout":
            rest = np.setdiff1d(np.arange(len(fine)), np.concatenate([idx for _, idx in drawn]))
            public_x, public_y = source.train_x[rest], table[fine[rest]]
        else:
            other = load_source(self.public, root=self.root, download=self.download, seed=seed)
            public_x, public_y = other.train_x, np.full(len(other.train_x), -1, dtype=np.int64)
            if other.sample_shape != source.sample_shape:
                raise ConfigurationError(
                    f"public={self.public!r} has samples of shape {other.sample_shape}, the tasks' "
                    f"data set {self.dataset!r} {source.sample_shape}: choose a source of the same shape"
                )
        if self.public_size is not None:
            if self.public_size > len(public_y):
                raise ConfigurationError(
                    f"public_size={self.public_size} exceeds the {len(public_y)} samples available "
                    f"for the public set ({self.public!r}): lower it or set it to null"
                )
            keep = np.sort(
                np.random.default_rng(derive_seed(seed, "public")).choice(
                    len(public_y), self.public_size, replace=False
                )
            )
            public_x, public_y = public_x[keep], public_y[keep]
        return CoFEDData(tasks, public_x, public_y, int(table.max()) + 1, names, partition)
