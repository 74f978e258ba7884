"""The privacy spent by a run: accountants for the Poisson-subsampled Gaussian mechanism
(docs/algorithms.md section 7.3).

Both kinds of differential privacy here release, at every step, a sum of contributions each
clipped to L2 norm ``C`` plus Gaussian noise of std ``z C``, over a Poisson sample in which every
unit (a client for client-level DP, a sample for DP-SGD) takes part independently with probability
``q``, under add/remove adjacency. :class:`PrivacyAccountant` keeps the composition as a history of
``(z, q, steps)`` and asks one of three accountants for epsilon at a given delta, each an upper
bound (a sound guarantee):

- ``pld`` (the default: the tightest of the three): Google's dp-accounting ``PLDAccountant``, the
  privacy loss distribution with pessimistic discretisation (Koskela, Jalko, Honkela, AISTATS
  2020; Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, PETS 2022, connect-the-dots) at value
  interval :data:`PLD_INTERVAL`;
- ``prv``: Opacus's ``PRVAccountant`` (Gopi, Lee, Wutschitz, NeurIPS 2021, arXiv:2106.02848), whose
  ``get_epsilon`` is the estimate's upper end: the estimate at ``delta - delta_error`` plus
  ``eps_error`` (0.01);
- ``rdp``: Opacus's ``RDPAccountant`` (Mironov, Talwar, Zhang, arXiv:1908.10530, converted by
  Balle et al.'s bound): sound, the loosest.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fedlightning.errors import ConfigurationError
from fedlightning.privacy.bounds import NOISE_RANGE
from fedlightning.privacy.opacus_extra import require_accountant

#: the accountants, tightest first (the first is the default)
MECHANISMS = ("pld", "prv", "rdp")
DEFAULT = MECHANISMS[0]
#: the library each accountant comes from (named in the run summary)
LIBRARY = {"pld": "dp-accounting", "prv": "Opacus", "rdp": "Opacus"}
#: PLD's value discretisation interval: pessimistic rounding keeps the bound sound at any interval;
#: 1e-3 is within 1e-4 of the library's default 1e-4 on configs/dp_fedavg.yaml at a seventh of
#: the time (docs/algorithms.md section 7.3)
PLD_INTERVAL = 1e-3
#: the calibration of target_epsilon stops when z's bracket is this narrow (relative)
CALIBRATION_TOLERANCE = 1e-3

History = tuple[tuple[float, float, int], ...]


class UnreachableEpsilon(ConfigurationError):
    """No noise multiplier in :data:`~fedlightning.privacy.bounds.NOISE_RANGE` spends as little as
    the target: ``smallest`` is the epsilon at the largest one (the message is one line)."""

    def __init__(self, message: str, smallest: float) -> None:
        super().__init__(message)
        self.smallest = smallest


class PrivacyAccountant:
    """A composition of Poisson-subsampled Gaussian mechanisms and its (epsilon, delta).

    ``history`` is the record Opacus's accountants keep: ``[z, q, steps]`` entries (noise
    multiplier, sampling rate, number of steps), consecutive steps with the same ``(z, q)``
    merged. Lists (not tuples), so that a checkpoint holds plain data. The history is the
    privacy spent; the accountant (``mechanism``) is how it is bounded.

    Args:
        mechanism: ``pld``, ``prv`` or ``rdp`` (module docstring).
        history: the steps taken so far.
    """

    def __init__(self, mechanism: str = DEFAULT, history: Iterable[Sequence[float]] = ()) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(
                f"accountant must be one of {', '.join(MECHANISMS)}, got {mechanism!r}"
            )
        self.mechanism = mechanism
        self.history: list[list[float]] = [[float(z), float(q), int(n)] for z, q, n in history]

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Compose ``steps`` more releases with noise multiplier ``z`` at sampling rate ``q``."""
        if steps <= 0:
            return
        last = self.history[-1] if self.history else None
        if last is not None and last[0] == noise_multiplier and last[1] == sample_rate:
            last[2] += steps
        else:
            self.history.append([float(noise_multiplier), float(sample_rate), int(steps)])

    @property
    def steps(self) -> int:
        """The number of releases composed so far."""
        return sum(int(n) for _, _, n in self.history)

    def epsilon(self, delta: float) -> float:
        """The epsilon of the composition at ``delta`` (0 before the first step):
        :func:`composition_epsilon` of the history."""
        if not self.history:
            return 0.0
        history = tuple((float(z), float(q), int(n)) for z, q, n in self.history)
        return composition_epsilon(self.mechanism, history, float(delta))

    def extends(self, other: PrivacyAccountant) -> bool:
        """Whether this composition is ``other``'s with more steps after it (privacy spent since
        ``other`` was recorded)."""
        if self.mechanism != other.mechanism or self.steps <= other.steps:
            return False
        n = len(other.history)
        if n == 0:
            return True
        head = self.history[: n - 1]
        last_same = self.history[n - 1][:2] == other.history[-1][:2]
        return (
            head == other.history[:-1]
            and last_same
            and self.history[n - 1][2] >= other.history[-1][2]
        )

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "history": [list(h) for h in self.history]}

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any] | None, mechanism: str = DEFAULT
    ) -> PrivacyAccountant:
        """The accountant :meth:`state_dict` described (``None``: a new one with ``mechanism``)."""
        if not state:
            return cls(mechanism)
        return cls(state["mechanism"], state["history"])


@functools.lru_cache(maxsize=1024)
def composition_epsilon(mechanism: str, history: History, delta: float) -> float:
    """Epsilon at ``delta`` of the composition ``history`` (``(z, q, steps)`` triples) by
    ``mechanism``'s accountant (module docstring); cached, as a run asks again for the same
    composition (the summary after the last row, a resume, clients with the same plan).

    A bound below 0 is reported as 0: (epsilon, delta)-DP with epsilon < 0 implies
    (0, delta)-DP, the strongest statement at that delta (Opacus's RDP conversion can go below 0
    at a large delta; PLD never does).
    """
    require_accountant(mechanism, f"the {mechanism} accountant")
    epsilon = {"pld": _pld_epsilon, "prv": _prv_epsilon, "rdp": _rdp_epsilon}[mechanism]
    return max(float(epsilon(history, delta)), 0.0)


def _pld_epsilon(history: History, delta: float) -> float:
    """dp-accounting's ``PLDAccountant`` (add/remove adjacency, pessimistic estimate) composing
    ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` ``steps`` times for each entry."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    accountant = PLDAccountant(value_discretization_interval=PLD_INTERVAL)
    for z, q, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


def _prv_epsilon(history: History, delta: float) -> float:
    """Opacus's ``PRVAccountant.get_epsilon``: the upper end of its estimate, eps_error 0.01
    included."""
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = list(history)
    return accountant.get_epsilon(delta=delta)


def _rdp_epsilon(history: History, delta: float) -> float:
    """Exactly ``RDPAccountant.get_epsilon(delta)`` (its default orders): the sum over the history
    of ``steps * rdp(z, q)`` (:func:`_rdp_per_step`) and Opacus's conversion ``get_privacy_spent``,
    the operations the accountant performs."""
    import numpy as np
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    rdp = sum(np.asarray(_rdp_per_step(z, q)) * n for z, q, n in history)
    epsilon, _ = analysis.get_privacy_spent(
        orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta
    )
    return epsilon


@functools.lru_cache(maxsize=4096)
def _rdp_per_step(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """Opacus's RDP of one step of the sampled Gaussian mechanism at its default orders
    (``compute_rdp(q, z, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)``); cached, as every step
    of a run (and every round of one DP-SGD client) has the same ``(z, q)``."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    rdp = analysis.compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
        orders=RDPAccountant.DEFAULT_ALPHAS,
    )  # fmt: skip
    return tuple(float(v) for v in rdp)


def calibrate_noise(
    target_epsilon: float, delta: float, sample_rate: float, steps: int,
    mechanism: str = DEFAULT, option: str = "target_epsilon",
) -> float:  # fmt: skip
    """The noise multiplier ``z`` that spends at most ``target_epsilon`` at ``delta`` after
    ``steps`` releases at sampling rate ``q``, by the accountant the run reports with
    (:func:`composition_epsilon`), within :data:`~fedlightning.privacy.bounds.NOISE_RANGE`: from
    z = 1, steps of x4 (or /4) bracket the target, then a bisection in log z narrows the bracket to
    :data:`CALIBRATION_TOLERANCE` (relative), or stops when epsilon is within it below the
    target. The smallest z of the range when it already spends at most the target; raises
    :class:`UnreachableEpsilon` naming ``option`` when even the largest spends more.

    One search for every accountant (not Opacus's ``get_noise_multiplier``, which bisects from
    z = 0, where PRV cannot be evaluated, and knows no PLD): the z chosen is the one whose
    reported epsilon is at most the target.
    """

    def spent(z: float) -> float:
        return composition_epsilon(mechanism, ((z, sample_rate, steps),), delta)

    smallest, largest = NOISE_RANGE
    low, high = 1.0, 1.0  # the bracket: spent(low) > target >= spent(high)
    while spent(high) > target_epsilon:
        if high == largest:
            raise UnreachableEpsilon(
                f"{option}={target_epsilon!r} cannot be reached: the smallest epsilon this run "
                f"can spend is {spent(high):.4g} (the {mechanism} accountant at the largest noise "
                f"multiplier allowed, {largest:g}, with q={sample_rate:.4g}, {steps} step(s), "
                f"delta={delta:g})",
                spent(high),
            )
        low, high = high, min(4 * high, largest)
    while low == high:  # high = 1 spends at most the target: find a low that spends more
        if low == smallest:
            return smallest
        low = max(low / 4, smallest)
        if spent(low) <= target_epsilon:
            high = low
    epsilon = spent(high)
    while high / low > 1 + CALIBRATION_TOLERANCE and (
        target_epsilon - epsilon > CALIBRATION_TOLERANCE * target_epsilon
    ):
        middle = math.sqrt(low * high)
        if spent(middle) <= target_epsilon:
            high, epsilon = middle, spent(middle)
        else:
            low = middle
    return high
