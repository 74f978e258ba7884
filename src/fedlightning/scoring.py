"""Networks owned by the scoring path (docs/algorithms.md section 6.1).

A reported accuracy must not depend on what a fit left in a module: its mode (a BatchNorm layer in
train mode normalises with the test batch's statistics), its group switch or its device. So
evaluation never scores the objective's own modules: :class:`ScoringNetworks` builds each network
it scores once per run (per key), keeps it on the evaluation device in eval mode with gradients
off, and loads the weights to score into it at every use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from fedlightning.protocol import StateDict


class ScoringNetworks:
    """Scoring networks by key: built once, then loaded with the weights of every use.

    Args:
        device: where every network lives and scores.
        dtype: the floating dtype of every network (``torch.float64`` for a ``64-true`` run);
            ``None``: as built.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype | None = None) -> None:
        self.device = device
        self.dtype = dtype
        self.networks = nn.ModuleDict()
        #: this evaluation's deployable weights by name (``"global"`` first), set by the loop's
        #: evaluation before an objective's ``evaluate_clients`` scores with these networks
        self.deployables: Mapping[str, StateDict] = {}

    def network(self, key: str, build: Callable[[], nn.Module]) -> nn.Module:
        """The network ``key`` (a name without dots), built by ``build`` on its first use: from a
        forked RNG (building never draws from the run's random stream), moved to the device and
        dtype, gradients off."""
        if key not in self.networks:
            with torch.random.fork_rng(devices=[]):
                network = build()
            self.networks[key] = network.requires_grad_(False).to(
                device=self.device, dtype=self.dtype
            )
        return self.networks[key]

    def load(
        self, key: str, state: StateDict, build: Callable[[], nn.Module] | None = None
    ) -> nn.Module:
        """The network ``key`` (built by ``build`` on its first use, :meth:`network`; without
        ``build`` it must exist) with ``state`` loaded (strictly), in eval mode."""
        network = self.networks[key] if build is None else self.network(key, build)
        network.load_state_dict(state)
        return network.eval()
