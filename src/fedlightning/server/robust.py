"""The base of the Byzantine-robust aggregators (docs/algorithms.md section 8): FedAvg's payloads,
state and aggregation template (:class:`~fedlightning.server.fedavg.FedAvg`), with the mean of
the uploads replaced by a robust combination in :meth:`FedAvg.average`."""

from __future__ import annotations

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import StateDict
from fedlightning.server.breakdown import require_honest_majority
from fedlightning.server.fedavg import FedAvg


class RobustAggregator(FedAvg):
    """FedAvg whose :meth:`average` is a robust rule over the individual uploads.

    The rule covers every floating entry of an upload, BatchNorm running statistics included (an
    attacker controls the whole upload: a mean of the statistics would let it through); BatchNorm
    ``running_var`` is clamped to ``>= 0`` afterwards, integer buffers come from one upload.
    Buffers take the rule's result, as FedAvg's buffers take its mean (docs/algorithms.md section
    8, "BatchNorm buffers").

    Class attributes:
        needs_individual_uploads: the rule reads each client's upload, not only their sum, so it
            cannot run under secure aggregation (Flower's SecAgg+ refuses it at start-up).
        owner_aware: the rule serves clients that own different keys (docs/algorithms.md section
            2.3); rules that compare whole uploads refuse them in :meth:`on_setup`.
    """

    needs_individual_uploads: bool = True
    owner_aware: bool = False

    def on_setup(self, initial: StateDict) -> None:
        if not self.owner_aware and self.is_heterogeneous():
            name = type(self).__name__
            raise ConfigurationError(
                f"loop.aggregator={name} compares whole uploads (one point per client), which "
                "needs clients that own the same keys, but these client groups own different "
                "keys: use an owner-aware rule (CenteredClipping, NormBound) or one network"
            )

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        """An honest majority, ``2 f < n`` (docs/algorithms.md section 8, "Breakdown points")."""
        if byzantine:
            require_honest_majority(type(self).__name__, per_round, byzantine)
