"""Server aggregators: pure torch on state_dicts, owner-aware (see :mod:`fedlightning.server.base`)."""

from fedlightning.server.base import Aggregator
from fedlightning.server.fedadam import FedAdam
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.fedavgm import FedAvgM
from fedlightning.server.fedcross import FedCross
from fedlightning.server.fednova import FedNova
from fedlightning.server.inco import InCo
from fedlightning.server.scaffold import Scaffold

__all__ = [
    "Aggregator", "FedAdam", "FedAvg", "FedAvgM", "FedCross", "FedNova", "InCo",
    "Scaffold",
]  # fmt: skip
