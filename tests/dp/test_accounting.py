"""The RDP accountant of the Poisson-subsampled Gaussian (cuvmap/dp/accounting.py): RDP at
integer and fractional orders, the conversion to (ε, δ), and the accountant's API. (The PLD
accountant: tests/dp/test_pld.py.)

Independent references:

* RDP at integer orders: the closed-form binomial sum evaluated in 60-digit ``decimal``
  arithmetic (no mpmath);
* RDP at fractional orders: the defining integral ``A_α = E_{z∼N(0,σ²)}[(μ/μ₀)^α]`` by
  the trapezoid rule on a fine grid (spectrally accurate for these smooth integrands);
* ε: values published by TF Privacy, dp_accounting and Opacus (cited at each table), with
  the conversion the source used, and the optimal Gaussian-mechanism δ (Balle & Wang 2018).
"""
import math
from decimal import Decimal, localcontext

import numpy as np
import pytest

from cuvmap import dp

# No fallback (cancellation) warning and no NumPy overflow may go unnoticed.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


# ---------------------------------------------------------------------------------------
# RDP of the sampled Gaussian mechanism: independent references
# ---------------------------------------------------------------------------------------


def _rdp_int_decimal(q, sigma, alpha):
    """Closed form for integer α in 60-digit decimal arithmetic:
    log(Σ_k C(α,k) (1−q)^(α−k) q^k exp((k²−k)/(2σ²))) / (α−1)."""
    with localcontext() as ctx:
        ctx.prec = 60
        qd, s2 = Decimal(q), Decimal(sigma) ** 2
        a = sum(
            Decimal(math.comb(alpha, k)) * (1 - qd) ** (alpha - k) * qd ** k * (Decimal(k * k - k) / (2 * s2)).exp()
            for k in range(alpha + 1)
        )
        return float(a.ln() / (alpha - 1))


def _rdp_quadrature(q, sigma, alpha, n=400001):
    """log(A_α)/(α−1) with A_α = ∫ φ_σ(z) ((1−q) + q·e^{(2z−1)/(2σ²)})^α dz by the trapezoid
    rule; A − 1 = ∫ φ_σ · expm1(α·log(μ/μ₀)) when A is close to 1 (no cancellation)."""
    z, h = np.linspace(-14 * sigma - 1, alpha + 14 * sigma + 1, n, retstep=True)
    t = (2 * z - 1) / (2 * sigma**2)
    tc = np.minimum(t, 700.0)
    log_ratio = np.where(
        t < 700, np.log1p(q * np.expm1(tc)), math.log(q) + t + np.log1p((1 - q) / q * np.exp(-np.maximum(t, 700.0)))
    )
    log_phi = -z * z / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi))
    logf = log_phi + alpha * log_ratio
    top = logf.max()
    log_a = math.log(h) + top + math.log(math.fsum(np.exp(logf - top).tolist()))
    if log_a < 1e-2:
        log_a = math.log1p(h * math.fsum((np.exp(log_phi) * np.expm1(alpha * log_ratio)).tolist()))
    return log_a / (alpha - 1)


@pytest.mark.parametrize("q,sigma,alpha", [
    (0.1, 2.0, 5), (256 / 60000, 1.1, 2), (256 / 60000, 1.1, 9), (256 / 60000, 1.1, 63),
    (0.04, 1.5, 32), (0.5, 0.5, 12), (0.01, 0.3, 128), (0.999, 3.0, 7), (1e-7, 1.0, 2), (1e-6, 1.0, 27),
])
def test_rdp_integer_orders_closed_form(q, sigma, alpha):
    got = dp.rdp_sampled_gaussian(q, sigma, alpha)
    assert isinstance(got, float)
    # Full relative precision even for tiny q, where A − 1 is far below 1 ulp of 1.
    assert got == pytest.approx(_rdp_int_decimal(q, sigma, alpha), rel=1e-12, abs=0)


@pytest.mark.parametrize("q,sigma,alpha", [(0.1, 2.0, 5), (0.01, 0.35, 3), (0.3, 1.0, 2), (0.04, 1.5, 12)])
def test_fractional_series_reduces_to_closed_form(q, sigma, alpha):
    # The series of the fractional path, run at an integer order (where it terminates) ...
    log_a = dp._log_a_frac(q, sigma, float(alpha))
    assert log_a / (alpha - 1) == pytest.approx(_rdp_int_decimal(q, sigma, alpha), rel=1e-11, abs=0)
    # ... and through the public API, just off the integer: continuity.
    for a in (alpha - 1e-7, alpha + 1e-7):
        assert dp.rdp_sampled_gaussian(q, sigma, a) == pytest.approx(dp.rdp_sampled_gaussian(q, sigma, alpha), rel=1e-5, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize("q,sigma,alpha", [
    (0.01, 2.5, 1.5), (0.01, 2.5, 2.5), (0.01, 0.35, 1.6), (0.01, 0.7, 4.4), (256 / 60000, 1.1, 8.3),
    (0.04, 1.5, 10.9), (0.5, 1.0, 1.1), (0.99, 0.5, 5.5), (1e-4, 1.0, 1.5), (0.01, 10.0, 20.5), (0.2, 0.3, 3.3),
])
def test_rdp_fractional_orders_quadrature(q, sigma, alpha):
    # The signed series sums O(1) terms, so log A_α is accurate to ~1e-16 absolute: a float
    # floor that only shows when q is tiny (here q = 1e-4, RDP ~ 1e-8, relative 1e-8).
    ref = _rdp_quadrature(q, sigma, alpha)
    assert dp.rdp_sampled_gaussian(q, sigma, alpha) == pytest.approx(ref, rel=1e-9, abs=1e-15 / (alpha - 1))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 4.530877117])
def test_rdp_q1_is_gaussian_mechanism(sigma):
    orders = np.array([1.1, 1.5, 2.0, 3.7, 12.0, 63.0])
    np.testing.assert_allclose(dp.rdp_sampled_gaussian(1.0, sigma, orders), orders / (2 * sigma**2), rtol=1e-15)
    # The q → 1 limit of both the closed form and the fractional series.
    np.testing.assert_allclose(dp.rdp_sampled_gaussian(1 - 1e-10, sigma, orders), orders / (2 * sigma**2), rtol=1e-6)


def test_rdp_edge_cases_and_errors():
    assert dp.rdp_sampled_gaussian(0.0, 1.0, 5) == 0.0
    assert dp.rdp_sampled_gaussian(0.1, 0.0, 5) == math.inf
    assert dp.rdp_sampled_gaussian(0.1, 1.0, math.inf) == math.inf
    np.testing.assert_allclose(dp.rdp_sampled_gaussian(0.1, 2.0, [3, 4.5], steps=10),
                               10 * dp.rdp_sampled_gaussian(0.1, 2.0, [3, 4.5]), rtol=1e-15)
    for bad in [dict(q=1.5), dict(noise_multiplier=-1.0), dict(orders=[0.5, 2]), dict(orders=1.0)]:
        kw = dict(q=0.1, noise_multiplier=1.0, orders=[2, 3]) | bad
        with pytest.raises(ValueError):
            dp.rdp_sampled_gaussian(**kw)


@pytest.mark.parametrize("q,sigma", [(256 / 60000, 1.1), (0.04, 1.5), (0.3, 0.6), (1e-3, 5.0)])
def test_rdp_monotone_in_order_and_log_a_convex(q, sigma):
    # Rényi divergence is nondecreasing in α, and (α − 1)·D_α = log A_α is convex in α
    # (van Erven & Harremoës 2014, Theorems 3 and 11).
    orders = np.array(dp.DEFAULT_ORDERS)
    rdp = dp.rdp_sampled_gaussian(q, sigma, orders)
    assert np.all(np.diff(rdp) >= -1e-15 * rdp[1:])
    log_a = (orders - 1) * rdp
    slopes = np.diff(log_a) / np.diff(orders)
    assert np.all(np.diff(slopes) >= -1e-9 * np.abs(slopes[1:]))


# ---------------------------------------------------------------------------------------
# Published reference values
# ---------------------------------------------------------------------------------------

# TF Privacy's compute_dp_sgd_privacy orders:
# tensorflow/privacy tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_lib.py
TF_ORDERS = [1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5] + list(range(5, 64)) + [128, 256, 512]
# dp_accounting's default RDP orders (dp_accounting/rdp/rdp_privacy_accountant.py).
DP_ACCOUNTING_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]


def test_tf_privacy_rdp_accountant_test_values():
    # tensorflow/privacy tensorflow_privacy/privacy/analysis/rdp_accountant_test.py
    # test_compute_rdp_scalar: compute_rdp(0.1, 2, 10, 5) ≈ 0.07737 (5 places).
    assert dp.rdp_sampled_gaussian(0.1, 2, 5, steps=10) == pytest.approx(0.07737, abs=5e-6)
    # test_compute_rdp_sequence (delta=1e-5), fractional orders 1.5 and 2.5 included.
    got = dp.rdp_sampled_gaussian(0.01, 2.5, [1.5, 2.5, 5, 50, 100, np.inf], steps=50)
    np.testing.assert_allclose(got[:-1], [0.00065, 0.001085, 0.00218075, 0.023846, 167.416307], rtol=0, atol=1e-5)
    assert got[-1] == np.inf
    # test_get_privacy_spent_check_target_delta, improved conversion: constant RDP 1.1 over
    # orders 2..32 → ε = 1.32783806176 at order 32; the Gaussian mechanism with σ =
    # 4.530877117 over orders 1.001..99.999 → exactly (1, 1e-6)-DP.
    eps, order = dp.rdp_to_epsilon(range(2, 33), [1.1] * 31, 1e-5)
    assert eps == pytest.approx(1.32783806176, abs=1e-10) and order == 32
    orders = [0.001 * i for i in range(1001, 100000)]
    eps, _ = dp.rdp_to_epsilon(orders, dp.rdp_sampled_gaussian(1, 4.530877117, orders), 1e-6)
    assert eps == pytest.approx(1.0, abs=1e-7)


def test_tf_privacy_composition_classic_and_improved():
    # rdp_accountant_test.py test_check_composition: written for the classic conversion
    # ("These tests use the old RDP -> approx DP conversion": ε = 8.509656 at order 2.5);
    # the improved conversion must stay below it.
    orders = (1.25, 1.5, 1.75, 2., 2.5, 3., 4., 5., 6., 7., 8., 10., 12., 14., 16., 20., 24., 28., 32., 64., 256.)
    rdp = dp.rdp_sampled_gaussian(1e-4, 0.4, orders, steps=40000) + dp.rdp_sampled_gaussian(0.1, 2, orders, steps=100)
    eps, order = dp.rdp_to_epsilon(orders, rdp, 1e-5, conversion="classic")
    assert eps == pytest.approx(8.509656, abs=5e-7) and order == 2.5
    assert dp.rdp_to_epsilon(orders, rdp, 1e-5)[0] <= 8.509656


@pytest.mark.parametrize("n,batch,sigma,epochs,delta,eps_ref,order_ref", [
    (60000, 150, 1.3, 15, 1e-5, 0.7242234026109595, 19.0),
    (100000, 100, 1.0, 30, 1e-7, 1.4154988495444842, 13.0),
    (100000000, 1024, 0.1, 10, 1e-7, 5907982.3113978775, 1.25),
])
def test_tf_privacy_compute_dp_sgd_privacy(n, batch, sigma, epochs, delta, eps_ref, order_ref):
    # tensorflow/privacy tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_test.py
    # (test_compute_dp_sgd_privacy): dp_accounting's RdpAccountant, improved conversion,
    # TF_ORDERS, steps = ceil(epochs·n/batch). The values are quoted to 16 digits; they
    # agree to ~1e-12 relative (the last one differs by 1.6e-5 absolute at ε ≈ 5.9e6).
    eps, order = dp.epsilon(n, batch, epochs, sigma, delta, orders=TF_ORDERS, return_order=True)
    assert eps == pytest.approx(eps_ref, rel=1e-10) and order == order_ref


def test_tf_privacy_mnist_readme_classic_conversion():
    # The MNIST run of TF Privacy's docs: N=60000, batch 256, noise 1.12, 60 epochs,
    # δ=1e-5 "satisfies (2.92, 1e-5)-DP" — compute_dp_sgd_privacy.py's docstring
    # (tensorflow/privacy tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy.py) and
    # tutorials/README.md. Published in 2019 with the classic conversion (rdp − log δ/(α−1)).
    assert round(dp.epsilon(60000, 256, 60, 1.12, 1e-5, orders=TF_ORDERS, conversion="classic"), 2) == 2.92
    # tutorials/README.md "Expected Output": ε after 1, 2 and 60 epochs is 1.00, 1.04, 2.92, from
    # tutorials/mnist_dpsgd_tutorial.py's compute_epsilon (orders 1.1..10.9 and 12..63,
    # 234 steps per epoch, classic conversion).
    tutorial_orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    for epochs, ref in [(1, 1.00), (2, 1.04), (60, 2.92)]:
        rdp = dp.rdp_sampled_gaussian(256 / 60000, 1.12, tutorial_orders, steps=epochs * (60000 // 256))
        assert round(dp.rdp_to_epsilon(tutorial_orders, rdp, 1e-5, conversion="classic")[0], 2) == ref
    # The improved conversion is tighter on the same RDP.
    assert dp.epsilon(60000, 256, 60, 1.12, 1e-5, orders=TF_ORDERS) < 2.9


def _dp_sgd_example_eps(num_epochs, sigma, delta, microbatching, q, fractional="exact"):
    # compute_dp_sgd_privacy_lib._compute_dp_sgd_example_privacy: microbatching halves σ,
    # count = ceil(epochs/q) Poisson steps (or ceil(epochs) full passes without sampling).
    if microbatching:
        sigma /= 2
    count = int(math.ceil(num_epochs / q)) if q else int(math.ceil(num_epochs))
    rdp = dp.rdp_sampled_gaussian(q or 1.0, sigma, DP_ACCOUNTING_ORDERS, steps=count, fractional=fractional)
    return dp.rdp_to_epsilon(DP_ACCOUNTING_ORDERS, rdp, delta)[0]


@pytest.mark.slow
def test_tf_privacy_example_privacy_and_statement():
    # compute_dp_sgd_privacy_test.py, test_compute_dp_sgd_example_privacy (RDP rows;
    # num_epochs=1.2, noise 0.7, δ=1e-5; improved conversion, dp_accounting orders).
    assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, False, None) == pytest.approx(10.8602036, abs=1e-7)
    assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, True, None) == pytest.approx(26.2880374, abs=1e-7)
    # The Poisson rows (q=1e-2) were produced by dp_accounting >= 0.4.4, whose fractional
    # series sums the terms' magnitudes (an upper bound): reproduced with
    # fractional="upper_bound". The exact series (checked against quadrature above) is tighter.
    for micro, ref in [(False, 3.2392676), (True, 22.6248601)]:
        assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, micro, 1e-2, "upper_bound") == pytest.approx(ref, abs=1e-7)
        assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, micro, 1e-2) < ref
    # test_dp_sgd_privacy_statement_*_with_rdp: 10000 examples, batch 64, 5 epochs, noise 2.0
    # with microbatching, δ=1e-6 → 13.376 (once per epoch) and 1.616 (Poisson), 3 decimals.
    assert round(_dp_sgd_example_eps(5.0, 2.0, 1e-6, True, None), 3) == 13.376
    assert round(_dp_sgd_example_eps(5.0, 2.0, 1e-6, True, 64 / 10000), 3) == 1.616


def test_dp_accounting_upper_bound_series():
    # dp_accounting 0.4.4 rdp_privacy_accountant_test.py test_compute_rdp_poisson_sampled_gaussian
    # (rtol 1e-4): the magnitude-sum series; integer orders are unchanged from the exact values.
    got = dp.rdp_sampled_gaussian(0.01, 2.5, [1.5, 2.5, 5, 50, 100, np.inf], steps=50, fractional="upper_bound")
    np.testing.assert_allclose(got, [6.70579741e-04, 1.08548710e-03, 2.18075656e-03, 2.38460375e-02, 1.67416308e02, np.inf],
                               rtol=1e-8)


def test_opacus_rdp_accountant():
    # pytorch/opacus opacus/tests/accountants_test.py test_rdp_accountant: noise 1.5, sample
    # rate 0.04, int(90/0.04) steps, δ=1e-5 → 7.32911117143 (7 places), default orders,
    # improved conversion (Balle et al. 2020, Thm 21, opacus/accountants/analysis/rdp.py).
    acct = dp.RDPAccountant()
    for _ in range(int(90 / 0.04)):
        acct.step(noise_multiplier=1.5, sample_rate=0.04)
    assert len(acct) == 2250 and len(acct.history) == 1
    assert acct.get_epsilon(delta=1e-5) == pytest.approx(7.32911117143, abs=1e-9)
    # The classic conversion is looser.
    assert acct.get_epsilon(delta=1e-5, conversion="classic") > 7.5


def test_opacus_heterogeneous_composition():
    # opacus/accountants/analysis/rdp.py module docstring: steps (q, σ, T) = (1e-5, 1.0, 10)
    # then (1e-4, 3.0, 4), orders 2..32, δ=1e-5 → (0.336, 23) (doctest +NUMBER: 3 decimals).
    acct = dp.RDPAccountant(orders=range(2, 33))
    acct.step(1.0, 1e-5, num_steps=10)
    acct.step(3.0, 1e-4, num_steps=4)
    eps, order = acct.get_privacy_spent(1e-5)
    assert round(eps, 3) == 0.336 and order == 23
    rdp = dp.rdp_sampled_gaussian(1e-5, 1.0, range(2, 33), steps=10) + dp.rdp_sampled_gaussian(1e-4, 3.0, range(2, 33), steps=4)
    np.testing.assert_allclose(acct.get_rdp(), rdp, rtol=1e-15)


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0])
def test_improved_conversion_respects_exact_gaussian_delta(sigma):
    # For the plain Gaussian mechanism the optimal δ(ε) is known (Balle & Wang 2018, Thm 8):
    # δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ). An RDP-derived (ε, δ) must satisfy
    # δ(ε) ≤ δ, and must not be absurdly loose.
    orders = [1 + 0.01 * i for i in range(1, 5000)]
    rdp = dp.rdp_sampled_gaussian(1.0, sigma, orders)
    for delta in (1e-3, 1e-5, 1e-9):
        eps, _ = dp.rdp_to_epsilon(orders, rdp, delta)
        exact = 0.5 * math.erfc((eps * sigma - 0.5 / sigma) / math.sqrt(2)) \
            - math.exp(eps) * 0.5 * math.erfc((eps * sigma + 0.5 / sigma) / math.sqrt(2))
        assert exact <= delta
        assert exact >= delta * 1e-3
        assert eps <= dp.rdp_to_epsilon(orders, rdp, delta, conversion="classic")[0]


# ---------------------------------------------------------------------------------------
# Conversion and accountant API
# ---------------------------------------------------------------------------------------


def test_rdp_to_epsilon_edge_cases():
    # Tiny RDP: δ ≥ sqrt(1 − e^{−rdp}) gives ε = 0.
    assert dp.rdp_to_epsilon([2, 3], [1e-12, 2e-12], 1e-5) == (0.0, 2.0)
    assert dp.rdp_to_epsilon([2, 3], [math.inf, math.inf], 1e-5)[0] == math.inf
    eps, order = dp.rdp_to_epsilon([2, 3], [math.inf, 0.5], 1e-5, conversion="classic")
    assert order == 3 and eps == pytest.approx(0.5 + math.log(1e5) / 2)
    for args in [([2, 3], [1.0], 1e-5), ([2, 3], [1.0, 1.0], 0.0), ([1.0, 3], [1.0, 1.0], 1e-5), ([2, 3], [-1.0, 1.0], 1e-5)]:
        with pytest.raises(ValueError):
            dp.rdp_to_epsilon(*args)
    with pytest.raises(ValueError, match="conversion"):
        dp.rdp_to_epsilon([2], [1.0], 1e-5, conversion="best")


def test_accountant_history_merging_and_epsilon_helper():
    acct = dp.RDPAccountant()
    acct.step(1.1, 256 / 60000, num_steps=100)
    acct.step(1.1, 256 / 60000, num_steps=134)
    acct.step(2.0, 0.01)
    acct.step(1.1, 256 / 60000)
    assert [h[2] for h in acct.history] == [234, 1, 1] and len(acct) == 236
    rdp = (dp.rdp_sampled_gaussian(256 / 60000, 1.1, dp.DEFAULT_ORDERS, steps=235)
           + dp.rdp_sampled_gaussian(0.01, 2.0, dp.DEFAULT_ORDERS))
    np.testing.assert_allclose(acct.get_rdp(), rdp, rtol=1e-13)
    assert acct.get_epsilon(1e-5) == pytest.approx(dp.rdp_to_epsilon(dp.DEFAULT_ORDERS, rdp, 1e-5)[0], rel=1e-13)
    assert dp.RDPAccountant().get_epsilon(1e-5) == 0.0  # no steps, no privacy loss
    # The helper: q = batch/N and ceil(epochs·N/batch) steps (here 60·60000/256 = 14062.5 → 14063).
    one = dp.RDPAccountant()
    one.step(1.1, 256 / 60000, num_steps=14063)
    assert dp.epsilon(60000, 256, 60, 1.1, 1e-5) == pytest.approx(one.get_epsilon(1e-5), rel=1e-14)
    with pytest.raises(ValueError):
        acct.step(1.0, 1.5)
    with pytest.raises(ValueError):
        dp.epsilon(100, 200, 1, 1.0, 1e-5)
    assert len(dp.DEFAULT_ORDERS) == 99 + 52 and dp.DEFAULT_ORDERS[0] == 1.1 and dp.DEFAULT_ORDERS[-1] == 63
