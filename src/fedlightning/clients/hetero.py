"""Heterogeneous clients: groups of clients train different architectures whose state_dict keys
nest (InCo Aggregation: Chan et al., "Internal Cross-layer Gradients for Extending Homogeneity to
Heterogeneity in Federated Learning", ICLR 2024, arXiv:2308.11464; HeteroFL-style averaging,
Diao et al., ICLR 2021, arXiv:2010.01264). ALGORITHMS.md 2.3.

Any client objective becomes heterogeneous with :class:`HeteroMixin` in front of it
(``class HeteroFedProx(HeteroMixin, FedProx)``): the mixin holds one network per group and makes
the group of the payload's keys the active ``self.network``, so the objective's own code (the
proximal anchor, SCAFFOLD's correction, FedNova's a_i) sees exactly the client's architecture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlightning.clients.base import ClientModule
from fedlightning.clients.fednova import FedNovaClient
from fedlightning.clients.fedprox import FedProx
from fedlightning.clients.moon import MOON, ProjectedNetwork
from fedlightning.clients.scaffold import ScaffoldClient
from fedlightning.errors import ConfigurationError, require
from fedlightning.models import create_model
from fedlightning.protocol import StateDict
from fedlightning.server.base import ClientKeys

if TYPE_CHECKING:
    from fedlightning.state import ClientStore


def assign_groups(num_clients: int, num_groups: int) -> list[int]:
    """Client ``i``'s group ``floor(i * G / N)``: G contiguous groups of equal size (sizes differ by
    at most one when G does not divide N), group 0 first."""
    require(
        num_clients >= num_groups,
        "data.num_clients",
        num_clients,
        f"at least one client per group (>= {num_groups})",
    )
    return [i * num_groups // num_clients for i in range(num_clients)]


def check_nested(names: Sequence[str], states: Sequence[StateDict]) -> int:
    """The index of the architecture whose keys contain every other's (the server model); raise a
    ConfigurationError if there is none, if two share a key set, or if a shared key's shape differs."""
    key_sets = [frozenset(s) for s in states]
    if len(set(key_sets)) != len(key_sets):
        raise ConfigurationError(
            f"model.networks={list(names)}: two architectures have the same state_dict keys"
        )
    largest = max(range(len(states)), key=lambda i: len(key_sets[i]))
    full = states[largest]
    for name, state in zip(names, states, strict=True):
        extra = sorted(set(state) - set(full))
        if extra:
            raise ConfigurationError(
                f"model.networks={list(names)}: {name} has keys {extra[:3]} that {names[largest]} lacks; "
                "heterogeneous architectures must nest (a smaller model's keys within the largest's)"
            )
        for key, value in state.items():
            if value.shape != full[key].shape:
                raise ConfigurationError(
                    f"model.networks={list(names)}: {key} has shape {tuple(value.shape)} in {name} but "
                    f"{tuple(full[key].shape)} in {names[largest]}: use the same widths in every group"
                )
    return largest


class HeteroMixin:
    """Put in front of a ClientModule subclass to train one architecture per client group.

    ``networks`` lists registered model names (built with the same ``network_kwargs``); they are
    ordered by parameter count, smallest first, and the clients split into that many equal,
    contiguous groups (:func:`assign_groups`). The largest architecture, whose keys contain every
    other's, is the server model (``self.network`` after construction, so the loop's initial
    state is its initialisation). A payload's key set selects the group whose network becomes
    ``self.network``; only that network is a submodule, so the optimizer, device moves and every
    objective's hooks see one architecture. After each test on the global test set the group's
    accuracy is recorded, and :meth:`evaluate_clients` reports their mean as ``group_mean_acc``
    (the paper's headline number; each group's own is ``<group>/test_acc``).

    Args:
        networks: registered model names whose state_dict keys nest (e.g. ``resnet10 ..
            resnet26``); ``network`` is ignored.
    """

    def __init__(self, networks: list[str] | None = None, **kwargs: Any) -> None:
        networks = list(networks or ["resnet10", "resnet14", "resnet18", "resnet22", "resnet26"])
        require(
            len(set(networks)) == len(networks) >= 1,
            "model.networks",
            networks,
            "distinct registered model names",
        )
        kwargs["network"] = networks[0]
        super().__init__(**kwargs)
        built = {networks[0]: self.network}
        for name in networks[1:]:
            built[name] = self.build_network(name)
        sizes = {name: sum(p.numel() for p in net.parameters()) for name, net in built.items()}
        self.groups: list[str] = sorted(networks, key=lambda n: (sizes[n], networks.index(n)))
        # a plain list, not submodules: only the active network is registered (as self.network)
        self._nets: list[nn.Module] = [built[n] for n in self.groups]
        states = [net.state_dict() for net in self._nets]
        self._server_group = check_nested(self.groups, states)
        self._by_keys = {frozenset(s): g for g, s in enumerate(states)}
        self.group_index = self._server_group
        self.network = self._nets[self._server_group]
        self._group_acc: dict[str, float] = {}

    def build_network(self, name: str) -> nn.Module:
        """The network of group ``name`` as the objective trains it (the first group's network is
        built by the objective's own constructor; an objective that wraps it wraps these too)."""
        hp = self.hparams
        return create_model(
            name, hp.num_classes, hp.in_channels, hp.image_size, **(hp.network_kwargs or {})
        )

    def on_group_change(self) -> None:
        """Called after another group's network became ``self.network`` (drop per-architecture caches)."""

    @property
    def group(self) -> str:
        """The active group's architecture name."""
        return self.groups[self.group_index]

    def client_key_sets(self, num_clients: int) -> list[ClientKeys]:
        groups = assign_groups(num_clients, len(self.groups))
        keys = [frozenset(net.state_dict()) for net in self._nets]
        return [ClientKeys(self.groups[g], keys[g]) for g in groups]

    def load_network_state(self, weights: StateDict) -> None:
        """Activate the group whose architecture has exactly ``weights``' keys and load them."""
        index = self._by_keys.get(frozenset(weights))
        if index is None:
            raise ValueError(
                f"no client group's architecture ({', '.join(self.groups)}) has exactly these {len(weights)} keys"
            )
        if index != self.group_index:
            like = next(self.network.parameters())
            self.group_index = index
            self.network = self._nets[index].to(like.device)
            self.on_group_change()
        self.network.load_state_dict(weights)

    def on_test_epoch_end(self) -> None:
        self._group_acc[self.group] = float(self.test_acc.compute())

    def evaluate_clients(
        self,
        client_ids: Sequence[int],
        store: ClientStore,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
        device: torch.device,
    ) -> dict[str, float]:
        out = super().evaluate_clients(client_ids, store, val_dataloader, device)
        if self._group_acc:
            out["group_mean_acc"] = sum(self._group_acc.values()) / len(self._group_acc)
        self._group_acc = {}
        return out


class HeteroClientModule(HeteroMixin, ClientModule):
    """Cross-entropy clients in architecture groups (InCoAvg / HeteroAvg clients); see :class:`HeteroMixin`."""


class HeteroFedProx(HeteroMixin, FedProx):
    """FedProx clients in architecture groups (InCoProx); see :class:`HeteroMixin`."""


class HeteroScaffoldClient(HeteroMixin, ScaffoldClient):
    """SCAFFOLD clients in architecture groups (InCoScaffold); ``c`` and ``c_i`` cover the
    client's own keys. See :class:`HeteroMixin`."""


class HeteroFedNovaClient(HeteroMixin, FedNovaClient):
    """FedNova clients in architecture groups (InCoNova); see :class:`HeteroMixin`."""


class HeteroMOON(HeteroMixin, MOON):
    """MOON clients in architecture groups (InCoMOON): every group's backbone gets its own
    projection head and classifier (keys ``backbone.*``, ``projection.*``, ``head.*``; InCo's
    ResNet rule accepts the ``backbone.`` prefix), and the frozen global/previous copies are
    rebuilt when the active architecture changes. See :class:`HeteroMixin`."""

    def build_network(self, name: str) -> nn.Module:
        hp = self.hparams
        return ProjectedNetwork(super().build_network(name), hp.num_classes, hp.projection_dim)

    def on_group_change(self) -> None:
        self._frozen = {}
