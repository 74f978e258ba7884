"""The privacy accountant (docs/algorithms.md section 7.3) against computations that do not go
through it: the Renyi divergence of the sampled Gaussian mechanism at integer orders written out
by hand (Mironov, Talwar and Zhang, arXiv:1908.10530, section 3.3), the exact privacy curve of the
Gaussian mechanism in closed form (q = 1), and Opacus's accountant classes called directly."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("opacus")
from opacus.accountants import PRVAccountant, RDPAccountant

from fedlightning.privacy import PrivacyAccountant, calibrate_noise

SETTINGS = [(0.5, 1.0, 4, 1e-5), (0.1, 1.1, 60, 1e-3), (0.03, 0.8, 500, 1e-5), (1.0, 2.0, 10, 1e-5)]


def hand_rdp(q: float, sigma: float, alpha: int) -> float:
    """RDP at integer order alpha of one step: ``log(A_alpha) / (alpha - 1)``,
    ``A_alpha = sum_k C(alpha, k) (1 - q)^(alpha - k) q^k exp((k^2 - k) / (2 sigma^2))``."""
    logs = [
        math.log(math.comb(alpha, k)) + (math.log(1 - q) * (alpha - k) if k < alpha else 0.0)
        + k * math.log(q)
        + (k * k - k) / (2 * sigma**2)
        for k in range(alpha + 1)
        if q < 1 or k == alpha  # q = 1: only k = alpha has (1 - q)^0
    ]  # fmt: skip
    top = max(logs)
    return (top + math.log(sum(math.exp(v - top) for v in logs))) / (alpha - 1)


def hand_epsilon(q: float, sigma: float, steps: int, delta: float, orders: range) -> float:
    """min over ``orders`` of the RDP-to-DP conversion of Balle et al. (arXiv:1905.09982, Thm 21):
    ``eps = T rdp - (log delta + log alpha) / (alpha - 1) + log((alpha - 1) / alpha)``."""
    return min(
        steps * hand_rdp(q, sigma, a) - (math.log(delta) + math.log(a)) / (a - 1)
        + math.log((a - 1) / a)
        for a in orders
    )  # fmt: skip


def gaussian_epsilon(sigma: float, steps: int, delta: float) -> float:
    """The exact epsilon of ``steps`` Gaussian mechanisms of noise multiplier ``sigma`` without
    subsampling: their composition is one Gaussian mechanism with ``mu = sqrt(steps) / sigma``,
    whose tight curve is ``delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)`` (Balle
    and Wang, ICML 2018, arXiv:1805.06530, Theorem 8; Dong, Roth, Su, arXiv:1905.02383),
    decreasing in eps: inverted by bisection."""
    mu = math.sqrt(steps) / sigma

    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2))

    low, high = 0.0, 100.0
    for _ in range(200):
        middle = (low + high) / 2
        if phi(mu / 2 - middle / mu) - math.exp(middle) * phi(-mu / 2 - middle / mu) > delta:
            low = middle
        else:
            high = middle
    return high


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # PRV's log(1 - q) at q = 1
@pytest.mark.parametrize(
    ("sigma", "steps", "delta"), [(2.0, 10, 1e-5), (5.0, 50, 1e-5), (1.0, 1, 1e-3)]
)
def test_without_subsampling_the_accountants_bound_the_closed_form(sigma, steps, delta):
    """q = 1: PRV is the exact epsilon to its error bound (Opacus's eps_error 0.01, reported from
    above), RDP a looser upper bound (Balle et al.'s conversion loses about 0.5 here)."""
    exact = gaussian_epsilon(sigma, steps, delta)
    prv = PrivacyAccountant("prv", [[sigma, 1.0, steps]]).epsilon(delta)
    rdp = PrivacyAccountant("rdp", [[sigma, 1.0, steps]]).epsilon(delta)
    assert exact <= prv <= exact + 0.02
    assert exact < rdp < exact + 1.0


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), SETTINGS)
def test_rdp_epsilon_equals_opacus_and_the_hand_formula(q, sigma, steps, delta):
    accountant = PrivacyAccountant("rdp")
    for _ in range(steps):
        accountant.step(sigma, q)
    assert accountant.history == [[sigma, q, steps]]
    epsilon = accountant.epsilon(delta)
    opacus = RDPAccountant()
    opacus.history = [(sigma, q, steps)]
    assert epsilon == opacus.get_epsilon(delta)  # exactly Opacus's accountant
    # the hand formula at the integer orders Opacus also uses (2..10, 12..63): its minimum can
    # only be larger (fewer orders), and the optimum is near an integer order
    integers = [*range(2, 11), *range(12, 64)]
    by_hand = hand_epsilon(q, sigma, steps, delta, integers)
    assert epsilon <= by_hand + 1e-9
    assert by_hand - epsilon < 0.05 * epsilon
    if q < 1 and sigma <= 1:  # swapping (q, sigma) would be another number altogether
        swapped = PrivacyAccountant("rdp", [[q, sigma, steps]]).epsilon(delta)
        assert abs(swapped - epsilon) > 0.1 * epsilon


def test_prv_epsilon_equals_opacus():
    accountant = PrivacyAccountant("prv", [[1.1, 0.1, 60]])
    opacus = PRVAccountant()
    opacus.history = [(1.1, 0.1, 60)]
    assert accountant.epsilon(1e-3) == pytest.approx(opacus.get_epsilon(1e-3), rel=1e-12)
    assert accountant.epsilon(1e-3) < PrivacyAccountant("rdp", [[1.1, 0.1, 60]]).epsilon(1e-3)


def test_composition_history_and_state():
    accountant = PrivacyAccountant("rdp")
    assert accountant.epsilon(1e-5) == 0.0 and accountant.steps == 0
    accountant.step(1.0, 0.5, 3)
    accountant.step(1.0, 0.5)
    accountant.step(1.0, 0.25, 2)
    assert accountant.history == [[1.0, 0.5, 4], [1.0, 0.25, 2]] and accountant.steps == 6
    restored = PrivacyAccountant.from_state(accountant.state_dict())
    assert restored.history == accountant.history
    assert restored.epsilon(1e-5) == accountant.epsilon(1e-5)
    opacus = RDPAccountant()
    opacus.history = [(1.0, 0.5, 4), (1.0, 0.25, 2)]
    assert accountant.epsilon(1e-5) == opacus.get_epsilon(1e-5)
    # privacy spent after a recorded state extends it; the state itself, or another, does not
    earlier = PrivacyAccountant("rdp", [[1.0, 0.5, 4]])
    assert accountant.extends(earlier) and not earlier.extends(accountant)
    assert not restored.extends(accountant)
    assert not accountant.extends(PrivacyAccountant("rdp", [[2.0, 0.5, 1]]))


@pytest.mark.slow  # Opacus's bisection: about 80 epsilon evaluations
def test_calibrated_noise_spends_at_most_the_target():
    sigma = calibrate_noise(4.0, 1e-3, 0.1, 60)
    spent = PrivacyAccountant("rdp", [[sigma, 0.1, 60]]).epsilon(1e-3)
    assert 3.98 <= spent <= 4.0
