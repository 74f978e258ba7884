"""Client objectives: one LightningModule per local training rule; any of them trains
heterogeneous clients with the ``networks`` option."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".base": "ClientModule", ".mutual": "FML", ".fednova": "FedNovaClient",
    ".fedprox": "FedProx", ".moon": "MOON", ".scaffold": "ScaffoldClient",
    ".worker_momentum": "WorkerMomentum", ".feddyn": "FedDynClient", ".ifca": "IFCAClient",
})  # fmt: skip
