"""Krum and Multi-Krum as statistics: Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning
with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017, arXiv:1703.02757 (section
4). docs/algorithms.md section 8.2."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict
from fedlightning.server.breakdown import require_krum
from fedlightning.server.functional import clamp_running_var, weighted_average
from fedlightning.server.robust_maths import (
    flat_floats,
    krum_neighbours,
    krum_scores,
    krum_select,
    pairwise_sq_distances,
)
from fedlightning.server.statistics.base import Statistic, StatisticContext

log = logging.getLogger(__name__)
STATISTIC = "loop.aggregator.init_args.statistic.init_args"


def check_krum_options(path: str, byzantine: int | None, selected: int | None) -> None:
    """Refuse Krum's options in one line naming the option under ``path``."""
    require(byzantine is None or byzantine >= 0, f"{path}.byzantine", byzantine,
            "null or an integer >= 0")  # fmt: skip
    require(selected is None or selected >= 1, f"{path}.selected", selected,
            "null or an integer >= 1")  # fmt: skip


class MultiKrum(Statistic):
    """Multi-Krum: the mean of the ``m`` uploads with the lowest Krum scores.

    Each upload ``w_i`` (its floating entries as one vector) scores
    ``s(i) = sum_{i -> j} ||w_i - w_j||^2`` over its ``n - f - 2`` nearest other uploads; the
    ``m`` lowest scores (ties in sampling order) are averaged, ``m = n - f`` by default, with the
    aggregator's client weights: uniformly under ``weighting: uniform`` (the paper's), by ``n_i``
    under ``weighting: samples`` (Flower's ``aggregate_krum``). Krum is ``m = 1``. Distances
    between whole uploads need every client to own the same keys.

    ``f`` is ``byzantine``, or (``None``) the most malicious clients a round of the run can hold
    under ``loop.attack`` (0 without one), handed over at start-up (:meth:`check_byzantine`), which
    refuses ``n <= 2f + 2`` (Proposition 1) and an explicit ``byzantine`` below the attack's f.
    Under an attack, a round left with ``n <= 2f + 2`` uploads (failed clients, Poisson sampling)
    fails instead of aggregating (:meth:`check_round_byzantine`, which the loop calls through the
    aggregator); without one (an explicit ``byzantine``), it is scored with ``max(n - f - 2, 1)``
    neighbours and a warning.

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
        selected: m, the uploads averaged; ``null``: ``n - f``.
    """

    def __init__(self, byzantine: int | None = None, selected: int | None = None) -> None:
        check_krum_options(STATISTIC, byzantine, selected)
        self.byzantine = byzantine
        self.selected = selected
        #: f of the run's attack, handed over at start-up
        self.attack_byzantine = 0

    @property
    def assumed_byzantine(self) -> int:
        """f: ``byzantine``, else the run's attack's."""
        return self.byzantine if self.byzantine is not None else self.attack_byzantine

    def selection_size(self, num_uploads: int) -> int:
        """m for a round of ``num_uploads`` uploads: ``selected`` or ``n - f``, within [1, n]."""
        wanted = (
            self.selected if self.selected is not None else num_uploads - self.assumed_byzantine
        )
        return min(max(wanted, 1), num_uploads)

    def check_byzantine(self, per_round: int, byzantine: int) -> None:
        if self.byzantine is not None and byzantine > self.byzantine:
            raise ConfigurationError(
                f"{self.options_path}.byzantine={self.byzantine}, but the attack of loop.attack "
                f"puts up to {byzantine} malicious clients in a round of this run: {self.option} "
                f"must assume f >= {byzantine} (null adopts the attack's)"
            )
        self.attack_byzantine = byzantine
        self.check_round_byzantine(per_round, byzantine)

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        """A round of ``uploads`` uploads, ``byzantine`` of them malicious (at most the f
        :meth:`check_byzantine` adopted, the most a round can hold): Krum scores with that f, so
        it needs ``n > 2f + 2`` and ``selected <= n - f`` for it, whatever this round holds."""
        f = self.assumed_byzantine
        if f:  # f is Krum's own option when set, else the attack's
            assumed = f"{self.options_path}.byzantine" if self.byzantine is not None else None
            require_krum(self.option, uploads, f, assumed)
        if self.selected is not None and self.selected > uploads - f:
            raise ConfigurationError(
                f"{self.options_path}.selected={self.selected} exceeds n - f = {uploads} - "
                f"{f}: {self.option} would have to average malicious uploads"
            )

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        n, f = len(uploads), self.assumed_byzantine
        if f and n <= 2 * f + 2:
            log.warning(
                "%s: %d upload(s) this round, not more than 2f + 2 = %d for f=%d: the robustness "
                "guarantee does not hold for this round", self.option, n, 2 * f + 2, f,
            )  # fmt: skip
        scores = krum_scores(pairwise_sq_distances(flat_floats(uploads)), krum_neighbours(n, f))
        chosen = krum_select(scores, self.selection_size(n))
        selection = [uploads[i] for i in chosen]
        return clamp_running_var(weighted_average(selection, [weights[i] for i in chosen]))


class Krum(MultiKrum):
    """Krum: the upload with the lowest Krum score (:class:`MultiKrum` with ``m = 1``), its
    BatchNorm statistics and counters included.

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
    """

    def __init__(self, byzantine: int | None = None) -> None:
        super().__init__(byzantine=byzantine, selected=1)
