"""An aggregator around an inner one (InCo, client-level DP): what the loop reads of it is the
inner's (docs/algorithms.md sections 2.4 and 7.1)."""

from __future__ import annotations

from collections.abc import Sequence

from fedlightning.protocol import Payload, StateDict
from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg


class WrappingAggregator(Aggregator):
    """Base of an aggregator that changes how an inner one aggregates: its payloads, required
    extras, weighting and models are the inner's (``self.inner``, a FedAvg subclass); the loop
    reads them from the instance. The inner's state is part of the wrapper's (under ``inner``,
    :meth:`~fedlightning.server.server_state.ServerState.children`), and the pairing rules see
    through the wrapper (:mod:`fedlightning.loop.pairing`). A subclass sets ``self.inner``, sets
    the inner up in ``on_setup``, writes ``aggregate`` and declares its own state."""

    inner: FedAvg

    @property
    def payload_extras(self) -> frozenset[str]:  # type: ignore[override]
        return self.inner.payload_extras

    @property
    def required_upload_extras(self) -> frozenset[str]:  # type: ignore[override]
        return self.inner.required_upload_extras

    @property
    def weighting(self) -> str:
        return self.inner.weighting

    @property
    def releases_every_round(self) -> bool:  # type: ignore[override]
        return self.inner.releases_every_round

    def configure_round(self, round_index: int, client_ids: Sequence[int]) -> dict[int, Payload]:
        return self.inner.configure_round(round_index, client_ids)

    def global_state(self) -> StateDict:
        return self.inner.global_state()

    def deployables(self) -> dict[str, StateDict]:
        return self.inner.deployables()

    def deployable_of(self, client_id: int) -> str | None:
        return self.inner.deployable_of(client_id)

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        self.inner.check_byzantine(per_round, byzantine)

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        self.inner.check_round_byzantine(uploads, byzantine)
