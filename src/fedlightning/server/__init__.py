"""Server aggregators: pure torch on state_dicts."""

from fedlightning.server.base import Aggregator
from fedlightning.server.fedavg import FedAvg

__all__ = ["Aggregator", "FedAvg"]
