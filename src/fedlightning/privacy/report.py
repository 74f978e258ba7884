"""What a run reports of the privacy it spent (docs/algorithms.md section 7.3): the client-level
(epsilon, delta) of an aggregator over the DP release (:class:`~fedlightning.privacy.ClientLevelDP`,
or any with a :class:`~fedlightning.privacy.NoisedMean` statistic) and the per-client epsilons of
DP-SGD clients, as metrics columns and lines of the run summary. The round component that keeps
the epsilons and calls these is :class:`fedlightning.loop.components.PrivacyReport`."""

from __future__ import annotations

from collections.abc import Mapping

from fedlightning.privacy.accountant import LIBRARY
from fedlightning.privacy.dp_statistic import private_release
from fedlightning.server.base import Aggregator


def dp_sgd_metrics(
    epsilons: Mapping[int, float], delta: float, num_clients: int
) -> dict[str, float]:
    """``dp_sgd_epsilon_max``/``_mean`` over all ``num_clients`` clients, from the ``epsilons`` of
    the clients that trained (one that never trained spent 0), and ``dp_sgd_delta``."""
    values = list(epsilons.values())
    return {
        "dp_sgd_epsilon_max": max(values, default=0.0),
        "dp_sgd_epsilon_mean": sum(values) / num_clients,
        "dp_sgd_delta": delta,
    }


def privacy_lines(
    aggregator: Aggregator | None, dp_sgd: Mapping[str, object] | None,
    epsilons: Mapping[int, float], num_clients: int,
) -> list[str]:  # fmt: skip
    """The run summary's privacy lines: the DP release's (if the aggregator has one) and the
    DP-SGD clients' epsilons (``dp_sgd``: ``loop.dp_sgd``'s settings, or ``None``)."""
    release = private_release(aggregator)
    lines = [release.summary_line()] if release is not None else []
    if dp_sgd is not None:
        delta, accountant = float(dp_sgd["delta"]), str(dp_sgd["accountant"])
        row = dp_sgd_metrics(epsilons, delta, num_clients)
        most, mean = row["dp_sgd_epsilon_max"], row["dp_sgd_epsilon_mean"]
        lines.append(
            f"privacy: sample-level DP-SGD, per-client epsilon max {most:.4g}, mean "
            f"{mean:.4g} over {num_clients} client(s) "
            f"({len(epsilons)} trained), delta={delta:g}, {accountant} "
            f"accountant ({LIBRARY[accountant]})"
        )
    return lines
