"""cuvmap.scipy.special and cuvmap.scipy.stats.norm: values against Python's math module
(one element at a time) and closed forms, derivatives against finite differences in both
modes (float64), vmap against a loop, jit against eager. Rows are data: one per function."""
import math

import numpy as np
import pytest

import cuvmap as cv
from cuvmap.scipy import special
from cuvmap.scipy.stats import norm
from cuvmap.test_util import check_batching, check_grads

import scipy_rows
from scipy_rows import Row

SQRT2 = math.sqrt(2)


def _loop(fn):
    """An elementwise reference from a Python function of floats."""
    return lambda *xs: np.vectorize(fn, otypes=[np.float64])(*xs)


def _ndtr_one(x):
    return 0.5 * math.erfc(-x / SQRT2)


def _log_ndtr_one(x):
    if x > -20:
        return math.log1p(-_ndtr_one(-x)) if x > 0 else math.log(_ndtr_one(x))
    # the asymptotic series of Φ(x)·√(2π)·(−x)·e^{x²/2}, summed until its terms stop shrinking
    total, term, k = 1.0, 1.0, 1
    while True:
        new = -term * (2 * k - 1) / (x * x)
        if abs(new) >= abs(term) or abs(new) < 1e-20:
            break
        total, term, k = total + new, new, k + 1
    return -x * x / 2 - math.log(-x) - 0.5 * math.log(2 * math.pi) + math.log(total)


def _ndtri_one(p):
    """Φ⁻¹(p) by bisection on math.erfc (on log Φ in the far tail)."""
    lo, hi = -40.0, 40.0
    target = math.log(p)
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return mid
        if _log_ndtr_one(mid) < target:
            lo = mid
        else:
            hi = mid


def _digamma_one(x):
    """ψ(x) = ψ(x + N) − Σ_{k<N} 1/(x + k), with ψ's asymptotic series at x + N."""
    n = 50
    y = x + n
    value = math.log(y) - 1 / (2 * y) - 1 / (12 * y ** 2) + 1 / (120 * y ** 4) - 1 / (252 * y ** 6)
    return value - math.fsum(1 / (x + k) for k in range(n))


def _logsumexp_ref(a, axis=None, b=None):
    b = np.ones_like(a) if b is None else np.broadcast_to(b, a.shape)
    a = np.moveaxis(a, axis, -1) if axis is not None else a.reshape(1, -1)
    b = np.moveaxis(b, axis, -1) if axis is not None else b.reshape(1, -1)
    flat_a, flat_b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    sums = [math.fsum(bj * math.exp(aj) for aj, bj in zip(ra, rb)) for ra, rb in zip(flat_a, flat_b)]
    out = np.array([math.log(abs(s)) for s in sums]).reshape(a.shape[:-1])
    sign = np.sign(np.array(sums)).reshape(a.shape[:-1])
    return (out if axis is not None else out[0]), (sign if axis is not None else sign[0])



RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4)) * 2
P = RNG.uniform(0.02, 0.98, (3, 4))
POS = RNG.uniform(0.5, 3.0, (3, 4))
B = RNG.standard_normal((3, 4))

ROWS = [
    Row("logsumexp", lambda a: special.logsumexp(a), lambda a: _logsumexp_ref(a)[0], (X,)),
    Row("logsumexp_axis", lambda a: special.logsumexp(a, axis=1), lambda a: _logsumexp_ref(a, 1)[0], (X,)),
    Row("logsumexp_b", lambda a, b: special.logsumexp(a, axis=0, b=b, return_sign=True)[0],
        lambda a, b: _logsumexp_ref(a, 0, b)[0], (X, B)),
    Row("logsumexp_sign", lambda a, b: special.logsumexp(a, axis=0, b=b, return_sign=True)[1],
        lambda a, b: _logsumexp_ref(a, 0, b)[1], (X, B), grad=False),
    Row("xlogy", special.xlogy, _loop(lambda x, y: x * math.log(y)), (X, POS)),
    Row("xlog1py", special.xlog1py, _loop(lambda x, y: x * math.log1p(y)), (X, POS)),
    Row("gammaln", special.gammaln, _loop(math.lgamma), (POS,)),
    Row("digamma", special.digamma, _loop(_digamma_one), (POS,), rtol=1e-12),
    Row("erf", special.erf, _loop(math.erf), (X,)),
    Row("erfc", special.erfc, _loop(math.erfc), (X,)),
    Row("erfinv", special.erfinv, _loop(lambda y: _ndtri_one((y + 1) / 2) / SQRT2), (2 * P - 1,), rtol=1e-12),
    Row("ndtr", special.ndtr, _loop(_ndtr_one), (X,)),
    Row("ndtri", special.ndtri, _loop(_ndtri_one), (P,), rtol=1e-12, grad_tol=1e-4),
    Row("log_ndtr", special.log_ndtr, _loop(_log_ndtr_one), (X,)),
    Row("log_ndtr_tail", special.log_ndtr, _loop(_log_ndtr_one), (X * 10 - 30,)),
    Row("expit", special.expit, _loop(lambda x: 1 / (1 + math.exp(-x))), (X,)),
    Row("logit", special.logit, _loop(lambda p: math.log(p / (1 - p))), (P,)),
    Row("softmax", lambda x: special.softmax(x, axis=1),
        lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True), (X,)),
    Row("log_softmax", lambda x: special.log_softmax(x, axis=0),
        lambda x: x - np.log(np.exp(x).sum(0, keepdims=True)), (X,)),
    Row("norm.logpdf", lambda x, m, s: norm.logpdf(x, m, s),
        _loop(lambda x, m, s: -((x - m) / s) ** 2 / 2 - math.log(s) - 0.5 * math.log(2 * math.pi)), (X, B, POS)),
    Row("norm.pdf", lambda x, m, s: norm.pdf(x, m, s),
        _loop(lambda x, m, s: math.exp(-((x - m) / s) ** 2 / 2) / (s * math.sqrt(2 * math.pi))), (X, B, POS)),
    Row("norm.cdf", lambda x, m, s: norm.cdf(x, m, s), _loop(lambda x, m, s: _ndtr_one((x - m) / s)), (X, B, POS)),
    Row("norm.logcdf", lambda x, m, s: norm.logcdf(x, m, s), _loop(lambda x, m, s: _log_ndtr_one((x - m) / s)),
        (X, B, POS)),
    Row("norm.sf", lambda x: norm.sf(x), _loop(lambda x: _ndtr_one(-x)), (X,)),
    Row("norm.logsf", lambda x: norm.logsf(x, 1.0, 2.0), _loop(lambda x: _log_ndtr_one(-(x - 1) / 2)), (X,)),
    Row("norm.ppf", lambda q, m, s: norm.ppf(q, m, s), _loop(lambda q, m, s: m + s * _ndtri_one(q)), (P, B, POS),
        rtol=1e-12, grad_tol=1e-4),
]
GRAD_ROWS = [r for r in ROWS if r.grad]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_values(row):
    scipy_rows.check_value(row)


@pytest.mark.parametrize("row", GRAD_ROWS, ids=lambda r: r.name)
def test_grads_both_modes(row):
    check_grads(row.fun, row.args, order=2, modes=("fwd", "rev"), atol=row.grad_tol, rtol=row.grad_tol)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_vmap_matches_loop(row):
    # a batch of 3 along a new leading axis of every operand, each example scaled a little
    # (every operand's domain is kept: P stays in (0, 1), POS positive)
    batched = tuple(np.stack([a * (1 + 0.01 * k) for k in range(3)]) for a in row.args)
    check_batching(row.fun, batched, in_axes=0, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_jit_matches_eager(row):
    np.testing.assert_allclose(cv.jit(row.fun)(*row.args), row.fun(*row.args), rtol=1e-15, atol=0)


def test_edges():
    assert special.xlogy(0.0, 0.0) == 0 and special.xlog1py(0.0, -1.0) == 0
    np.testing.assert_allclose(cv.grad(special.xlogy, argnums=(0, 1))(0.0, 2.0), (math.log(2.0), 0.0))
    assert special.ndtri(0.0) == -np.inf and special.ndtri(1.0) == np.inf
    assert np.isnan(special.ndtri(1.5))
    np.testing.assert_allclose(special.ndtri(0.975), 1.959963984540054, rtol=1e-15)
    # far tails: log Φ(ndtri(p)) = log p where p itself is tiny
    for p in (1e-300, 1e-100, 1e-20):
        np.testing.assert_allclose(special.log_ndtr(special.ndtri(p)), math.log(p), rtol=1e-14)
    np.testing.assert_allclose(special.log_ndtr(-40.0), _log_ndtr_one(-40.0), rtol=1e-15)
    assert np.isfinite(cv.grad(special.log_ndtr)(-100.0))  # φ/Φ ≈ 100, no NaN from the other pieces
    np.testing.assert_allclose(cv.grad(special.log_ndtr)(-100.0), 100.0099980007, rtol=1e-9)
    assert special.logsumexp(np.array([-np.inf, -np.inf])) == -np.inf
    assert np.isnan(special.logsumexp(np.array([0.0, 1.0]), b=np.array([1.0, -1.0])))
    out, sign = special.logsumexp(np.array([0.0, 1.0]), b=np.array([1.0, -1.0]), return_sign=True)
    np.testing.assert_allclose(out, math.log(math.e - 1))
    assert sign == -1
    assert special.logsumexp([1.0, 2.0], keepdims=True).shape == (1,)
    np.testing.assert_allclose(norm.logpdf([0.0, 1.0]), [-0.5 * math.log(2 * math.pi), -0.5 - 0.5 * math.log(2 * math.pi)])
    np.testing.assert_allclose(norm.cdf(np.array([1, 2])), [_ndtr_one(1.0), _ndtr_one(2.0)])  # integers promote


def test_gamma_functions_under_scipy_names():
    a = np.array([0.5, 1.0, 2.0])
    x = np.array([2.0, 0.7, 3.0])
    np.testing.assert_allclose(special.gammainc(a, x),
                               [math.erf(math.sqrt(2.0)), -math.expm1(-0.7), 1 - 4 * math.exp(-3.0)], rtol=1e-14)
    np.testing.assert_allclose(special.gammaincc(a, x) + special.gammainc(a, x), 1.0, rtol=1e-15)
    assert special.psi is special.digamma


GAMMA_X = np.array([0.5, 1.0, 3.5, 7.0, -0.5, -1.5, -2.25])


def test_gamma_family_closed_forms():
    np.testing.assert_allclose(special.gamma(GAMMA_X), [math.gamma(v) for v in GAMMA_X], rtol=1e-13)
    np.testing.assert_allclose(special.rgamma(GAMMA_X), [1 / math.gamma(v) for v in GAMMA_X], rtol=1e-13)
    np.testing.assert_array_equal(special.gammasgn(GAMMA_X), np.sign([math.gamma(v) for v in GAMMA_X]))
    assert special.rgamma(-2.0) == 0 and np.isnan(special.gammasgn(0.0))
    a, b = np.array([0.5, 2.0, 3.0]), np.array([0.5, 3.0, 1.5])
    want = [math.gamma(x) * math.gamma(y) / math.gamma(x + y) for x, y in zip(a, b)]
    np.testing.assert_allclose(special.beta(a, b), want, rtol=1e-13)
    np.testing.assert_allclose(special.betaln(a, b), np.log(want), rtol=1e-13, atol=1e-15)
    # Γ_2(a) = √π Γ(a) Γ(a − 1/2)
    np.testing.assert_allclose(special.multigammaln(3.0, 2),
                               math.log(math.sqrt(math.pi) * math.gamma(3.0) * math.gamma(2.5)), rtol=1e-14)
    np.testing.assert_allclose(special.polygamma(1, 1.0), math.pi ** 2 / 6, rtol=1e-15)
    np.testing.assert_allclose(special.polygamma(0, 1.0), -0.5772156649015329, rtol=1e-15)
    with pytest.raises(ValueError, match="polygamma"):
        special.polygamma(np.array([1, 2]), 1.0)
    check_grads(lambda x, y: special.betaln(x, y), (a, b), order=2)
    check_grads(special.gamma, (GAMMA_X,), order=2, atol=1e-4, rtol=1e-4)
    check_batching(lambda x: special.multigammaln(x, 3), (np.stack([a + 2, a + 3]),))


def test_against_scipy():
    sp = pytest.importorskip("scipy.special")  # optional: the references above are independent
    x = np.linspace(-38, 8, 2001)
    np.testing.assert_allclose(special.log_ndtr(x), sp.log_ndtr(x), rtol=1e-13)
    p = np.concatenate([np.logspace(-300, -1, 300), np.linspace(0.1, 0.999, 300)])
    np.testing.assert_allclose(special.ndtri(p), sp.ndtri(p), rtol=1e-13)
