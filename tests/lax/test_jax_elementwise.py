"""JAX's remaining elementwise lax names (issue 32): values at points with closed forms, the
edges (poles, infinities, NaN, underflow), the rounding methods, reduce_precision's bits and
derivative, clamp's and select_n's derivatives, jit. The generic checks (impl against
math-module references, shape rules, vmap against loops, check_grads in both modes) are the
rows of tests/op_table.py (``_rows_jax_elementwise``)."""
import math

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap.test_util import check_grads

EULER = 0.5772156649015329
ZETA3 = 1.2020569031595942


def _bessel_ie(order, x):
    """e^{−|x|} I_order(x) by the trapezoid rule over a period of (1/π)∫₀^π e^{x cos θ} cos(order θ) dθ."""
    theta = np.arange(2000) * (2 * math.pi / 2000)
    return float(np.mean(np.exp(x * np.cos(theta) - abs(x)) * np.cos(order * theta)))


# (name, function, arguments, expected, rtol): closed forms and known values
VALUES = [
    ("erfc_0", lax.erfc, (0.0,), 1.0, 0),
    ("erfc_1", lax.erfc, (1.0,), math.erfc(1.0), 1e-15),
    ("erfc_negative", lax.erfc, (-1.5,), 2 - math.erfc(1.5), 1e-15),
    ("erfc_tail_10", lax.erfc, (10.0,), math.erfc(10.0), 1e-14),
    ("erfc_tail_26", lax.erfc, (26.0,), math.erfc(26.0), 1e-13),
    ("erfc_underflow", lax.erfc, (30.0,), 0.0, 0),
    ("erfc_inf", lax.erfc, (-np.inf,), 2.0, 0),
    ("lgamma_half", lax.lgamma, (0.5,), 0.5 * math.log(math.pi), 1e-15),
    ("lgamma_1", lax.lgamma, (1.0,), 0.0, 0),
    ("lgamma_10", lax.lgamma, (10.0,), math.log(362880.0), 4e-15),
    ("lgamma_minus_half", lax.lgamma, (-0.5,), math.log(2 * math.sqrt(math.pi)), 1e-15),
    ("lgamma_100", lax.lgamma, (100.0,), math.lgamma(100.0), 1e-15),
    ("lgamma_1e10", lax.lgamma, (1e10,), math.lgamma(1e10), 1e-15),
    ("lgamma_pole_0", lax.lgamma, (0.0,), np.inf, 0),
    ("lgamma_pole_minus_3", lax.lgamma, (-3.0,), np.inf, 0),
    ("lgamma_minus_100_5", lax.lgamma, (-100.5,), math.lgamma(-100.5), 1e-13),
    ("digamma_1", lax.digamma, (1.0,), -EULER, 1e-15),
    ("digamma_half", lax.digamma, (0.5,), -EULER - 2 * math.log(2), 1e-15),
    ("digamma_2", lax.digamma, (2.0,), 1 - EULER, 1e-15),
    ("digamma_minus_half", lax.digamma, (-0.5,), -EULER - 2 * math.log(2) + 2, 1e-14),
    ("digamma_pole", lax.digamma, (-2.0,), np.nan, 0),
    ("trigamma_1", lambda x: lax.polygamma(1, x), (1.0,), math.pi ** 2 / 6, 1e-15),
    ("trigamma_half", lambda x: lax.polygamma(1, x), (0.5,), math.pi ** 2 / 2, 1e-15),
    ("tetragamma_1", lambda x: lax.polygamma(2, x), (1.0,), -2 * ZETA3, 1e-14),
    ("igamma_a1", lax.igamma, (1.0, 0.7), -math.expm1(-0.7), 1e-15),
    ("igamma_half_is_erf", lax.igamma, (0.5, 2.0), math.erf(math.sqrt(2.0)), 1e-15),
    ("igamma_a2", lax.igamma, (2.0, 3.0), 1 - 4 * math.exp(-3.0), 1e-14),
    ("igamma_at_0", lax.igamma, (3.0, 0.0), 0.0, 0),
    ("igamma_at_inf", lax.igamma, (3.0, np.inf), 1.0, 0),
    ("igamma_bad_a", lax.igamma, (-1.0, 1.0), np.nan, 0),
    ("igammac_tail", lax.igammac, (1.0, 50.0), math.exp(-50.0), 1e-13),
    ("igammac_half_is_erfc", lax.igammac, (0.5, 30.0), math.erfc(math.sqrt(30.0)), 1e-13),
    ("bessel_i0e_0", lax.bessel_i0e, (0.0,), 1.0, 0),
    ("bessel_i1e_0", lax.bessel_i1e, (0.0,), 0.0, 0),
    ("bessel_i0e_19", lax.bessel_i0e, (19.5,), _bessel_ie(0, 19.5), 1e-14),
    ("bessel_i0e_30", lax.bessel_i0e, (30.0,), _bessel_ie(0, 30.0), 1e-14),
    ("bessel_i0e_minus_100", lax.bessel_i0e, (-100.0,), _bessel_ie(0, -100.0), 1e-14),
    ("bessel_i1e_30", lax.bessel_i1e, (30.0,), _bessel_ie(1, 30.0), 1e-14),
    ("bessel_i1e_minus_7", lax.bessel_i1e, (-7.0,), _bessel_ie(1, -7.0), 1e-14),
    ("bessel_i0e_inf", lax.bessel_i0e, (np.inf,), 0.0, 0),
    ("tan", lax.tan, (1.0,), math.tan(1.0), 1e-15),
    ("asin", lax.asin, (0.5,), math.pi / 6, 1e-15),
    ("acos", lax.acos, (0.5,), math.pi / 3, 1e-15),
    ("acosh", lax.acosh, (2.0,), math.log(2 + math.sqrt(3)), 1e-15),
    ("atanh", lax.atanh, (0.5,), 0.5 * math.log(3), 1e-15),
    ("cbrt_negative", lax.cbrt, (-27.0,), -3.0, 0),
    ("square_int", lax.square, (np.int32(-7),), 49, 0),
    ("exp2", lax.exp2, (10.0,), 1024.0, 0),
    ("nextafter_up", lax.nextafter, (1.0, 2.0), 1.0 + 2.0 ** -52, 0),
    ("nextafter_f32_down", lax.nextafter, (np.float32(1.0), np.float32(0.0)), 1.0 - 2.0 ** -24, 0),
    ("population_count_int8", lax.population_count, (np.int8(-1),), 8, 0),
    ("population_count_int64_min", lax.population_count, (np.int64(np.iinfo(np.int64).min),), 1, 0),
    ("population_count_uint16", lax.population_count, (np.uint16(0b1011000000000001),), 4, 0),
    ("clamp_inside", lax.clamp, (0.0, 0.5, 1.0), 0.5, 0),
    ("clamp_min_above_max", lax.clamp, (2.0, 0.5, 1.0), 1.0, 0),
]


@pytest.mark.parametrize("name,fun,args,expected,rtol", VALUES, ids=[v[0] for v in VALUES])
def test_values(name, fun, args, expected, rtol):
    got = np.asarray(fun(*args))
    if np.isnan(expected):
        assert np.isnan(got), f"{name}: {got}"
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=0, err_msg=name)


def test_round_methods():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999999999999994, -3.7, 3.2])
    away = lax.round(x)
    even = lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)
    np.testing.assert_array_equal(away, [-3, -2, -1, 1, 2, 3, 0, -4, 3])
    np.testing.assert_array_equal(even, [-2, -2, -0.0, 0, 2, 2, 0, -4, 3])
    assert np.signbit(lax.round(np.array(-0.2)))  # the sign of zero stays
    np.testing.assert_array_equal(lax.round(x, 1), even)  # JAX's int spelling of the enum
    np.testing.assert_array_equal(cv.numpy.round(np.array([2.5, 0.25]), 1), [2.5, 0.2])  # NumPy's


def test_is_finite():
    np.testing.assert_array_equal(lax.is_finite(np.array([1.0, np.inf, -np.inf, np.nan])), [True, False, False, False])
    with pytest.raises(ValueError, match="floating"):
        lax.is_finite(np.array([1, 2]))


@pytest.mark.parametrize("dtype,narrow", [(np.float64, np.float32), (np.float64, np.float16), (np.float32, np.float16)])
def test_reduce_precision_rounds_as_the_narrow_dtype(dtype, narrow):
    info = np.finfo(narrow)
    exponent_bits, mantissa_bits = {np.float32: (8, 23), np.float16: (5, 10)}[narrow]
    rng = np.random.default_rng(0)
    # normal values of the narrow dtype, ties included (the narrow values plus half an ulp)
    x = (rng.uniform(1, 2, 2000) * 2.0 ** rng.integers(-8, 8, 2000)).astype(dtype)
    ties = (x.astype(narrow).astype(dtype) * (1 + float(info.eps) / 2)).astype(dtype)
    x = np.concatenate([x, ties])
    got = lax.reduce_precision(x, exponent_bits, mantissa_bits)
    np.testing.assert_array_equal(got, x.astype(narrow).astype(dtype))
    edges = np.array([float(info.max) * 4, -float(info.max) * 4, float(info.tiny) / 4, np.nan, np.inf], dtype)
    got = lax.reduce_precision(edges, exponent_bits, mantissa_bits)
    np.testing.assert_array_equal(got[:2], [np.inf, -np.inf])
    assert got[2] == 0 and np.isnan(got[3]) and got[4] == np.inf


def test_reduce_precision_derivative_is_reduce_precision():
    x = np.array([0.1, 1 / 3, 2.7])
    t = np.array([1 / 7, 0.3, -1 / 9])
    _, tangent = cv.jvp(lambda v: lax.reduce_precision(v, 8, 23), (x,), (t,))
    np.testing.assert_array_equal(tangent, t.astype(np.float32).astype(np.float64))
    grad = cv.grad(lambda v: lax.reduce_precision(v, 8, 23).sum())(x)
    np.testing.assert_array_equal(grad, np.ones(3))


def test_clamp_derivatives_follow_the_operand_taken():
    lo = np.array([0.0, 0.0, 0.0, 2.0, 2.0])
    x = np.array([-1.0, 0.5, 3.0, 0.5, 1.5])
    hi = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    g_lo, g_x, g_hi = cv.grad(lambda a, b, c: lax.clamp(a, b, c).sum(), argnums=(0, 1, 2))(lo, x, hi)
    # taken: lo, x, hi, hi (lo > hi: hi wins though x < hi), hi
    np.testing.assert_array_equal(g_lo, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(g_x, [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(g_hi, [0, 0, 1, 1, 1])
    check_grads(lambda a, b, c: lax.clamp(a, b, c), (lo + 0.1, x, hi + 0.05), order=2)


def test_select_n_picks_and_differentiates_its_cases():
    which = np.array([0, 2, 1, 2], dtype=np.int32)
    cases = [np.arange(4.0), 10 + np.arange(4.0), 20 + np.arange(4.0)]
    np.testing.assert_array_equal(lax.select_n(which, *cases), [0, 21, 12, 23])
    np.testing.assert_array_equal(lax.select_n(np.array([True, False]), np.ones(2), np.zeros(2)), [0, 1])
    grads = cv.grad(lambda *cs: (lax.select_n(which, *cs) * np.array([1.0, 2, 3, 4])).sum(), argnums=(0, 1, 2))(*cases)
    np.testing.assert_array_equal(grads[0], [1, 0, 0, 0])
    np.testing.assert_array_equal(grads[1], [0, 0, 3, 0])
    np.testing.assert_array_equal(grads[2], [0, 2, 0, 4])
    with pytest.raises(ValueError):
        lax.select_n(np.array([3, 0]), np.ones(2), np.zeros(2))
    with pytest.raises(ValueError, match="two cases"):
        lax.select_n(np.array([True]), np.ones(1), np.ones(1), np.ones(1))


def test_igamma_derivatives():
    a = np.array([0.7, 1.5, 3.0])
    x = np.array([0.3, 2.0, 5.0])
    check_grads(lax.igamma, (a, x), order=1, atol=1e-6, rtol=1e-6)
    check_grads(lax.igammac, (a, x), order=1, atol=1e-6, rtol=1e-6)
    check_grads(lambda v: lax.igamma(a, v), (x,), order=2, atol=1e-6, rtol=1e-6)
    with pytest.raises(NotImplementedError, match="igamma_grad_a"):
        cv.grad(lambda v: lax.igamma_grad_a(v, x).sum())(a)


def test_bessel_i1e_derivative_at_zero():
    assert cv.grad(lax.bessel_i1e)(0.0) == 0.5
    check_grads(lax.bessel_i0e, (np.array([-3.0, -0.5, 0.5, 25.0]),), order=2)


JIT_FUNCTIONS = [lax.tan, lax.asin, lax.acos, lax.atanh, lax.cbrt, lax.square, lax.exp2, lax.erfc, lax.lgamma,
                 lax.digamma, lax.bessel_i0e, lax.bessel_i1e, lax.is_finite, lax.round,
                 lambda x: lax.reduce_precision(x, 5, 10), lambda x: lax.igamma(x + 1, x + 0.5),
                 lambda x: lax.clamp(-0.2, x, 0.3), lambda x: lax.select_n(x > 0, x, -x),
                 lambda x: lax.acosh(x + 2)]


@pytest.mark.parametrize("fun", JIT_FUNCTIONS, ids=lambda f: getattr(f, "__name__", "f"))
def test_jit_matches_eager(fun):
    x = np.linspace(0.05, 0.95, 7)
    np.testing.assert_array_equal(cv.jit(fun)(x), fun(x))


def test_against_scipy_over_wide_ranges():
    special = pytest.importorskip("scipy.special")  # optional: the references above are SciPy's peers
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-30, 30, 5000), rng.uniform(-3, 3, 5000)])
    pos = rng.uniform(0.01, 60, 5000)
    np.testing.assert_allclose(lax.erfc(x[x < 26]), special.erfc(x[x < 26]), rtol=1e-13)
    np.testing.assert_allclose(lax.lgamma(pos), special.gammaln(pos), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(lax.digamma(pos), special.digamma(pos), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lax.bessel_i0e(x), special.i0e(x), rtol=1e-14)
    np.testing.assert_allclose(lax.bessel_i1e(x), special.i1e(x), rtol=1e-13, atol=1e-300)
    a = rng.uniform(0.05, 40, 5000)
    np.testing.assert_allclose(lax.igamma(a, pos), special.gammainc(a, pos), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lax.igammac(a, pos), special.gammaincc(a, pos), rtol=1e-12, atol=1e-14)
