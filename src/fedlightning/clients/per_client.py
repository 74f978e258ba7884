"""The round's inputs on a client objective (``client_id``, ``payload``, ``state``), readable
everywhere except in a ``local_loss`` that the cohort backend runs for all clients at once.

Under :class:`~fedlightning.backends.CohortBackend` one vectorized call of ``local_loss`` computes
every client's loss, while the objective holds a single client's inputs: reading them there would
give every client the same one. The cohort sets :data:`VECTORIZED_FLAG` on the objective for that
call, and reading an input then raises a ConfigurationError that says what to do instead.
"""

from __future__ import annotations

from typing import Any

from fedlightning.errors import ConfigurationError

#: the instance attribute the cohort backend sets while its vectorized ``local_loss`` runs
VECTORIZED_FLAG = "_vectorized_loss"


def per_client_input(name: str, doc: str) -> property:
    """A property ``name`` stored as ``_<name>`` whose read fails under the cohort's ``local_loss``."""
    storage = f"_{name}"

    def get(self: Any) -> Any:
        values = self.__dict__
        if values.get(VECTORIZED_FLAG):
            raise ConfigurationError(
                f"loop.backend=CohortBackend cannot train {type(self).__name__}: its local_loss "
                f"reads self.{name}, which holds one client's value while local_loss runs for "
                f"every client at once: copy what local_loss needs from self.{name} into an "
                "attribute in begin_client (the cohort stacks it per client)"
            )
        if storage not in values:
            raise AttributeError(name)
        return values[storage]

    def set(self: Any, value: Any) -> None:
        self.__dict__[storage] = value

    return property(get, set, doc=doc)
