"""cuvmap.scipy.special's Bessel functions (j0, j1, y0, y1, jn, yn, iv, ive, bessel_jn),
betainc and erfcinv: values against integral representations evaluated by Gauss–Legendre
quadrature and against closed forms, derivatives against finite differences in both modes
(float64, to second order), vmap against a loop, jit against eager, float32 against float64.
Rows are data: one per function and argument range."""
import math
import functools
import sys
from pathlib import Path

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap.errors import MissingRuleError
from cuvmap.scipy import special
from cuvmap.test_util import check_grads

import scipy_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bessel_references import betainc_series_one, iv_one, iv_series_one, jn_one, yn_one  # noqa: E402

def _loop(fn):
    return lambda *xs: np.vectorize(fn, otypes=[np.float64])(*xs)



Row = functools.partial(scipy_rows.Row, atol=1e-14)

RNG = np.random.default_rng(3)
X = RNG.uniform(0.2, 20.0, (3, 4))       # autograd's range for j0, j1, y0, y1
XI = RNG.uniform(0.3, 12.0, (3, 4))
V = RNG.uniform(1.0, 50.0, (3, 4))        # autograd's range for iv's order
VF = RNG.uniform(0.0, 3.0, (3, 4))
A = RNG.uniform(1.1, 5.0, (3, 4))
B = RNG.uniform(1.1, 5.0, (3, 4))
U = RNG.uniform(0.02, 0.98, (3, 4))
YC = RNG.uniform(0.05, 1.95, (3, 4))

ROWS = [
    Row("j0", special.j0, _loop(lambda x: jn_one(0, x)), (X,)),
    Row("j1", special.j1, _loop(lambda x: jn_one(1, x)), (X,)),
    Row("j0_negative", special.j0, _loop(lambda x: jn_one(0, x)), (-X,)),
    Row("y0", special.y0, _loop(lambda x: yn_one(0, x)), (X,), rtol=1e-11, atol=1e-13),
    Row("y1", special.y1, _loop(lambda x: yn_one(1, x)), (X,), rtol=1e-11, atol=1e-13),
    Row("jn_2", lambda x: special.jn(2, x), _loop(lambda x: jn_one(2, x)), (X,)),
    Row("jn_7", lambda x: special.jn(7, x), _loop(lambda x: jn_one(7, x)), (X * 2,)),
    Row("jn_minus_3", lambda x: special.jn(-3, x), _loop(lambda x: jn_one(-3, x)), (X,)),
    Row("yn_2", lambda x: special.yn(2, x), _loop(lambda x: yn_one(2, x)), (X,), rtol=1e-11, atol=1e-13),
    Row("yn_5", lambda x: special.yn(5, x), _loop(lambda x: yn_one(5, x)), (X + 3,), rtol=1e-11, atol=1e-13),
    Row("iv", special.iv, _loop(iv_one), (VF, XI), rtol=1e-12, atol=0),
    Row("iv_high_order", special.iv, _loop(lambda v, x: iv_series_one(v, x)), (V, XI), rtol=1e-12, atol=0,
        grad_tol=1e-4),
    Row("ive", special.ive, _loop(lambda v, x: iv_one(v, x) * math.exp(-x)), (VF, XI), rtol=1e-12, atol=0),
    Row("ive_far", special.ive, _loop(lambda v, x: iv_one(v, x) * math.exp(-x)), (VF, XI * 8), rtol=1e-12,
        atol=0),
    Row("betainc", special.betainc, _loop(lambda a, b, x: betainc_series_one(a, b, x)), (A, B, U), rtol=1e-12,
        atol=1e-15),
    Row("erfcinv", special.erfcinv, _loop(lambda y: _erfc_root(y)), (YC,), rtol=1e-13),
]


def _erfc_root(y):
    """erfcinv by bisection on math.erfc."""
    lo, hi = -30.0, 30.0
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return mid
        if math.erfc(mid) > y:
            lo = mid
        else:
            hi = mid


# the differentiated argument: x (the last); the orders and betainc's a, b are held fixed
def _in_x(fun, args):
    fixed = args[:-1]
    return (lambda x: fun(*fixed, x)), (args[-1],)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_values(row):
    scipy_rows.check_value(row)


@pytest.mark.parametrize("row", [r for r in ROWS if r.grad], ids=lambda r: r.name)
def test_grads_both_modes(row):
    f, args = _in_x(row.fun, row.args)
    check_grads(f, args, order=2, modes=("fwd", "rev"), atol=row.grad_tol, rtol=row.grad_tol)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_vmap_over_each_argument(row):
    batched = tuple(np.stack([a * (1 + 0.01 * k) for k in range(3)]) for a in row.args)
    scipy_rows.check_vmap_over_each_argument(row, batched)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_jit_matches_eager(row):
    np.testing.assert_allclose(cv.jit(row.fun)(*row.args), row.fun(*row.args), rtol=1e-15, atol=0)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_float32(row):
    args32 = tuple(a.astype(np.float32) for a in row.args)
    out = row.fun(*args32)
    assert out.dtype == np.float32, (row.name, out.dtype)
    np.testing.assert_allclose(out, row.fun(*(a.astype(np.float64) for a in args32)), rtol=2e-6, atol=2e-6)


# ---------------------------------------------------------------------------------------
# Closed forms, derivative identities, edges and refusals
# ---------------------------------------------------------------------------------------

XS = np.array([0.3, 1.0, 2.5, 7.0])
BETAINC_CLOSED = [  # (a, b, I_x(a, b) as a function of x)
    (1.0, 1.0, lambda x: x),
    (3.0, 1.0, lambda x: x ** 3),
    (1.0, 2.5, lambda x: 1 - (1 - x) ** 2.5),
    (2.0, 2.0, lambda x: 3 * x ** 2 - 2 * x ** 3),
    (0.5, 0.5, lambda x: 2 / math.pi * np.arcsin(np.sqrt(x))),
    (30.0, 40.0, None),  # only the symmetry I_x(a, b) = 1 − I_{1−x}(b, a)
]


@pytest.mark.parametrize("a,b,closed", BETAINC_CLOSED)
def test_betainc_closed_forms(a, b, closed):
    x = np.linspace(0.01, 0.99, 25)
    if closed is not None:
        np.testing.assert_allclose(special.betainc(a, b, x), closed(x), rtol=2e-14, atol=1e-16)
    np.testing.assert_allclose(special.betainc(a, b, x), 1 - special.betainc(b, a, 1 - x), rtol=1e-13, atol=1e-15)


def test_bessel_identities():
    # the half-integer orders in closed form: I_{1/2}(x) = √(2/(πx)) sinh x
    np.testing.assert_allclose(special.iv(0.5, XS), np.sqrt(2 / (math.pi * XS)) * np.sinh(XS), rtol=1e-14)
    np.testing.assert_allclose(special.iv(1.5, XS), np.sqrt(2 / (math.pi * XS)) * (np.cosh(XS) - np.sinh(XS) / XS),
                               rtol=1e-13)
    # the integer orders agree with i0, i1; I_{−n} = I_n; I_n(−x) = (−1)ⁿ I_n(x)
    np.testing.assert_allclose(special.iv(0.0, XS), special.i0(XS), rtol=1e-14)
    np.testing.assert_allclose(special.ive(1.0, -XS), special.i1e(-XS), rtol=1e-14)
    np.testing.assert_allclose(special.iv(-3.0, -XS), -special.iv(3.0, XS), rtol=1e-15)
    # Wronskian J_{n+1} Y_n − J_n Y_{n+1} = 2/(πx), near and past the switch to Hankel's expansion
    x = np.concatenate([XS, [24.9, 25.0, 60.0, 800.0]])
    for n in (0, 1, 4):
        w = special.jn(n + 1, x) * special.yn(n, x) - special.jn(n, x) * special.yn(n + 1, x)
        np.testing.assert_allclose(w, 2 / (math.pi * x), rtol=1e-13)
    # J_0 + 2 Σ J_{2k} = 1 over a large x, and the recurrence J_{n−1} + J_{n+1} = (2n/x) J_n
    big = np.array([30.0, 100.0])
    np.testing.assert_allclose(special.j0(big) + 2 * sum(special.jn(2 * k, big) for k in range(1, 80)), 1.0,
                               atol=1e-14)
    np.testing.assert_allclose(special.jn(9, big) + special.jn(11, big), 20 / big * special.jn(10, big), atol=1e-15)
    # JAX's bessel_jn stacks the orders 0..v
    np.testing.assert_allclose(special.bessel_jn(XS, v=3), np.stack([special.jn(k, XS) for k in range(4)]), rtol=0)
    # derivatives: j0' = −j1, y0' = −y1, iv' = (iv(v−1) + iv(v+1))/2
    np.testing.assert_allclose(cv.vmap(cv.grad(special.j0))(XS), -special.j1(XS), rtol=1e-14)
    np.testing.assert_allclose(cv.vmap(cv.grad(special.y0))(XS), -special.y1(XS), rtol=1e-13)
    np.testing.assert_allclose(cv.vmap(cv.grad(lambda x: special.iv(2.3, x)))(XS),
                               (special.iv(1.3, XS) + special.iv(3.3, XS)) / 2, rtol=1e-13)
    np.testing.assert_allclose(cv.grad(lambda x: special.ive(1.0, x))(0.0), 0.5)
    np.testing.assert_allclose(cv.grad(lambda x: special.betainc(2.0, 3.0, x))(0.4), 12 * 0.4 * 0.6 ** 2, rtol=1e-14)


def test_bessel_edges():
    assert special.j0(0.0) == 1 and special.j1(0.0) == 0 and special.jn(3, 0.0) == 0
    assert special.y0(0.0) == -np.inf and special.yn(4, 0.0) == -np.inf
    assert np.isnan(special.y1(-1.0)) and np.isnan(special.jn(2.5, 1.0))
    assert special.yn(100, 0.5) < -1e200  # the forward recurrence far below the order
    assert special.ive(0.0, 0.0) == 1 and special.ive(2.5, 0.0) == 0
    assert np.isnan(special.ive(0.5, -1.0)) and np.isnan(special.ive(-0.5, 1.0))
    assert special.ive(0.0, np.inf) == 0
    with np.errstate(over="ignore"):
        assert special.iv(3.0, 1000.0) == np.inf  # e^{1000} overflows
    np.testing.assert_allclose(special.jn(3, 1e-5), (5e-6) ** 3 / 6 * (1 - 2.5e-11 / 4), rtol=1e-15)
    assert special.betainc(2.0, 3.0, 0.0) == 0 and special.betainc(2.0, 3.0, 1.0) == 1
    assert np.isnan(special.betainc(-1.0, 3.0, 0.5)) and np.isnan(special.betainc(2.0, 3.0, 1.5))
    assert special.erfcinv(0.0) == np.inf and special.erfcinv(2.0) == -np.inf
    np.testing.assert_allclose(special.erfcinv(1e-300), _erfc_root(1e-300), rtol=1e-14)
    assert lax.betainc(2.0, 3.0, 0.4).dtype == np.float64


def test_order_derivatives_refused():
    for f in (lambda v: special.jn(v, 2.0), lambda v: special.yn(v, 2.0), lambda v: special.iv(v, 2.0),
              lambda a: special.betainc(a, 2.0, 0.5), lambda b: special.betainc(2.0, b, 0.5)):
        with pytest.raises(MissingRuleError, match="derivative"):
            cv.grad(f)(2.0)
    with pytest.raises(TypeError, match="complex"):
        special.j0(np.array([1.0 + 1j]))
    with pytest.raises(ValueError, match="bessel_jn"):
        special.bessel_jn(XS, v=-1)


def test_against_scipy():
    sp = pytest.importorskip("scipy.special")  # optional: the references above are independent
    x = np.concatenate([np.geomspace(1e-6, 1e3, 400), np.linspace(0.2, 30, 300)])
    for n in (0, 1, 2, 5, 30):
        np.testing.assert_allclose(special.jn(n, x), sp.jv(n, x), rtol=1e-9, atol=2e-15)
        np.testing.assert_allclose(special.yn(n, x), sp.yn(n, x), rtol=1e-11, atol=1e-14)
    for v in (0.0, 0.7, 2.5, 20.0, 50.0):
        # the series' scale exp(log t_k* − x) carries lgamma's error times the exponent (NOTE [ive by its
        # series summed from the largest term]): 5e-12 near x = 1000 for the high orders
        np.testing.assert_allclose(special.ive(v, x), sp.ive(v, x), rtol=5e-12, atol=1e-300)
    a, b = np.meshgrid(np.geomspace(0.1, 200, 20), np.geomspace(0.1, 200, 20))
    u = np.linspace(0.001, 0.999, 400).reshape(20, 20)
    np.testing.assert_allclose(special.betainc(a, b, u), sp.betainc(a, b, u), rtol=1e-11, atol=1e-15)
