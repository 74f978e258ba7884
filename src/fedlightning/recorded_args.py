"""Constructor arguments recorded at construction: what a plug-in object was built with.

A run's configuration (:mod:`fedlightning.run_config`) describes an aggregator or a backend made
in Python by the arguments its constructor was called with, never by the attributes it happens to
keep: an option passed through ``**kwargs`` to a parent class, or kept under another name, would
otherwise be missed (a changed ``weighting`` of a ``**kwargs`` plug-in resumed silently).

:class:`RecordsInitArgs` is a base class whose ``__new__`` binds each constructor call to the
``__init__`` signature, fills in the defaults and, where ``__init__`` takes ``**kwargs``, follows
them to the next ``__init__`` up the class hierarchy (its parameters and defaults join the record),
as jsonargparse resolves ``**kwargs`` for the CLI. So ``ServerNesterov(beta=0.5, weighting=
"uniform")`` with ``def __init__(self, beta=0.5, **kwargs): super().__init__(**kwargs)`` records
``beta``, ``weighting`` and every other ``FedAvg`` argument with its default, the same set the CLI
shows for it.
"""

from __future__ import annotations

import inspect
from typing import Any


class RecordsInitArgs:
    """Base class: :func:`recorded_init_args` returns the arguments an instance was built with."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__new__(cls)
        instance._init_args = bind_init_args(cls, args, kwargs)
        return instance


def recorded_init_args(obj: Any) -> dict[str, Any] | None:
    """The constructor arguments ``obj`` recorded (``None``: not a :class:`RecordsInitArgs`)."""
    recorded = vars(obj).get("_init_args") if hasattr(obj, "__dict__") else None
    return dict(recorded) if isinstance(recorded, dict) else None


def bind_init_args(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``{name: value}`` of a call ``cls(*args, **kwargs)``, defaults filled in, ``**kwargs``
    followed up ``cls.__mro__`` (see the module docstring).

    A call that does not bind (the constructor will raise its own TypeError), or ``**kwargs`` that
    no parent ``__init__`` takes (a class that consumes them itself), keeps the remaining
    arguments as given, so nothing passed is ever dropped."""
    recorded: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        if klass is object:
            break
        try:
            signature = inspect.signature(init)
            bound = signature.bind(None, *args, **kwargs)
        except (TypeError, ValueError):
            recorded.update({f"*{i}": value for i, value in enumerate(args)})
            recorded.update({k: v for k, v in kwargs.items() if k not in recorded})
            break
        bound.apply_defaults()
        forwarded: dict[str, Any] | None = None
        args = ()
        for name, parameter in list(signature.parameters.items())[1:]:  # [0] is self
            value = bound.arguments.get(name)
            if parameter.kind is parameter.VAR_KEYWORD:
                forwarded = dict(value or {})
            elif parameter.kind is parameter.VAR_POSITIONAL:
                args = tuple(value or ())
            else:
                recorded.setdefault(name, value)
        if forwarded is None:  # no **kwargs: the parents get nothing of this call
            if args:
                recorded.update({f"*{i}": value for i, value in enumerate(args)})
            break
        kwargs = forwarded
    return recorded
