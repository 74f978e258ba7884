"""fedlightning: federated learning research on PyTorch Lightning."""

from fedlightning.clients import ClientModule
from fedlightning.data import FederatedDataModule
from fedlightning.errors import ConfigurationError
from fedlightning.loop import FederatedLoop
from fedlightning.models import create_model, list_models, register_model
from fedlightning.protocol import Payload, Upload
from fedlightning.server import Aggregator, FedAvg
from fedlightning.state import ClientStore

__all__ = [
    "Aggregator",
    "ClientModule",
    "ClientStore",
    "ConfigurationError",
    "FedAvg",
    "FederatedDataModule",
    "FederatedLoop",
    "Payload",
    "Upload",
    "create_model",
    "list_models",
    "register_model",
]
__version__ = "0.1.0"
