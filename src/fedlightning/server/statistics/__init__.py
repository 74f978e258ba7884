"""The server's statistics: what combines a round's uploads, injected into
:class:`~fedlightning.server.fedavg.FedAvg` as ``statistic`` (docs/algorithms.md section 2.8;
the protocol in :mod:`fedlightning.server.statistics.base`). The differentially private mean is
:class:`fedlightning.privacy.NoisedMean`."""

from fedlightning.server.statistics.base import Statistic, StatisticContext
from fedlightning.server.statistics.centered import CenteredClip
from fedlightning.server.statistics.coordinate import Mean, Median, TrimmedMean
from fedlightning.server.statistics.geomed import GeometricMedian
from fedlightning.server.statistics.krum import Krum, MultiKrum

__all__ = [
    "CenteredClip", "GeometricMedian", "Krum", "Mean", "Median", "MultiKrum", "Statistic",
    "StatisticContext", "TrimmedMean",
]  # fmt: skip
