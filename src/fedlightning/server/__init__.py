"""Server aggregators: pure torch on state_dicts, owner-aware (see :mod:`fedlightning.server.base`)."""

from fedlightning.server.adaptive import FedAdagrad, FedYogi
from fedlightning.server.base import Aggregator
from fedlightning.server.centered_clip import CenteredClipping
from fedlightning.server.cfl import ClusteredFL
from fedlightning.server.fedadam import FedAdam
from fedlightning.server.fedavg import FedAvg
from fedlightning.server.fedavgm import FedAvgM
from fedlightning.server.fedcross import FedCross
from fedlightning.server.feddyn import FedDyn
from fedlightning.server.fednova import FedNova
from fedlightning.server.geomed import GeometricMedian
from fedlightning.server.ifca import IFCA
from fedlightning.server.inco import InCo
from fedlightning.server.krum import Krum, MultiKrum
from fedlightning.server.norm_bound import NormBound
from fedlightning.server.scaffold import Scaffold

__all__ = [
    "Aggregator", "CenteredClipping", "ClusteredFL", "FedAdagrad", "FedAdam", "FedAvg", "FedAvgM",
    "FedCross", "FedDyn", "FedNova", "FedYogi", "GeometricMedian", "IFCA", "InCo", "Krum",
    "MultiKrum", "NormBound", "Scaffold",
]  # fmt: skip
