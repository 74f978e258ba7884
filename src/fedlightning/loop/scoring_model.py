"""The scoring model: what evaluation scores a deployable with (docs/algorithms.md section 6.1).

For each architecture of the objective's client groups it owns one scoring network, built once per
run at start-up: the objective's :meth:`~fedlightning.clients.ClientModule.scoring_network`
around a copy of that architecture's network, on the evaluation device, in eval mode, gradients
off (:class:`~fedlightning.scoring.ScoringNetworks`), in float64 for a ``64-true`` run. A
deployable's key set selects the architecture (as a payload's selects a client's), and its
weights, mapped by :meth:`~fedlightning.clients.ClientModule.scoring_state`, are loaded at every
use. Nothing here touches the objective's own modules, so no training mode, BatchNorm statistic
or group switch of a fit reaches a reported number.

:meth:`ScoringModel.saved` gives every deployable as the run saves it in ``models.pt``
(:mod:`fedlightning.loop.deployables`), and :meth:`ScoringModel.load_saved` loads such an entry
back into the same network (``fedlightning test RUN_DIR``).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedlightning.clients.base import ClientModule
from fedlightning.clients.evaluation_hooks import EvaluationHooks
from fedlightning.errors import ConfigurationError
from fedlightning.placement import to_cpu
from fedlightning.protocol import StateDict
from fedlightning.scoring import ScoringNetworks

if TYPE_CHECKING:
    from fedlightning.compute import Compute
    from fedlightning.state import ClientStore

#: one saved deployable: ``{"architecture": str | None, "state_dict": StateDict}``
SavedModel = dict[str, object]


def check_scoring_hooks(objective: ClientModule) -> None:
    """Refuse an objective whose ``forward`` is its own while it scores its network as is:
    evaluation would not score what the objective computes."""
    kind = type(objective)
    if kind.forward is not ClientModule.forward and (
        kind.scoring_network is EvaluationHooks.scoring_network
    ):
        raise ConfigurationError(
            f"{kind.__name__} overrides forward, which evaluation does not call: it scores the "
            "network through the scoring path (docs/algorithms.md section 6.1); override "
            "scoring_network(network) to return the module to score around the network"
        )


class ScoringModel:
    """The scoring networks of one run's objective (module docstring).

    Args:
        objective: the client objective (read for its client groups and scoring hooks only).
        device: where scoring runs.
        autocast: the run's precision context, entered around every forward pass.
        dtype: the networks' floating dtype (``None``: as the objective built them).
    """

    def __init__(
        self,
        objective: ClientModule,
        device: torch.device,
        autocast: Callable[[], AbstractContextManager],
        dtype: torch.dtype | None = None,
    ) -> None:
        check_scoring_hooks(objective)
        self.objective = objective
        self.autocast = autocast
        self.networks = ScoringNetworks(device, dtype)
        groups = objective.client_groups
        self.architectures = list(groups.architectures)
        #: the client groups' names (empty without groups): deployables named so are group models
        self.group_names = groups.names
        self._index_of = groups.index_of
        for index, network in enumerate(groups.networks):  # once per run, before any fit
            self.networks.network(_key(index), functools.partial(_scoring_copy, objective, network))
        accepts = inspect.signature(objective.evaluate_clients).parameters.values()
        self._passes_scoring = any(
            p.name == "scoring" or p.kind is inspect.Parameter.VAR_KEYWORD for p in accepts
        )

    @classmethod
    def for_run(cls, objective: ClientModule, compute: Compute) -> ScoringModel:
        """The scoring model of a run on ``compute`` (float64 networks for ``64-true``)."""
        dtype = torch.float64 if compute.precision == "64-true" else None
        return cls(objective, compute.device, compute.autocast, dtype)

    @property
    def device(self) -> torch.device:
        return self.networks.device

    def prepare(self, store: ClientStore, deployables: Mapping[str, StateDict]) -> None:
        """Start an evaluation of ``deployables``: the objective's ``prepare_evaluation`` with
        every client's state in ``store``."""
        self.objective.prepare_evaluation(store)
        self.networks.deployables = deployables

    def architecture(self, weights: StateDict) -> str | None:
        """The registered name of ``weights``' architecture (selected by their key set)."""
        return self.architectures[self._index_of(weights)]

    def load(self, weights: StateDict) -> nn.Module:
        """The scoring network of ``weights``' architecture (selected by their key set), loaded
        with them (through ``scoring_state``), in eval mode."""
        index = self._index_of(weights)
        state = self.objective.scoring_state(weights)
        return self.networks.load(_key(index), state)

    def load_saved(self, entry: SavedModel) -> nn.Module:
        """The scoring network of a :meth:`saved` entry, loaded with its state, in eval mode."""
        reason = self.misfit(entry)
        if reason is not None:
            raise ConfigurationError(
                f"a saved model does not fit this objective's network: {reason}"
            )
        index = self.architectures.index(entry["architecture"])  # type: ignore[arg-type]
        return self.networks.load(_key(index), entry["state_dict"])  # type: ignore[arg-type]

    def misfit(self, entry: SavedModel) -> str | None:
        """Why a :meth:`saved` entry cannot be loaded into its architecture's scoring network (an
        architecture this objective does not build, a key missing or extra, a shape that
        differs: a network of another size), or None."""
        architecture = entry["architecture"]
        if architecture not in self.architectures:
            built = ", ".join(map(str, self.architectures))
            return f"its architecture {architecture!r} is not one this objective builds ({built})"
        index = self.architectures.index(architecture)
        expected = self.networks.networks[_key(index)].state_dict()
        state: Mapping[str, Tensor] = entry["state_dict"]  # type: ignore[assignment]
        missing = [key for key in expected if key not in state]
        extra = [key for key in state if key not in expected]
        if missing or extra:
            return (
                f"its keys differ from the network's (missing: {missing[:3]}, extra: {extra[:3]})"
            )
        for key, tensor in expected.items():
            if not isinstance(state[key], Tensor):
                return f"{key} is a {type(state[key]).__name__} in the file, not a tensor"
            if tuple(state[key].shape) != tuple(tensor.shape):
                return (
                    f"{key} has shape {list(state[key].shape)} in the file but "
                    f"{list(tensor.shape)} in the network"
                )
        return None

    def saved(self, deployables: Mapping[str, StateDict]) -> dict[str, SavedModel]:
        """Every deployable as ``models.pt`` keeps it: its architecture's registered name and the
        state its scoring network is loaded with (on the CPU); call after :meth:`prepare`."""
        out: dict[str, SavedModel] = {}
        for name, weights in deployables.items():
            state = to_cpu(self.objective.scoring_state(weights), copy=True)
            out[name] = {"architecture": self.architecture(weights), "state_dict": state}
        return out

    def evaluate_clients(
        self,
        client_ids: Sequence[int],
        store: ClientStore,
        val_dataloader: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
    ) -> dict[str, float]:
        """The objective's own metrics (``evaluate_clients``), given these scoring networks when
        its override declares ``scoring``."""
        args = (client_ids, store, val_dataloader, self.device)
        if self._passes_scoring:
            return self.objective.evaluate_clients(*args, scoring=self.networks)
        return self.objective.evaluate_clients(*args)


def _key(index: int) -> str:
    return f"architecture_{index}"


def _scoring_copy(objective: ClientModule, network: nn.Module) -> nn.Module:
    """The objective's scoring module around a copy of ``network`` (the copy is never trained)."""
    return objective.scoring_network(copy.deepcopy(network))
