"""Krum and Multi-Krum presets: Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017, arXiv:1703.02757 (section 4).
docs/algorithms.md section 8.2."""

from __future__ import annotations

from typing import Literal

from fedlightning.server.fedavg import FedAvg
from fedlightning.server.statistics import krum
from fedlightning.server.statistics.base import PRESET_OPTIONS, preset_statistic


class MultiKrum(FedAvg):
    """FedAvg whose statistic is Multi-Krum (:class:`fedlightning.server.statistics.MultiKrum`
    has the rule): the mean of the ``m`` uploads with the lowest Krum scores, ``m = n - f`` by
    default, ``f`` the run's attack's unless ``byzantine`` is set. A preset: the same as
    ``FedAvg(weighting=weighting, statistic=statistics.MultiKrum(byzantine, selected))``.
    The breakdown checks, at start-up and each round of an attacked run (``check_byzantine``,
    ``check_round_byzantine``), are the statistic's, read through the aggregator.

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
        selected: m, the uploads averaged; ``null``: ``n - f``.
        weighting: how the selection is averaged: ``uniform`` (the paper's) or ``samples`` (by
            n_i, as Flower's ``aggregate_krum``).
    """

    def __init__(
        self,
        byzantine: int | None = None,
        selected: int | None = None,
        weighting: Literal["uniform", "samples"] = "uniform",
    ) -> None:
        krum.check_krum_options(PRESET_OPTIONS, byzantine, selected)
        statistic = preset_statistic(krum.MultiKrum(byzantine, selected), self)
        super().__init__(weighting, statistic=statistic)


class Krum(FedAvg):
    """FedAvg whose statistic is Krum (:class:`fedlightning.server.statistics.Krum`): the upload
    with the lowest Krum score becomes the model, its BatchNorm statistics and counters included.
    A preset: ``FedAvg(weighting="uniform", statistic=statistics.Krum(byzantine))``.

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
    """

    def __init__(self, byzantine: int | None = None) -> None:
        krum.check_krum_options(PRESET_OPTIONS, byzantine, None)
        statistic = preset_statistic(krum.Krum(byzantine), self)
        super().__init__("uniform", statistic=statistic)
