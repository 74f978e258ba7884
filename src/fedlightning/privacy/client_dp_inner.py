"""Which aggregators client-level DP can wrap, and what their server update may not read under it
(docs/algorithms.md section 7.1, "Which aggregators qualify")."""

from __future__ import annotations

from typing import Any, NoReturn

from fedlightning.errors import ConfigurationError
from fedlightning.server import FedAvg, FedNova, Scaffold
from fedlightning.server.base import Aggregator

OPTION = "loop.aggregator.init_args."
#: built-in FedAvg subclasses whose server update reads every upload, not only the mean
READS_UPLOADS: dict[type, str] = {
    FedNova: "its server update normalises each upload by the client's own a_i",
    Scaffold: "its server update adds every client's delta_c to c, un-noised",
}
#: FedAvg methods the private release takes the place of: a subclass overriding one is refused
REPLACED = ("average", "client_weights", "aggregate")


def inner_refusal(inner: Aggregator) -> str | None:
    """Why ``inner`` cannot run under client-level DP (``None``: it can). It must combine the
    uploads by the owner-aware mean and then read only that mean: FedAvg, FedAvgM and FedAdam
    (``within_groups`` too), with ``weighting='uniform'``, ``aggregation='mean'`` and no
    ``clip_norm`` of its own."""
    name = type(inner).__name__
    inner_option = OPTION + "inner.init_args."
    if not isinstance(inner, FedAvg):
        return (
            f"{name} is not built on the owner-aware mean (a FedAvg subclass): FedCross mixes "
            "individual uploads, InCo post-processes by the keys the sampled clients uploaded"
        )
    if getattr(inner, "needs_individual_uploads", False):
        return (
            f"{name} is a Byzantine-robust rule over the individual uploads (docs/algorithms.md "
            "section 8), and a DP round releases only the noised mean of clipped updates; "
            "ClientLevelDP's clip_norm already bounds each client's influence"
        )
    for kind, why in READS_UPLOADS.items():
        if isinstance(inner, kind):
            return f"{name} cannot: {why}; a DP round releases only the noised mean"
    for method in REPLACED:
        if getattr(type(inner), method) is not getattr(FedAvg, method):
            return f"{name} overrides FedAvg.{method}, which the private mean replaces"
    if inner.aggregation != "mean":
        return (
            f"{inner_option}aggregation={inner.aggregation!r} is a robust statistic of individual "
            "uploads, not a sum one client changes by at most the clipping norm: use 'mean'"
        )
    if inner.clip_norm is not None:
        return f"{inner_option}clip_norm must be null: ClientLevelDP clips (its own clip_norm)"
    if inner.weighting != "uniform":
        return (
            f"{inner_option}weighting={inner.weighting!r} weights a client by n_i, which the "
            "clipping does not bound: use 'uniform' (each clipped update counts once)"
        )
    return None


class Withheld:
    """What a server update under client-level DP may not read (``server_round.uploads`` and
    ``.owners``): any access raises a ConfigurationError naming the aggregator."""

    def __init__(self, aggregator: str) -> None:
        self.aggregator = aggregator

    def _refuse(self, *_: Any) -> NoReturn:
        raise ConfigurationError(
            f"{self.aggregator}.server_update reads the round's individual uploads (or their "
            "owner counts), which ClientLevelDP withholds: a DP round releases only the noised "
            "mean (docs/algorithms.md section 7.1); use an aggregator whose server update reads "
            "only server_round.mean"
        )

    __getitem__ = __iter__ = __len__ = __contains__ = get = keys = values = items = _refuse
