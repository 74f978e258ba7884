"""Cheap fingerprints of Python values: whether an attribute changed between two moments, without
reading a tensor's data (docs/algorithms.md section 2.6, "State either declared or refused").

The state contract of plug-ins (an aggregator's state declared with ``add_state``, a client
objective's per-client state returned by ``end_client``) is checked by comparing fingerprints of
their instance attributes before and after a round: :mod:`fedlightning.server.state_watch` for
aggregators, :mod:`fedlightning.clients.round_watch` for client objectives.

A fingerprint is an equality-comparable value built from

- a tensor: its identity and its version counter (every in-place write, ``t += 1`` or
  ``t[i] = x``, bumps it), never its data;
- a number, string, bytes, ``None``: the value itself;
- a dict, list, tuple, set, deque or dataclass: the fingerprints of its items, in order;
- a random generator (torch, ``random``, numpy): its state (a stream drawn from across rounds is
  state too);
- a NumPy array: its shape, dtype and a hash of its bytes;
- an ``nn.Module``: its parameters' and buffers' fingerprints, or with ``modules=False`` only its
  identity (a client objective's frozen models are loaded in place for every client: round
  context, not state);
- a function, method or class: its identity;
- any other object: its identity and the fingerprint of its ``__dict__``.

Containers are compared by content, not identity: rebinding an attribute to an equal list is no
change. Cycles are followed once; nesting deeper than :data:`MAX_DEPTH` counts by identity.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import types
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

#: how deep containers and objects are followed (deeper values count by identity)
MAX_DEPTH = 8
_ATOMS = (int, float, complex, str, bytes, bool, type(None))
_REFS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, torch.dtype,
         torch.device)  # fmt: skip


def fingerprint(value: Any, modules: bool = True) -> Hashable:
    """The fingerprint of ``value`` (see the module docstring)."""
    return _fingerprint(value, modules, 0, frozenset())


def _fingerprint(value: Any, modules: bool, depth: int, path: frozenset[int]) -> Hashable:
    if isinstance(value, Tensor):  # first: the most common leaf
        return ("tensor", id(value), _version(value))
    if isinstance(value, _ATOMS):
        return value
    if isinstance(value, _REFS) or depth >= MAX_DEPTH or id(value) in path:
        return ("ref", id(value))
    path = path | {id(value)}
    inner = _items(value, modules)
    if inner is None:
        return ("ref", id(value))
    kind, items = inner
    return (kind, *(_fingerprint(item, modules, depth + 1, path) for item in items))


def _items(value: Any, modules: bool) -> tuple[str, list[Any]] | None:
    """What a value's fingerprint is made of: a kind and the items to fingerprint."""
    if isinstance(value, dict):
        return "dict", [*value.keys(), *value.values()]
    if isinstance(value, list | tuple | collections.deque):
        return type(value).__name__, list(value)
    if isinstance(value, set | frozenset):
        return "set", sorted(value, key=repr)
    if isinstance(value, nn.Module):
        if not modules:
            return None
        return "module", [t for _, t in [*value.named_parameters(), *value.named_buffers()]]
    if isinstance(value, torch.Generator):
        return "generator", [hash(bytes(value.get_state().tolist()))]
    if isinstance(value, random.Random):
        return "random", [value.getstate()]
    if isinstance(value, np.random.Generator):
        return "numpy-generator", [value.bit_generator.state]
    if isinstance(value, np.random.RandomState):
        return "numpy-randomstate", [value.get_state(legacy=False)]
    if isinstance(value, np.ndarray):
        return "ndarray", [value.shape, str(value.dtype), hash(value.tobytes())]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "dataclass", [getattr(value, f.name) for f in dataclasses.fields(value)]
    if hasattr(value, "__dict__"):
        return "object", [id(value), vars(value)]
    return None


def _version(tensor: Tensor) -> int | None:
    try:
        return tensor._version  # bumped by every in-place write (autograd's counter)
    except RuntimeError:  # an inference-mode tensor has no version counter
        return None
