"""The privacy extra is optional: every differential-privacy feature asks for the libraries it
stands on here first (Opacus: DP-SGD's optimizer and sampler, the ``prv`` and ``rdp``
accountants; Google's dp-accounting: the ``pld`` accountant), so that without them a run stops
with one line naming the extra (docs/algorithms.md section 7)."""

from __future__ import annotations

import importlib

from fedlightning.errors import ConfigurationError

#: how to install what the privacy features need
INSTALL = "pip install 'fedlightning[privacy]'"


def require_opacus(feature: str) -> None:
    """Raise a one-line ConfigurationError naming ``feature`` and the extra unless Opacus
    imports."""
    _require("opacus", "Opacus", feature)


def require_accountant(mechanism: str, feature: str) -> None:
    """The same for the library of accountant ``mechanism`` (``pld``: dp-accounting)."""
    if mechanism == "pld":
        _require("dp_accounting", "Google's dp-accounting", feature)
    else:
        require_opacus(feature)


def _require(module: str, name: str, feature: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigurationError(f"{feature} needs {name}: {INSTALL}") from None
