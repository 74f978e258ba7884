"""Partial sharing: the base of the personalized objectives that share part of the network and
keep the rest on the client (FedBN, FedPer, LG-FedAvg, FedRep, FedBABU; docs/algorithms.md
section 10.2).

The network's state_dict splits into the **shared** keys and the **kept** keys. Only the shared
part travels: the objective declares it as every client's keys (:meth:`client_key_sets`), so the
aggregator sends and averages exactly that sub-state_dict (the owner-aware mean of section 2.3:
keys no upload owns, the kept part, stay as they were on the server, at their initial values) and
the communication meter counts exactly what the paper sends. A client's kept part is, at the start
of its round, the one it kept in its ClientStore state after its last fit (``state["local"]``), or
the network's initial values before its first fit (:attr:`keeps_local`: or always the initial
values, FedBABU's frozen head); after the fit the shared part is uploaded and the kept part stored.

The model a client deploys (``personal_state``) is the server's deployable with the client's kept
part: before its first fit, the deployable itself (its kept part is the initial one). Each
objective is defined for one architecture: heterogeneous client groups (``networks`` with more than
one name) are refused.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from torch import nn

from fedlightning.clients.base import ClientModule
from fedlightning.clients.groups import refuse_groups
from fedlightning.errors import ConfigurationError, require
from fedlightning.protocol import ClientKeys, StateDict

#: the ClientKeys group of a partial-sharing objective's clients (one key set for all)
SHARED_GROUP = "shared"


def module_keys(network: nn.Module, names: Sequence[str], option: str) -> frozenset[str]:
    """The state_dict keys of the submodules ``names`` of ``network`` (a one-line
    ConfigurationError naming ``option`` when one is not a submodule)."""
    require(bool(names), option, list(names), "a non-empty list of submodule names")
    known = dict(network.named_modules())
    keys: set[str] = set()
    for name in names:
        if name not in known or not name:
            children = ", ".join(n for n, _ in network.named_children())
            raise ConfigurationError(
                f"{option}={list(names)}: {name!r} is not a submodule of the network (its "
                f"top-level ones: {children})"
            )
        keys |= {f"{name}.{k}" for k in known[name].state_dict()}
    return frozenset(keys)


class PartialSharing(ClientModule):
    """Shares :meth:`kept_keys`' complement with the server, keeps the rest (module docstring)."""

    personalized: ClassVar[bool] = True
    #: the kept part persists in the client's state (``False``: it is the initial one every round)
    keeps_local: ClassVar[bool] = True
    #: the shared part is averaged by the FedAvg family's owner-aware rule (any statistic)
    required_aggregator: ClassVar[frozenset[str]] = frozenset({"FedAvg"})
    bookkeeping_attributes: ClassVar[frozenset[str]] = ClientModule.bookkeeping_attributes | {
        "kept", "_initial_kept",
    }  # fmt: skip

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        refuse_groups(kwargs.get("networks"), type(self).__name__, "is defined for one "
                      "architecture (its paper shares one network's layers), and client groups "
                      "of several are not")  # fmt: skip
        full = self.network.state_dict()
        #: the state_dict keys each client keeps (never uploaded)
        self.kept = frozenset(self.kept_keys(self.network))
        if not self.kept or self.kept >= set(full):
            raise ConfigurationError(
                f"{type(self).__name__} keeps {len(self.kept)} of the network's {len(full)} "
                "state_dict entries on the client: it must keep some and share some"
            )
        # the network's values at construction: the run's initial model, the same on the server
        # (the run's identity pins it), read-only
        self._initial_kept = {k: full[k].detach().clone() for k in sorted(self.kept)}

    @abstractmethod
    def kept_keys(self, network: nn.Module) -> Iterable[str]:
        """The state_dict keys of ``network`` each client keeps."""

    def shared_keys(self) -> frozenset[str]:
        """The state_dict keys sent, trained and uploaded (the complement of :attr:`kept`)."""
        return frozenset(self.network.state_dict()) - self.kept

    def client_key_sets(self, num_clients: int) -> list[ClientKeys]:
        """Every client owns the shared keys: the aggregator sends and averages only those."""
        shared = ClientKeys(SHARED_GROUP, self.shared_keys())
        return [shared] * num_clients

    def load_network_state(self, weights: StateDict) -> None:
        """The shared ``weights`` (a payload) completed with the client's kept part (its state's,
        or the initial one)."""
        if self.kept.isdisjoint(weights):
            weights = {**weights, **self._kept_part(self.state)}
        super().load_network_state(weights)

    def _kept_part(self, state: Mapping[str, Any]) -> StateDict:
        local = state.get("local") if self.keeps_local else None
        return self._initial_kept if local is None else local

    def end_client(self, num_steps: int) -> tuple[StateDict, dict[str, Any], dict[str, Any]]:
        """Upload the shared part; the kept part joins the client's state (``local``)."""
        weights, extras, state = super().end_client(num_steps)
        shared = {k: v for k, v in weights.items() if k not in self.kept}
        if self.keeps_local:
            local = {
                k: v.detach().to("cpu", copy=True) for k, v in weights.items() if k in self.kept
            }
            state = {**state, "local": local}
        return shared, extras, state

    def personal_state(
        self, client_id: int, state: Mapping[str, Any], deployed: StateDict
    ) -> StateDict:
        """The server's deployable with the client's kept part (before its first fit, the
        deployable's own, the initial one)."""
        local = state.get("local") if self.keeps_local else None
        return deployed if local is None else {**deployed, **local}
