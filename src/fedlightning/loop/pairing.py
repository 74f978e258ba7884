"""Pairing rules, checked at start-up before anything is written (docs/algorithms.md section 2.6,
"Pairing"): a client objective and an aggregator must be meant for each other, send and receive
what the other needs, and the objective must train in the run's precision.

Either side may declare what it needs of the other, by name:

- a client objective's ``required_aggregator``: aggregator names, one of which the aggregator
  must answer to (SCAFFOLD's client needs ``Scaffold``, FedNova's ``FedNova``);
- an aggregator's ``served_objectives``: objective names, one of which the objective must answer
  to (``Scaffold`` serves ``ScaffoldClient``, ``FedNova`` serves ``FedNovaClient``).

An object answers to the names of its class and of every base class, and to its
``capabilities``. An aggregator that wraps another (InCo, client-level DP: held in an attribute,
:meth:`~fedlightning.server.server_state.ServerState.children`) answers to the names of both, and
the wrapped one's ``served_objectives`` still apply: the check sees through wrappers.

Then the data each needs: the payload extras the objective reads (``required_payload_extras``
against the aggregator's ``payload_extras``), the upload extras the aggregator reads
(``required_upload_extras`` against the objective's ``upload_extras``) and the weighting the
objective's uploads need (FML's ``required_weighting``: uniform). A mismatch is one line naming
both sides and what to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlightning.errors import ConfigurationError

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule
    from fedlightning.server.base import Aggregator


def answers_to(obj: object) -> frozenset[str]:
    """The names ``obj`` (a class or an instance) answers to: its classes' and its
    ``capabilities``."""
    cls = obj if isinstance(obj, type) else type(obj)
    return frozenset(c.__name__ for c in cls.__mro__) | frozenset(obj.capabilities)


def chain(aggregator: Aggregator) -> list[Aggregator]:
    """``aggregator`` and every aggregator it holds (a wrapper's inner), outermost first."""
    members = [aggregator]
    for member in members:
        members += list(member.children().values())
    return members


def describe(aggregator: Aggregator) -> str:
    """``InCo around Scaffold``: the aggregator as a user configured it."""
    return " around ".join(type(member).__name__ for member in chain(aggregator))


def pairing_refusal(
    objective: type[ClientModule] | ClientModule, aggregator: Aggregator
) -> str | None:
    """Why ``objective`` (a class or an instance) and ``aggregator`` cannot run together (module
    docstring), or None."""
    members = chain(aggregator)
    name = objective.__name__ if isinstance(objective, type) else type(objective).__name__
    agg = describe(aggregator)
    wanted = objective.required_aggregator
    if wanted and not wanted & frozenset().union(*map(answers_to, members)):
        first = sorted(wanted)[0]
        return (
            f"client objective {name} needs aggregator {' or '.join(sorted(wanted))}, but "
            f"loop.aggregator is {agg}: use loop.aggregator {first} (or an aggregator whose "
            "capabilities name it)"
        )
    for member in members:
        served = member.served_objectives
        if served and not served & answers_to(objective):
            return (
                f"aggregator {type(member).__name__} (loop.aggregator: {agg}) serves client "
                f"objective {' or '.join(sorted(served))}, but the model is {name}: use the model "
                f"{sorted(served)[0]} (or an objective whose capabilities name it)"
            )
    return _data_refusal(objective, name, aggregator, agg)


def _data_refusal(
    objective: type[ClientModule] | ClientModule, name: str, aggregator: Aggregator, agg: str
) -> str | None:
    """Why the extras or the weighting do not fit (module docstring), or None."""
    missing = objective.required_payload_extras - aggregator.payload_extras
    if missing:
        return (
            f"client objective {name} needs {sorted(missing)} from the server, which aggregator "
            f"{agg} does not send: pair it with its own aggregator"
        )
    weighting = getattr(aggregator, "weighting", None)
    required = objective.required_weighting
    if required is not None and weighting not in (None, required):
        return (
            f"client objective {name} needs its uploads averaged with weighting={required!r}, "
            f"but aggregator {agg} has weighting={weighting!r}: set "
            f"loop.aggregator.init_args.weighting: {required}"
        )
    missing = aggregator.required_upload_extras - objective.upload_extras
    if missing:
        return (
            f"aggregator {agg} needs {sorted(missing)} in each upload, which client objective "
            f"{name} does not produce: pair it with its own client objective"
        )
    return None


def check_pairing(model: ClientModule, aggregator: Aggregator, precision: str) -> None:
    """Refuse a client objective and aggregator that do not fit each other (one line naming
    both), or a precision the objective cannot train with."""
    model.check_precision(precision)
    refusal = pairing_refusal(model, aggregator)
    if refusal is not None:
        raise ConfigurationError(refusal)
