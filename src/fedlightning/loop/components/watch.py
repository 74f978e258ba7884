"""A round component's state either declared or refused, checked every round
(docs/algorithms.md section 6.2, "State, declared or refused").

A resumed run rebuilds each component from its options, sets it up, then loads its declared
state (``add_state``) from the checkpoint. So an attribute that changes across rounds without
being declared (a running mean ``self.mean = ...``, a counter, a random generator drawn from)
would restart on resume, and the run would silently differ from a straight one (issue 40: a
meter's running mean read 0.4815 resumed against 0.4770 straight).

:class:`ComponentWatch` takes a fingerprint (:func:`fedlightning.fingerprint.fingerprint`) of
every attribute of every component when the rounds start, after start-up and any resume, except

- the declared states, which may change (their layout is checked when a checkpoint loads);
- ``transient_attributes`` (of every class of the component's hierarchy): values no later round
  reads;
- the run's parts the component was given (the aggregator, the summary, the run's context...):
  they are the run's, each watched by its owner;
- what the base class keeps (the constructor's arguments, the declarations).

Options (``__init__``'s) and set-up data (``setup``'s) never change after, so they pass. At the
end of every round :meth:`ComponentWatch.check` compares again and refuses, in one line naming
the component, the attribute and the fix, the first attribute that changed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any

from fedlightning.errors import ConfigurationError
from fedlightning.fingerprint import fingerprint
from fedlightning.round_components import RoundComponent

#: what the base classes keep on an instance: never state
BOOKKEEPING = frozenset({"_init_args", "_declared_state"})
_ATOMS = (int, float, str, bool, type(None))


def transients(component: RoundComponent) -> frozenset[str]:
    """The ``transient_attributes`` of every class of ``component``'s hierarchy."""
    return frozenset().union(
        *(vars(c).get("transient_attributes", ()) for c in type(component).__mro__)
    )


class ComponentWatch:
    """Watches the run's round components across rounds (see the module docstring).

    Args:
        components: the run's components, set up (and resumed) before the first round.
        parts: the run's parts they may hold (compared by identity).
    """

    def __init__(self, components: Sequence[RoundComponent], parts: Iterable[object]) -> None:
        self.components = components
        # objects only: a number is no part (and small ints are shared by every attribute)
        self.parts = {id(part) for part in parts if not isinstance(part, _ATOMS)}
        self.prints = self._fingerprints()

    def _watched(self, component: RoundComponent) -> Iterator[tuple[str, Any]]:
        skip = set(component.declared_states()) | transients(component) | BOOKKEEPING
        for name, value in vars(component).items():
            if name not in skip and id(value) not in self.parts:
                yield name, value

    def _fingerprints(self) -> dict[tuple[int, str], Hashable]:
        return {
            (index, name): fingerprint(value)
            for index, component in enumerate(self.components)
            for name, value in self._watched(component)
        }

    def check(self, round_index: int) -> None:
        """At the end of round ``round_index``: raise a ConfigurationError when an undeclared
        attribute of a component changed (module docstring)."""
        now = self._fingerprints()
        changed = [key for key, value in now.items() if self.prints.get(key, value) != value]
        changed += [key for key in now if key not in self.prints]
        self.prints = now
        if changed:
            index, name = changed[0]
            raise ConfigurationError(self._refusal(round_index, self.components[index], name))

    @staticmethod
    def _refusal(round_index: int, component: RoundComponent, name: str) -> str:
        cls = type(component).__name__
        value = vars(component).get(name)
        shown = f" (now {value!r})" if isinstance(value, _ATOMS) else ""
        return (
            f"round {round_index + 1}: the round component {cls}.{name} changed{shown} but is not "
            "declared state, so a resumed run would restart it: declare it in __init__ with "
            f"self.add_state({name!r}, <initial value>) (docs/algorithms.md section 6.2), or, if "
            f"no later round reads it, list it in {cls}.transient_attributes"
        )
