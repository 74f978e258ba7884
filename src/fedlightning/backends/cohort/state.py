"""What the cohort backend keeps of each client between its ``begin_client`` and its
``end_client``, how it checks that a cohort can be stacked, and how ``local_loss`` sees a client.

``begin_client`` runs once per client and round. Right after it, :meth:`ClientView.capture` keeps
the client's view of the objective: its own attributes (:mod:`fedlightning.backends.cohort.context`),
with copies of

- ``params``: every parameter (the network as dispatched to this client, so FedCross's different
  payloads are different slices of one stack; FML's personal model from the client's state);
- ``buffers``: every buffer (BatchNorm running statistics and ``num_batches_tracked``);
- the round context: every tensor of the objective's own attributes (SCAFFOLD's ``c - c_i``,
  FedProx's anchor, a user's per-client term, FML's label mask) and the parameters and buffers of
  its unregistered modules (MOON's frozen models). Tensors that are the same for every client are
  stacked too: an objective holds its round context, a few model-sized tensors at most, so one
  copy per client costs what the parameters do.

:func:`~fedlightning.backends.cohort.checks.check_cohort` then refuses, naming the attribute,
what cannot be stacked into one ``local_loss``.

:class:`ContextLoss` is the module that ``functional_call`` runs: it binds each client's context
slices in place of the attributes (in copies of their containers), calls the objective's own
``local_loss`` through its batch metrics and puts the attributes back, so the same code runs
sequentially and under ``vmap`` (and traces whole under ``torch.compile``). While the cohort's
steps run (:meth:`ContextLoss.vectorized`), reading ``self.payload``, ``self.state`` or
``self.client_id`` raises (:mod:`fedlightning.clients.per_client`). After training,
:meth:`ClientView.restore` gives the objective each client's view again before its ``end_client``:
its context as slices of the stacks, except tensors that were the same object, unchanged, for
every client (a run-level table, the payload's weights), which it gets back themselves, so that
the objective keeps them where they were after the round.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from fedlightning.backends.cohort.checks import alias_refusal
from fedlightning.backends.cohort.context import (
    Path,
    context_attributes,
    lightning_attributes,
    prefixes,
    rebuild,
    walk,
)
from fedlightning.clients.per_client import VECTORIZED_FLAG

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule

_MISSING = object()


def _copy(tensor: Tensor) -> Tensor:
    return tensor.detach().clone()


@dataclass
class ClientView:
    """One client's objective after its ``begin_client`` (see the module docstring)."""

    client_id: int
    attributes: dict[str, Any]
    params: dict[str, Tensor]
    buffers: dict[str, Tensor]
    tensors: dict[Path, Tensor] = field(default_factory=dict)
    modules: dict[Path, nn.Module] = field(default_factory=dict)
    module_tensors: dict[Path, dict[str, Tensor]] = field(default_factory=dict)
    others: dict[Path, Any] = field(default_factory=dict)
    #: the context tensors' own objects: the first client's (kept), the others' ids
    origins: dict[Path, Tensor] = field(default_factory=dict)
    origin_ids: dict[Path, int] = field(default_factory=dict)

    @classmethod
    def capture(cls, objective: ClientModule, client_id: int, first: bool) -> ClientView:
        """The view of client ``client_id``, whose ``begin_client`` ran last (``first``: the
        first of its cohort, whose context tensors themselves are kept)."""
        own = vars(objective)
        params, buffers = list(objective.named_parameters()), list(objective.named_buffers())
        view = cls(
            client_id,
            {k: v for k, v in own.items() if k not in lightning_attributes()},
            {n: _copy(p) for n, p in params},
            {n: _copy(b) for n, b in buffers},
        )
        owners = _Owners(objective, params + buffers)
        for name in context_attributes(objective):
            for path, leaf in walk(own[name], (("attr", name),), owners.registered):
                if isinstance(leaf, Tensor):
                    alias = owners.tensor(leaf)
                    if alias is not None:
                        raise alias_refusal(objective, path, alias)
                    view.tensors[path] = _copy(leaf)
                    view.origin_ids[path] = id(leaf)
                    if first:
                        view.origins[path] = leaf
                elif isinstance(leaf, nn.Module):
                    tensors = dict(chain(leaf.named_parameters(), leaf.named_buffers()))
                    alias = next(filter(None, map(owners.tensor, tensors.values())), None)
                    if alias is not None:
                        raise alias_refusal(objective, path, alias)
                    view.modules[path] = leaf
                    view.module_tensors[path] = {n: _copy(t) for n, t in tensors.items()}
                elif not isinstance(leaf, torch.optim.Optimizer):
                    view.others[path] = leaf.copy() if isinstance(leaf, np.ndarray) else leaf
        # the view holds the copies: the client's own tensors are free once the next client begins
        view._bind(view.tensors, prefixes(view.tensors))
        return view

    def _bind(self, leaves: dict[Path, Any], inner: set[Path]) -> None:
        for attr in {path[0][1] for path in leaves}:
            path = (("attr", attr),)
            self.attributes[attr] = rebuild(self.attributes[attr], path, leaves, inner)

    def release(self, leaves: dict[Path, Any], inner: set[Path]) -> None:
        """After stacking: the context leaves become ``leaves`` (slices of the stacks, or the
        tensors themselves where every client had the same), and the copies are freed."""
        self._bind(leaves, inner)
        self.params, self.buffers, self.tensors, self.module_tensors = {}, {}, {}, {}
        self.origins, self.origin_ids = {}, {}

    def restore(self, objective: ClientModule) -> None:
        """Give ``objective`` this client's attributes again (before its ``end_client``)."""
        own = vars(objective)
        framework = lightning_attributes()
        for name in [n for n in own if n not in framework and n not in self.attributes]:
            del own[name]  # set by a later client's begin_client
        own.update(self.attributes)


class _Owners:
    """Which modules and tensors belong to the objective itself (registered), looked up only when
    an attribute holds a module or a tensor."""

    def __init__(self, objective: ClientModule, named: list[tuple[str, Tensor]]) -> None:
        self.objective, self.named = objective, named
        self._modules: set[int] | None = None
        self._tensors: dict[int, str] | None = None
        self._storages: dict[int, str] = {}

    def registered(self, module: nn.Module) -> bool:
        if self._modules is None:
            self._modules = {id(m) for m in self.objective.modules()}
        return id(module) in self._modules

    def tensor(self, tensor: Tensor) -> str | None:
        """The name of the parameter or buffer that ``tensor`` is or shares memory with."""
        if self._tensors is None:
            self._tensors = {id(t): n for n, t in self.named}
            self._storages = {_storage(t): n for n, t in self.named if _storage(t) is not None}
        return self._tensors.get(id(tensor)) or self._storages.get(_storage(tensor))


def _storage(tensor: Tensor) -> int | None:
    """The address of ``tensor``'s memory (``None`` when it has none to share)."""
    if not tensor.numel() or tensor.device.type == "meta":
        return None
    return tensor.untyped_storage().data_ptr()


class ContextLoss(nn.Module):
    """``forward(batch, context) = (loss, tracked values)`` of the objective's own ``local_loss``
    with each context path bound to its ``context`` slice (see the module docstring).

    Context modules are registered here as submodules ``context_modules.m<k>`` (one per module
    object, from the first client's view), so that ``functional_call`` swaps their parameters and
    buffers with each client's slice too."""

    def __init__(self, objective: ClientModule, first: ClientView) -> None:
        super().__init__()
        self.objective = objective
        self.context_modules = nn.ModuleDict()
        self.module_names: dict[Path, str] = {}
        names: dict[int, str] = {}
        for path, module in first.modules.items():
            if id(module) not in names:
                names[id(module)] = f"m{len(names)}"
                self.context_modules[names[id(module)]] = module
            self.module_names[path] = names[id(module)]
        self.tensor_names = {path: f"t{i}" for i, path in enumerate(first.tensors)}
        leaves = [*self.tensor_names, *self.module_names]
        self.attributes = sorted({path[0][1] for path in leaves})
        self.inner = prefixes(leaves)
        self._targets: list[tuple[Tensor, Tensor]] | None = None

    def stack(self, views: list[ClientView], device: torch.device) -> tuple[dict, dict, dict]:
        """``(params, buffers, context)`` stacked over the clients' ``views`` on ``device``, keyed
        for ``functional_call`` on this module; the views then hold slices of them."""

        def stacked(tensors: list[Tensor]) -> Tensor:
            return torch.stack(tensors).to(device)

        params = {f"objective.{k}": stacked([v.params[k] for v in views]) for k in views[0].params}
        buffers = {
            f"objective.{k}": stacked([v.buffers[k] for v in views]) for k in views[0].buffers
        }
        context = {n: stacked([v.tensors[p] for v in views]) for p, n in self.tensor_names.items()}
        first_paths = {name: path for path, name in reversed(self.module_names.items())}
        for name, path in first_paths.items():
            for key in views[0].module_tensors[path]:
                tensors = [v.module_tensors[path][key] for v in views]
                context[f"context_modules.{name}.{key}"] = stacked(tensors)
        shared = self._shared(views, context)
        modules = {p: self.context_modules[n] for p, n in self.module_names.items()}
        for i, view in enumerate(views):
            slices = {p: shared.get(p, context[n][i]) for p, n in self.tensor_names.items()}
            view.release({**slices, **modules}, self.inner)
        return params, buffers, context

    def _shared(self, views: list[ClientView], context: dict[str, Tensor]) -> dict[Path, Tensor]:
        """The context tensors that were the same object, unchanged, for every client (a run-level
        table, the payload's weights): the views get them back themselves rather than slices, so
        that the objective keeps them where they were (device, identity) after the round."""
        first = views[0].origins
        same = [p for p in self.tensor_names if all(v.origin_ids[p] == id(first[p]) for v in views)]
        if not same:
            return {}
        stacks = [context[self.tensor_names[p]] for p in same]
        equal = torch.stack([(s == s[:1]).all() for s in stacks]).tolist()  # one device sync
        return {p: first[p] for p, unchanged in zip(same, equal, strict=True) if unchanged}

    def forward(
        self, batch: tuple[Tensor, Tensor], context: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        # attributes set as Python sets them (``object.__setattr__``: no module registration),
        # which torch.compile traces as it traces local_loss's reads
        objective = self.objective
        saved = dict(vars(objective))
        leaves: dict[Path, Any] = {p: context[n] for p, n in self.tensor_names.items()}
        leaves.update((p, self.context_modules[n]) for p, n in self.module_names.items())
        try:
            for attr in self.attributes:
                value = rebuild(saved[attr], (("attr", attr),), leaves, self.inner)
                object.__setattr__(objective, attr, value)
            return objective.batch_metrics.step(objective.local_loss, batch)
        finally:  # also undoes what local_loss assigned: no vmapped tensor escapes
            own = vars(objective)
            for name in [n for n in own if n not in saved]:
                object.__delattr__(objective, name)
            for name, value in saved.items():
                if own.get(name, _MISSING) is not value:
                    object.__setattr__(objective, name, value)

    @contextmanager
    def vectorized(self) -> Iterator[None]:
        """The block runs ``local_loss`` for every client at once: reading ``self.payload``,
        ``self.state`` or ``self.client_id`` there raises (:data:`VECTORIZED_FLAG`)."""
        setattr(self.objective, VECTORIZED_FLAG, True)
        try:
            yield
        finally:
            delattr(self.objective, VECTORIZED_FLAG)

    def load_client(self, i: int, stacks: dict[str, Tensor]) -> None:
        """Copy client ``i``'s slices of ``stacks`` (parameters, buffers, context modules' tensors)
        into the objective and the context modules."""
        if self._targets is None:  # the same tensors for every client of the cohort
            named = chain(self.named_parameters(), self.named_buffers())
            self._targets = [(tensor, stacks[name]) for name, tensor in named if name in stacks]
        with torch.no_grad():
            for tensor, stacked in self._targets:
                tensor.copy_(stacked[i])
