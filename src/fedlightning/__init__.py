"""fedlightning: federated learning research on PyTorch Lightning.

Client objectives (LightningModules) train locally, server aggregators combine their state_dicts,
and the FederatedLoop runs rounds with exact resume. See the README for the algorithm table.

Layering: a module imports only modules of its own package and of lower layers; the top-level
modules of layer 0 may import each other. ``tests/test_layering.py`` reads the table below and
checks every import in ``src/fedlightning`` (typing-only and function-level imports included):

=====  ==========================================================================================
layer  packages and top-level modules
=====  ==========================================================================================
0      errors seeding gc_tuning protocol placement metrics compute training state tracking
       recorded_args optim_config signals torch_settings fingerprint scoring
1      models data server analysis
2      clients run_config attacks privacy
3      fit
4      flower_app
5      backends
6      loop
7      cofed
entry  cli cli_errors cli_help cli_scoring cofed.cli flower_app.server flower_app.__main__
       fedlightning
=====  ==========================================================================================

Entry points (the commands, the Flower ServerApp, this package root) may import anything; no
other module imports an entry point. Beyond the layers: ``server`` imports no Lightning (plain
torch on state_dicts) and ``clients`` never imports ``server`` (an objective and an aggregator
meet only through :mod:`fedlightning.protocol`). So ``server`` and ``clients`` know nothing of
the loop or the backends, ``backends`` nothing of the loop, and ``flower_app`` (the code that runs
on SuperNodes) nothing of the backends. Module-level imports form no cycle.
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
