"""What a run's progress, closing line and summary headline: the number the run is about.

A run without client groups headlines ``test_acc``, the global model's accuracy on the test set.
A run with client groups (``ClientModule(networks=[...])``: HeteroAvg, InCo, the within-groups
baselines) is scored by ``group_mean_acc``, the unweighted mean of the group models'
``<group>/test_acc`` (the InCo paper's number, docs/algorithms.md section 6.1): its ``test_acc``
scores one model only, the global one (the largest architecture's), which in a within-groups run
is one group's model, trained by that group's clients alone. So a grouped run headlines
``group_mean_acc``, named, followed by each group's model and its accuracy::

    group_mean_acc 0.7044 (resnet10 0.8306, resnet14 0.8111, ..., resnet26 0.1000)

and its summary says which model ``test_acc`` (the column metrics.csv keeps) scores. A row that
lacks ``group_mean_acc`` (evaluation not run yet) falls back to ``test_acc``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedlightning.protocol import StateDict

if TYPE_CHECKING:
    from fedlightning.loop.scoring_model import ScoringModel

#: the mean over the client groups' models (fedlightning.loop.evaluation)
GROUP_MEAN = "group_mean_acc"


@dataclass(frozen=True)
class ScoredModels:
    """What a run's evaluation scores: its client ``groups`` (names, smallest first; empty without
    groups) and the architecture of its global model (``None``: unnamed or no groups)."""

    groups: Sequence[str] = ()
    global_model: str | None = None

    @property
    def grouped(self) -> bool:
        """Several client groups: ``group_mean_acc`` is the headline."""
        return len(self.groups) > 1

    @classmethod
    def of(
        cls, scoring: ScoringModel, deployables: Callable[[], Mapping[str, StateDict]]
    ) -> ScoredModels:
        """A run's: the groups of its scoring model and, with groups, the architecture of the
        ``"global"`` model of ``deployables()`` (the aggregator's; selected by its key set)."""
        groups = tuple(scoring.group_names)
        if not groups:
            return cls()
        models = deployables()
        return cls(groups, scoring.architecture(models["global"]) if "global" in models else None)


#: a run without client groups
UNGROUPED = ScoredModels()


def headline_metric(metrics: Mapping[str, float], scored: ScoredModels) -> str:
    """The metric a row headlines: ``group_mean_acc`` for a grouped run's row that has it, else
    ``test_acc``."""
    return GROUP_MEAN if scored.grouped and GROUP_MEAN in metrics else "test_acc"


def headline(metrics: Mapping[str, float], scored: ScoredModels) -> str:
    """``test_acc 0.9333``, or ``group_mean_acc 0.7044 (resnet10 0.8306, ...)`` with every group's
    model that the row scored; ``""`` when the row has no finite value of it (not evaluated)."""
    metric = headline_metric(metrics, scored)
    if not math.isfinite(metrics.get(metric, math.nan)):
        return ""
    text = f"{metric} {metrics[metric]:.4f}"
    if metric == GROUP_MEAN:
        text += f" ({group_list(metrics, scored.groups)})"
    return text


def group_list(metrics: Mapping[str, float], groups: Sequence[str]) -> str:
    """``resnet10 0.8306, resnet14 0.8111``: each group's model's ``test_acc`` in ``metrics``."""
    return ", ".join(
        f"{group} {metrics[f'{group}/test_acc']:.4f}"
        for group in groups
        if f"{group}/test_acc" in metrics
    )


def scored_line(metrics: Mapping[str, float], scored: ScoredModels) -> list[str]:
    """The summary's line on what the run's numbers score (a grouped run's only: without groups
    ``test_acc`` is the one model's): the headline's meaning and which model ``test_acc`` is."""
    if not scored.grouped or GROUP_MEAN not in metrics:
        return []
    scored_groups = [g for g in scored.groups if f"{g}/test_acc" in metrics]
    global_acc = metrics.get("test_acc", math.nan)
    model = f" ({scored.global_model})" if scored.global_model else ""
    return [
        f"  headline: {GROUP_MEAN} {metrics[GROUP_MEAN]:.4f} at round {int(metrics['round'])}, "
        f"the mean test_acc of the {len(scored_groups)} group models: "
        f"{group_list(metrics, scored.groups)}; metrics.csv's test_acc {global_acc:.4f} scores "
        f"the global model{model} only"
    ]
