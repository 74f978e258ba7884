"""The federated loop (rounds) and its parts: sampling, the failure policy, evaluation,
checkpoints and reporting, one module each."""

from fedlightning.loop.checkpoint import CHECKPOINT_FORMAT, atomic_save
from fedlightning.loop.core import FederatedLoop
from fedlightning.loop.failures import ClientBug
from fedlightning.loop.sampling import sample_clients

__all__ = [
    "CHECKPOINT_FORMAT", "ClientBug", "FederatedLoop", "atomic_save", "sample_clients",
]  # fmt: skip
