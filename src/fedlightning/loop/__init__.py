"""The federated loop (rounds) and its parts: sampling, the failure policy, evaluation,
checkpoints and reporting, one module each."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
EXPORTS = {
    "CHECKPOINT_FORMAT": "fedlightning.loop.checkpoint",
    "ClientBug": "fedlightning.loop.failures",
    "FederatedLoop": "fedlightning.loop.core",
    "atomic_save": "fedlightning.loop.checkpoint",
    "sample_clients": "fedlightning.loop.sampling",
}
__all__ = list(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
