"""The federated loop (rounds) and its parts: sampling, the failure policy, evaluation,
checkpoints and reporting, one module each."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".checkpoint": "CHECKPOINT_FORMAT atomic_save", ".failures": "ClientBug",
    ".core": "FederatedLoop", ".sampling": "sample_clients",
})  # fmt: skip
