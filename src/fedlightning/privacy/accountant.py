"""The privacy spent by a run: Opacus's accountants for the Poisson-subsampled Gaussian mechanism
(docs/algorithms.md section 7.3).

Both kinds of differential privacy here release, at every step, a sum of contributions each
clipped to L2 norm ``C`` plus Gaussian noise of std ``z C``, over a Poisson sample in which every
unit (a client for client-level DP, a sample for DP-SGD) takes part independently with probability
``q``. That is the sampled Gaussian mechanism Opacus's accountants analyse (Mironov, Talwar and
Zhang, "Renyi Differential Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530, for
``rdp``; Gopi, Lee and Wutschitz, NeurIPS 2021, arXiv:2106.02848, for ``prv``), under add/remove
adjacency. :class:`PrivacyAccountant` keeps the composition as Opacus keeps it, a history of
``(z, q, steps)``, and asks Opacus for epsilon at a given delta.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fedlightning.privacy.opacus_extra import require_opacus

#: Opacus's accountants this library reports with
MECHANISMS = ("rdp", "prv")


class PrivacyAccountant:
    """A composition of Poisson-subsampled Gaussian mechanisms and its (epsilon, delta).

    ``history`` is Opacus's own record: ``[z, q, steps]`` entries (noise multiplier, sampling
    rate, number of steps), consecutive steps with the same ``(z, q)`` merged, as
    ``opacus.accountants.RDPAccountant.step`` merges them. Lists (not tuples), so that a
    checkpoint holds plain data.

    Args:
        mechanism: ``rdp`` (Opacus's RDPAccountant) or ``prv`` (its PRVAccountant).
        history: the steps taken so far.
    """

    def __init__(self, mechanism: str = "rdp", history: Iterable[Sequence[float]] = ()) -> None:
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
        """The epsilon of the composition at ``delta`` (0 before the first step), by Opacus.

        ``rdp``: exactly ``RDPAccountant.get_epsilon(delta)`` (its default orders), with the
        per-step Renyi divergence of each ``(z, q)`` computed once per process
        (:func:`_rdp_per_step`): the sum over the history of ``steps * rdp(z, q)`` and Opacus's
        conversion ``get_privacy_spent``, the same operations the accountant performs.
        ``prv``: ``PRVAccountant.get_epsilon(delta)``.
        """
        if not self.history:
            return 0.0
        require_opacus("the privacy accountant")
        if self.mechanism == "rdp":
            import numpy as np
            from opacus.accountants import RDPAccountant
            from opacus.accountants.analysis import rdp as analysis

            rdp = sum(np.asarray(_rdp_per_step(z, q)) * n for z, q, n in self.history)
            eps, _ = analysis.get_privacy_spent(
                orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta
            )
            return float(eps)
        from opacus.accountants import create_accountant

        accountant = create_accountant(self.mechanism)
        accountant.history = [(z, q, int(n)) for z, q, n in self.history]
        return float(accountant.get_epsilon(delta=delta))

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
        cls, state: Mapping[str, Any] | None, mechanism: str = "rdp"
    ) -> PrivacyAccountant:
        """The accountant :meth:`state_dict` described (``None``: a new one with ``mechanism``)."""
        if not state:
            return cls(mechanism)
        return cls(state["mechanism"], state["history"])


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
    target_epsilon: float, delta: float, sample_rate: float, steps: int, mechanism: str = "rdp"
) -> float:
    """The noise multiplier ``z`` that spends at most ``target_epsilon`` at ``delta`` after
    ``steps`` releases at sampling rate ``q``: Opacus's ``get_noise_multiplier`` (a bisection on
    the accountant's epsilon to 0.01 below the target)."""
    require_opacus("target_epsilon")
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
            steps=steps, accountant=mechanism,
        )
    )  # fmt: skip
