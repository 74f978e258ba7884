"""The Bulyan preset: El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed
Learning in Byzantium", ICML 2018, arXiv:1802.07927 (section 4). docs/algorithms.md section 8.8."""

from __future__ import annotations

from fedlightning.server.fedavg import FedAvg
from fedlightning.server.statistics import bulyan, krum
from fedlightning.server.statistics.base import PRESET_OPTIONS, preset_statistic


class Bulyan(FedAvg):
    """FedAvg whose statistic is Bulyan (:class:`fedlightning.server.statistics.Bulyan` has the
    rule): Krum chooses ``n - 2f`` uploads one after another, then per coordinate the
    ``n - 4f`` chosen values nearest their median are averaged; ``f`` the run's attack's unless
    ``byzantine`` is set, ``n >= 4f + 3`` checked at start-up and each round of an attacked run.
    A preset: ``FedAvg(weighting="uniform", statistic=statistics.Bulyan(byzantine))``.

    Args:
        byzantine: f, the malicious uploads a round may hold; ``null``: the run's attack's.
    """

    def __init__(self, byzantine: int | None = None) -> None:
        krum.check_krum_options(PRESET_OPTIONS, byzantine, None)
        statistic = preset_statistic(bulyan.Bulyan(byzantine), self)
        super().__init__("uniform", statistic=statistic)
