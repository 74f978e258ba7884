"""Independent initialisations of a client module's network (FedCross Algorithm 1 line 2: K
middleware models from K independent initialisations; docs/algorithms.md section 2.2)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedlightning.protocol import StateDict
from fedlightning.seeding import derive_seed

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule


def fresh_network(model: ClientModule) -> nn.Module:
    """A newly initialised copy of ``model.network`` from the current global RNG.

    A network named in the registry is rebuilt by its builder (so custom initialisations such as
    the ResNets' Kaiming init are repeated) and wrapped by the objective (MOON's projection head);
    an ``nn.Module`` given directly is deep-copied and every submodule that has
    ``reset_parameters()`` re-initialised.
    """
    name = model.hparams.get("network")
    if isinstance(name, str) and not model.groups:
        return model.wrap_network(model.create_network(name))
    network = copy.deepcopy(model.network)
    for module in network.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
    return network


def independent_states(model: ClientModule, count: int, seed: int) -> list[StateDict]:
    """``count`` initial state_dicts (on CPU), the i-th drawn with the global RNG seeded from
    ``derive_seed(seed, "initial-state", i)`` inside a forked RNG (the run's stream is untouched)."""
    states = []
    for i in range(count):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, "initial-state", i))
            network = fresh_network(model)
        states.append({k: v.detach().to("cpu", copy=True) for k, v in network.state_dict().items()})
    return states
