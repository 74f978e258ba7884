"""Which aggregators client-level DP can serve, and what their server update may read under it
(docs/algorithms.md section 7.1, "Which aggregators qualify"). The rules read the aggregator's
statistic (:mod:`fedlightning.server.statistics`) and its server update, not a list of classes
but the built-ins whose update reads the uploads."""

from __future__ import annotations

from typing import Any

from fedlightning.server import FedAvg, FedDyn, FedNova, Scaffold
from fedlightning.server.base import Aggregator

OPTION = "loop.aggregator.init_args."
#: built-in FedAvg subclasses whose server update reads every upload, not only the mean
READS_UPLOADS: dict[type, str] = {
    FedNova: "its server update normalises each upload by the client's own a_i",
    Scaffold: "its server update adds every client's delta_c to c, un-noised",
    FedDyn: "its server update scales h's step by how many sampled clients uploaded each key, "
    "which the noised mean does not release",
}
#: FedAvg methods the private release depends on: a subclass overriding one is refused
REPLACED = ("client_weights", "aggregate")


def server_update_refusal(aggregator: Any) -> str | None:
    """Why the DP release cannot serve ``aggregator`` (``None``: it can): it must be built on
    FedAvg's template, weight clients uniformly (the clipping bounds each client's update, not
    its n_i), and its server update must read only the release (FedAvg, FedAvgM, FedAdam;
    ``within_groups`` too). A server update that reads the uploads anyway fails loudly at the
    first round (:class:`~fedlightning.server.round.Withheld`)."""
    name = type(aggregator).__name__
    if not isinstance(aggregator, FedAvg):
        return (
            f"{name} is not built on FedAvg's statistic and server update: FedCross mixes "
            "individual uploads, InCo post-processes by the keys the sampled clients uploaded"
        )
    for kind, why in READS_UPLOADS.items():
        if isinstance(aggregator, kind):
            return f"{name} cannot: {why}; a DP round releases only the noised mean"
    for method in REPLACED:
        if getattr(type(aggregator), method) is not getattr(FedAvg, method):
            return f"{name} overrides FedAvg.{method}, which the private release depends on"
    if aggregator.weighting != "uniform":
        return (
            f"weighting={aggregator.weighting!r} weights a client by n_i, which the clipping "
            "does not bound: use 'uniform' (each clipped update counts once)"
        )
    return None


def inner_refusal(inner: Aggregator) -> str | None:
    """Why ``inner`` cannot run under :class:`~fedlightning.privacy.ClientLevelDP` (``None``: it
    can): its statistic must be the plain weighted mean (``weighted_mean``: the release takes
    its place; a robust rule or a clipped mean reads each upload, and ClientLevelDP clips
    itself), and :func:`server_update_refusal` must accept it."""
    if isinstance(inner, FedAvg) and not inner.statistic.weighted_mean:
        statistic = inner.statistic
        option = statistic.option
        return (
            f"{type(inner).__name__} combines the uploads by {type(statistic).__name__} "
            f"({option}), a statistic over the individual uploads, not the plain mean the DP "
            "release replaces; ClientLevelDP's own clip_norm bounds each client's influence: "
            "use the mean (aggregation: mean, clip_norm: null, no statistic)"
        )
    refusal = server_update_refusal(inner)
    if refusal is not None and refusal.startswith("weighting="):
        return OPTION + "inner.init_args." + refusal
    return refusal
