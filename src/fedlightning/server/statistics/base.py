"""The server's statistic: the object that combines a round's uploads into one state_dict
(docs/algorithms.md section 2.8, "The server statistic").

:class:`~fedlightning.server.fedavg.FedAvg` (and every aggregator built on it: FedAvgM, FedAdam,
SCAFFOLD, FedNova, the robust presets, client-level DP) aggregates in two injected parts::

    combined = statistic.combine(uploads, weights, context)     # this module's protocol
    update   = aggregator.server_update(ServerRound(..., mean=combined, ...))

so a robust or private statistic composes with any server optimizer (FedAdam over a median,
FedAvgM over the DP mean) with no new class. A statistic is a :class:`Statistic` subclass (the
type ``FedAvg(statistic=...)`` and the CLI's ``class_path`` accept): it writes one method, and
its base class declares every capability the rest of the library reads, with its default:

- ``combine(uploads, weights, context) -> StateDict``: ``uploads`` are the round's uploaded
  state_dicts (sampling order, each with the keys its client owns), ``weights`` the aggregator's
  ``q_i`` before normalisation (``n_i`` or 1), ``context`` a :class:`StatisticContext` (the round,
  the run's seed, the pre-round server model ``w``). It returns the combined value of every key
  some upload owns (keys no upload owns are left out and stay unchanged).
- ``check_byzantine(per_round, byzantine)``: refuse an attack beyond the statistic's breakdown
  point (docs/algorithms.md section 8, "Breakdown points"); an honest majority where
  ``needs_honest_majority``, nothing by default (a mean has none).
- ``check_round_byzantine(uploads, byzantine)``: the same test for one round of an attacked run,
  before it aggregates (a round beyond it fails instead); ``check_byzantine``'s by default, and a
  statistic that adopts the run's f at start-up (Krum) tests the round against the f it adopted.
- ``weighted_mean`` (default ``False``): the statistic is the owner-aware weighted mean of the
  uploads as they are, so SecAgg+ can compute it from their sum and client-level DP may replace
  it by its private release.
- ``owner_aware`` (default ``False``): it serves clients that own different keys
  (docs/algorithms.md section 2.3); otherwise heterogeneous clients are refused at set-up.
- ``withholds_uploads`` / ``releases_every_round`` (default ``False``): the differentially
  private release's (the server update may read only the release; every round aggregates).
- ``round_metrics()``: this round's numbers for ``metrics.csv`` (none by default).
- ``check_aggregator(aggregator)``: refuse an aggregator the statistic cannot serve (the DP
  release: a server update that reads the individual uploads); nothing by default.
- ``option``: the config path that configured it, for messages.

A statistic also gets declared state (``add_state``, as an aggregator's: built at set-up on the
server device, checkpointed, restored on resume and by an undone round, watched every round)
under the aggregator's ``statistic`` entry. An object that is not a :class:`Statistic` is refused
(:func:`check_statistic`), saying what it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fedlightning.errors import ConfigurationError, what_it_is
from fedlightning.protocol import ClientKeys, StateDict
from fedlightning.recorded_args import RecordsInitArgs
from fedlightning.server.breakdown import require_honest_majority
from fedlightning.server.server_state import ServerState


@dataclass(frozen=True, eq=False)
class StatisticContext:
    """What a statistic may read besides the uploads (read-only).

    Attributes:
        index: the round, 0-based (randomness derives from ``(seed, index)``).
        seed: the run's seed.
        model: the server model ``w`` before this round (the aggregator's ``weights``, in its key
            space): the reference of an update ``u_i = w_i - w``.
    """

    index: int
    seed: int
    model: StateDict


class Statistic(ServerState, RecordsInitArgs, ABC):
    """Base of every statistic: declared state, set-up and every capability with its default
    (module docstring). A subclass writes :meth:`combine`."""

    weighted_mean: ClassVar[bool] = False
    owner_aware: ClassVar[bool] = False
    withholds_uploads: ClassVar[bool] = False
    releases_every_round: ClassVar[bool] = False
    #: breaks down once half the uploads are malicious (the default :meth:`check_byzantine`)
    needs_honest_majority: ClassVar[bool] = False
    #: how the run configured this statistic, and where its own options live, for messages (an
    #: aggregator preset that builds it from its own options sets both)
    option: str = "loop.aggregator.init_args.statistic"
    options_path: str = "loop.aggregator.init_args.statistic.init_args"
    bookkeeping_attributes = ServerState.bookkeeping_attributes | {"option", "options_path"}

    def setup(
        self,
        initial: StateDict,
        parameters: frozenset[str],
        num_clients: int,
        seed: int,
        client_keys: Sequence[ClientKeys] | None,
    ) -> None:
        """Build the declared state from the server model ``initial`` (server key space), then
        :meth:`on_setup` (a refusal of what the statistic cannot serve)."""
        self.num_clients, self.seed = num_clients, seed
        self.client_keys = None if client_keys is None else list(client_keys)
        self.parameters = parameters
        self.build_state(initial, parameters)
        self.on_setup(initial)
        self.record_transients()

    def on_setup(self, initial: StateDict) -> None:  # noqa: B027 (an optional hook)
        """After the declared state is built: refuse what the configuration cannot serve."""

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        """Refuse ``byzantine`` malicious of ``per_round`` uploads beyond the breakdown point:
        an honest majority where :attr:`needs_honest_majority` (docs/algorithms.md section 8,
        "Breakdown points"), nothing otherwise."""
        if byzantine and self.needs_honest_majority:
            require_honest_majority(self.option, per_round, byzantine)

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        """Refuse one round of ``uploads`` uploads, ``byzantine`` of them malicious, beyond the
        breakdown point; :meth:`check_byzantine`'s test by default."""
        self.check_byzantine(uploads, byzantine)

    def check_aggregator(self, aggregator: Any) -> None:  # noqa: B027 (optional)
        """Refuse an aggregator this statistic cannot serve; nothing by default."""

    def named(self, option: str, options_path: str) -> Statistic:
        """This statistic, named in messages as configured by ``option`` with its options under
        ``options_path`` (an aggregator preset's, e.g. ``loop.aggregator=Krum`` and
        ``loop.aggregator.init_args``); returns ``self``."""
        self.option, self.options_path = option, options_path
        return self

    def round_metrics(self) -> dict[str, float]:
        """This round's numbers (e.g. the Weiszfeld iterations); none by default."""
        return {}

    @abstractmethod
    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        """The combined value of every key some upload owns."""


def check_statistic(statistic: object, option: str = Statistic.option) -> Statistic:
    """``statistic`` when it is a :class:`Statistic`; otherwise a ConfigurationError naming
    ``option``, saying what the object is and what is expected."""
    if not isinstance(statistic, Statistic):
        raise ConfigurationError(
            f"{option}={type(statistic).__name__} is {what_it_is(statistic)}, not a Statistic: a "
            "statistic subclasses fedlightning.server.statistics.Statistic and writes "
            "combine(uploads, weights, context) (docs/algorithms.md section 2.8)"
        )
    return statistic


def setup_statistic(
    statistic: Statistic,
    initial: StateDict,
    parameters: frozenset[str],
    num_clients: int,
    seed: int,
    client_keys: Sequence[ClientKeys] | None,
    heterogeneous: bool,
) -> None:
    """Set ``statistic`` up for a run (its declared state), after
    refusing clients that own different keys unless it is ``owner_aware``."""
    if heterogeneous and not statistic.owner_aware:
        raise ConfigurationError(
            f"{statistic.option} compares whole uploads (one point per client) or coordinates across them "
            f"(statistic {type(statistic).__name__}), which needs clients that own the same keys, "
            "but these client groups own different keys: use an owner-aware statistic (the mean, "
            "a clipped mean, centered clipping) or one network"
        )
    statistic.setup(initial, parameters, num_clients, seed, client_keys)


#: where an aggregator preset's options live (its own init_args)
PRESET_OPTIONS = "loop.aggregator.init_args"


def preset_statistic(statistic: Statistic, preset: object) -> Statistic:
    """``statistic`` as the aggregator preset ``preset`` (Krum, GeometricMedian, ...) builds it
    from its own options: named ``loop.aggregator=<class>`` in messages, its options under
    ``loop.aggregator.init_args``."""
    return statistic.named(f"loop.aggregator={type(preset).__name__}", PRESET_OPTIONS)
