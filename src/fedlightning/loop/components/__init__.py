"""The loop's round components (docs/algorithms.md section 6.2), built once per run by start-up.

:data:`COMPONENTS` lists, in the order each point of a round calls them, one factory per
component: ``factory(context) -> RoundComponent | None`` (``None``: not in this run, e.g. no
attack). The order matters where one component reads what an earlier one did: the adversary
transforms the uploads before anything else sees them, the meters add their columns before the
server guard may discard a failed round's row, the targets come after the guard (a discarded row
reaches no target), the run's path is recorded in the identity before the checkpoint writer,
which comes last (a checkpoint holds what every other
component did in its round). A new meter or attack is one file and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedlightning.loop.communication import CommunicationMeter
from fedlightning.loop.components.adversary import AdversaryComponent
from fedlightning.loop.components.checkpoints import CheckpointSaver
from fedlightning.loop.components.run_path import RunPath
from fedlightning.loop.options import RunOptions
from fedlightning.loop.run_state import RunState
from fedlightning.loop.server_guard import ServerGuard
from fedlightning.loop.targets import TargetTracker
from fedlightning.privacy.report import PrivacyReport
from fedlightning.round_components import RoundComponent


@dataclass(frozen=True)
class RunContext:
    """What a component factory may read of the run.

    Attributes:
        options: the loop's options, parts and records (:class:`~fedlightning.loop.options.
            RunOptions`).
        run: what start-up resolved (device, adversary, identity...).
        num_clients: the run's number of clients.
        components: the components built so far (the checkpoint writer saves theirs).
    """

    options: RunOptions
    run: RunState
    num_clients: int
    components: list[RoundComponent]


def _adversary(c: RunContext) -> RoundComponent | None:
    if c.run.adversary is None:
        return None
    o = c.options
    return AdversaryComponent(c.run.adversary, o.aggregator, o.summary, o.on_round_failure)


#: the round components of every run, in order (see the module docstring)
COMPONENTS: tuple[Callable[[RunContext], RoundComponent | None], ...] = (
    lambda c: CommunicationMeter(),
    lambda c: PrivacyReport(c.options.dp_sgd, c.options.aggregator, c.num_clients),
    _adversary,
    lambda c: ServerGuard(c.options.aggregator, c.options.summary, c.options.on_round_failure),
    lambda c: TargetTracker(c.options.target_acc),
    lambda c: RunPath(c.options.backend, c.run.identity, c.run.compute.device),
    lambda c: CheckpointSaver(c.options, c.run, c.components),
)


def build_components(options: RunOptions, run: RunState, num_clients: int) -> list[RoundComponent]:
    """The run's round components, from :data:`COMPONENTS`."""
    components: list[RoundComponent] = []
    context = RunContext(options, run, num_clients, components)
    for factory in COMPONENTS:
        component = factory(context)
        if component is not None:
            components.append(component)
    return components
