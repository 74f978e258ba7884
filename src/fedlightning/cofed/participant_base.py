"""The CoFED participant interfaces: :class:`Participant` (one silo's model with its own label
space and recipe) and :class:`Participants` (the config group that builds them).
Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (docs/algorithms.md section 3).

Implementations: :mod:`fedlightning.cofed.torch_participants` (registered models trained with
Lightning) and :mod:`fedlightning.cofed.tabular` (scikit-learn estimators).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from torch import Tensor


class Participant(ABC):
    """One silo's model. Labels are column indices of its own label space (0..|Y_i|-1)."""

    #: a one-line description for the report (architecture and recipe)
    description: str = ""
    #: the learning-rate search's candidates after update training (empty: no search ran)
    search_log: tuple[Any, ...] = ()

    @abstractmethod
    def fit(self, x: Tensor, y: np.ndarray, seed: int) -> None:
        """Local training on private data."""

    @abstractmethod
    def update(self, x: Tensor, y: np.ndarray, seed: int) -> None:
        """Update training on local plus pseudo-labelled data, starting from the local model."""

    def update_from(
        self,
        local_x: Tensor,
        local_y: np.ndarray,
        pseudo_x: Tensor,
        pseudo_y: np.ndarray,
        seed: int,
    ) -> None:
        """Update training on the local data (as given to :meth:`fit`) plus the pseudo-labelled
        rows ``R_i``; by default :meth:`update` on their concatenation."""
        self.update(torch.cat([local_x, pseudo_x]), np.concatenate([local_y, pseudo_y]), seed)

    @abstractmethod
    def predict_proba(self, x: Tensor) -> np.ndarray:
        """``n x |Y_i|`` class probabilities."""

    def accuracy(self, x: Tensor, y: np.ndarray) -> float:
        """Top-1 accuracy (NaN on an empty set)."""
        if len(y) == 0:
            return float("nan")
        return float((self.predict_proba(x).argmax(axis=1) == y).mean())


class Participants(ABC):
    """Builds a run's participants (the config group ``participants``)."""

    @abstractmethod
    def build(
        self, index: int, num_classes: int, sample_shape: tuple[int, ...], seed: int
    ) -> Participant:
        """Participant ``index`` for ``num_classes`` classes, its randomness drawn from ``seed``."""
