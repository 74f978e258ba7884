"""Differential privacy (docs/algorithms.md section 7): client-level DP on the server
(:class:`NoisedMean`: DP-FedAvg's release with fixed or adaptive clipping, a statistic any
FedAvg-based aggregator takes; :class:`ClientLevelDP`, its preset around FedAvg, FedAvgM or
FedAdam) and sample-level DP-SGD in every client fit (:class:`DPSGD`, the loop's ``dp_sgd``
option), accounted by dp-accounting's PLD (the default) or Opacus's PRV or RDP accountant
(:class:`PrivacyAccountant`, docs/algorithms.md section 7.3). Needs the extra:
``pip install 'fedlightning[privacy]'``; without it each feature refuses with one line."""

from fedlightning.privacy.accountant import PrivacyAccountant, calibrate_noise
from fedlightning.privacy.client_dp import ClientLevelDP
from fedlightning.privacy.dp_sgd import DPSGD
from fedlightning.privacy.dp_statistic import NoisedMean

__all__ = ["ClientLevelDP", "DPSGD", "NoisedMean", "PrivacyAccountant", "calibrate_noise"]
