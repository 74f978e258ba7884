"""The centered-clipping preset: Karimireddy, He, Jaggi, "Learning from History for Byzantine
Robust Optimization", ICML 2021, arXiv:2012.10333 (section 4, eq. (CC)). docs/algorithms.md
section 8.4."""

from __future__ import annotations

from fedlightning.server.fedavg import FedAvg
from fedlightning.server.statistics import centered
from fedlightning.server.statistics.base import PRESET_OPTIONS, preset_statistic


class CenteredClipping(FedAvg):
    """FedAvg whose statistic is centered clipping of the client updates around the last round's
    aggregate update (:class:`fedlightning.server.statistics.CenteredClip` has the rule and its
    declared state ``center``), unweighted as in the paper, owner-aware. A preset: the same as
    ``FedAvg(weighting="uniform", statistic=statistics.CenteredClip(radius, iterations))``.

    Args:
        radius: tau > 0, the clipping radius around the center (in the norm of a whole update).
        iterations: L >= 1, clipping iterations per round (the paper uses 1).
    """

    def __init__(self, radius: float = 1.0, iterations: int = 1) -> None:
        centered.check_clipping_options(PRESET_OPTIONS, radius, iterations)
        statistic = preset_statistic(centered.CenteredClip(radius, iterations), self)
        super().__init__("uniform", statistic=statistic)
