"""Architecture groups for heterogeneous clients (``ClientModule(networks=[...])``): which client
trains which architecture, the check that the architectures' state_dict keys nest (InCo
Aggregation: Chan et al., ICLR 2024, arXiv:2308.11464; HeteroFL-style averaging: Diao et al., ICLR
2021, arXiv:2010.01264), and :class:`ClientGroups`, the one object that owns every group's
network. docs/algorithms.md sections 2.3 and 6.1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import ClientKeys, StateDict


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


def refuse_groups(networks: Sequence[str] | None, objective: str, reason: str) -> None:
    """A one-line ConfigurationError when ``model.networks`` names more than one architecture
    for an objective defined for one (``reason``: why, completing "<objective> ...")."""
    if networks is not None and len(networks) > 1:
        raise ConfigurationError(
            f"model.networks={list(networks)}: {objective} {reason}: give model.network"
        )


class ClientGroups:
    """Every architecture a client objective trains, each network built once and owned here.

    ``networks`` is one ``nn.ModuleList`` (smallest architecture first), so a single ``.to()``,
    ``.train()`` or ``.double()`` on it reaches every group. The objective trains one of them at a
    time (its registered ``network``); :meth:`activate` hands it the network a payload's key set
    selects, carrying over the device, dtype and mode of the network it replaces. The scoring
    path copies these networks and never trains them (docs/algorithms.md section 6.1).

    Args:
        architectures: each network's registered model name (``None``: a module given directly).
        networks: the networks, in the same order.
        grouped: whether the objective was built with ``networks=[...]`` (client groups), even
            a single one; ``False``: one network that every client trains.
    """

    def __init__(
        self, architectures: Sequence[str | None], networks: Sequence[nn.Module], grouped: bool
    ) -> None:
        self.architectures = list(architectures)
        self.networks = nn.ModuleList(networks)
        self.grouped = grouped
        states = [net.state_dict() for net in self.networks]
        self.server_index = (
            check_nested(self.architectures, states) if grouped else 0  # type: ignore[arg-type]
        )
        self._by_keys = {frozenset(s): g for g, s in enumerate(states)}

    @classmethod
    def build(cls, names: list[str], build: Callable[[str], nn.Module]) -> ClientGroups:
        """The groups of the architectures ``names`` (distinct registered names), each built by
        ``build`` in the order given and ordered by parameter count, smallest first."""
        built = {name: build(name) for name in names}
        sizes = {name: sum(p.numel() for p in net.parameters()) for name, net in built.items()}
        ordered = sorted(names, key=lambda n: (sizes[n], names.index(n)))
        return cls(ordered, [built[n] for n in ordered], grouped=True)

    @property
    def names(self) -> list[str]:
        """The groups' architecture names, smallest first (empty without client groups)."""
        return [str(a) for a in self.architectures] if self.grouped else []

    def __len__(self) -> int:
        return len(self.networks)

    def index_of(self, weights: StateDict) -> int:
        """The group whose architecture has exactly ``weights``' keys (without client groups: the
        one network, whose ``load_state_dict`` checks the keys)."""
        if not self.grouped:
            return 0
        index = self._by_keys.get(frozenset(weights))
        if index is None:
            raise ValueError(
                f"no client group's architecture ({', '.join(self.names)}) has exactly these "
                f"{len(weights)} keys"
            )
        return index

    def activate(self, index: int, current: nn.Module) -> nn.Module:
        """Group ``index``'s network, moved to the device and floating dtype of ``current`` (the
        network it replaces) and put in its mode."""
        network = self.networks[index]
        like = next(current.parameters(), None)
        if like is not None:
            network.to(device=like.device, dtype=like.dtype if like.is_floating_point() else None)
        return network.train(current.training)

    def client_key_sets(self, num_clients: int) -> list[ClientKeys] | None:
        """Each client's architecture group and state_dict keys (``None`` with fewer than two
        groups: every client trains the whole network)."""
        if len(self.names) < 2:
            return None
        keys = [frozenset(net.state_dict()) for net in self.networks]
        names = self.names
        return [ClientKeys(names[g], keys[g]) for g in assign_groups(num_clients, len(names))]

    def group_of(self, client_id: int, num_clients: int) -> str | None:
        """Client ``client_id``'s group name (:func:`assign_groups`; ``None`` without at least
        two groups: it trains the one network)."""
        if len(self.names) < 2:
            return None
        return self.names[assign_groups(num_clients, len(self.names))[client_id]]

    def server_parameter_names(self) -> frozenset[str]:
        """The trainable parameters' state_dict keys of the server model (the network whose keys
        contain every other's); every other entry is a buffer."""
        named = self.networks[self.server_index].named_parameters(remove_duplicate=False)
        return frozenset(name for name, p in named if p.requires_grad)
