"""What the Flower backend checks before a run under secure aggregation (SecAgg+) starts: the
protocol's options, the number of SuperNodes they must fit, and the aggregator, which must be able
to work from the sum SecAgg+ delivers (:mod:`fedlightning.flower_app.secure`;
docs/algorithms.md section 2.7). Every refusal is a ConfigurationError naming the option, the
value and what is allowed, raised before anything is written.
"""

from __future__ import annotations

import math
from typing import Any

from fedlightning.errors import ConfigurationError, require
from fedlightning.recorded_args import recorded_init_args
from fedlightning.server import FedAdam, FedAvg, FedAvgM
from fedlightning.server.base import Aggregator
from fedlightning.server.inco import InCo

PREFIX = "loop.backend.init_args."
#: the SecAgg+ options and their defaults (Flower's, but for the shares: every node holds a share
#: of every other's secrets, a strict majority of them reconstructs one)
DEFAULTS = {
    "num_shares": 1.0,
    "reconstruction_threshold": 0.75,
    "clipping_range": 8.0,
    "quantization_range": 2**22,
    "modulus_range": 2**32,
}
#: aggregators whose server update reads only the statistic's result, with the options they may
#: have (exact classes: a subclass may read individual uploads); their statistic must be a plain
#: weighted mean (its ``weighted_mean``), which SecAgg+'s sum gives
ON_SUMS = {
    FedAvg: {"weighting", "within_groups", "trim_beta", "statistic"},
    FedAvgM: {"weighting", "within_groups", "trim_beta", "statistic", "server_lr",
              "server_momentum"},
    FedAdam: {"weighting", "within_groups", "trim_beta", "statistic", "server_lr", "beta1",
              "beta2", "tau"},
}  # fmt: skip
#: FedAvg's shorthands for a statistic: what they make is checked as the statistic
SHORTHANDS = ("aggregation", "clip_norm")
#: why the other built-in aggregators cannot run on sums
WHY_NOT = {
    "FedCross": "its cross-aggregation pairs each client's own upload with another's",
    "Scaffold": "its clients keep c_i as per-client state, which the server's ClientStore would "
    "hold in plain and which reveals the client's model (the server's c update itself needs only "
    "the sum of the delta_c)",
    "FedNova": "its normalised step weights each client's update by its own a_i (expressible on "
    "sums of n_i a_i, n_i / a_i and n_i x_i / a_i, which this backend does not send)",
    "ClientLevelDP": "it clips each client's update on the server before the noised sum (the "
    "clipping would have to move into the clients)",
}


def secure_options(enabled: bool, **options: Any) -> dict[str, Any] | None:
    """The checked SecAgg+ options (``None``: secure aggregation off; options other than their
    defaults then are an error, not ignored)."""
    if not enabled:
        changed = [k for k, v in options.items() if v != DEFAULTS[k]]
        require(
            not changed, PREFIX + (changed[0] if changed else ""),
            options.get(changed[0]) if changed else None,
            "its default unless secure_aggregation is true (it is a SecAgg+ option)",
        )  # fmt: skip
        return None
    shares, threshold = options["num_shares"], options["reconstruction_threshold"]
    require(
        _fraction(shares) or (_integer(shares) and shares >= 3), PREFIX + "num_shares", shares,
        "an integer >= 3 (shares per node) or a fraction in (0, 1] of the nodes",
    )  # fmt: skip
    require(
        _fraction(threshold) or (_integer(threshold) and threshold >= 2),
        PREFIX + "reconstruction_threshold", threshold,
        "an integer >= 2 or a fraction in (0, 1] of num_shares",
    )  # fmt: skip
    if _integer(shares) and _integer(threshold):
        require(
            threshold < shares, PREFIX + "reconstruction_threshold", threshold,
            f"an integer below num_shares={shares}",
        )  # fmt: skip
    clipping = options["clipping_range"]
    require(
        isinstance(clipping, (int, float)) and math.isfinite(clipping) and clipping > 0,
        PREFIX + "clipping_range", clipping, "a finite number > 0",
    )  # fmt: skip
    target, modulus = options["quantization_range"], options["modulus_range"]
    require(
        _integer(target) and 2 <= target < 2**31, PREFIX + "quantization_range", target,
        "an integer in [2, 2**31) (Flower quantises to int32)",
    )  # fmt: skip
    require(
        _integer(modulus) and modulus & (modulus - 1) == 0 and target < modulus <= 2**32,
        PREFIX + "modulus_range", modulus,
        f"a power of 2 above quantization_range={target} and at most 2**32",
    )  # fmt: skip
    return {**options, "clipping_range": float(clipping)}


def check_nodes(options: dict[str, Any], nodes: int) -> None:
    """Raise unless SecAgg+ with ``options`` works on ``nodes`` SuperNodes (at start): at least
    2, integer shares and threshold within them, and :func:`check_modulus`."""
    if nodes < 2:
        raise ConfigurationError(
            f"{PREFIX}secure_aggregation=true needs at least 2 SuperNodes (SecAgg+ reveals a "
            f"single node's vector), but {nodes} serve this run's clients"
        )
    shares = options["num_shares"]
    if _integer(shares):
        require(shares <= nodes, PREFIX + "num_shares", shares, f"at most the {nodes} SuperNodes")
    threshold = options["reconstruction_threshold"]
    if _integer(threshold):
        share_count = shares if _integer(shares) else max(round(shares * nodes), 2)
        require(
            threshold <= min(share_count, nodes), PREFIX + "reconstruction_threshold", threshold,
            f"at most the {min(share_count, nodes)} shares of each node's secrets",
        )  # fmt: skip
    check_modulus(options, nodes)


def check_modulus(options: dict[str, Any], nodes: int) -> None:
    """Raise unless the sum of ``nodes`` quantised vectors stays below the modulus (else it wraps
    around: a silently wrong sum); checked at start and every round (nodes may join)."""
    target, modulus = options["quantization_range"], options["modulus_range"]
    require(
        nodes * target < modulus, PREFIX + "modulus_range", modulus,
        f"more than {nodes} SuperNodes x quantization_range={target} = {nodes * target} (the "
        "largest sum of quantised vectors), or lower quantization_range",
    )  # fmt: skip


def check_aggregator(aggregator: Aggregator) -> str:
    """Raise unless ``aggregator`` computes its update from the owner-aware weighted mean only
    (FedAvg, FedAvgM, FedAdam over a statistic that is a plain weighted mean, and InCo around
    one of them); its ``weighting``. The statistic is read, not the class: a robust rule or a
    clipped mean, whichever class holds it, is refused."""
    if type(aggregator) is InCo:
        return check_aggregator(aggregator.inner)
    name = type(aggregator).__name__
    statistic = getattr(aggregator, "statistic", None)
    why = WHY_NOT.get(name)
    if why is None and statistic is not None and not statistic.weighted_mean:
        option = statistic.option
        why = (
            f"its statistic {type(statistic).__name__} ({option}) reads each client's upload, "
            "not only their sum (a robust statistic or per-client clipping, docs/algorithms.md "
            "sections 2.8 and 8)"
        )
    if why is None and type(aggregator) not in ON_SUMS:
        why = "it is not known to compute its update from the sum only"
    if why is not None:
        raise ConfigurationError(
            f"{PREFIX}secure_aggregation=true delivers the server only the sum of the uploads, "
            f"and loop.aggregator {name} cannot run on it: {why}. Use FedAvg (mean), FedAvgM, "
            "FedAdam or InCo around one of them"
        )
    args = recorded_init_args(aggregator) or {}
    unknown = sorted(set(args) - ON_SUMS[type(aggregator)] - set(SHORTHANDS))
    if unknown:
        raise ConfigurationError(
            f"loop.aggregator.init_args.{unknown[0]} of {name} is not known to run on the sum "
            "secure aggregation delivers: refused under secure_aggregation=true"
        )
    return aggregator.weighting


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fraction(value: Any) -> bool:
    return isinstance(value, float) and 0 < value <= 1
