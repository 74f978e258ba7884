"""Client objectives: one LightningModule per local training rule; any of them trains
heterogeneous clients with the ``networks`` option."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".base": "ClientModule", ".mutual": "FML", ".fednova": "FedNovaClient",
    ".fedprox": "FedProx", ".moon": "MOON", ".scaffold": "ScaffoldClient",
    ".worker_momentum": "WorkerMomentum", ".feddyn": "FedDynClient", ".ifca": "IFCAClient",
    ".fedbn": "FedBN", ".fedper": "FedPer", ".lg_fedavg": "LGFedAvg", ".fedrep": "FedRep",
    ".fedbabu": "FedBABU", ".ditto": "Ditto", ".apfl": "APFL",
    ".perfedavg": "PerFedAvg", ".pfedme": "PFedMe",
    ".fedrod": "FedRoD", ".fedala": "FedALA",
})  # fmt: skip
