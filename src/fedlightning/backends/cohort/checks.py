"""The cohort backend's checks that a round's clients can be stacked into one ``local_loss``.

:func:`check_cohort` compares every client's view (:class:`~fedlightning.backends.cohort.state.
ClientView`, taken after its ``begin_client``) with the first client's and refuses, with a
ConfigurationError naming the attribute and the fix, what would make the vectorized ``local_loss``
see one client's value for every client or could not be stacked:

- a number, string or other non-tensor attribute that differs between clients (only tensors and
  modules are stacked; objects other than numbers and strings are compared by identity;
  optimizers, per client by design, are not compared);
- a context tensor, parameter or buffer whose shape or dtype differs, or an attribute set for
  some clients only;
- (:func:`alias_refusal`, at capture) a context tensor that is the module's own parameter or
  buffer, which would be stacked as it was after ``begin_client`` while a sequential fit reads the
  trained value.

They run at every round before any step (per-client state can make clients differ only in later
rounds): a refusal ends the run with exit status 2, never a client failure.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from fedlightning.backends.cohort.context import Path, render
from fedlightning.errors import ConfigurationError

if TYPE_CHECKING:
    from fedlightning.backends.cohort.state import ClientView
    from fedlightning.clients.base import ClientModule

#: values compared by ``==`` between clients (numpy arrays: elementwise; others: by identity)
PLAIN = (type(None), bool, int, float, complex, str, bytes, Enum, np.generic)
PLAIN += (torch.dtype, torch.device)


class CohortRefusal(ConfigurationError):
    """The cohort cannot train this run's clients together (found when their round begins);
    ``auto`` then trains the run sequentially (:class:`~fedlightning.backends.auto.AutoBackend`)."""


def refuse(objective: ClientModule, problem: str, fix: str) -> ConfigurationError:
    """The cohort's refusal of ``objective``: one line naming the problem and the fix."""
    return CohortRefusal(
        f"loop.backend=CohortBackend cannot train {type(objective).__name__}: {problem}: {fix}"
    )


def alias_refusal(objective: ClientModule, path: Path, alias: str) -> ConfigurationError:
    """The refusal of a context tensor at ``path`` that is the objective's own ``alias``."""
    return refuse(
        objective,
        f"self.{render(path)} is (or shares memory with) its own parameter or buffer {alias}, "
        "which the cohort would stack as it was after begin_client while a sequential fit reads "
        "the trained value",
        "store a copy (.detach().clone()) to keep the dispatched value, or read the parameter "
        "through the module in local_loss",
    )


#: the fix when clients' parameters or buffers differ
ARCHITECTURE = "the cohort trains clients of one architecture at once: use the SequentialBackend"
#: the fix when clients' attributes differ in structure
STRUCTURE = "set the same attributes for every client in begin_client (tensors are stacked)"


def check_cohort(objective: ClientModule, views: list[ClientView]) -> None:
    """Refuse (a ConfigurationError naming the attribute and the fix) a cohort whose clients'
    views cannot be stacked into one ``local_loss`` (see the module docstring)."""
    first = views[0]
    for view in views[1:]:
        clients = (first.client_id, view.client_id)
        for kind, a, b in (("parameter", first.params, view.params),
                           ("buffer", first.buffers, view.buffers)):  # fmt: skip
            _same_tensors(objective, _named(a, kind), _named(b, kind), clients, ARCHITECTURE)
        _same_tensors(objective, _rendered(first.tensors), _rendered(view.tensors), clients,
                      "give it one shape and dtype for every client (e.g. pad it)")  # fmt: skip
        _same_keys(objective, _rendered(first.modules), _rendered(view.modules), clients)
        if _groups(first.modules) != _groups(view.modules):
            raise refuse(
                objective,
                f"its modules in {', '.join(_rendered(first.modules))} are the same objects for "
                f"client {clients[0]} but not for client {clients[1]}",
                STRUCTURE,
            )
        for path, tensors in first.module_tensors.items():
            prefix = f"self.{render(path)}."
            a, b = (_named(t, prefix) for t in (tensors, view.module_tensors[path]))
            _same_tensors(objective, a, b, clients, ARCHITECTURE)
        _same_keys(objective, _rendered(first.others), _rendered(view.others), clients)
        for path, value in first.others.items():
            other = view.others[path]
            if not _same(value, other):
                raise _different(objective, path, value, other, clients)


def _named(tensors: dict[str, Tensor], kind: str) -> dict[str, Tensor]:
    separator = "" if kind.endswith(".") else " "
    return {f"{kind}{separator}{name}": tensor for name, tensor in tensors.items()}


def _rendered(values: dict[Path, Any]) -> dict[str, Any]:
    return {f"self.{render(p)}": value for p, value in values.items()}


def _groups(modules: dict[Path, nn.Module]) -> list[int]:
    """For each module path, the index of the first path holding the same module object."""
    objects = list(modules.values())
    return [next(j for j, o in enumerate(objects) if o is m) for m in objects]


def _same_keys(
    objective: ClientModule, a: dict, b: dict, clients: tuple[int, int], fix: str = STRUCTURE
) -> None:
    """Refuse clients whose ``a`` and ``b`` (keyed by display names) name different things."""
    missing = [(name, clients) for name in a if name not in b]
    missing += [(name, clients[::-1]) for name in b if name not in a]
    if missing:
        name, (owner, other) = missing[0]
        raise refuse(
            objective, f"after begin_client, {name} exists for client {owner} but not for client "
            f"{other}", fix,
        )  # fmt: skip


def _same_tensors(
    objective: ClientModule, a: dict[str, Tensor], b: dict[str, Tensor],
    clients: tuple[int, int], fix: str,
) -> None:  # fmt: skip
    _same_keys(objective, a, b, clients, fix)
    for name, tensor in a.items():
        other = b[name]
        if tensor.shape != other.shape or tensor.dtype != other.dtype:
            raise refuse(
                objective,
                f"{name} is {tuple(tensor.shape)} {tensor.dtype} for client {clients[0]} but "
                f"{tuple(other.shape)} {other.dtype} for client {clients[1]}, and the cohort "
                "stacks it across the clients of a round",
                fix,
            )


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.all((a == b) | (a != a)))
    if isinstance(a, PLAIN):
        return bool(a == b) or (a != a and b != b)  # NaN equals NaN here
    return a is b


def _different(
    objective: ClientModule, path: Path, a: Any, b: Any, clients: tuple[int, int]
) -> ConfigurationError:
    if isinstance(a, (*PLAIN, np.ndarray)):
        values = f"{_short(a)} for client {clients[0]} but {_short(b)} for client {clients[1]}"
    else:
        values = f"a different {type(a).__name__} object for clients {clients[0]} and {clients[1]}"
    return refuse(
        objective,
        f"after begin_client, self.{render(path)} is {values}, and the cohort stacks only "
        "tensors and modules: local_loss would see one client's value for every client",
        "hold per-client values in tensors (e.g. torch.tensor(value)), which are stacked",
    )


def _short(value: Any) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."
