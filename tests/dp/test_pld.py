"""cuvmap.dp.PLDAccountant (privacy loss distributions of the Poisson-subsampled Gaussian)
and cuvmap.dp.calibrate_noise.

Independent references:

* no subsampling (q = 1): the Gaussian mechanism's exact δ(ε) (Balle & Wang 2018, Thm 8),
  ``δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)`` with ``μ = sqrt(Σ_t 1/σ_t²)`` for a
  composition (the sum of Gaussian losses is Gaussian), inverted by bisection with
  ``math.erfc``;
* one subsampled step: the hockey-stick divergence ``∫ (p(x) − e^ε q(x))₊ dx`` of the
  mixture and the Gaussian by the trapezoid rule on a fine grid; two steps: the same
  integral over the plane;
* compositions: values computed with Google's ``dp_accounting`` 0.6.0 (``PLDAccountant``
  with ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``, add/remove), stored below as data;
* the discretisation is pessimistic: every ε here is at or above the exact one.
"""
import math

import numpy as np
import pytest

from cuvmap import dp
from cuvmap.dp import pld

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def _phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _gaussian_delta(eps, mu):
    """Exact δ(ε) of the Gaussian mechanism with sensitivity/σ = μ."""
    return _phi(mu / 2 - eps / mu) - math.exp(eps) * _phi(-mu / 2 - eps / mu)


def _gaussian_epsilon(delta, mu):
    lo, hi = 0.0, 500.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _gaussian_delta(mid, mu) > delta else (lo, mid)
    return hi


def _eps(sigma, q, steps, delta, h=pld.DEFAULT_DISCRETIZATION):
    acct = dp.PLDAccountant(discretization=h)
    acct.step(noise_multiplier=sigma, sample_rate=q, num_steps=steps)
    return acct.get_epsilon(delta)


# ---------------------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------------------

# (σ, steps, δ): no subsampling, the composition of `steps` Gaussian mechanisms
GAUSSIAN = [
    (1.0, 1, 1e-5), (2.0, 1, 1e-5), (0.8, 1, 1e-3), (1.5, 1, 1e-9),
    (5.0, 10, 1e-5), pytest.param(10.0, 100, 1e-3, marks=pytest.mark.slow),
    pytest.param(3.0, 7, 1e-6, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("sigma,steps,delta", GAUSSIAN)
def test_gaussian_mechanism_exact_epsilon(sigma, steps, delta):
    exact = _gaussian_epsilon(delta, math.sqrt(steps) / sigma)
    got = _eps(sigma, 1.0, steps, delta)
    assert exact <= got <= exact * (1 + 1e-6)           # pessimistic, and tight
    acct = dp.PLDAccountant()
    acct.step(sigma, 1.0, steps)
    assert delta <= acct.get_delta(exact) <= delta * (1 + 1e-5)


def test_heterogeneous_gaussian_composition():
    # σ = 2 three times, then σ = 5 twice and σ = 1 once: μ² = 3/4 + 2/25 + 1
    acct = dp.PLDAccountant()
    acct.step(2.0, 1.0, 3)
    acct.step(5.0, 1.0, 2)
    acct.step(1.0, 1.0)
    mu = math.sqrt(3 / 4 + 2 / 25 + 1)
    for delta in (1e-3, 1e-5, 1e-8):
        exact = _gaussian_epsilon(delta, mu)
        assert exact <= acct.get_epsilon(delta) <= exact * (1 + 1e-6)


def _grid(sigma, n):
    x = np.linspace(-12 * sigma, 1 + 12 * sigma, n)
    g0 = np.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    g1 = np.exp(-0.5 * ((x - 1) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    return x, g0, g1


def _trapezoid(y, x):
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)


# (σ, q): one subsampled step
ONE_STEP = [(1.1, 256 / 60000), (3.0, 0.08192), (0.7, 0.3), (2.0, 0.9)]


@pytest.mark.parametrize("sigma,q", ONE_STEP)
def test_one_subsampled_step_against_quadrature(sigma, q):
    x, g0, g1 = _grid(sigma, 400_001)
    mix = (1 - q) * g0 + q * g1
    pairs = {"remove": (mix, g0), "add": (g0, mix)}
    for pair, (p, qq) in pairs.items():
        one = pld.step_pld(sigma, q, pair)
        # at the grid's points the discrete δ is the exact one; between them it is the
        # chord of the convex δ(e^ε), above the curve
        for eps, rel in [(0.0, 1e-6), (0.5, 1e-6), (1.0, 1e-6), (2.0, 1e-6), (0.3 * q, 1e-3), (0.55555, 1e-3)]:
            ref = _trapezoid(np.maximum(p - math.exp(eps) * qq, 0.0), x)
            got = one.get_delta(eps)
            assert got >= ref * (1 - 1e-8) - 1e-13, (pair, eps)  # (the rule errs by ~1e-10 at the kink)
            assert got <= ref * (1 + rel) + 1e-13, (pair, eps)


@pytest.mark.slow
def test_two_subsampled_steps_against_quadrature_in_the_plane():
    sigma, q = 1.0, 0.2
    x, g0, g1 = _grid(sigma, 3001)
    mix = (1 - q) * g0 + q * g1
    acct = dp.PLDAccountant()
    acct.step(sigma, q, 2)
    composed = acct.get_pld()
    for pair, (p, qq) in {"remove": (mix, g0), "add": (g0, mix)}.items():
        for eps in (0.1, 0.5, 1.0):
            inner = np.maximum(np.outer(p, p) - math.exp(eps) * np.outer(qq, qq), 0.0)
            ref = _trapezoid(np.array([_trapezoid(row, x) for row in inner]), x)
            got = composed[pair].get_delta(eps)
            assert got == pytest.approx(ref, rel=2e-3), (pair, eps)


# ---------------------------------------------------------------------------------------
# dp_accounting's values, stored as data
# ---------------------------------------------------------------------------------------

# (σ, q, steps, δ) → ε by dp_accounting 0.6.0: PLD at value_discretization_interval 1e-4
# (its default) and 1e-3, and its RDP accountant (whose fractional orders sum the series'
# magnitudes: an upper bound a little above cuvmap's exact series).
DP_ACCOUNTING = [
    ((1.1, 256 / 60000, 14063, 1e-5), 2.381778813, 2.390623414, 2.59665553),   # MNIST, 60 epochs
    pytest.param((3.0, 4096 / 50000, 2500, 1e-5), 6.578903907, 6.579700497, 7.098494143,  # CIFAR-10
                 marks=pytest.mark.slow),
    pytest.param((0.8, 0.01, 1000, 1e-5), 3.141018319, 3.141435247, 3.695613193, marks=pytest.mark.slow),
    pytest.param((2.0, 0.001, 50000, 1e-6), 0.4828017598, 0.619414948, 0.5213005766, marks=pytest.mark.slow),
    pytest.param((1.0, 0.1, 100, 1e-5), 7.046602877, 7.046628943, 7.903850224, marks=pytest.mark.slow),
    pytest.param((5.0, 0.5, 200, 1e-5), 6.701169897, 6.70123287, 7.23178224, marks=pytest.mark.slow),
    ((1.5, 1.0, 1, 1e-5), 2.753381385, 2.753382206, 2.984800045),
]


@pytest.mark.parametrize("args,fine,coarse,rdp", DP_ACCOUNTING)
def test_dp_accounting_values(args, fine, coarse, rdp):
    sigma, q, steps, delta = args
    got = _eps(sigma, q, steps, delta)
    assert got == pytest.approx(fine, rel=1e-5)
    assert _eps(sigma, q, steps, delta, h=1e-3) == pytest.approx(coarse, rel=1e-5)
    ours_rdp = dp.RDPAccountant()
    ours_rdp.step(sigma, q, steps)
    assert got < ours_rdp.get_epsilon(delta) <= rdp * (1 + 1e-6)


def test_issue_anchors_within_one_percent():
    # issue 25: dp_accounting 0.6.0 gives PLD 2.382 (RDP 2.597) and 6.580 (RDP 7.098)
    assert _eps(1.1, 256 / 60000, 14063, 1e-5) == pytest.approx(2.382, rel=1e-2)
    assert _eps(3.0, 4096 / 50000, 2500, 1e-5) == pytest.approx(6.580, rel=1e-2)


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_monotone_in_every_parameter():
    base = dict(sigma=1.2, q=0.01, steps=500, delta=1e-5)

    def eps(**kw):
        a = {**base, **kw}
        return _eps(a["sigma"], a["q"], a["steps"], a["delta"])

    sigmas = [eps(sigma=s) for s in (0.9, 1.2, 1.6, 2.5)]
    rates = [eps(q=q) for q in (0.002, 0.01, 0.05, 0.2)]
    steps = [eps(steps=t) for t in (1, 50, 500, 5000)]
    deltas = [eps(delta=d) for d in (1e-8, 1e-5, 1e-3, 1e-1)]
    assert all(a > b for a, b in zip(sigmas, sigmas[1:]))
    assert all(a < b for a, b in zip(rates, rates[1:]))
    assert all(a < b for a, b in zip(steps, steps[1:]))
    assert all(a > b for a, b in zip(deltas, deltas[1:]))
    # a coarser grid is a coarser upper bound
    assert eps() <= _eps(1.2, 0.01, 500, 1e-5, h=1e-3) <= _eps(1.2, 0.01, 500, 1e-5, h=1e-2)


@pytest.mark.parametrize("sigma,q", ONE_STEP + [(1.0, 1.0)])
def test_step_pld_is_a_valid_dominating_pld(sigma, q):
    for pair in pld.PAIRS:
        one = pld.step_pld(sigma, q, pair)
        assert np.all(one.probs >= 0) and one.infinity_mass >= 0
        assert one.probs.sum() + one.infinity_mass == pytest.approx(1.0, abs=1e-13)
        # the Q-mass it implies is at most 1 (the rest sits at L = −∞)
        assert float(np.sum(one.probs * np.exp(-one.losses))) <= 1 + 1e-13
        assert one.infinity_mass < 1e-22


def test_normal_tail_against_math_erfc():
    z = np.concatenate((np.linspace(0.0, 37.0, 20001), [0.5, 1e-300]))
    ref = np.array([0.5 * math.erfc(v / math.sqrt(2.0)) for v in z])
    np.testing.assert_allclose(pld._normal_sf(z), ref, rtol=3e-13, atol=0)
    assert pld._normal_sf(np.array([np.inf, 45.0])).tolist() == [0.0, 0.0]
    # masses between points from either tail
    pts = [-np.inf, -40.0, -3.0, -1e-3, 0.0, 2.0, 8.0, np.inf]
    r2 = math.sqrt(2.0)

    def mass(a, b):  # from erfc on the side away from 0, erf across it
        if a >= 0:
            return 0.5 * (math.erfc(a / r2) - math.erfc(b / r2))
        if b <= 0:
            return 0.5 * (math.erfc(-b / r2) - math.erfc(-a / r2))
        return 0.5 * (math.erf(b / r2) - math.erf(a / r2))

    ref = [mass(a, b) for a, b in zip(pts, pts[1:])]
    np.testing.assert_allclose(pld._normal_masses(np.array(pts)), ref, rtol=1e-11, atol=1e-300)


def test_fft_composition_against_direct_convolution():
    one = pld.step_pld(2.0, 0.3, "remove", h=1e-2)
    other = pld.step_pld(0.9, 0.05, "add", h=1e-2)
    steps = 25
    direct = one.probs
    for _ in range(steps - 1):
        direct = np.convolve(direct, one.probs)
    composed = pld.self_compose(one, steps)
    start = composed.offset - steps * one.offset
    window = direct[start:start + len(composed.probs)]
    np.testing.assert_allclose(composed.probs, window, rtol=1e-9, atol=1e-15)
    outside = direct.sum() - window.sum()
    assert outside <= pld.TAIL_MASS and composed.infinity_mass >= outside  # the cut tail is at +∞
    assert len(composed.probs) < len(direct) / 2  # the Chernoff window cut something
    both = pld.compose(composed, other)
    ref = np.convolve(composed.probs, other.probs)
    cut = both.offset - composed.offset - other.offset
    np.testing.assert_allclose(both.probs[1:], ref[cut + 1:cut + len(both.probs)], rtol=1e-9, atol=1e-15)
    assert both.probs[0] >= ref[cut]  # the lowest masses moved up, not dropped
    assert both.probs.sum() + both.infinity_mass == pytest.approx(1.0, abs=1e-12)


def test_epsilon_and_delta_are_inverse():
    acct = dp.PLDAccountant()
    acct.step(1.3, 0.02, 300)
    for delta in (1e-7, 1e-5, 1e-3):
        eps = acct.get_epsilon(delta)
        assert acct.get_delta(eps) == pytest.approx(delta, rel=1e-9)
        assert acct.get_delta(eps * 0.999) > delta
    assert acct.get_delta(0.0) < 1 and acct.get_delta(50.0) <= pld.TAIL_MASS * 1.001  # (the FFT's cut tails)


@pytest.mark.slow
def test_history_order_and_merging_do_not_matter():
    a = dp.PLDAccountant()
    for _ in range(20):
        a.step(noise_multiplier=1.5, sample_rate=0.05)
    a.step(3.0, 0.2, num_steps=10)
    a.step(1.5, 0.05, num_steps=5)
    assert len(a) == 35 and [h[2] for h in a.history] == [20, 10, 5]
    b = dp.PLDAccountant()
    b.step(3.0, 0.2, num_steps=10)
    b.step(1.5, 0.05, num_steps=25)
    for delta in (1e-5, 1e-3):
        assert a.get_epsilon(delta) == pytest.approx(b.get_epsilon(delta), rel=1e-9)
    eps = a.get_epsilon(1e-5)
    a.step(1.5, 0.05)  # a new step clears the composed PLDs
    assert a.get_epsilon(1e-5) > eps


def test_edge_cases_and_errors():
    assert dp.PLDAccountant().get_epsilon(1e-5) == 0.0  # no steps, no privacy loss
    acct = dp.PLDAccountant()
    acct.step(1.0, 0.0, 100)  # nobody sampled
    acct.step(2.0, 0.1, 0)
    assert acct.get_epsilon(1e-5) == 0.0 and acct.get_delta(0.0) == 0.0
    acct.step(0.0, 0.1)  # a step without noise
    assert acct.get_epsilon(1e-5) == math.inf and acct.get_delta(10.0) == 1.0
    with pytest.raises(ValueError, match="PLDAccountant.step: sample_rate"):
        acct.step(1.0, 1.5)
    with pytest.raises(ValueError, match="PLDAccountant.step: noise_multiplier"):
        acct.step(-1.0, 0.5)
    with pytest.raises(ValueError, match="PLDAccountant.step: num_steps"):
        acct.step(1.0, 0.5, -1)
    with pytest.raises(ValueError, match="get_epsilon: delta"):
        dp.PLDAccountant().get_epsilon(0.0)
    with pytest.raises(ValueError, match="discretization"):
        dp.PLDAccountant(discretization=0.0)
    with pytest.raises(ValueError, match="step_pld: pair"):
        pld.step_pld(1.0, 0.1, "replace")
    with pytest.raises(ValueError, match="grid points"):
        pld.step_pld(1e-3, 1.0, "remove")


# ---------------------------------------------------------------------------------------
# calibrate_noise
# ---------------------------------------------------------------------------------------

# (target ε, δ, q, steps)
# each a bisection of PLD compositions: the last (the cheapest) by default, the others slow
CALIBRATION = [
    pytest.param(2.382, 1e-5, 256 / 60000, 14063, marks=pytest.mark.slow),
    pytest.param(6.58, 1e-5, 4096 / 50000, 2500, marks=pytest.mark.slow),
    pytest.param(1.0, 1e-5, 0.01, 1000, marks=pytest.mark.slow),
    pytest.param(8.0, 1e-5, 1.0, 1, marks=pytest.mark.slow),
    (0.5, 1e-6, 0.001, 50000),
]


@pytest.mark.parametrize("target,delta,q,steps", CALIBRATION)
def test_calibrate_noise_round_trip(target, delta, q, steps):
    rtol = 1e-3
    sigma_pld = dp.calibrate_noise(target, delta, q, steps)
    assert _eps(sigma_pld, q, steps, delta) <= target < _eps(sigma_pld / (1 + rtol), q, steps, delta)
    sigma_rdp = dp.calibrate_noise(target, delta, q, steps, accountant="rdp")

    def rdp_eps(s):
        acct = dp.RDPAccountant()
        acct.step(s, q, steps)
        return acct.get_epsilon(delta)

    assert rdp_eps(sigma_rdp) <= target < rdp_eps(sigma_rdp / (1 + rtol))
    assert sigma_pld < sigma_rdp  # the tight accountant needs less noise


@pytest.mark.slow
def test_calibrate_noise_finds_the_anchor_and_memoises():
    # the MNIST anchor: σ = 1.1 gives ε = 2.3818 (dp_accounting), so that target gives σ ≈ 1.1
    sigma = dp.calibrate_noise(2.381778813, 1e-5, 256 / 60000, 14063)
    assert sigma == pytest.approx(1.1, rel=1.5e-3) and sigma >= 1.1 * (1 - 1e-9)
    from cuvmap.dp.accounting import _calibrate

    hits = _calibrate.cache_info().hits
    assert dp.calibrate_noise(2.381778813, 1e-5, 256 / 60000, 14063) == sigma
    assert _calibrate.cache_info().hits == hits + 1


def test_calibrate_noise_edge_cases_and_errors():
    assert dp.calibrate_noise(1.0, 1e-5, 0.0, 100) == 0.0
    assert dp.calibrate_noise(1.0, 1e-5, 0.1, 0) == 0.0
    for kwargs, match in [
        (dict(target_epsilon=0.0), "target_epsilon"), (dict(delta=1.0), "delta"),
        (dict(sample_rate=1.5), "sample_rate"), (dict(num_steps=-1), "num_steps"),
        (dict(accountant="gdp"), "accountant"), (dict(rtol=0.0), "rtol"),
    ]:
        args = {**dict(target_epsilon=1.0, delta=1e-5, sample_rate=0.01, num_steps=10), **kwargs}
        with pytest.raises(ValueError, match=f"calibrate_noise: {match}"):
            dp.calibrate_noise(**args)
