"""A client objective's per-client state either returned or refused, checked for every client fit
on every backend (docs/algorithms.md section 1, "Per-client state: returned, never kept").

One objective instance serves every client in turn, and a client's persistent state lives in the
loop's ClientStore: ``begin_client`` receives it, ``end_client`` returns the new one. Per-client
data kept on the module instead (``self.memory[client_id] = ...``) trains sequentially but is not
checkpointed (a resumed run drifts), and under the cohort backend each client's attributes are
restored from its captured view before its ``end_client``, so what one client's round writes into
such an attribute is lost for the others.

:class:`ClientWatch` tells the two apart without a declaration. Round context is what
``begin_client`` assigns (binds an attribute to a new object): it is each client's own. The rule:
during a client's round, no attribute that its ``begin_client`` did not assign may change, in
place or by assignment, nor may one appear; such a change carries data from one client (or round)
to the next outside the ClientStore (and the cohort, which restores each client's attributes
before its ``end_client``, would drop it). The watch fingerprints the objective's attributes
(:func:`fedlightning.fingerprint.fingerprint`: tensors by identity and version counter, never by
data; registered parameters, buffers and submodules are the network's, loaded every round, and are
not attributes here; an attribute's unregistered modules count by identity, as MOON's frozen
models are round context loaded in place) before ``begin_client``, after it, and after
``end_client``, and refuses the first such change in one line naming the class, the attribute
and the fix. Lightning's attributes and the base class's bookkeeping
(``ClientModule.bookkeeping_attributes``) are not watched.

Not detected: a value ``begin_client`` rebuilds from the previous client's (``self.count += 1``
binds a new number): it is taken for round context.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import TYPE_CHECKING

import lightning.pytorch as pl

from fedlightning.errors import ConfigurationError
from fedlightning.fingerprint import fingerprint

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule

#: an attribute's identity (``None`` for a number, a string or ``None``: compared by value) and
#: fingerprint
Print = tuple[int | None, Hashable]
_ATOMS = (int, float, complex, str, bytes, type(None))


@functools.cache
def _lightning_attributes() -> frozenset[str]:
    """The instance attributes of a bare LightningModule (Lightning's and torch's own)."""
    return frozenset(vars(pl.LightningModule()))


def _prints(objective: ClientModule) -> dict[str, Print]:
    skip = _lightning_attributes() | objective.bookkeeping_attributes
    return {
        name: (None if isinstance(value, _ATOMS) else id(value), fingerprint(value, modules=False))
        for name, value in vars(objective).items()
        if name not in skip
    }


class ClientWatch:
    """One client's round on ``objective``, from before its ``begin_client`` (construct it then):
    call :meth:`begun` after ``begin_client`` and :meth:`ended` after ``end_client``; a backend
    that puts the client's attributes back before ``end_client`` (the cohort) calls :meth:`mark`
    once they are back."""

    def __init__(self, objective: ClientModule, client_id: int) -> None:
        self.objective, self.client_id = objective, client_id
        self.before = _prints(objective)
        self.context: frozenset[str] = frozenset()

    def begun(self) -> None:
        """After ``begin_client``: what it assigned is this client's round context; an attribute
        it changed in place (without assigning it) is refused."""
        after, context = _prints(self.objective), set()
        for name, (identity, print_) in after.items():
            old = self.before.get(name)
            if old is None or old[0] != identity or (identity is None and old[1] != print_):
                context.add(name)  # assigned (a new object, or a new number)
            elif old[1] != print_:
                self._refuse(name, "changed in place in begin_client")
        self.context, self.before = frozenset(context), after

    def mark(self) -> None:
        """The client's attributes are as its round left them (before its ``end_client``)."""
        self.before = _prints(self.objective)

    def ended(self) -> None:
        """After ``end_client``: an attribute ``begin_client`` did not assign that changed since
        :meth:`begun` (or :meth:`mark`), in place or by assignment, is refused."""
        for name, print_ in _prints(self.objective).items():
            old = self.before.get(name)
            if name in self.context or old == print_:
                continue
            if old is None:
                how = "appeared"
            else:
                how = "was assigned" if old[0] != print_[0] else "changed in place"
            self._refuse(name, f"{how} outside begin_client")

    def _refuse(self, name: str, how: str) -> None:
        raise ConfigurationError(
            f"{type(self.objective).__name__}.{name} {how} during client {self.client_id}'s "
            "round: per-client data kept on the module is not checkpointed and is lost under "
            "the cohort backend; return it in end_client's state (and read it back from the "
            "state in begin_client), or, if it is round context, assign it in begin_client "
            "(docs/algorithms.md section 1)"
        )
