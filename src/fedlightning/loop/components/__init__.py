"""The run's round components (docs/algorithms.md section 6.2): the built-ins in their places and
the config's (``loop.components``), each built from its own options.

A run's components, in the order each point of a round calls them:

1. :class:`CommunicationMeter`: always on.
2. :class:`PrivacyReport`: always on (its columns and lines need ``loop.dp_sgd`` or a DP
   aggregator).
3. :class:`Adversary`: with an attack (``loop.attack: X`` or ``{class_path: ...Adversary,
   init_args: {attack: X}}`` in ``loop.components``).
4. :class:`ServerGuard`: always on (``loop.on_round_failure``).
5. :class:`TargetTracker`: always on (``loop.target_acc: a`` or ``{class_path:
   ...TargetTracker, init_args: {target: a}}``; without a target it only keeps the run's time).
6. :class:`~fedlightning.system.SystemModel`: the virtual clock, when ``loop.components`` lists
   one (after the tracker: it adds the virtual time at which the target was reached); a run
   has one clock: this or an asynchronous server (:mod:`fedlightning.asynchronous`), which
   runs among the user's components.
7. the user's components, in the order ``loop.components`` lists them.
8. :class:`RunPath`: always on (records the path each round took in the run's identity).
9. :class:`CheckpointSaver`: always on, last (``loop.checkpoint_every``).

The order is the order of effects: the adversary transforms the uploads before anything else
sees them; the server guard discards a failed round's row before the targets and the user's
components see it (they never react to a model the run rolled back); the run's path is recorded
in the identity before the checkpoint writer, which comes last, so a checkpoint holds what every
other component did in its round. A built-in keeps its
place whatever the list's order; one of each at most, and one spelling (a shorthand and a listed
one together are refused). The always-on built-ins take their options from the run and are not
listed.

Start-up (:func:`setup_components`) sets each component's declared state to its initial value,
calls its ``setup`` with the run (:class:`RunContext`), then folds ``configure_fit`` over the
components; a run without an adversary gets the aggregator's breakdown check for no attack.
The last two built-ins (:func:`closing_components`) are made once the run's identity and device
are resolved: they read and write the run's state (:class:`~fedlightning.loop.run_state.RunState`).
"""

from __future__ import annotations

from collections.abc import Sequence

from fedlightning.asynchronous.server import AsyncServer
from fedlightning.attacks.base import Attack
from fedlightning.errors import ConfigurationError, require, what_it_is
from fedlightning.loop.communication import CommunicationMeter
from fedlightning.loop.components.adversary import Adversary
from fedlightning.loop.components.checkpoints import CheckpointSaver
from fedlightning.loop.components.context import RunContext
from fedlightning.loop.components.identity import SHORTHANDS
from fedlightning.loop.components.privacy import PrivacyReport
from fedlightning.loop.components.run_path import RunPath
from fedlightning.loop.options import RunParts
from fedlightning.loop.run_state import RunState
from fedlightning.loop.server_guard import ServerGuard
from fedlightning.loop.targets import TargetTracker
from fedlightning.protocol import FitConfig
from fedlightning.round_components import RoundComponent
from fedlightning.system.model import SystemModel

__all__ = [
    "Adversary", "CheckpointSaver", "CommunicationMeter", "PrivacyReport", "RunContext",
    "RunPath", "ServerGuard", "TargetTracker", "closing_components", "configured_components",
    "run_components", "setup_components",
]  # fmt: skip

#: the built-ins that are always on, and what configures each (they are not listed)
ALWAYS_ON: dict[type[RoundComponent], str] = {
    CommunicationMeter: "it has no options",
    PrivacyReport: "loop.dp_sgd and the aggregator give its columns",
    ServerGuard: "loop.on_round_failure is its option",
    RunPath: "loop.backend is what it records",
    CheckpointSaver: "loop.checkpoint_every is its option",
}


def configured_components(
    listed: Sequence[RoundComponent] | None, attack: Attack | None, target_acc: float | None
) -> tuple[RoundComponent, ...]:
    """``loop.components`` with the shorthands ``loop.attack`` and ``loop.target_acc``: the
    adversary (with an attack), the target tracker, then the user's components as listed;
    refuses, naming the entry, what is not a component, an always-on built-in, a second
    adversary or tracker, a built-in given by both spellings, and two components whose states
    would share a checkpoint key."""
    listed = list(listed or [])
    for index, component in enumerate(listed):
        _check_listed(index, component)
    require(
        attack is None or isinstance(attack, Attack),
        "loop.attack", attack, "null or an Attack (fedlightning.attacks: LabelFlip, SignFlip, ...)",
    )  # fmt: skip
    require(
        target_acc is None or 0.0 < target_acc <= 1.0,
        "loop.target_acc", target_acc, "null or an accuracy in (0, 1]",
    )  # fmt: skip
    shorthand = {Adversary: attack, TargetTracker: target_acc}
    built_in: dict[type[RoundComponent], list[RoundComponent]] = {}
    for kind, (_, option) in SHORTHANDS.items():
        found = [i for i, c in enumerate(listed) if isinstance(c, kind)]
        if len(found) > 1:
            raise ConfigurationError(
                f"loop.components[{found[1]}] is a second {kind.__name__} (loop.components"
                f"[{found[0]}] is one): a run has one"
            )
        if found and shorthand[kind] is not None:
            raise ConfigurationError(
                f"{option} and loop.components[{found[0]}] ({kind.__name__}) both configure the "
                f"{kind.__name__}: give one of them"
            )
        built_in[kind] = [listed[i] for i in found]
    adversary = built_in[Adversary] or ([Adversary(attack)] if attack is not None else [])
    tracker = built_in[TargetTracker] or [TargetTracker(target_acc)]
    clocks = _one_clock(listed)
    system = [c for c in clocks if isinstance(c, SystemModel)]
    yours = [c for c in listed if not isinstance(c, (*SHORTHANDS, SystemModel))]
    configured = (*adversary, *tracker, *system, *yours)
    _check_keys(configured)
    return configured


def _one_clock(listed: Sequence[RoundComponent]) -> list[RoundComponent]:
    """The listed SystemModel or asynchronous server (which has its own system model): one at
    most, the other refused naming both entries."""
    clocks = [i for i, c in enumerate(listed) if isinstance(c, SystemModel | AsyncServer)]
    if len(clocks) > 1:
        first, second = (type(listed[i]).__name__ for i in clocks[:2])
        raise ConfigurationError(
            f"loop.components[{clocks[1]}] ({second}) and loop.components[{clocks[0]}] ({first}) "
            "both keep the run's clock: a run has one (an asynchronous server's system model "
            "is its option `system`)"
        )
    return [listed[i] for i in clocks]


def _check_listed(index: int, component: object) -> None:
    if not isinstance(component, RoundComponent):
        raise ConfigurationError(
            f"loop.components[{index}]={type(component).__name__} is {what_it_is(component)}, "
            "not a round component: a component subclasses "
            "fedlightning.round_components.RoundComponent (docs/algorithms.md section 6.2)"
        )
    for kind, why in ALWAYS_ON.items():
        if isinstance(component, kind):
            raise ConfigurationError(
                f"loop.components[{index}]={kind.__name__} is a built-in round component that "
                f"every run has, in its place ({why}): leave it out of loop.components"
            )


def _check_keys(components: Sequence[RoundComponent]) -> None:
    """Refuse two components that would keep their states under one checkpoint key (the
    always-on built-ins' keys included)."""
    owners = {key: f"the built-in {kind.__name__}" for kind in ALWAYS_ON if (key := kind.name)}
    for component in components:
        if not component.declared_states():
            continue
        key, name = component.state_key, type(component).__name__
        if key in owners:
            raise ConfigurationError(
                f"loop.components: {name} keeps its state under {key!r}, as {owners[key]} does: "
                f"give {name} another name (its class attribute `name`)"
            )
        owners[key] = name


def run_components(
    configured: Sequence[RoundComponent],
) -> list[RoundComponent]:
    """The run's components but the last two (:func:`closing_components`), in their places
    (module docstring):
    the always-on built-ins made afresh, the configured ones around them."""
    adversary = [c for c in configured if isinstance(c, Adversary)]
    rest = [c for c in configured if not isinstance(c, Adversary)]
    return [CommunicationMeter(), PrivacyReport(), *adversary, ServerGuard(), *rest]


def closing_components(
    parts: RunParts, run: RunState, components: Sequence[RoundComponent]
) -> list[RoundComponent]:
    """The run's last two built-ins (module docstring), made once ``run`` has its identity and
    device: the run's path, then the checkpoint writer, which saves every one of ``components``
    (the list these two are appended to, them included)."""
    path = RunPath(parts.backend, run.identity, run.compute.device)
    return [path, CheckpointSaver(parts, run, components)]


def setup_components(components: Sequence[RoundComponent], run: RunContext) -> FitConfig:
    """Start-up (module docstring): each component's declared state set to its initial value,
    its ``setup`` with ``run``; returns the fit config every component's ``configure_fit`` left
    (the adversary's label-flipping clients)."""
    for component in components:
        component.build_state()
        component.setup(run)
    if not any(isinstance(c, Adversary) for c in components):
        run.aggregator.check_byzantine(run.clients_per_round, 0)  # no attack: f = 0
    config = run.fit_config
    for component in components:
        config = component.configure_fit(config)
    return config
