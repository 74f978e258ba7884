"""The privacy report as a round component (docs/algorithms.md sections 6.2 and 7.3): the
per-client DP-SGD epsilons of a run (``loop.dp_sgd``: each stored fit result's upload metric
``dp_sgd_epsilon``, the client's own accountant after its last fit), their columns in every
evaluated row, and the summary lines, with the DP release's (:mod:`fedlightning.privacy.report`).
Always on: a run without differential privacy adds no column and no line. DP-SGD itself is how
every client fit runs, so ``loop.dp_sgd`` is an option of the fit (the fit config), which this
report reads."""

from __future__ import annotations

from typing import Any

from fedlightning.privacy.dp_sgd import EPSILON_METRIC
from fedlightning.privacy.report import dp_sgd_metrics, privacy_lines
from fedlightning.round_components import Round, RoundComponent, Row


class PrivacyReport(RoundComponent):
    """DP-SGD clients' epsilons and the run's privacy lines (see the module docstring).

    State: ``epsilons``, ``[client, epsilon]`` pairs by client (the latest of each client).
    """

    name = "privacy"

    def __init__(self) -> None:
        self.add_state("epsilons", [])

    def setup(self, run: Any) -> None:
        self.run = run

    @property
    def by_client(self) -> dict[int, float]:
        return {int(cid): float(eps) for cid, eps in self.epsilons}

    def on_results(self, round: Round) -> None:
        table = self.by_client
        for client_id, result in round.kept:
            epsilon = result.upload.metrics.get(EPSILON_METRIC)
            if epsilon is not None:
                table[client_id] = float(epsilon)
        self.epsilons = [[cid, eps] for cid, eps in sorted(table.items())]

    def on_evaluated(self, round: Round, row: Row) -> Row | None:
        dp_sgd = self.run.fit_config.dp_sgd
        if dp_sgd is None:
            return row
        return {**row, **dp_sgd_metrics(self.by_client, dp_sgd["delta"], self.run.num_clients)}

    def summary_lines(self) -> list[str]:
        run = self.run
        return privacy_lines(run.aggregator, run.fit_config.dp_sgd, self.by_client, run.num_clients)
