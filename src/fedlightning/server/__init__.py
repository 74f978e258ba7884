"""Server aggregators: pure torch on state_dicts."""

from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.fedcross import FedCross
from fedlightning.server.fednova import FedNova
from fedlightning.server.heteroavg import HeteroAvg, HeteroNova, HeteroScaffold
from fedlightning.server.inco import InCo, InCoNova, InCoScaffold
from fedlightning.server.scaffold import Scaffold

__all__ = [
    "Aggregator", "FedAvg", "FedCross", "FedNova", "HeteroAvg", "HeteroNova", "HeteroScaffold",
    "InCo", "InCoNova", "InCoScaffold", "Scaffold",
]  # fmt: skip
