"""No silently skipped hooks (docs/algorithms.md section 2.6, "Hooks that cannot be skipped").

A plug-in (client objective, aggregator, statistic, attack, backend, round component) overrides the hooks its base class
documents. One that defines a method under a name the framework used to call and no longer does
(``server_step``), or under a near miss of a hook's name (``local_los``, ``begin_clinet``), would
run with its override never called. :func:`check_hooks` refuses both at start-up, before anything
is written, in one line naming the class, its name and the hook to use, as Lightning does for its
removed hooks:

- :data:`REMOVED`: per base class, the names it used to call (or read: ``round_context``) and
  what replaces each; an exact match is refused;
- a near miss: a public name the plug-in defines that no class of its hierarchy defines, within
  :data:`CUTOFF` (``difflib`` similarity) of a public hook of its base classes. A plug-in's own
  helpers that resemble no hook (``trainable``, ``alpha_at``) pass; base methods a plug-in calls
  rather than overrides (:data:`UTILITIES`) are no hooks.

The plug-in's classes are those of its hierarchy below the framework's base classes
(:data:`BASES`): the shipped algorithms are checked like a user's.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from fedlightning.attacks.base import Attack, UploadAttack
from fedlightning.backends.base import Backend
from fedlightning.clients.base import ClientModule
from fedlightning.errors import ConfigurationError
from fedlightning.round_components import RoundComponent
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.server_state import ServerState
from fedlightning.server.statistics import Statistic
from fedlightning.server.wrapping import WrappingAggregator

#: the framework's base classes: their public names are the hooks a plug-in overrides
BASES = (ClientModule, FedAvg, WrappingAggregator, Aggregator, Statistic, ServerState, UploadAttack,
         Attack, Backend, RoundComponent)  # fmt: skip
_EVALUATION = "evaluate_clients (the loop scores every deployable model itself)"
#: per base class: names its plug-ins used to define that the framework no longer calls or reads
REMOVED: dict[type, dict[str, str]] = {
    Aggregator: {
        "server_step": "server_update(server_round)",
        "combine": "a statistic (an object with combine(uploads, weights, context)) passed as "
        "FedAvg(statistic=...)",
        "average": "a statistic (an object with combine(uploads, weights, context)) passed as "
        "FedAvg(statistic=...); server_update for what follows the combination",
        "private_round": "a statistic: FedAvg(statistic=NoisedMean(...))",
        "aggregate_fit": "aggregate(round_index, uploads), or server_update for a server optimizer",
        "configure_fit": "configure_round(round_index, client_ids)",
        "heterogeneous": "on_setup (every aggregator gets client_keys: refuse there what it "
        "cannot serve)",
        "state_dict": "add_state in __init__ (declared state is checkpointed with no code)",
        "load_state_dict": "add_state in __init__, and on_load_state to check a checkpoint",
    },
    ClientModule: {
        "round_context": "begin_client (the round context is what it sets, with no declaration)",
        "loss_uses_client_state": "begin_client (copy what local_loss needs from self.state "
        "into an attribute)",
        "validation_step": _EVALUATION,
        "test_step": _EVALUATION,
        "on_validation_epoch_start": _EVALUATION,
        "on_validation_epoch_end": _EVALUATION,
    },
}
#: per base class: methods the framework derives from a plug-in's declarations (overriding one
#: would keep state the declarations do not describe)
DERIVED: dict[type, frozenset[str]] = {RoundComponent: frozenset({"state_dict", "load_state_dict"})}
#: base methods a plug-in calls rather than overrides (a name near one of them is no skipped hook)
UTILITIES = frozenset({
    "add_state", "children", "declared_states", "build_state", "record_transients", "transients",
    "snapshot", "restore", "declared_state_problem", "payloads", "keys_of", "group_keys",
    "is_heterogeneous",
    "grouped", "group_models", "track", "batch_metrics", "group", "client_id", "payload", "state",
    "state_key",
})  # fmt: skip
#: how similar a name must be to a hook's to be its near miss (difflib's ratio)
CUTOFF = 0.8


def _public(cls: type) -> Iterator[str]:
    return (name for name in vars(cls) if not name.startswith("_"))


def hook_problem(plugin: Any) -> str | None:
    """Why ``plugin``'s class would have a hook silently skipped (module docstring), or None."""
    cls = type(plugin)
    bases = [b for b in BASES if isinstance(plugin, b)]
    if not bases:
        return None
    own = [c for c in cls.__mro__ if not issubclass(bases[0], c) and c not in BASES]
    removed = {k: v for b in bases for k, v in REMOVED.get(b, {}).items()}
    inherited = {n for c in cls.__mro__ if c not in own for n in vars(c)}
    hooks = sorted({n for b in bases for n in _public(b)} - UTILITIES)
    for klass in own:
        for name in _public(klass):
            if name in removed:
                return (
                    f"{klass.__name__}.{name} is no longer called: the framework never calls or "
                    f"reads it; use {removed[name]} (docs/algorithms.md section 2.6)"
                )
            if name in {n for b in bases for n in DERIVED.get(b, ())}:
                return (
                    f"{klass.__name__}.{name} overrides what {bases[0].__name__} derives from its "
                    "declared state: declare each value kept across rounds with self.add_state("
                    "name, initial value) in __init__ instead (docs/algorithms.md section 6.2)"
                )
            if name in inherited:
                continue
            close = difflib.get_close_matches(name, hooks, n=1, cutoff=CUTOFF)
            if close:
                return (
                    f"{klass.__name__}.{name} is not a hook of {bases[0].__name__} and would "
                    f"never be called: did you mean {close[0]}? (rename it, or give a helper a "
                    "name that resembles no hook; docs/algorithms.md section 2.6)"
                )
    return None


def check_hooks(*plugins: Any) -> None:
    """Refuse, with a ConfigurationError, the first of ``plugins`` (and of the aggregators they
    hold) that defines a removed hook or a near miss of a hook (module docstring)."""
    pending = [p for p in plugins if p is not None]
    while pending:
        plugin = pending.pop(0)
        if isinstance(plugin, ServerState):
            pending += list(plugin.children().values())
        if isinstance(plugin, RoundComponent):  # the plug-ins it holds (the adversary's attack)
            pending += [v for v in vars(plugin).values() if isinstance(v, BASES)]
        problem = hook_problem(plugin)
        if problem is not None:
            raise ConfigurationError(problem)
