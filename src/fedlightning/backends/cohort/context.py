"""An objective's round context, derived from its attributes: what the cohort backend stacks per
client besides the parameters and buffers.

After a client's ``begin_client`` the objective holds that client's round context in its own
instance attributes. :func:`context_attributes` lists those attributes: all of them except the
ones every bare LightningModule has (Lightning's and torch's own) and the base class's bookkeeping
(:attr:`fedlightning.clients.ClientModule.bookkeeping_attributes`). :func:`walk` finds the leaves
of an attribute's value through dicts, lists, tuples and dataclasses:

- a tensor: round context, stacked per client;
- an ``nn.Module`` that is not one of the objective's registered submodules (MOON's frozen
  models): its parameters and buffers are round context;
- anything else (numbers, strings, other objects): must be the same for every client of a cohort
  (:mod:`fedlightning.backends.cohort.state` checks it).

A registered submodule reached through an attribute (an alias) is no leaf: its tensors are stacked
as the objective's own parameters and buffers. :func:`rebuild` puts other leaves in place (each
client's slices while ``local_loss`` runs) in copies of the containers, never mutating the
objective's own containers.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from torch import Tensor, nn

if TYPE_CHECKING:
    from fedlightning.clients.base import ClientModule

#: one step from a value into a container: ``("attr", name)`` (an attribute or a dataclass
#: field) or ``("item", key)`` (a dict key or a list/tuple index)
Step = tuple[str, Any]
#: the steps from the objective to a leaf; the first is ``("attr", <attribute name>)``
Path = tuple[Step, ...]


@functools.cache
def lightning_attributes() -> frozenset[str]:
    """The instance attributes of a bare LightningModule (Lightning's and torch's own)."""
    return frozenset(vars(pl.LightningModule()))


def context_attributes(objective: ClientModule) -> list[str]:
    """The names of ``objective``'s own attributes that can hold round context."""
    skip = lightning_attributes() | objective.bookkeeping_attributes
    return [name for name in vars(objective) if name not in skip]


def render(path: Path) -> str:
    """``path`` as Python would write it after ``self.``: ``_anchor['head.weight']``."""
    text = ""
    for kind, key in path:
        text += (f".{key}" if text else key) if kind == "attr" else f"[{key!r}]"
    return text


def _children(value: Any) -> list[tuple[Step, Any]] | None:
    """The items of a container (``None``: not a container)."""
    if isinstance(value, dict):
        return [(("item", k), v) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [(("item", i), v) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(("attr", f.name), getattr(value, f.name)) for f in dataclasses.fields(value)]
    return None


def walk(
    value: Any,
    path: Path,
    registered: Callable[[nn.Module], bool],
    inside: tuple[int, ...] = (),
) -> Iterator[tuple[Path, Any]]:
    """``(path, leaf)`` for every leaf of ``value`` (see the module docstring); ``registered``
    says whether a module is one of the objective's registered modules. A container met again
    inside itself (a cycle) is not entered twice."""
    if isinstance(value, nn.Module):
        if not registered(value):
            yield path, value
        return
    children = None if isinstance(value, Tensor) else _children(value)
    if children is None:
        yield path, value
        return
    if id(value) in inside:
        return
    for step, child in children:
        yield from walk(child, (*path, step), registered, (*inside, id(value)))


def prefixes(paths: Any) -> set[Path]:
    """Every proper prefix of the ``paths``: the containers :func:`rebuild` copies."""
    return {path[:n] for path in paths for n in range(1, len(path))}


def rebuild(value: Any, path: Path, leaves: dict[Path, Any], inner: set[Path]) -> Any:
    """``value`` (found at ``path``) with the leaf at each path of ``leaves`` replaced by its
    value there; the containers on the way (``inner``: :func:`prefixes`) are copied."""
    if path in leaves:
        return leaves[path]
    if path not in inner:
        return value
    if isinstance(value, tuple):
        items = [rebuild(v, (*path, ("item", i)), leaves, inner) for i, v in enumerate(value)]
        return type(value)(*items) if hasattr(type(value), "_fields") else type(value)(items)
    # a plain dict or list copied by its constructor (which torch.compile traces), others by copy
    new = type(value)(value) if type(value) in (dict, list) else copy.copy(value)
    for step, child in _children(value) or ():
        step_path = (*path, step)
        if step_path in leaves or step_path in inner:
            item = rebuild(child, step_path, leaves, inner)
            if step[0] == "item":
                new[step[1]] = item
            else:  # a dataclass field (frozen ones too)
                object.__setattr__(new, step[1], item)
    return new
