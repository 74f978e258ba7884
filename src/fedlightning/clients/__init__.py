"""Client objectives: one LightningModule per local training rule; any of them trains
heterogeneous clients with the ``networks`` option."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
EXPORTS = {
    "ClientModule": "fedlightning.clients.base",
    "FML": "fedlightning.clients.mutual",
    "FedNovaClient": "fedlightning.clients.fednova",
    "FedProx": "fedlightning.clients.fedprox",
    "MOON": "fedlightning.clients.moon",
    "ScaffoldClient": "fedlightning.clients.scaffold",
    "WorkerMomentum": "fedlightning.clients.worker_momentum",
}
__all__ = list(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
