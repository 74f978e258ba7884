"""CoFED: one-shot heterogeneous co-training through pseudo labels on a public set.

Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603. Run it with ``fedlightning cofed --config configs/cofed.yaml``.
"""

from fedlightning.cofed.participants import (
    Participant,
    Participants,
    Recipe,
    TorchParticipants,
    class_balanced_weights,
)
from fedlightning.cofed.pipeline import CoFED, CoFEDResult
from fedlightning.cofed.tabular import SklearnParticipants, TabularTasks
from fedlightning.cofed.tasks import (
    CIFAR100_SUPERCLASSES,
    DIGIT_GROUPS,
    CoFEDData,
    LabelSpaceTasks,
    ParticipantTask,
    Tasks,
    label_space_tasks,
)
from fedlightning.cofed.voting import vote, vote_scores

__all__ = [
    "CIFAR100_SUPERCLASSES",
    "DIGIT_GROUPS",
    "CoFED",
    "CoFEDData",
    "CoFEDResult",
    "LabelSpaceTasks",
    "Participant",
    "ParticipantTask",
    "Participants",
    "Recipe",
    "SklearnParticipants",
    "TabularTasks",
    "Tasks",
    "TorchParticipants",
    "class_balanced_weights",
    "label_space_tasks",
    "vote",
    "vote_scores",
]
