"""fedlightning: federated learning research on PyTorch Lightning.

Client objectives (LightningModules) train locally, server aggregators combine their state_dicts,
and the FederatedLoop runs rounds with exact resume. See the README for the algorithm table.

Layering: a module imports only modules of its own package and of lower layers; the top-level
modules of layer 0 may import each other. ``tests/test_layering.py`` reads the table below and
checks every import in ``src/fedlightning`` (typing-only and function-level imports included):

=====  ==========================================================================================
layer  packages and top-level modules
=====  ==========================================================================================
0      errors seeding gc_tuning lazy protocol placement metrics compute training
       state tracking recorded_args optim_config signals torch_settings fingerprint scoring
       folder_lock folder_owner
       config_checks determinism fit_steps
1      models data server analysis
2      clients run_config attacks privacy round_components
3      fit system
4      flower_app asynchronous
5      backends
6      loop
7      cofed
entry  cli cofed.cli flower_app.server flower_app.__main__ fedlightning
=====  ==========================================================================================

Entry points (the commands, the Flower ServerApp, this package root) may import anything; no
other module imports an entry point. Beyond the layers: ``server`` imports no Lightning (plain
torch on state_dicts) and ``clients`` never imports ``server`` (an objective and an aggregator
meet only through :mod:`fedlightning.protocol`). So ``server`` and ``clients`` know nothing of
the loop or the backends, ``backends`` nothing of the loop, and ``flower_app`` (the code that runs
on SuperNodes) nothing of the backends. Module-level imports form no cycle.
"""

from fedlightning.lazy import lazy_exports

#: the public names, each imported from its module on first use (:mod:`fedlightning.lazy`), so
#: that ``fedlightning --version``, ``--help`` and ``list`` import no Lightning
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".clients.base": "ClientModule", ".clients.mutual": "FML", ".clients.moon": "MOON",
    ".clients.fednova": "FedNovaClient", ".clients.fedprox": "FedProx", ".errors": "ConfigurationError",
    ".clients.scaffold": "ScaffoldClient", ".data.datamodule": "FederatedDataModule",
    ".loop.core": "FederatedLoop", ".models": "create_model list_models register_model",
    ".protocol": "Payload Upload", ".state": "ClientStore", ".server.base": "Aggregator",
    ".server.fedadam": "FedAdam", ".server.fedavg": "FedAvg", ".server.fedavgm": "FedAvgM",
    ".server.fedcross": "FedCross", ".server.fednova": "FedNova", ".server.inco": "InCo",
    ".server.scaffold": "Scaffold", ".loop.personal_options": "PersonalEvaluation",
})  # fmt: skip
__version__ = "0.1.0"
