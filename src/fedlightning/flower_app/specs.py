"""How the server names the client module and the data module to its SuperNodes, and how a node
builds them back: a JSON spec ``{"class_path": ..., "init_args": ...}`` per object, the server's
own class and init args (:class:`~fedlightning.backends.flower.FlowerBackend` sends them,
:mod:`fedlightning.flower_app.client` builds from them).
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from fedlightning.errors import ConfigurationError


def class_spec(obj: Any, what: str) -> dict[str, Any]:
    """``obj``'s class path and init args (its ``hparams``) as a JSON-ready spec; one line naming
    ``what`` when they are not plain JSON values."""
    spec = {
        "class_path": f"{type(obj).__module__}.{type(obj).__qualname__}",
        "init_args": {k: v for k, v in obj.hparams.items() if not k.startswith("_")},
    }
    try:
        json.dumps(spec)
    except TypeError as error:
        raise ConfigurationError(
            f"loop.backend=FlowerBackend sends SuperNodes the {what}'s class and init args as JSON, "
            f"and {type(obj).__name__}'s are not ({error}); pass them as plain values"
        ) from None
    return spec


def instantiate(spec: dict[str, Any]) -> Any:
    """The object a :func:`class_spec` describes, built anew."""
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**spec["init_args"])
