"""Backends run a round's client fits (:class:`Backend`): ``SequentialBackend`` (one after the
other, the default), ``CohortBackend`` (all sampled clients at once with ``torch.func.vmap``) and
``RayBackend`` (long-lived Ray actors; the ``ray`` extra) and ``FlowerBackend`` (SuperNodes of a Flower
deployment; the ``flower`` extra). Chosen by ``loop.backend`` with a
``class_path`` like the aggregator; results do not depend on the backend."""

from fedlightning.backends.base import Backend
from fedlightning.backends.cohort import CohortBackend
from fedlightning.backends.flower import FlowerBackend
from fedlightning.backends.ray import RayBackend
from fedlightning.backends.sequential import SequentialBackend

__all__ = ["Backend", "CohortBackend", "FlowerBackend", "RayBackend", "SequentialBackend"]
