"""Server state declared once (as torchmetrics' ``add_state``): :class:`StateSpec` says how one
named state of an aggregator starts and what it may hold; :class:`Declarations` holds an
aggregator's specs, builds them at ``setup`` and says where a value (a checkpoint's, or the state
after a round) breaks its declaration (docs/algorithms.md section 2.6).

A declared state is one of

- a state_dict built from the initial server state: ``"model"`` (a copy), ``"parameters"``
  (``fill`` like each trainable parameter), ``"floating"`` (``fill`` like every floating entry),
  or a callable ``init(initial, parameters) -> StateDict``; its key set, shapes, dtypes and device
  are those it was built with;
- a Python number (``0``, ``1.0``, ``True``): an int, float or bool it stays (a step counter);
- ``None``: an optional number, ``None`` until it is set (the round a target was reached);
- a tensor (e.g. a 0-dim counter): a copy on the server device, whose shape, dtype and device it
  keeps;
- an empty list (``[]``), to which the aggregator appends (FedCross's K middleware models,
  client-level DP's privacy history): a list it stays;
- an empty dict (``{}``), a table the owner fills (per client, per key): a dict it stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from fedlightning.protocol import StateDict
from fedlightning.server.functional import clone_state

#: how a declared state starts: a named rule, ``init(initial, parameters) -> StateDict``, a
#: number, ``None`` (an optional number), a tensor, an empty list or an empty dict
StateInit = (
    Literal["model", "parameters", "floating"]
    | Callable[[StateDict, frozenset[str]], StateDict]
    | bool | int | float | None | Tensor | list | dict
)  # fmt: skip
#: the kind built from the initial server state (the others are values: :attr:`StateSpec.kind`)
STATE_DICT = "state_dict"
INITS = ("model", "parameters", "floating")
#: state_dict entries that every aggregator writes besides its declared states
RESERVED = frozenset({"num_clients"})
_NUMBER = (bool, int, float)
#: a value kind -> the Python types its value may have, and how a message names them
_VALUE_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "number": (_NUMBER, "a Python number"),
    "optional": (_NUMBER, "None or a Python number"),
    "list": ((list,), "a list"),
    "dict": ((dict,), "a dict"),
}


def clone_value(value: Any) -> Any:
    """A copy of a state value that later in-place updates cannot reach: tensors cloned,
    dicts and lists copied (recursively), numbers and other leaves as they are."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: clone_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone_value(v) for v in value]
    return value


def _layout(tensor: Tensor) -> tuple[str, tuple[int, ...], torch.device]:
    return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tensor.device


def _describe(layout: tuple[str, tuple[int, ...], torch.device]) -> str:
    dtype, shape, device = layout
    return f"{dtype} {shape} on {device}"


@dataclass(frozen=True)
class StateSpec:
    """One declared state: ``name`` (the attribute and the checkpoint entry), how it starts
    (``init``, ``fill``) and whether an undone round restores it (``rollback``); module
    docstring."""

    name: str
    init: Any
    fill: float = 0.0
    rollback: bool = True

    @property
    def kind(self) -> str:
        """``state_dict``, ``number``, ``optional`` (a number or None), ``tensor``, ``list`` or
        ``dict``."""
        if isinstance(self.init, Tensor):
            return "tensor"
        if isinstance(self.init, _NUMBER):
            return "number"
        if self.init is None:
            return "optional"
        if isinstance(self.init, list):
            return "list"
        if isinstance(self.init, dict):
            return "dict"
        return STATE_DICT

    def build(self, initial: StateDict, parameters: frozenset[str]) -> Any:
        """The state's value at ``setup``, on the device of ``initial`` (the server device)."""
        if self.kind == "tensor":
            device = next(iter(initial.values())).device if initial else None
            return self.init.detach().to(device, copy=True)
        if self.kind in ("number", "optional"):
            return self.init
        if self.kind in ("list", "dict"):
            return type(self.init)()
        if self.init == "model":
            return clone_state(initial)
        if self.init == "parameters":
            return {k: torch.full_like(v, self.fill) for k, v in initial.items() if k in parameters}
        if self.init == "floating":
            return {
                k: torch.full_like(v, self.fill)
                for k, v in initial.items()
                if v.is_floating_point()
            }
        return dict(self.init(initial, parameters))

    def describe(self) -> str:
        """How the state starts, in words (the run's identity, the docs)."""
        kept = "" if self.rollback else " (kept when a round is undone)"
        if self.kind == "tensor":
            dtype, shape, _ = _layout(self.init)
            values = f" {self.init.tolist()!r}" if self.init.numel() <= 8 else ""
            return f"the {dtype} {shape} tensor{values}" + kept
        if self.kind == "number":
            return f"the number {self.init!r}" + kept
        if self.kind == "optional":
            return "None (an optional number)" + kept
        if self.kind in ("list", "dict"):
            return f"an empty {self.kind}" + kept
        if callable(self.init):
            return f"built by {getattr(self.init, '__qualname__', repr(self.init))}" + kept
        if self.init == "model":
            return "a copy of the initial server model" + kept
        what = "trainable parameter" if self.init == "parameters" else "floating entry"
        return f"{self.fill!r} like each {what}" + kept

    def layout(self, value: Any) -> Any:
        """What of ``value`` its declaration fixes: per key the dtype, shape and device (a
        state_dict), the tensor's, or its kind (a number, an optional number, a list, a dict)."""
        if self.kind == STATE_DICT:
            return {k: _layout(v) for k, v in value.items()}
        if self.kind == "tensor":
            return _layout(value)
        return self.kind

    def mismatch(self, value: Any, expected: Any) -> str | None:
        """Where ``value`` breaks the layout ``expected`` (from :meth:`layout` at set-up), as
        ``name['key'] <what>``, or None."""
        if self.kind == STATE_DICT:
            if not isinstance(value, Mapping):
                return f"{self.name} is a {type(value).__name__}, declared a state_dict"
            for key in [k for k in expected if k not in value][:1]:
                return f"{self.name}[{key!r}] is missing"
            for key in [k for k in value if k not in expected][:1]:
                return f"{self.name}[{key!r}] is not a key of the declared state"
            for key, tensor in value.items():
                if not isinstance(tensor, Tensor):
                    return f"{self.name}[{key!r}] is a {type(tensor).__name__}, not a tensor"
                if _layout(tensor) != expected[key]:
                    return (f"{self.name}[{key!r}] is {_describe(_layout(tensor))}, declared "
                            f"{_describe(expected[key])}")  # fmt: skip
            return None
        if self.kind == "tensor":
            if not isinstance(value, Tensor):
                return f"{self.name} is a {type(value).__name__}, declared a tensor"
            if _layout(value) != expected:
                return f"{self.name} is {_describe(_layout(value))}, declared {_describe(expected)}"
            return None
        if self.kind == "optional" and value is None:
            return None
        wanted, article = _VALUE_KINDS[self.kind]
        if not isinstance(value, wanted):
            return f"{self.name} is a {type(value).__name__}, declared {article}"
        return None


@dataclass
class Declarations:
    """An aggregator's declared states, in declaration order, and the layout each was built with
    (``layouts``, once ``setup`` built them)."""

    specs: dict[str, StateSpec] = field(default_factory=dict)
    layouts: dict[str, Any] = field(default_factory=dict)

    def add(self, owner: str, name: str, init: StateInit, fill: float, rollback: bool) -> None:
        if not name.isidentifier() or name.startswith("_") or name in RESERVED:
            raise ValueError(
                f"{owner}.add_state: name {name!r} must be a public identifier other than "
                f"{', '.join(sorted(RESERVED))}"
            )
        if name in self.specs:
            raise ValueError(f"{owner}.add_state: {name!r} is already declared")
        known = isinstance(init, (Tensor, *_NUMBER)) or init is None or init in INITS
        if not (known or callable(init) or (isinstance(init, list | dict) and not init)):
            raise ValueError(
                f"{owner}.add_state({name!r}): init must be one of {', '.join(INITS)}, a callable "
                f"(initial, parameters) -> state_dict, a number, None, a tensor, [] or {{}}, got "
                f"{init!r}"
            )
        if fill != 0.0 and init not in ("parameters", "floating"):
            raise ValueError(f"{owner}.add_state({name!r}): fill applies to 'parameters' and "
                             "'floating' only")  # fmt: skip
        self.specs[name] = StateSpec(name, init, float(fill), rollback)

    def build(self, initial: StateDict, parameters: frozenset[str]) -> dict[str, Any]:
        """Every state's value at set-up (and its layout, kept for :meth:`mismatch`)."""
        values = {name: spec.build(initial, parameters) for name, spec in self.specs.items()}
        self.layouts = {name: self.specs[name].layout(v) for name, v in values.items()}
        return values

    def mismatch(self, values: Mapping[str, Any]) -> str | None:
        """The first place where ``values`` (state name -> value) breaks a declaration: a state
        missing, or one whose layout differs from the one it was built with; None if none."""
        for name, spec in self.specs.items():
            if name not in values:
                return f"{name} (declared: {spec.describe()}) is missing"
            if name in self.layouts:
                problem = spec.mismatch(values[name], self.layouts[name])
                if problem is not None:
                    return problem
        return None
