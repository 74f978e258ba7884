"""What a backend that ships the objective to other processes (Ray) cannot send: the attribute
that does not pickle, named before any worker starts (docs/algorithms.md section 1, "Objectives
a backend cannot run").

Pickling the whole objective says only ``cannot pickle '_thread.lock' object``; the search below
pickles the parts of the one that failed (an object's attributes as its ``__getstate__`` gives
them, a module's submodules, parameters and buffers, a dict's values, a list's items) and
descends into the first that fails until none of its parts does: that part is the attribute to
name (``self.guard``, ``self.net.head.cache['x']``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fedlightning.errors import ConfigurationError

#: torch.nn.Module's own dicts, whose entries read as attributes (``self.net.fc``)
_MODULE_DICTS = ("_modules", "_parameters", "_buffers")


def unpicklable_part(
    value: Any, dumps: Callable[[Any], bytes], path: str = "self"
) -> tuple[str, Any, Exception] | None:
    """``(path, part, error)`` for the innermost part of ``value`` that ``dumps`` cannot pickle,
    or None when ``value`` pickles.

    >>> import pickle, threading
    >>> class Holder:
    ...     def __init__(self):
    ...         self.ok, self.items = 1, {"lock": threading.Lock()}
    >>> path, part, _ = unpicklable_part(Holder(), pickle.dumps)
    >>> path, type(part).__name__
    ("self.items['lock']", 'lock')
    """
    try:
        dumps(value)
    except Exception as error:  # noqa: BLE001 (any pickling failure: TypeError, PicklingError...)
        return _innermost(value, dumps, path, error, {id(value)})
    return None


def _innermost(
    value: Any, dumps: Callable[[Any], bytes], path: str, error: Exception, seen: set[int]
) -> tuple[str, Any, Exception]:
    for child_path, child in _parts(value, path):
        if id(child) in seen:
            continue
        seen.add(id(child))
        try:
            dumps(child)
        except Exception as child_error:  # noqa: BLE001
            return _innermost(child, dumps, child_path, child_error, seen)
    return path, value, error


def _parts(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}[{key!r}]", item
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield f"{path}[{index}]", item
    elif isinstance(state := _pickled_state(value), dict):
        for name, item in state.items():
            if name in _MODULE_DICTS and isinstance(item, dict):
                for key, inner in item.items():
                    yield f"{path}.{key}", inner
            else:
                yield f"{path}.{name}", item


def _pickled_state(value: Any) -> object:
    """What pickling ``value`` sends of it: ``__getstate__()`` (Lightning's leaves out the
    trainer), None for an object without one or whose state cannot be read."""
    getstate = getattr(value, "__getstate__", None)
    if getstate is None or isinstance(value, type):
        return None
    try:
        return getstate()
    except Exception:  # noqa: BLE001 (a __getstate__ that refuses: the object is the part)
        return None


def refuse_unpicklable(model: Any, dumps: Callable[[Any], bytes], backend: str) -> None:
    """Raise a ConfigurationError naming the attribute of ``model`` that ``dumps`` cannot pickle,
    which ``backend`` must send to its workers; nothing when the objective pickles."""
    found = unpicklable_part(model, dumps)
    if found is None:
        return
    path, part, error = found
    kind = type(part)
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    raise ConfigurationError(
        f"loop.backend={backend} sends the objective to its worker processes by pickling, and "
        f"model={type(model).__name__}'s attribute {path} ({kind.__module__}.{kind.__qualname__}) "
        f"cannot be pickled ({reason}): "
        "create it where it is used (begin_client, local_loss), leave it out of __getstate__, "
        "or use a backend that trains in this process (fedlightning.backends.SequentialBackend)"
    )
