"""The Aggregator contract: server state, per-client payloads, folding uploads back in.

Aggregators are plain torch on state_dicts: they never import Lightning and can be tested with
hand-made tensors. They are device-agnostic: they compute on the device of the tensors they are
given and keep their state there (the loop gives them its server device,
:mod:`fedlightning.loop.server_device`; docs/algorithms.md section 2.1). One round, as the loop
drives it::

    aggregator.setup(initial, num_clients, seed, client_keys,   # once; client_keys may be None
                     parameters=model.server_parameter_names())
    payloads = aggregator.configure_round(round, client_ids)    # {client_id: Payload}
    uploads  = [train(client_id, payloads[client_id]) ...]      # by the client objectives
    aggregator.aggregate(round, uploads)                        # new server state
    aggregator.deployables()                                    # {"global": state_dict, ...}

**Owner-aware.** ``client_keys`` (one :class:`ClientKeys` per client, or ``None`` when every client
trains the whole ``initial`` model) says which sub-state_dict each client owns. Every aggregator
takes it: a client's payload holds only its own keys (clients of one group share one
:class:`~fedlightning.protocol.Payload` object), and each key is combined over the uploads that
own it (:func:`~fedlightning.server.functional.owner_combine`). An aggregator that cannot serve
clients with different key sets refuses them in :meth:`Aggregator.setup` with a
:class:`~fedlightning.errors.ConfigurationError`.

**A statistic and one extension hook.** :class:`~fedlightning.server.fedavg.FedAvg` and every
subclass aggregate by one template (docs/algorithms.md sections 2.6 and 2.8)::

    mean   = self.statistic.combine(states, weights, context)  # the injected statistic: the
                                                               # owner-aware mean, a robust rule,
                                                               # the DP release, any object
    update = self.server_update(ServerRound(round_index, mean, owners, uploads, parameters))
    # new state: update's values for the parameter keys it returns, the mean for every other
    # owned key (buffers), unowned keys unchanged

``server_update(server_round) -> StateDict`` (:class:`~fedlightning.server.round.ServerRound`) is
the hook for "combination of uploads -> new state" (FedAvg returns ``{}``; FedAvgM and FedAdam
apply a server optimizer, SCAFFOLD updates ``c``, FedNova takes its normalised step); the
statistic (:mod:`fedlightning.server.statistics`) is an object the aggregator is given, so the
two compose. ``self.weights`` is the server model.

**Declared state.** An aggregator declares each value it keeps across rounds once, in
``__init__``: ``self.add_state("momentum", "parameters")``, ``self.add_state("t", 0)``
(:class:`~fedlightning.server.server_state.ServerState`, a base of :class:`Aggregator`). Set-up
builds it on the server device; checkpoints, resume, an undone round and the run's identity carry
it with no more code. Every round the loop checks that each declared state keeps its layout and
that no other attribute changes (:mod:`fedlightning.server.state_watch`): state outside the
declaration is refused, naming the attribute. Set-up work that is not state goes in
:meth:`Aggregator.on_setup`.

**Pairing.** The loop reads ``payload_extras``, ``required_upload_extras``, ``weighting``,
``served_objectives`` and ``capabilities`` from the instance (class attributes or properties, as a
wrapper such as InCo forwards its inner aggregator's) and refuses an objective that does not fit
before anything is written (:mod:`fedlightning.loop.pairing`, docs/algorithms.md section 2.6).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import ClientKeys, Payload, StateDict, Upload
from fedlightning.recorded_args import RecordsInitArgs
from fedlightning.server.functional import parameter_keys
from fedlightning.server.server_state import ServerState

#: one :class:`ClientKeys` per client, or ``None`` (every client trains the whole model)
ClientKeyList = Sequence[ClientKeys] | None


def restrict(state: StateDict, keys: frozenset[str] | None) -> StateDict:
    """``state`` restricted to ``keys`` (``None``: ``state`` itself, not a copy)."""
    return state if keys is None else {k: v for k, v in state.items() if k in keys}


def group_keys(client_keys: Sequence[ClientKeys] | None) -> dict[str, frozenset[str]]:
    """Each client group's keys, in order of first appearance (empty for ``None``)."""
    out: dict[str, frozenset[str]] = {}
    for group, keys in client_keys or ():
        out.setdefault(group, keys)
    return out


def check_client_keys(initial: StateDict, client_keys: list[ClientKeys], num_clients: int) -> None:
    """Raise a ConfigurationError unless ``client_keys`` has one entry per client, each group's
    keys are keys of the server model ``initial``, and the clients of a group own the same keys."""
    require(
        len(client_keys) == num_clients,
        "client_keys",
        len(client_keys),
        f"one entry per client ({num_clients})",
    )
    groups = group_keys(client_keys)
    for group, keys in groups.items():
        missing = sorted(keys - set(initial))
        if missing:
            raise ConfigurationError(
                f"client group {group} has keys {missing[:3]} that the server model lacks"
            )
    for group, keys in client_keys:
        if keys != groups[group]:
            raise ConfigurationError(f"clients of group {group} own different keys")


class Aggregator(ServerState, RecordsInitArgs, ABC):
    """Base class of all server aggregators.

    Subclasses declare what they put in payload extras (``payload_extras``), what they need in
    upload extras (``required_upload_extras``) and which objectives they serve
    (``served_objectives``), so the loop can refuse a client objective that does not fit before
    training starts. The arguments an aggregator is constructed with are recorded
    (:mod:`fedlightning.recorded_args`): they are part of a run's identity. Its state is declared
    (:class:`~fedlightning.server.server_state.ServerState`).
    """

    payload_extras: frozenset[str] = frozenset()
    required_upload_extras: frozenset[str] = frozenset()
    #: the client objectives this aggregator serves, by class name (any base class's counts) or
    #: capability (an objective's ``capabilities``): one of them is needed; empty: any objective
    served_objectives: ClassVar[frozenset[str]] = frozenset()
    #: names an objective's ``required_aggregator`` may ask for, besides the class names of this
    #: aggregator (and of the aggregator it wraps)
    capabilities: ClassVar[frozenset[str]] = frozenset()
    num_clients: int = 0
    seed: int = 0
    client_keys: list[ClientKeys] | None = None
    #: the server state's keys that are trainable parameters (set by :meth:`setup`)
    parameters: frozenset[str] = frozenset()
    #: every round is a release the loop must aggregate, also one with no upload (client-level
    #: differential privacy, docs/algorithms.md section 7.1: skipping it would reveal the sample)
    releases_every_round: bool = False

    def setup(
        self,
        initial: StateDict,
        num_clients: int,
        seed: int = 0,
        client_keys: Sequence[ClientKeys] | None = None,
        *,
        parameters: Iterable[str] | None = None,
    ) -> None:
        """Initialise (or re-initialise) all server state from the template model's state_dict
        ``initial``, the server model whose keys contain every client's: every declared state
        (:meth:`~ServerState.add_state`) is built on the device of ``initial``, then
        :meth:`on_setup` runs, then the transient attributes' values are kept.

        ``seed`` is the run's seed: an aggregator that needs randomness (e.g. FedCross's shuffle of
        the sampled clients) derives it from ``(seed, round)`` with
        :func:`fedlightning.seeding.derive_seed`, never from the global RNG.

        ``client_keys`` (from the client objective's ``client_key_sets``) gives each client's group
        and keys, one entry per client; ``None`` means every client trains the whole ``initial``
        model. Clients of one group own the same keys.

        ``parameters``: the keys of ``initial`` that are trainable parameters (the loop passes the
        model's, :meth:`fedlightning.clients.ClientModule.server_parameter_names`); the others are
        buffers. ``None`` falls back to :func:`~fedlightning.server.functional.parameter_keys`
        (floating entries that are not normalisation running statistics), for an aggregator used
        without a model.
        """
        parameters = frozenset(parameter_keys(initial) if parameters is None else parameters)
        unknown = sorted(parameters - set(initial))
        if unknown:
            raise ConfigurationError(
                f"parameters {unknown[:3]} are not keys of the server model's state_dict"
            )
        initial, client_keys, parameters = self.server_key_space(initial, client_keys, parameters)
        self.num_clients = num_clients
        self.seed = seed
        self.client_keys = None if client_keys is None else list(client_keys)
        self.parameters = parameters
        if self.client_keys is not None:
            check_client_keys(initial, self.client_keys, num_clients)
        self.build_state(initial, parameters)
        self.on_setup(initial)
        self.record_transients()

    def server_key_space(
        self, initial: StateDict, client_keys: ClientKeyList, parameters: frozenset[str]
    ) -> tuple[StateDict, ClientKeyList, frozenset[str]]:
        """The server's key space: ``initial``, ``client_keys`` and ``parameters`` as the server
        state names them. The model's own by default; ``FedAvg(within_groups=True)`` keeps one
        model per group under ``<group>/<key>``."""
        return initial, client_keys, parameters

    def on_setup(self, initial: StateDict) -> None:  # noqa: B027 (an optional hook)
        """Called at the end of :meth:`setup`, with ``initial`` in the server's key space and every
        declared state built: check what the configuration cannot serve, derive what is not
        state (e.g. SCAFFOLD's owner counts). Nothing by default."""

    def group_keys(self) -> dict[str, frozenset[str]]:
        """Each client group's keys, in order of first appearance (empty without client_keys)."""
        return group_keys(self.client_keys)

    def is_heterogeneous(self) -> bool:
        """Whether clients own more than one distinct key set."""
        return len(set(self.group_keys().values())) > 1

    def keys_of(self, client_id: int) -> frozenset[str] | None:
        """Client ``client_id``'s keys (``None``: the whole model)."""
        return None if self.client_keys is None else self.client_keys[client_id].keys

    def payloads(
        self,
        client_ids: Sequence[int],
        make: Callable[[frozenset[str] | None], Payload],
    ) -> dict[int, Payload]:
        """``{cid: make(keys_of(cid))}``, one Payload object per distinct key set."""
        cache: dict[frozenset[str] | None, Payload] = {}
        out = {}
        for cid in client_ids:
            keys = self.keys_of(cid)
            if keys not in cache:
                cache[keys] = make(keys)
            out[cid] = cache[keys]
        return out

    def initial_states_needed(self, clients_per_round: int) -> int:
        """How many independently initialised states the aggregator wants besides ``initial``
        (e.g. FedCross's K middleware models with ``independent_init``); 0: none. The loop then
        calls :meth:`set_initial_states` after :meth:`setup` with that many fresh initialisations of
        the model (:func:`fedlightning.loop.initial_states.independent_states`)."""
        return 0

    def set_initial_states(self, states: Sequence[StateDict]) -> None:
        """Receive the states asked for by :meth:`initial_states_needed`."""
        raise NotImplementedError(f"{type(self).__name__} asks for no initial states")

    def check_byzantine(self, per_round: int, byzantine: int) -> None:  # noqa: B027 (optional)
        """Start-up hands the aggregator the run's clients per round ``per_round`` (n) and the most
        malicious clients any round of the run holds, ``byzantine`` (f, from ``loop.attack``; 0
        without one): raise a ConfigurationError naming the option when f is beyond the rule's
        breakdown point (docs/algorithms.md section 8, "Breakdown points"). Nothing by default: a
        mean has no breakdown point, it is the baseline an attack breaks."""

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        """Each round of a run with an attack, before aggregating: raise a ConfigurationError
        when the round's ``byzantine`` malicious among its ``uploads`` uploads are beyond the
        rule's breakdown point (the round then fails instead of aggregating). By default
        :meth:`check_byzantine`'s test; a rule whose :meth:`check_byzantine` adopts the run's f
        (Krum) overrides this to test the round against the f it adopted."""
        self.check_byzantine(uploads, byzantine)

    def round_metrics(self) -> dict[str, float]:
        """Server-side statistics of the last aggregated round, added to the loop's metrics row
        (e.g. InCo's theta/beta); none by default."""
        return {}

    @abstractmethod
    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        """The payload for each sampled client of round ``round_index`` (0-based): the
        sub-state_dict of the client's own keys and the algorithm's extras."""

    @abstractmethod
    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        """Fold the round's successful uploads (in sampling order) into the server state."""

    @abstractmethod
    def global_state(self) -> StateDict:
        """The deployable global model's state_dict (saved as ``global.pt``)."""

    def deployable_of(self, client_id: int) -> str | None:
        """The name, among :meth:`deployables`, of the model client ``client_id`` would deploy
        when it is not the one its architecture group downloads (clustered FL: its cluster's,
        ``cluster_<j>``); personalized evaluation scores it (docs/algorithms.md section 10.1).
        ``None`` (the default): the group's model, else ``"global"``."""
        return None

    def deployables(self) -> dict[str, StateDict]:
        """Every model the loop should evaluate, by name: ``"global"`` (the deployable one) and,
        when clients are in groups of different keys (architectures), each group's sub-model of
        it, named by the group (the InCo paper's evaluation, logged as ``<group>/test_acc``).
        Clients that all own the same part of the model (a partial-sharing objective's shared
        layers, docs/algorithms.md section 10.2) deploy the whole of it: no sub-model."""
        out = {"global": self.global_state()}
        heterogeneous = self.is_heterogeneous()
        for group, keys in self.group_keys().items():
            if not heterogeneous and keys != frozenset(out["global"]):
                continue  # every client owns the same part (partial sharing): it deploys the whole
            out.setdefault(group, restrict(out["global"], keys))
        return out
