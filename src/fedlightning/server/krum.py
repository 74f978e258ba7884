"""Krum and Multi-Krum: Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017, arXiv:1703.02757 (section 4).
docs/algorithms.md section 8.2."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict, Upload
from fedlightning.server.breakdown import require_krum
from fedlightning.server.functional import clamp_running_var, uniform_average
from fedlightning.server.robust import RobustAggregator
from fedlightning.server.robust_maths import (
    flat_floats,
    krum_neighbours,
    krum_scores,
    krum_select,
    pairwise_sq_distances,
)

log = logging.getLogger("fedlightning")


class MultiKrum(RobustAggregator):
    """Multi-Krum: the uniform mean of the ``m`` uploads with the lowest Krum scores.

    Each upload ``w_i`` (its floating entries as one vector) scores
    ``s(i) = sum_{i -> j} ||w_i - w_j||^2`` over its ``n - f - 2`` nearest other uploads; the
    ``m`` lowest scores (ties in sampling order) are averaged, ``m = n - f`` by default. Krum is
    ``m = 1``: the upload with the lowest score becomes the model. Distances between whole
    uploads need every client to own the same keys: heterogeneous clients are refused.

    ``f`` is ``byzantine``, or (``None``) the most malicious clients a round of the run can
    hold under ``loop.attack`` (0 without one), which start-up hands over
    (:meth:`check_byzantine`); start-up refuses ``n <= 2f + 2`` (Proposition 1) and an explicit
    ``byzantine`` below the attack's f. Under an attack, a round left with ``n <= 2f + 2``
    uploads (failed clients, Poisson sampling) fails instead of aggregating
    (:meth:`check_round_byzantine`); without one (an explicit ``byzantine``), it is scored with
    ``max(n - f - 2, 1)`` neighbours and a warning.

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
        selected: m, the uploads averaged; ``null``: ``n - f``.
    """

    def __init__(self, byzantine: int | None = None, selected: int | None = None) -> None:
        require(byzantine is None or byzantine >= 0, "loop.aggregator.init_args.byzantine",
                byzantine, "null or an integer >= 0")  # fmt: skip
        require(selected is None or selected >= 1, "loop.aggregator.init_args.selected",
                selected, "null or an integer >= 1")  # fmt: skip
        super().__init__(weighting="uniform")
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
        name = type(self).__name__
        if self.byzantine is not None and byzantine > self.byzantine:
            raise ConfigurationError(
                f"loop.aggregator.init_args.byzantine={self.byzantine}, but the attack of "
                f"loop.attack puts up to {byzantine} malicious clients in a round of this run: "
                f"{name} must assume f >= {byzantine} (null adopts the attack's)"
            )
        self.attack_byzantine = byzantine
        self.check_round_byzantine(per_round, byzantine)

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        """A round of ``uploads`` uploads, ``byzantine`` of them malicious (at most the f
        :meth:`check_byzantine` adopted, the most a round can hold): Krum scores with that f, so
        it needs ``n > 2f + 2`` and ``selected <= n - f`` for it, whatever this round holds."""
        f = self.assumed_byzantine
        if f:
            require_krum(type(self).__name__, uploads, f)
        if self.selected is not None and self.selected > uploads - f:
            raise ConfigurationError(
                f"loop.aggregator.init_args.selected={self.selected} exceeds n - f = "
                f"{uploads} - {f}: {type(self).__name__} would have to average malicious uploads"
            )

    def average(self, uploads: Sequence[Upload]) -> StateDict:
        states = [u.weights for u in uploads]
        n, f = len(states), self.assumed_byzantine
        if f and n <= 2 * f + 2:
            log.warning(
                "%s: %d upload(s) this round, not more than 2f + 2 = %d for f=%d: the robustness "
                "guarantee does not hold for this round", type(self).__name__, n, 2 * f + 2, f,
            )  # fmt: skip
        scores = krum_scores(pairwise_sq_distances(flat_floats(states)), krum_neighbours(n, f))
        chosen = krum_select(scores, self.selection_size(n))
        return clamp_running_var(uniform_average([states[i] for i in chosen]))


class Krum(MultiKrum):
    """Krum: the upload with the lowest Krum score becomes the model (:class:`MultiKrum` with
    ``m = 1``), its BatchNorm statistics and counters included.

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
    """

    def __init__(self, byzantine: int | None = None) -> None:
        super().__init__(byzantine=byzantine, selected=1)
