"""Backends run a round's client fits (:class:`Backend`): ``SequentialBackend`` (one after the
other), ``CohortBackend`` (all sampled clients at once with ``torch.func.vmap``) and
``RayBackend`` (long-lived Ray actors; the ``ray`` extra), ``FlowerBackend`` (SuperNodes of a
Flower deployment; the ``flower`` extra); ``AutoBackend`` (the loop's default)
picks the cohort where it is supported and faster, else sequential. Chosen by ``loop.backend`` with a
``class_path`` like the aggregator; results do not depend on the backend beyond the cohort's
floating-point reassociation (see :mod:`fedlightning.backends.base` for where that shows)."""

from fedlightning.backends.auto import AutoBackend
from fedlightning.backends.base import Backend
from fedlightning.backends.cohort import CohortBackend
from fedlightning.backends.flower import FlowerBackend
from fedlightning.backends.ray import RayBackend
from fedlightning.backends.sequential import SequentialBackend

__all__ = [
    "AutoBackend", "Backend", "CohortBackend", "FlowerBackend", "RayBackend", "SequentialBackend",
]  # fmt: skip
