"""What the cohort backend stacks per client: the objective's tensors after ``begin_client``.

After ``begin_client(cid, payload, state)`` the objective holds client ``cid``'s whole round
context, and :func:`snapshot` reads it as flat dicts of tensors:

- ``params``: every parameter of the objective (the network as dispatched to this client, so
  different payloads per client, e.g. FedCross's, are just different slices of the stack; FML's
  personal model from the client's state);
- ``buffers``: every buffer (BatchNorm running statistics and ``num_batches_tracked``);
- ``context``: the tensors named by the objective's ``round_context`` attributes
  (:attr:`fedlightning.clients.ClientModule.round_context`): a tensor, a dict of tensors (SCAFFOLD's
  ``c - c_i``, FedProx's anchor) or frozen modules (MOON's global and previous models).

:class:`ContextLoss` is the module that ``functional_call`` runs: it binds each client's context
slices into the objective's attributes, calls the objective's own ``local_loss`` and puts the
attributes back, so the same code runs sequentially and under ``vmap``. Other attributes that
``local_loss`` reassigns (running metric sums, e.g. FML's ``personal_train_loss``) are put back
too: under the cohort a client's metrics are its ``train_loss``, the mean of ``local_loss``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule

SEP = "/"  # separates an attribute from a key in context names (never in module paths)


def _context_items(model: ClientModule) -> Iterator[tuple[str, str | None, Any]]:
    for attr in model.round_context:
        value = getattr(model, attr)
        if isinstance(value, dict):
            for key, item in value.items():
                yield attr, str(key), item
        else:
            yield attr, None, value


def _slot(attr: str, key: str | None) -> str:
    return attr if key is None else f"{attr}{SEP}{key}"


class ContextLoss(nn.Module):
    """``forward(batch, context) = objective.local_loss(batch)`` with the context tensors bound.

    Context modules (frozen models) are registered here as submodules ``ctx_*``, so that
    ``functional_call`` swaps their parameters and buffers with each client's slice too."""

    def __init__(self, objective: ClientModule) -> None:
        super().__init__()
        self.objective = objective
        self.context_modules = nn.ModuleDict()
        self.tensor_slots: list[tuple[str, str | None]] = []
        for attr, key, value in _context_items(objective):
            if isinstance(value, nn.Module):
                self.context_modules[_module_name(attr, key)] = value
            elif isinstance(value, Tensor):
                self.tensor_slots.append((attr, key))
            else:
                raise TypeError(
                    f"{type(objective).__name__}.{attr} (round_context) holds "
                    f"{type(value).__name__}: expected tensors or modules"
                )

    def forward(self, batch: tuple[Tensor, Tensor], context: dict[str, Tensor]) -> Tensor:
        objective = self.objective
        saved = {attr: getattr(objective, attr) for attr, _ in self.tensor_slots}
        before = dict(vars(objective))  # side effects of local_loss (metric sums) are undone
        try:
            for attr in saved:
                value = saved[attr]
                if isinstance(value, dict):
                    bound = dict(value)
                    for a, key in self.tensor_slots:
                        if a == attr:
                            bound[key] = context[_slot(a, key)]
                    setattr(objective, attr, bound)
                else:
                    setattr(objective, attr, context[attr])
            return objective.local_loss(batch)
        finally:
            for attr, value in saved.items():
                setattr(objective, attr, value)
            for attr, value in list(vars(objective).items()):
                if attr in before and before[attr] is not value:
                    setattr(objective, attr, before[attr])


def _module_name(attr: str, key: str | None) -> str:
    return "ctx_" + attr.lstrip("_") + ("" if key is None else "_" + key)


def snapshot(
    wrapper: ContextLoss,
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """``(params, buffers, context)`` of the client whose ``begin_client`` ran last, as detached
    copies keyed for ``functional_call`` on ``wrapper`` (context modules' tensors are in
    ``context`` under their ``ctx_*`` module paths)."""
    objective = wrapper.objective
    params = {f"objective.{n}": p.detach().clone() for n, p in objective.named_parameters()}
    buffers = {f"objective.{n}": b.detach().clone() for n, b in objective.named_buffers()}
    context: dict[str, Tensor] = {}
    for attr, key, value in _context_items(objective):
        if isinstance(value, nn.Module):
            prefix = f"context_modules.{_module_name(attr, key)}."
            for n, t in (*value.named_parameters(), *value.named_buffers()):
                context[prefix + n] = t.detach().clone()
        else:
            context[_slot(attr, key)] = value.detach().clone()
    return params, buffers, context
