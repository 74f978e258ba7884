"""Opacus is an optional extra: every differential-privacy feature asks for it here first, so that
without it a run stops with one line naming the extra (docs/algorithms.md section 7)."""

from __future__ import annotations

from fedlightning.errors import ConfigurationError

#: how to install what the privacy features need
INSTALL = "pip install 'fedlightning[privacy]'"


def require_opacus(feature: str) -> None:
    """Raise a one-line ConfigurationError naming ``feature`` and the extra unless Opacus
    imports."""
    try:
        import opacus  # noqa: F401
    except ImportError:
        raise ConfigurationError(f"{feature} needs Opacus: {INSTALL}") from None
