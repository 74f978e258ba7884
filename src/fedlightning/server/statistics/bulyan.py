"""Bulyan as a statistic: El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed
Learning in Byzantium", ICML 2018, arXiv:1802.07927 (section 4, Bulyan over Krum).
docs/algorithms.md section 8.8."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from fedlightning.protocol import StateDict
from fedlightning.server.breakdown import require_bulyan
from fedlightning.server.functional import clamp_running_var
from fedlightning.server.robust_maths import (
    flat_floats,
    krum_neighbours,
    krum_scores,
    krum_select,
    pairwise_sq_distances,
)
from fedlightning.server.statistics.base import StatisticContext
from fedlightning.server.statistics.krum import STATISTIC, MultiKrum, check_krum_options
from fedlightning.server.summation import wide

log = logging.getLogger(__name__)


def bulyan_selection(sq_distances: torch.Tensor, byzantine: int, count: int) -> list[int]:
    """Bulyan's first phase: Krum applied ``count`` times (``theta = n - 2f``), each time to the
    uploads not yet chosen (scores over ``|R| - f - 2`` neighbours among them, at least one while
    another is left), the chosen one moved from R to the selection; ties to the earlier upload.

    >>> d = pairwise_sq_distances(torch.tensor([[0.0], [1.0], [2.0], [9.0], [30.0]]).double())
    >>> bulyan_selection(d, byzantine=0, count=3)  # 2 scores 1 + 4 + 49, then 1, then 0 (a tie)
    [2, 1, 0]
    """
    remaining = list(range(len(sq_distances)))
    chosen: list[int] = []
    for _ in range(count):
        if len(remaining) == 1:  # the last one left needs no score
            chosen.append(remaining.pop())
            continue
        rows = torch.tensor(remaining, device=sq_distances.device)
        sub = sq_distances[rows][:, rows]
        scores = krum_scores(sub, krum_neighbours(len(remaining), byzantine))
        chosen.append(remaining.pop(krum_select(scores, 1)[0]))
    return chosen


def closest_to_median_mean(values: torch.Tensor, keep: int) -> torch.Tensor:
    """Bulyan's second phase on a stack ``(theta, ...)``: per coordinate, the mean of the ``keep``
    values (``beta = theta - 2f``) nearest the coordinate-wise median (the mean of the two middle
    values for an even count), ties to the earlier row.

    >>> closest_to_median_mean(torch.tensor([[0.0], [1.0], [2.0], [10.0]]), 2)  # median 1.5
    tensor([1.5000])
    """
    ordered = values.sort(dim=0).values
    count = len(values)
    median = (ordered[(count - 1) // 2] + ordered[count // 2]) / 2
    nearest = (values - median).abs().sort(dim=0, stable=True).indices[:keep]
    return values.gather(0, nearest).mean(dim=0)


class Bulyan(MultiKrum):
    """Bulyan: with ``f`` the malicious uploads a round may hold and ``theta = n - 2f``, Krum
    chooses ``theta`` uploads one after another, each time among those not yet chosen
    (:func:`bulyan_selection`); then per coordinate, of the chosen uploads' values, the
    ``beta = theta - 2f`` nearest their coordinate-wise median are averaged
    (:func:`closest_to_median_mean`). Unweighted, as in the paper. Each upload is one point of its
    floating entries (BatchNorm statistics included, ``running_var`` clamped to >= 0); integer
    entries come from the first chosen upload. Needs ``n >= 4f + 3`` (the paper's condition) and
    clients that own the same keys.

    ``f`` is ``byzantine``, or (``None``) the most malicious clients a round of the run can hold
    under ``loop.attack``, as for Krum (:class:`~fedlightning.server.statistics.MultiKrum`).

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
    """

    def __init__(self, byzantine: int | None = None) -> None:
        check_krum_options(STATISTIC, byzantine, None)
        super().__init__(byzantine=byzantine, selected=None)

    def check_round_byzantine(self, uploads: int, byzantine: int) -> None:
        """A round of ``uploads`` uploads against the f adopted at start-up: ``n >= 4f + 3``."""
        f = self.assumed_byzantine
        if f:
            require_bulyan(self.option, uploads, f)

    def combine(
        self, uploads: Sequence[StateDict], weights: Sequence[float], context: StatisticContext
    ) -> StateDict:
        n, f = len(uploads), self.assumed_byzantine
        if f and n < 4 * f + 3:
            log.warning(
                "%s: %d upload(s) this round, fewer than 4f + 3 = %d for f=%d: the robustness "
                "guarantee does not hold for this round", self.option, n, 4 * f + 3, f,
            )  # fmt: skip
        theta = max(n - 2 * f, 1)
        keep = max(theta - 2 * f, 1)
        chosen = bulyan_selection(pairwise_sq_distances(flat_floats(uploads)), f, theta)
        first = uploads[chosen[0]]
        out: StateDict = {}
        for key, value in first.items():
            if not value.is_floating_point():
                out[key] = value.clone()
                continue
            stacked = torch.stack([wide(uploads[i][key]) for i in chosen])
            out[key] = closest_to_median_mean(stacked, keep).to(value.dtype)
        return clamp_running_var(out)
