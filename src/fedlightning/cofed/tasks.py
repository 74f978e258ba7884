"""CoFED's heterogeneous tasks: each participant its own label space, IID or sub-class non-IID.
Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (docs/algorithms.md section 3, "Tasks"; section 4).

:func:`~fedlightning.cofed.label_spaces.label_space_tasks` is the pure partition (re-exported
here), :mod:`fedlightning.cofed.superclasses` the fine -> superclass tables (``BUILTIN_SUPERCLASSES``
and the names it is built from, re-exported here); :class:`LabelSpaceTasks` is the config object
that loads a source, partitions it and assembles the public set.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedlightning.cofed.label_spaces import label_space_tasks
from fedlightning.cofed.superclasses import (
    BUILTIN_SUPERCLASSES,
    CIFAR100_CLASSES,
    CIFAR100_SUPERCLASSES,
    DIGIT_GROUPS,
    group_table,
)
from fedlightning.data.sources import SOURCES, DataSplit, load_source
from fedlightning.errors import ConfigurationError, require
from fedlightning.seeding import derive_seed

#: the moved names this module re-exports, beside its own
__all__ = [
    "BUILTIN_SUPERCLASSES",
    "CIFAR100_CLASSES",
    "CIFAR100_SUPERCLASSES",
    "DIGIT_GROUPS",
    "CoFEDData",
    "LabelSpaceTasks",
    "ParticipantTask",
    "Tasks",
    "group_table",
    "label_space_tasks",
]


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
        _check_options(
            dataset, num_participants, classes_per_participant, label_level, superclass_table,
            distribution, noniid_subclasses, samples_per_class, public, public_size,
        )  # fmt: skip
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
        taken = np.concatenate([idx for _, idx in drawn])
        public_x, public_y = self._public_set(source, table, taken, seed)
        return CoFEDData(tasks, public_x, public_y, int(table.max()) + 1, names, partition)

    def _public_set(
        self, source: DataSplit, table: np.ndarray, taken: np.ndarray, seed: int
    ) -> tuple[torch.Tensor, np.ndarray]:
        """The unlabeled public set ``(x, true global class or -1)``: the training pool's rows
        nobody ``taken`` (``holdout``) or another source's training set, subsampled to
        ``public_size`` when set."""
        if self.public == "holdout":
            fine = source.train_y.numpy()
            rest = np.setdiff1d(np.arange(len(fine)), taken)
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
        return public_x, public_y


def _check_options(
    dataset: str,
    num_participants: int,
    classes_per_participant: tuple[int, int],
    label_level: str,
    superclass_table: list[int] | None,
    distribution: str,
    noniid_subclasses: list[int],
    samples_per_class: int,
    public: str,
    public_size: int | None,
) -> None:
    """One line naming the first bad :class:`LabelSpaceTasks` option and what is allowed."""
    require(dataset in SOURCES, "tasks.dataset", dataset, f"one of {', '.join(SOURCES)}")
    require(num_participants >= 1, "tasks.num_participants", num_participants, "an integer >= 1")
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
    require(samples_per_class >= 1, "tasks.samples_per_class", samples_per_class, "an integer >= 1")
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
