"""fedlightning: federated learning research on PyTorch Lightning.

Client objectives (LightningModules) train locally, server aggregators combine their state_dicts,
and the FederatedLoop runs rounds with exact resume. See the README for the algorithm table.
"""

from fedlightning.gc_tuning import gc_paused

with gc_paused():  # Lightning's imports: see fedlightning.gc_tuning
    from fedlightning.clients import (
        FML,
        MOON,
        ClientModule,
        FedNovaClient,
        FedProx,
        ScaffoldClient,
    )
    from fedlightning.data import FederatedDataModule
    from fedlightning.errors import ConfigurationError
    from fedlightning.loop import FederatedLoop
    from fedlightning.models import create_model, list_models, register_model
    from fedlightning.protocol import Payload, Upload
    from fedlightning.server import (
        Aggregator,
        FedAdam,
        FedAvg,
        FedAvgM,
        FedCross,
        FedNova,
        InCo,
        Scaffold,
    )
    from fedlightning.state import ClientStore

__all__ = [
    "FML",
    "MOON",
    "Aggregator",
    "ClientModule",
    "ClientStore",
    "ConfigurationError",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedCross",
    "FedNova",
    "FedNovaClient",
    "FedProx",
    "FederatedDataModule",
    "FederatedLoop",
    "InCo",
    "Payload",
    "Scaffold",
    "ScaffoldClient",
    "Upload",
    "create_model",
    "list_models",
    "register_model",
]
__version__ = "0.1.0"
