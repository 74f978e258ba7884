"""Architecture groups for heterogeneous clients (``ClientModule(networks=[...])``): which client
trains which architecture, and the check that the architectures' state_dict keys nest (InCo
Aggregation: Chan et al., ICLR 2024, arXiv:2308.11464; HeteroFL-style averaging: Diao et al., ICLR
2021, arXiv:2010.01264). docs/algorithms.md section 2.3.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import StateDict


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
