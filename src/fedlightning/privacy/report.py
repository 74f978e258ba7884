"""What a run reports of the privacy it spent (docs/algorithms.md section 7.3): the client-level
(epsilon, delta) of an aggregator over the DP release (:class:`~fedlightning.privacy.ClientLevelDP`,
or any with a :class:`~fedlightning.privacy.NoisedMean` statistic) and the per-client epsilons of
DP-SGD clients, as metrics columns and lines of the run summary. A round component
(docs/algorithms.md section 6.2): it reads each round's kept results and adds its columns to each
evaluated row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedlightning.privacy.accountant import LIBRARY
from fedlightning.privacy.dp_sgd import DPSGD, EPSILON_METRIC
from fedlightning.privacy.dp_statistic import private_release
from fedlightning.protocol import FitResult
from fedlightning.round_components import Round, RoundComponent, Row
from fedlightning.server.base import Aggregator


class PrivacyReport(RoundComponent):
    """The per-client DP-SGD epsilons of a run (from each stored fit result's upload metric
    ``dp_sgd_epsilon``: the client's own accountant after its last fit), and the summary lines.

    Args:
        dp_sgd: the DP-SGD clients' options (``None``: the run has no DP-SGD clients).
        aggregator: the run's aggregator (one over the DP release has a summary line).
        num_clients: the run's number of clients.
    """

    name = "privacy"

    def __init__(
        self,
        dp_sgd: DPSGD | None = None,
        aggregator: Aggregator | None = None,
        num_clients: int = 1,
    ) -> None:
        self.delta = dp_sgd.delta if dp_sgd is not None else None
        self.accountant = dp_sgd.accountant if dp_sgd is not None else None
        self.epsilons: dict[int, float] = {}
        self.aggregator = aggregator
        self.num_clients = num_clients

    def on_results(self, round: Round) -> None:
        self.update(round.kept)

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        return {**row, **self.metrics(self.num_clients)}

    def summary_lines(self) -> list[str]:
        return self.lines(self.aggregator, self.num_clients)

    def update(self, results: Sequence[tuple[int, FitResult]]) -> None:
        """Take the round's results whose state the ClientStore keeps."""
        for client_id, result in results:
            epsilon = result.upload.metrics.get(EPSILON_METRIC)
            if epsilon is not None:
                self.epsilons[client_id] = float(epsilon)

    def metrics(self, num_clients: int) -> dict[str, float]:
        """``dp_sgd_epsilon_max``/``_mean`` over all ``num_clients`` clients (one that never
        trained spent 0) and ``dp_sgd_delta``; nothing without DP-SGD clients."""
        if self.delta is None:
            return {}
        values = list(self.epsilons.values())
        return {
            "dp_sgd_epsilon_max": max(values, default=0.0),
            "dp_sgd_epsilon_mean": sum(values) / num_clients,
            "dp_sgd_delta": self.delta,
        }

    def lines(self, aggregator: Aggregator | None, num_clients: int) -> list[str]:
        """The run summary's privacy lines (none for a run without differential privacy)."""
        release = private_release(aggregator)
        lines = [release.summary_line()] if release is not None else []
        if self.delta is not None:
            row = self.metrics(num_clients)
            most, mean = row["dp_sgd_epsilon_max"], row["dp_sgd_epsilon_mean"]
            lines.append(
                f"privacy: sample-level DP-SGD, per-client epsilon max {most:.4g}, mean "
                f"{mean:.4g} over {num_clients} client(s) "
                f"({len(self.epsilons)} trained), delta={self.delta:g}, {self.accountant} "
                f"accountant ({LIBRARY[self.accountant]})"
            )
        return lines

    def state_dict(self) -> dict[str, Any]:
        return {"epsilons": [[cid, eps] for cid, eps in sorted(self.epsilons.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epsilons = {int(cid): float(eps) for cid, eps in state.get("epsilons", [])}
