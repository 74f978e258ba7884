"""Epsilon computed by the accountant libraries called directly, not through
``fedlightning.privacy``: the independent references the privacy tests compare the library's
reported epsilon with (docs/algorithms.md section 7.3)."""

from __future__ import annotations

import dp_accounting
from dp_accounting.pld import PLDAccountant
from opacus.accountants import PRVAccountant, RDPAccountant

#: Opacus's PRV error bound (its get_epsilon's eps_error default)
PRV_EPS_ERROR = 0.01


def pld_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """dp-accounting's PLD accountant (interval 1e-3, pessimistic) on ``(z, q, steps)`` entries."""
    accountant = PLDAccountant(value_discretization_interval=1e-3)
    for z, q, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


def opacus_epsilon(mechanism: str, history: list[tuple[float, float, int]], delta: float) -> float:
    """Opacus's ``RDPAccountant`` or ``PRVAccountant`` on the same history."""
    accountant = {"rdp": RDPAccountant, "prv": PRVAccountant}[mechanism]()
    accountant.history = list(history)
    return accountant.get_epsilon(delta)
