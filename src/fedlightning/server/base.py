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
from typing import Any, ClassVar

from fedlightning.protocol import Payload, StateDict, Upload


class Aggregator(ABC):
    """Base class of all server aggregators.

    Subclasses declare what they put in payload extras (``payload_extras``) and what they need in
    upload extras (``required_upload_extras``), so the loop can refuse a client objective that
    does not fit before training starts.
    """

    payload_extras: ClassVar[frozenset[str]] = frozenset()
    required_upload_extras: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self.num_clients = 0
        self.seed = 0

    def setup(self, initial: StateDict, num_clients: int, seed: int = 0) -> None:
        """Initialise the server state from the template model's state_dict ``initial``.

        ``seed`` is the run's seed: an aggregator that needs randomness (e.g. FedCross's shuffle of
        the sampled clients) derives it from ``(seed, round)`` with
        :func:`fedlightning.seeding.derive_seed`, never from the global RNG.
        """
        self.num_clients = num_clients
        self.seed = seed

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
