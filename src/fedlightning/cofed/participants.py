"""CoFED participants: any model with its own label space and its own training recipe.
Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (docs/algorithms.md section 3).

A :class:`Participant` is trained locally, predicts class probabilities on the public set and is
update-trained on its local plus pseudo-labelled data. :class:`TorchParticipants` builds
participants from registered models (by default CoFED's random CNN family) trained with Lightning;
scikit-learn estimators are in :mod:`fedlightning.cofed.tabular`.

This module gathers the public names of :mod:`fedlightning.cofed.participant_base` (the
interfaces), :mod:`fedlightning.cofed.torch_participants` (the torch family) and
:mod:`fedlightning.cofed.recipe`.
"""

from fedlightning.cofed.participant_base import Participant, Participants
from fedlightning.cofed.recipe import Recipe
from fedlightning.cofed.torch_participants import (
    TorchParticipant,
    TorchParticipants,
    class_balanced_weights,
)

__all__ = [
    "Participant",
    "Participants",
    "Recipe",
    "TorchParticipant",
    "TorchParticipants",
    "class_balanced_weights",
]
