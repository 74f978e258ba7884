"""Client objectives: one LightningModule per local training rule; any of them trains
heterogeneous clients with the ``networks`` option."""

from fedlightning.clients.base import ClientModule
from fedlightning.clients.fednova import FedNovaClient
from fedlightning.clients.fedprox import FedProx
from fedlightning.clients.moon import MOON
from fedlightning.clients.mutual import FML
from fedlightning.clients.scaffold import ScaffoldClient
from fedlightning.clients.worker_momentum import WorkerMomentum

__all__ = [
    "ClientModule",
    "FML",
    "FedNovaClient",
    "FedProx",
    "MOON",
    "ScaffoldClient",
    "WorkerMomentum",
]
