"""Server state declared once (as torchmetrics' ``add_state``): :class:`StateSpec` says how one
named state_dict of an aggregator starts; :class:`Declarations` holds an aggregator's specs,
builds them at ``setup`` and checks a checkpoint's state against them at ``load_state_dict``
(docs/algorithms.md section 2.6).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from fedlightning.errors import ConfigurationError
from fedlightning.protocol import StateDict
from fedlightning.server.functional import clone_state

#: how a declared state starts: a named rule, or ``init(initial, parameters) -> StateDict``
StateInit = (
    Literal["model", "parameters", "floating"] | Callable[[StateDict, frozenset[str]], StateDict]
)
INITS = ("model", "parameters", "floating")
#: state_dict entries that every aggregator writes besides its declared states
RESERVED = frozenset({"num_clients"})


@dataclass(frozen=True)
class StateSpec:
    """One declared state: ``name`` (the attribute and the checkpoint entry) and how it starts.

    ``init``: ``"model"`` (a copy of the initial server state), ``"parameters"`` (``fill`` like
    each trainable parameter), ``"floating"`` (``fill`` like every floating entry, parameters and
    float buffers), or a callable ``init(initial, parameters) -> StateDict``. Built on the device
    of ``initial`` (the server device).
    """

    name: str
    init: StateInit
    fill: float = 0.0

    def build(self, initial: StateDict, parameters: frozenset[str]) -> StateDict:
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
        return dict(self.init(initial, parameters))  # type: ignore[operator]

    def describe(self) -> str:
        if callable(self.init):
            return f"built by {getattr(self.init, '__qualname__', repr(self.init))}"
        if self.init == "model":
            return "a copy of the initial server model"
        what = "trainable parameter" if self.init == "parameters" else "floating entry"
        return f"{self.fill!r} like each {what}"


@dataclass
class Declarations:
    """An aggregator's declared states, in declaration order; ``allocated`` once ``setup`` built
    them (a checkpoint is then checked against their key sets and shapes)."""

    specs: dict[str, StateSpec] = field(default_factory=dict)
    allocated: bool = False

    def add(self, owner: str, name: str, init: StateInit, fill: float) -> None:
        if not name.isidentifier() or name.startswith("_") or name in RESERVED:
            raise ValueError(
                f"{owner}.add_state: name {name!r} must be a public identifier other than "
                f"{', '.join(sorted(RESERVED))}"
            )
        if name in self.specs:
            raise ValueError(f"{owner}.add_state: {name!r} is already declared")
        if not callable(init) and init not in INITS:
            raise ValueError(
                f"{owner}.add_state({name!r}): init must be one of {', '.join(INITS)} or a "
                f"callable (initial, parameters) -> state_dict, got {init!r}"
            )
        if init == "model" and fill != 0.0:
            raise ValueError(f"{owner}.add_state({name!r}): fill applies to 'parameters' and "
                             "'floating', not to 'model'")  # fmt: skip
        self.specs[name] = StateSpec(name, init, float(fill))

    def check(
        self, owner: str, loaded: Mapping[str, Any], current: Mapping[str, StateDict]
    ) -> None:
        """Raise a ConfigurationError naming the state and the key where ``loaded`` (a
        checkpoint's aggregator state) does not fit the declaration: a declared state missing,
        or, once allocated, a different key set or a different shape than ``current``."""
        for name in self.specs:
            if name not in loaded:
                raise ConfigurationError(
                    f"the checkpoint's {owner} state has no {name!r} (declared by {owner}: "
                    f"{self.specs[name].describe()}); resume with the aggregator that wrote it"
                )
            if not self.allocated:
                continue
            state, expected = loaded[name], current[name]
            missing = [k for k in expected if k not in state]
            extra = [k for k in state if k not in expected]
            if missing or extra:
                where = "is missing" if missing else "is not in this run's server model"
                raise ConfigurationError(
                    f"the checkpoint's {owner} state {name}[{(missing or extra)[0]!r}] {where}: "
                    "it was written for another model"
                )
            for key, value in state.items():
                if tuple(value.shape) != tuple(expected[key].shape):
                    raise ConfigurationError(
                        f"the checkpoint's {owner} state {name}[{key!r}] has shape "
                        f"{tuple(value.shape)}, this run's {tuple(expected[key].shape)}: it was "
                        "written for another model"
                    )
