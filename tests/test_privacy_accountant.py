"""The privacy accountant (docs/algorithms.md section 7.3) against computations that do not go
through it: the Renyi divergence of the sampled Gaussian mechanism at integer orders written out
by hand (Mironov, Talwar and Zhang, arXiv:1908.10530, section 3.3), the exact privacy curve of the
Gaussian mechanism in closed form (q = 1), and Opacus's and dp-accounting's accountants called
directly; the calibration of target_epsilon by the same accountant."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("opacus")
pytest.importorskip("dp_accounting")
from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402

from fedlightning.privacy import PrivacyAccountant, calibrate_noise  # noqa: E402
from fedlightning.privacy.accountant import UnreachableEpsilon  # noqa: E402
from fedlightning.privacy.bounds import NOISE_RANGE  # noqa: E402
from privacy_reference import PRV_EPS_ERROR, opacus_epsilon, pld_epsilon  # noqa: E402

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
    """q = 1: every accountant is an upper bound of the exact epsilon (sound); PLD (the default)
    within its discretisation (1e-3 an interval) above it, PRV within its error bound (Opacus's
    eps_error 0.01, reported from above), RDP looser (Balle et al.'s conversion loses about 0.5)."""
    exact = gaussian_epsilon(sigma, steps, delta)
    pld = PrivacyAccountant("pld", [[sigma, 1.0, steps]]).epsilon(delta)
    prv = PrivacyAccountant("prv", [[sigma, 1.0, steps]]).epsilon(delta)
    rdp = PrivacyAccountant("rdp", [[sigma, 1.0, steps]]).epsilon(delta)
    assert exact <= pld <= exact + 0.005
    assert exact <= prv <= exact + 2 * PRV_EPS_ERROR
    assert exact < rdp < exact + 1.0
    assert PrivacyAccountant().mechanism == "pld"  # the default: the tightest of the three


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


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), SETTINGS)
def test_pld_epsilon_equals_dp_accounting(q, sigma, steps, delta):
    accountant = PrivacyAccountant("pld", [[sigma, q, steps]])
    assert accountant.epsilon(delta) == pld_epsilon([(sigma, q, steps)], delta)
    two = PrivacyAccountant("pld", [[sigma, q, steps], [sigma * 2, q / 2, 3]])  # composed
    assert two.epsilon(delta) == pld_epsilon([(sigma, q, steps), (sigma * 2, q / 2, 3)], delta)


def test_the_default_is_the_tightest_sound_accountant_on_the_shipped_config():
    """configs/dp_fedavg.yaml's 60 rounds (z 1.5, q 0.1, delta 1e-4): PLD 2.2953, PRV 2.3055, RDP
    2.6277 (docs/algorithms.md section 7.3). PLD and PRV bound the same epsilon from above, PRV
    within its stated error (its value is its estimate's upper end: at most 2 eps_error above
    the true epsilon, which PLD's pessimistic value is at least)."""
    plan, delta = [(1.5, 0.1, 60)], 1e-4
    pld, prv, rdp = (PrivacyAccountant(m, plan).epsilon(delta) for m in ("pld", "prv", "rdp"))
    assert (pld, prv, rdp) == (
        pld_epsilon(plan, delta), opacus_epsilon("prv", plan, delta),
        opacus_epsilon("rdp", plan, delta),
    )  # fmt: skip
    assert prv - 2 * PRV_EPS_ERROR <= pld <= prv
    assert pld < prv < rdp
    assert (round(pld, 4), round(prv, 4), round(rdp, 4)) == (2.2953, 2.3055, 2.6277)


def test_a_bound_below_zero_is_reported_as_zero():
    """At a large delta Opacus's RDP conversion goes below 0; (epsilon < 0, delta)-DP implies
    (0, delta)-DP, so the accountant reports 0, never a negative epsilon."""
    plan = [(1e3, 0.1, 1)]
    assert opacus_epsilon("rdp", plan, 0.4) < 0
    assert PrivacyAccountant("rdp", plan).epsilon(0.4) == 0.0
    assert PrivacyAccountant("pld", plan).epsilon(0.4) == 0.0


@pytest.mark.parametrize("mechanism", ["pld", "rdp"])
def test_calibration_finds_the_smallest_noise_by_the_same_accountant(mechanism):
    """The calibrated z spends at most the target by the accountant the run reports with, and
    0.2% less noise would spend more (the bisection's bracket is 0.1%)."""
    z = calibrate_noise(2.0, 1e-5, 0.1, 20, mechanism)
    spent = PrivacyAccountant(mechanism, [[z, 0.1, 20]]).epsilon(1e-5)
    assert spent <= 2.0
    assert PrivacyAccountant(mechanism, [[z / 1.002, 0.1, 20]]).epsilon(1e-5) > 2.0 or (
        spent >= 2.0 * (1 - 1e-3)
    )
    assert calibrate_noise(1e6, 1e-5, 0.1, 20, mechanism) == NOISE_RANGE[0]  # any z is enough


def test_an_unreachable_target_names_the_smallest_epsilon_reachable():
    """RDP at Opacus's default orders never goes below about 0.07 at delta 1e-4, whatever z: a
    smaller target is refused in one line with that floor, computed at the largest z allowed."""
    floor = opacus_epsilon("rdp", [(NOISE_RANGE[1], 0.1, 60)], 1e-4)
    with pytest.raises(UnreachableEpsilon) as error:
        calibrate_noise(
            1e-9, 1e-4, 0.1, 60, "rdp", option="loop.aggregator.init_args.target_epsilon"
        )
    assert error.value.smallest == floor
    assert str(error.value) == (
        f"loop.aggregator.init_args.target_epsilon=1e-09 cannot be reached: the smallest epsilon "
        f"this run can spend is {floor:.4g} (the rdp accountant at the largest noise multiplier "
        "allowed, 1e+06, with q=0.1, 60 step(s), delta=0.0001)"
    )


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


@pytest.mark.slow  # PRV's bisection: about 15 evaluations of a second each
def test_prv_calibration_spends_at_most_the_target():
    sigma = calibrate_noise(4.0, 1e-3, 0.1, 60, "prv")
    spent = PrivacyAccountant("prv", [[sigma, 0.1, 60]]).epsilon(1e-3)
    assert spent == opacus_epsilon("prv", [(sigma, 0.1, 60)], 1e-3)
    assert 3.99 <= spent <= 4.0
