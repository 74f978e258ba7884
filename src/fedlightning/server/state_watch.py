"""An aggregator's state either declared or refused, checked every round (docs/algorithms.md
section 2.6, "State either declared or refused").

What a resumed run rebuilds is the aggregator as constructed and set up, then its declared state
loaded from the checkpoint; a round the loop undoes puts back the declared state only. So an
attribute that changes across rounds without being declared (a step counter ``self.t += 1``, a
per-client table ``self.memory[cid] = ...``, a random generator drawn from) is lost on resume and
kept by an undone round: the run would silently differ from a straight one.

:class:`StateWatch` takes a fingerprint (:func:`fedlightning.fingerprint.fingerprint`: identity
and version counter of each tensor, values of numbers, contents of containers) of every attribute
of the aggregator and of each aggregator it holds (a wrapper's ``inner``) when the rounds start,
after set-up and any resume, except

- the declared states (``add_state``), which may change: they are checked instead to keep the
  layout they were built with (keys, shapes, dtypes, devices; a number stays a number);
- ``transient_attributes``: caches and this round's metrics that no later round reads;
- ``bookkeeping_attributes``: what the base class sets up (``num_clients``, ``client_keys``...);
- held aggregators, watched as aggregators of their own.

Configuration (``__init__``'s) and set-up data (``on_setup``'s, ``check_byzantine``'s, a DP
aggregator's plan) are written before the rounds start and never change after, so they pass.
After every aggregation :meth:`StateWatch.check` compares again and refuses, in one line naming
the class, the attribute and the fix, the first attribute that changed since the last check.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

from fedlightning.errors import ConfigurationError
from fedlightning.fingerprint import fingerprint
from fedlightning.server.server_state import ServerState

_ATOMS = (int, float, str, bool, type(None))


def watched(aggregator: ServerState) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of each attribute of ``aggregator`` that must not change across rounds
    (see the module docstring)."""
    skip = (
        set(aggregator.declared_states())
        | aggregator.transients()
        | aggregator.bookkeeping_attributes
        | set(aggregator.children())
    )
    return ((name, value) for name, value in vars(aggregator).items() if name not in skip)


class StateWatch:
    """Watches an aggregator (and those it holds) across rounds (see the module docstring).

    Args:
        aggregator: the run's aggregator, set up (and resumed) before the first round.
        option: the config path it was given by (``loop.aggregator``), for messages.
    """

    def __init__(self, aggregator: ServerState, option: str = "loop.aggregator") -> None:
        self.aggregator = aggregator
        self.option = option
        self.prints = self._fingerprints()

    def _members(self) -> Iterator[tuple[str, ServerState]]:
        """``(option, aggregator)`` of the run's aggregator and every one it holds."""
        pending = [(self.option, self.aggregator)]
        while pending:
            option, member = pending.pop(0)
            yield option, member
            pending += [(f"{option}.init_args.{n}", c) for n, c in member.children().items()]

    def _fingerprints(self) -> dict[tuple[str, str], Hashable]:
        return {
            (option, name): fingerprint(value)
            for option, member in self._members()
            for name, value in watched(member)
        }

    def check(self, round_index: int) -> None:
        """After round ``round_index``'s aggregation: raise a ConfigurationError when a declared
        state lost its layout or an undeclared attribute changed (module docstring)."""
        problem = self.aggregator.declared_state_problem()
        if problem is not None:
            raise ConfigurationError(
                f"round {round_index + 1}: {problem} after aggregation: an aggregator must keep "
                "each declared state's keys, shapes, dtypes and device (and a number a number), "
                "as add_state built it (docs/algorithms.md section 2.6)"
            )
        now = self._fingerprints()
        changed = [key for key, value in now.items() if self.prints.get(key, value) != value]
        changed += [key for key in now if key not in self.prints]
        self.prints = now
        if changed:
            raise ConfigurationError(self._refusal(round_index, *changed[0]))

    def _refusal(self, round_index: int, option: str, name: str) -> str:
        member = dict(self._members())[option]
        cls = type(member).__name__
        value = vars(member).get(name)
        shown = f" (now {value!r})" if isinstance(value, _ATOMS) else ""
        where = "" if option == self.option else f" ({option})"
        return (
            f"round {round_index + 1}: {cls}.{name}{where} changed{shown} but is not declared "
            "state, so a resumed run would lose it and an undone round would keep it: declare it "
            f"in __init__ with self.add_state({name!r}, <initial value>) (docs/algorithms.md "
            f"section 2.6), or, if no later round reads it (a cache, this round's metric), list "
            f"it in {cls}.transient_attributes"
        )
