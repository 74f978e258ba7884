"""Differential privacy (docs/algorithms.md section 7): client-level DP on the server
(:class:`ClientLevelDP`: DP-FedAvg with fixed or adaptive clipping, wrapping FedAvg, FedAvgM or
FedAdam) and sample-level DP-SGD in every client fit (:class:`DPSGD`, the loop's ``dp_sgd``
option), accounted by dp-accounting's PLD (the default) or Opacus's PRV or RDP accountant
(:class:`PrivacyAccountant`, docs/algorithms.md section 7.3). Needs the extra:
``pip install 'fedlightning[privacy]'``; without it each feature refuses with one line."""

from fedlightning.privacy.accountant import PrivacyAccountant, calibrate_noise
from fedlightning.privacy.client_dp import ClientLevelDP
from fedlightning.privacy.dp_sgd import DPSGD

__all__ = ["ClientLevelDP", "DPSGD", "PrivacyAccountant", "calibrate_noise"]
