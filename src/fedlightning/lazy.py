"""Package attributes imported on first use (PEP 562), so that a package costs only what is used.

``fedlightning``, ``fedlightning.clients``, ``fedlightning.data``, ``fedlightning.loop`` and
``fedlightning.backends`` export classes whose modules import Lightning (about a second of CPU on
top of torch). Their ``__init__`` modules name each public attribute and the module defining it;
:func:`lazy_exports` gives them the module ``__getattr__`` and ``__dir__`` that import that module
the first time the attribute is read (``from fedlightning.clients import FedProx`` works as
before), under :func:`~fedlightning.gc_tuning.gc_paused`. A submodule not imported yet is also
an attribute (``import fedlightning; fedlightning.server.FedAvg``), as after an eager import. So
``fedlightning --version``, ``--help`` and ``list`` and the modules they use import no Lightning
(``benchmarks/startup.py`` times them).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

from fedlightning.gc_tuning import gc_paused


def lazy_exports(
    package: str, modules: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` (its ``__name__``), whose
    public attributes ``modules`` lists by defining module: ``{".fedprox": "FedProx", ...}``, a
    module relative to ``package`` and the space-separated names it defines."""
    exports = {
        name: importlib.util.resolve_name(module, package)
        for module, names in modules.items()
        for name in names.split()
    }

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(_imported(exports[name]), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}"):
            value = _imported(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # the next read is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__, sorted(exports)


def _imported(module: str) -> Any:
    """``module``, imported under :func:`~fedlightning.gc_tuning.gc_paused` unless it is already
    (whose exit counts the frozen objects: a walk over all of them once the process froze its
    imports)."""
    if module in sys.modules:
        return sys.modules[module]
    with gc_paused():
        return importlib.import_module(module)
