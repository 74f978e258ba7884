"""The state half of the Aggregator contract: state declared once, and everything that follows
from the declaration (docs/algorithms.md section 2.6).

:class:`ServerState` is a base of :class:`~fedlightning.server.base.Aggregator`. An aggregator
declares each value it keeps across rounds in ``__init__`` with :meth:`ServerState.add_state`
(:mod:`fedlightning.server.declared_state`: state_dicts, numbers, tensors, lists), and gets with
no more code:

- set-up: every declared state built on the server device (:meth:`ServerState.build_state`);
- checkpoints: :meth:`ServerState.state_dict` holds every declared state, and that of each
  aggregator it holds in an attribute (a wrapper's ``inner``) under the attribute's name;
  :meth:`ServerState.load_state_dict` refuses a checkpoint that does not fit the declarations,
  naming the state and the key (and :meth:`ServerState.on_load_state` one the run's options
  cannot continue);
- an undone round: :meth:`ServerState.snapshot` and :meth:`ServerState.restore` copy and put
  back every declared state (except those declared ``rollback=False``: what a failed round spent
  stays spent, e.g. client-level DP's privacy);
- the run's identity: :meth:`ServerState.declared_states` names each state and how it starts;
- the checks of every round (:mod:`fedlightning.server.state_watch`): each declared state keeps
  the layout it was built with, and nothing else changes across rounds.

``transient_attributes`` names attributes a round may rewrite that no later round reads (caches,
this round's metrics; each class of the hierarchy adds its own): they are not state, and they go
back to their value at the end of set-up whenever the state is loaded or restored.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import StateDict
from fedlightning.server.declared_state import Declarations, StateInit, clone_value


class ServerState:
    """Declared server state (see the module docstring)."""

    #: attributes a round may rewrite that no later round reads (caches, this round's metrics):
    #: not checkpointed, reset to their value at the end of set-up when state is loaded or
    #: restored; a subclass's add to its bases' (:meth:`transients`)
    transient_attributes: ClassVar[frozenset[str]] = frozenset()
    #: the base classes' own attributes, set at set-up and never state
    bookkeeping_attributes: ClassVar[frozenset[str]] = frozenset({
        "num_clients", "seed", "client_keys", "parameters", "_init_args", "_declared_state",
        "_transient_values",
    })  # fmt: skip
    num_clients: int = 0

    def add_state(
        self, name: str, init: StateInit, *, fill: float = 0.0, rollback: bool = True
    ) -> None:
        """Declare a value this aggregator keeps across rounds (call it in ``__init__``, as
        torchmetrics' ``add_state``): ``self.<name>`` holds it, :meth:`build_state` builds it at
        set-up on the server device, :meth:`state_dict`/:meth:`load_state_dict` carry it under
        ``name``.

        ``init``: ``"model"`` (a copy of the initial server state), ``"parameters"`` (``fill``,
        by default zeros, like each trainable parameter), ``"floating"`` (``fill`` like every
        floating entry), a callable ``init(initial, parameters) -> StateDict``, a number (a step
        counter: ``add_state("t", 0)``), a tensor (copied onto the server device) or ``[]``
        (:mod:`~fedlightning.server.declared_state`). Until set-up a state_dict is ``{}``, any
        other state its ``init``. ``rollback=False``: a round the loop undoes keeps this state's
        new value.
        """
        self._declarations.add(type(self).__name__, name, init, fill, rollback)
        spec = self._declarations.specs[name]
        setattr(self, name, {} if spec.kind == "state_dict" else clone_value(init))

    @property
    def _declarations(self) -> Declarations:
        # created on first use: a subclass need not call a base __init__
        return vars(self).setdefault("_declared_state", Declarations())

    def children(self) -> dict[str, ServerState]:
        """The aggregators this one holds in its attributes (a wrapper's ``inner``), by name:
        their state is part of this one's, as a submodule's is part of an ``nn.Module``'s."""
        return {k: v for k, v in vars(self).items() if isinstance(v, ServerState)}

    def declared_states(self) -> dict[str, str]:
        """Every declared state's name (``inner.<name>`` for a held aggregator's) and how it
        starts: part of the run's identity."""
        out = {name: spec.describe() for name, spec in self._declarations.specs.items()}
        for child_name, child in self.children().items():
            out.update({f"{child_name}.{k}": v for k, v in child.declared_states().items()})
        return out

    def build_state(self, initial: StateDict, parameters: frozenset[str]) -> None:
        """Build every declared state from the initial server state (``setup``)."""
        for name, value in self._declarations.build(initial, parameters).items():
            setattr(self, name, value)

    @classmethod
    def transients(cls) -> frozenset[str]:
        """The ``transient_attributes`` of every class of the hierarchy."""
        return frozenset().union(*(vars(c).get("transient_attributes", ()) for c in cls.__mro__))

    def record_transients(self) -> None:
        """Keep the transient attributes' values at the end of set-up (``setup``)."""
        values = {n: getattr(self, n) for n in self.transients() if hasattr(self, n)}
        vars(self)["_transient_values"] = copy.deepcopy(values)

    def _reset_transients(self) -> None:
        for name, value in vars(self).get("_transient_values", {}).items():
            setattr(self, name, copy.deepcopy(value))

    def _declared_values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._declarations.specs}

    def state_dict(self) -> dict[str, Any]:
        """All server state, for checkpoints: every declared state under its name, each held
        aggregator's state under its attribute's name, and ``num_clients``."""
        children = {name: child.state_dict() for name, child in self.children().items()}
        return {**self._declared_values(), **children, "num_clients": self.num_clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state :meth:`state_dict` returned (after set-up: every declared state must
        have the layout this run built, else a ConfigurationError naming the state and the key);
        the values are copied, transient attributes reset."""
        owner = type(self).__name__
        problem = self._declarations.mismatch(state)
        if problem is not None:
            raise ConfigurationError(
                f"the checkpoint's {owner} state {problem}: it was written for another model or "
                f"aggregator; resume with the run's own model and aggregator"
            )
        self.on_load_state(state)
        for name in self._declarations.specs:
            setattr(self, name, clone_value(state[name]))
        for name, child in self.children().items():
            if name not in state:
                raise ConfigurationError(
                    f"the checkpoint's {owner} state has no {name!r} (the state of {owner}.{name}, "
                    f"a {type(child).__name__}); resume with the aggregator that wrote it"
                )
            child.load_state_dict(state[name])
        self.num_clients = state["num_clients"]
        self._reset_transients()

    def on_load_state(self, state: dict[str, Any]) -> None:  # noqa: B027 (an optional hook)
        """Called by :meth:`load_state_dict` with a checkpoint's state that fits the declarations,
        before it is loaded: refuse (a ConfigurationError) one this run's options cannot continue
        (FedCross: another number of models; client-level DP: another noise multiplier).
        Nothing by default."""

    def snapshot(self) -> dict[str, Any]:
        """Copies of every declared state an undone round restores (``rollback``), and of each
        held aggregator's, for :meth:`restore`."""
        specs = self._declarations.specs
        own = {n: clone_value(getattr(self, n)) for n, spec in specs.items() if spec.rollback}
        return {**own, **{name: c.snapshot() for name, c in self.children().items()}}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Put back a :meth:`snapshot` (the loop undoing a round); transient attributes reset."""
        children = self.children()
        for name, value in snapshot.items():
            if name in children:
                children[name].restore(value)
            else:
                setattr(self, name, value)
        self._reset_transients()

    def declared_state_problem(self) -> str | None:
        """Where the declared state (this aggregator's, then each held one's) breaks the layout
        it was built with, as ``Class.state['key'] <what>``; None when it does not."""
        problem = self._declarations.mismatch(self._declared_values())
        if problem is not None:
            return f"{type(self).__name__}.{problem}"
        for child in self.children().values():
            problem = child.declared_state_problem()
            if problem is not None:
                return problem
        return None
