"""The Aggregator contract: server state, per-client payloads, folding uploads back in.

Aggregators are plain torch on state_dicts: they never import Lightning and can be tested with
hand-made tensors. One round, as the loop drives it::

    payloads = aggregator.configure_round(round, client_ids)    # {client_id: Payload}
    uploads  = [train(client_id, payloads[client_id]) ...]      # by the client objectives
    aggregator.aggregate(round, uploads)                        # new server state
    aggregator.deployables()                                    # {"global": state_dict, ...}

Everything a resumed run needs is returned by :meth:`Aggregator.state_dict`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from fedlightning.protocol import Payload, StateDict, Upload


class ClientKeys(NamedTuple):
    """What one client trains when clients own different architectures: its group's name (e.g.
    ``"resnet10"``) and the state_dict keys of that architecture (a subset of the server's)."""

    group: str
    keys: frozenset[str]


class Aggregator(ABC):
    """Base class of all server aggregators.

    Subclasses declare what they put in payload extras (``payload_extras``) and what they need in
    upload extras (``required_upload_extras``), so the loop can refuse a client objective that
    does not fit before training starts.
    """

    payload_extras: ClassVar[frozenset[str]] = frozenset()
    required_upload_extras: ClassVar[frozenset[str]] = frozenset()
    #: whether :meth:`setup` takes ``client_keys`` (clients owning different sub-state_dicts)
    heterogeneous: ClassVar[bool] = False

    def __init__(self) -> None:
        self.num_clients = 0
        self.seed = 0
        self.client_keys: list[ClientKeys] | None = None

    def setup(
        self,
        initial: StateDict,
        num_clients: int,
        seed: int = 0,
        client_keys: Sequence[ClientKeys] | None = None,
    ) -> None:
        """Initialise the server state from the template model's state_dict ``initial``.

        ``seed`` is the run's seed: an aggregator that needs randomness (e.g. FedCross's shuffle of
        the sampled clients) derives it from ``(seed, round)`` with
        :func:`fedlightning.seeding.derive_seed`, never from the global RNG.

        ``client_keys`` (only passed to ``heterogeneous`` aggregators, from the client objective's
        :meth:`~fedlightning.clients.ClientModule.client_key_sets`) gives each client's group and
        keys; ``None`` means every client trains the whole ``initial`` model.
        """
        self.num_clients = num_clients
        self.seed = seed
        self.client_keys = None if client_keys is None else list(client_keys)

    @abstractmethod
    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        """The payload for each sampled client of round ``round_index`` (0-based)."""

    @abstractmethod
    def aggregate(self, round_index: int, uploads: Sequence[Upload]) -> None:
        """Fold the round's successful uploads (in sampling order) into the server state."""

    @abstractmethod
    def global_state(self) -> StateDict:
        """The deployable global model's state_dict (saved as ``global.pt``)."""

    def deployables(self) -> dict[str, StateDict]:
        """Every model the loop should evaluate, by name; ``"global"`` is the deployable one."""
        return {"global": self.global_state()}

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """All server state, for checkpoints."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""
