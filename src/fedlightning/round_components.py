"""Round components: what the loop does around the algorithm, each behind one small protocol
(docs/algorithms.md section 6.2).

The round body (:mod:`fedlightning.loop.rounds`) reads as the algorithm: sample, dispatch, train,
screen, aggregate, evaluate, record. Every feature around it (the communication meter, the
targets, the privacy report, the adversary, the server guard, the checkpoint writer, and any
component of a user's) is a :class:`RoundComponent`: it is built from its own options
(``class_path``/``init_args`` in ``loop.components``), reads the run at start-up
(:meth:`~RoundComponent.setup`), sees the round (a :class:`Round`) at the named points below, in
the order the run's components are listed (:mod:`fedlightning.loop.components`), and owns its
declared state. Each hook does nothing by default, so a component overrides only the points it
needs; a new one is a class and one config entry, with no edit of the library.

Points of a round, in order (each hook's docstring says which fields of the round it sees; the
others are still empty there, and ``tests/test_component_contract.py`` checks both):

1. :meth:`~RoundComponent.on_round_start`: before the clients are sampled.
   :meth:`~RoundComponent.select_clients`: which of the sampled clients train (the system
   model's available ones), each component seeing the previous one's choice;
   :meth:`~RoundComponent.configure_jobs`: the fits handed to the backend (a step budget).
2. :meth:`~RoundComponent.on_results`: after the fits and the failure policy.
3. :meth:`~RoundComponent.transform_uploads`: may replace uploads (the adversary), each
   component seeing the previous one's output; ``round.uploads`` is then the result.
4. :meth:`~RoundComponent.admits`: whether the round may be aggregated (asked only of a round
   with enough uploads; every component is asked until one refuses).
5. :meth:`~RoundComponent.on_aggregating` and :meth:`~RoundComponent.on_aggregated`: around the
   aggregator's ``aggregate`` (the server guard copies and checks the state).
6. :meth:`~RoundComponent.on_evaluated`: an evaluated round's metrics row; returns it with the
   component's own columns, or ``None`` to discard the row (the round failed).
7. :meth:`~RoundComponent.on_round_end`: after the row is recorded (time meters, checkpoints).

And per run: :meth:`~RoundComponent.setup` and :meth:`~RoundComponent.configure_fit` at
start-up, before anything is written; :meth:`~RoundComponent.on_run_end` when the rounds are over
(or the run stops); :meth:`~RoundComponent.summary_lines` and :meth:`~RoundComponent.done_note`
for the closing output.

**State, declared or refused.** What a component keeps across rounds is declared in ``__init__``
with :meth:`~RoundComponent.add_state` (as an aggregator's: a number, ``None`` for an optional
number, a tensor, ``[]`` or ``{}``): start-up sets it to its initial value, every checkpoint
carries it under the component's :attr:`~RoundComponent.name` and a resume restores it, refusing
in one line a checkpoint whose state does not fit the declarations. Any other attribute that
changes across rounds is refused at the end of that round, naming it
(:mod:`fedlightning.loop.components.watch`), except ``transient_attributes`` (values no later
round reads) and the run's parts a component was given (the aggregator, the summary...).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import ClientJob, FitConfig, FitResult, Payload, Upload
from fedlightning.recorded_args import RecordsInitArgs
from fedlightning.server.declared_state import STATE_DICT, Declarations, StateInit, clone_value

#: a metrics row of an evaluated round: column -> value
Row = dict[str, float]


@dataclass
class Round:
    """One round as the components see it (filled in as the round goes; each hook's docstring
    says which fields are filled when it is called).

    Attributes:
        index: the 0-based round.
        last: the run's last round.
        started: ``time.perf_counter()`` when the round started.
        client_ids: the sampled clients.
        payloads: the server's payload per sampled client.
        jobs: the fits handed to the backend.
        results: the backend's answer per client (a FitResult or the exception it raised).
        kept: the successful fits whose new state the ClientStore keeps, ``(client, result)``.
        uploads: the successful fits' uploads: as the clients sent them at ``on_results``, as the
            aggregator receives them (after :meth:`RoundComponent.transform_uploads`) from
            ``admits`` on.
        aggregated: whether the aggregator aggregated them (False: too few uploads, or a
            component refused the round in :meth:`RoundComponent.admits`); set from
            ``on_aggregating`` on (False before).
    """

    index: int
    last: bool
    started: float = field(default_factory=time.perf_counter)
    client_ids: list[int] = field(default_factory=list)
    payloads: dict[int, Payload] = field(default_factory=dict)
    jobs: list[ClientJob] = field(default_factory=list)
    results: Mapping[int, FitResult | BaseException] = field(default_factory=dict)
    kept: Sequence[tuple[int, FitResult]] = ()
    uploads: list[Upload] = field(default_factory=list)
    aggregated: bool = False

    def seconds(self) -> float:
        """Wall time since the round started."""
        return time.perf_counter() - self.started


class RoundComponent(RecordsInitArgs):
    """A feature of the loop around the algorithm (see the module docstring for the points).

    Its constructor takes its own options (``loop.components[i].init_args``); the run's parts
    come at :meth:`setup`.

    Attributes:
        name: the key of its declared state in checkpoints (``""``: the class's name).
        resume_may_change: its options a resume may change (they change no result, and its
            state is the same whatever their value): the target tracker's ``target``. Any other
            change of the components at a resume is refused (docs/algorithms.md section 6.2).
        transient_attributes: attributes a round may rewrite that no later round reads (this
            round's numbers, a cache): neither state nor watched.
    """

    name: ClassVar[str] = ""
    resume_may_change: ClassVar[frozenset[str]] = frozenset()
    transient_attributes: ClassVar[frozenset[str]] = frozenset()

    # -- start-up ---------------------------------------------------------------------------------
    def setup(self, run: Any) -> None:
        """At start-up, before anything is written: read the run (``run``, a
        :class:`fedlightning.loop.components.RunContext`: its options, the aggregator, the
        backend, the number of clients...) and refuse what this component cannot serve with a
        :class:`~fedlightning.errors.ConfigurationError` naming the option. It may keep the run's
        parts as attributes: they are not its state."""

    def configure_fit(self, config: FitConfig) -> FitConfig:
        """How every client fit runs, after :meth:`setup`: ``config`` (the run's, as the previous
        components left it) or a copy with this component's change (the adversary's
        label-flipping clients)."""
        return config

    # -- the points of a round --------------------------------------------------------------------
    def on_round_start(self, round: Round) -> None:
        """Before the round's clients are sampled.

        Sees: ``round.index``, ``round.last``, ``round.started``."""

    def select_clients(self, round: Round, client_ids: list[int]) -> list[int]:
        """Which of the sampled ``client_ids`` (the previous component's choice) train this
        round: all by default; the others receive nothing and keep their state.

        Sees: ``round.index``, ``round.last``, ``round.started``."""
        return client_ids

    def configure_jobs(self, round: Round, jobs: list[ClientJob]) -> list[ClientJob]:
        """The fits handed to the backend: ``jobs`` (the previous component's) as they are by
        default; the system model gives a straggler a step budget (``ClientJob.max_steps``).

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``."""
        return jobs

    def on_results(self, round: Round) -> None:
        """After the fits and the failure policy (the store kept the successful fits' state).

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``, ``round.jobs``, ``round.results`` (as the backend answered),
        ``round.kept``, ``round.uploads`` (the successful fits' uploads as the clients sent
        them)."""

    def transform_uploads(self, round: Round, uploads: list[Upload]) -> list[Upload]:
        """The uploads the aggregator receives: ``uploads`` (the previous component's output) as
        they are by default.

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``, ``round.jobs``, ``round.results``, ``round.kept``, ``round.uploads``
        (as the clients sent them)."""
        return uploads

    def admits(self, round: Round) -> bool:
        """Whether the round may aggregate ``round.uploads`` (asked of a round with enough
        uploads); a refusing component logs and counts why (or raises RunStopped).

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``, ``round.jobs``, ``round.results``, ``round.kept``, ``round.uploads``
        (as the aggregator receives them)."""
        return True

    def on_aggregating(self, round: Round) -> None:
        """Just before the aggregator aggregates ``round.uploads``.

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``, ``round.jobs``, ``round.results``, ``round.kept``, ``round.uploads``
        (as the aggregator receives them), ``round.aggregated`` (True)."""

    def on_aggregated(self, round: Round) -> None:
        """Just after the aggregation.

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``, ``round.jobs``, ``round.results``, ``round.kept``, ``round.uploads``
        (as the aggregator received them), ``round.aggregated`` (True)."""

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        """An evaluated round's ``row`` (with the earlier components' columns); returns it with
        this component's columns added, or ``None`` to discard it (the later components do not
        see it).

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``, ``round.jobs``, ``round.results``, ``round.kept``, ``round.uploads``
        (as the aggregator received them), ``round.aggregated`` (False in a round that
        aggregated nothing: too few uploads, or refused)."""
        return row

    def on_round_end(self, round: Round) -> None:
        """After the round's row is recorded (every round, evaluated or not).

        Sees: ``round.index``, ``round.last``, ``round.started``, ``round.client_ids``,
        ``round.payloads``, ``round.jobs``, ``round.results``, ``round.kept``, ``round.uploads``
        (as the aggregator received them), ``round.aggregated`` (False in a round that
        aggregated nothing: too few uploads, or refused)."""

    # -- the end of the run -----------------------------------------------------------------------
    def on_run_end(self, failing: bool) -> str | None:
        """The rounds are over or the run stops: finish what is in flight (``failing``: another
        error is on its way up, so log rather than raise). Returns why the final model must not
        be saved, or None."""
        return None

    def summary_lines(self) -> list[str]:
        """Lines of the run summary printed at the end."""
        return []

    def done_note(self) -> str:
        """Appended to the closing ``done:`` line (e.g. ``, test_acc >= 0.9 at round 12``)."""
        return ""

    # -- declared state ---------------------------------------------------------------------------
    def add_state(self, name: str, init: StateInit) -> None:
        """Declare a value this component keeps across rounds (call it in ``__init__``):
        ``self.<name>`` holds it, start-up sets it to ``init``, every checkpoint carries it and a
        resume restores it. ``init``: a number (``0``, ``0.0``), ``None`` (an optional number), a
        tensor, ``[]`` or ``{}`` (a table the component fills)."""
        owner = type(self).__name__
        if hasattr(RoundComponent, name):
            raise ValueError(
                f"{owner}.add_state: {name!r} is a name of the RoundComponent protocol"
            )
        declarations = Declarations(dict(self._declarations.specs))
        declarations.add(owner, name, init, 0.0, True)
        if declarations.specs[name].kind == STATE_DICT:
            raise ValueError(
                f"{owner}.add_state({name!r}): a round component's state is a number, None, a "
                f"tensor, [] or {{}}, got {init!r}"
            )
        vars(self)["_declared_state"] = declarations
        setattr(self, name, clone_value(init))

    @property
    def _declarations(self) -> Declarations:
        # created on first use: a subclass need not call a base __init__
        return vars(self).setdefault("_declared_state", Declarations())

    @property
    def state_key(self) -> str:
        """The key of this component's state in checkpoints: :attr:`name`, or the class's."""
        return self.name or type(self).__name__

    def declared_states(self) -> dict[str, str]:
        """Each declared state's name and how it starts."""
        return {name: spec.describe() for name, spec in self._declarations.specs.items()}

    def build_state(self) -> None:
        """Set every declared state to its initial value (start-up)."""
        for name, value in self._declarations.build({}, frozenset()).items():
            setattr(self, name, value)

    def state_dict(self) -> dict[str, Any]:
        """Every declared state under its name (what a resumed run needs of this component)."""
        return {name: getattr(self, name) for name in self._declarations.specs}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: each declared state from ``state`` (copied), after
        checking that it fits its declaration (else a ConfigurationError naming the state)."""
        problem = self._declarations.mismatch(state)
        if problem is not None:
            raise ConfigurationError(
                f"the checkpoint's state of the round component {type(self).__name__} (under "
                f"{self.state_key!r}) does not fit its declarations: {problem}; resume with the "
                "component code that wrote it"
            )
        for name in self._declarations.specs:
            setattr(self, name, clone_value(state[name]))


def component_states(components: Iterable[RoundComponent]) -> dict[str, dict[str, Any]]:
    """``{key: state}`` of the components that declare state, for a checkpoint."""
    return {c.state_key: c.state_dict() for c in components if c.declared_states()}


def load_component_states(
    components: Iterable[RoundComponent],
    states: Mapping[str, Mapping[str, Any]],
    always_on: tuple[type[RoundComponent], ...] = (),
) -> None:
    """Restore each component that declares state from ``states`` (refused, naming it, when
    its entry is missing). A run cannot add or drop an always-on built-in (``always_on``), so
    one missing from ``states`` means the checkpoint was written by a library before it
    existed: it keeps its initial state (the run's path: the summary covers the rounds after
    the resume)."""
    for component in components:
        if not component.declared_states():
            continue
        if component.state_key not in states and isinstance(component, always_on):
            continue
        if component.state_key not in states:
            raise ConfigurationError(
                f"the checkpoint holds no state of the round component "
                f"{type(component).__name__} (under {component.state_key!r}): it was written "
                "by a run without it; resume with the components it ran"
            )
        component.load_state_dict(states[component.state_key])
