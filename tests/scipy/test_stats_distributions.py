"""cuvmap.scipy.stats' t, chi2, gamma, beta, poisson, multivariate_normal and dirichlet:
values against Python's math module (one element at a time) and closed forms, derivatives
against finite differences in both modes (float64, second order) in the arguments each
function is differentiable in, vmap over each argument against a loop, jit against eager,
float32 against float64. Rows are data: one per function."""
import math

import numpy as np
import pytest

import cuvmap as cv
from cuvmap.errors import MissingRuleError
from cuvmap.scipy.stats import beta, chi2, dirichlet, gamma, multivariate_normal, poisson, t
from cuvmap.test_util import check_batching, check_grads

import scipy_rows
from scipy_rows import Row

LOG_2PI = math.log(2 * math.pi)


def _loop(fn):
    return lambda *xs: np.vectorize(fn, otypes=[np.float64])(*xs)


def _t_logpdf_one(x, df, loc, scale):
    z = (x - loc) / scale
    return (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi) - math.log(scale)
            - (df + 1) / 2 * math.log1p(z * z / df))


def _t_cdf_one(x, df):
    """P(T ≤ x) for an integer df by the finite sums of Abramowitz & Stegun 26.7.3–4."""
    df = int(df)
    theta = math.atan(x / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2 == 1:
        total, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):  # c + (2/3) c³ + (2·4)/(3·5) c⁵ + ⋯
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        a = 2 / math.pi * (theta + (s * total if df > 1 else 0.0))
    else:
        total, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):  # 1 + (1/2) c² + (1·3)/(2·4) c⁴ + ⋯
            total += term
            term *= c * c * (2 * k - 1) / (2 * k)
        a = s * total
    return 0.5 + 0.5 * a


def _gamma_cdf_integer_one(x, a):
    """P(a, x) = 1 − e^{−x} Σ_{k<a} x^k/k! for an integer a."""
    return -math.expm1(-x) if a == 1 else 1 - math.exp(-x) * math.fsum(x ** k / math.factorial(k) for k in range(int(a)))


def _poisson_cdf_one(k, mu):
    return math.fsum(math.exp(j * math.log(mu) - mu - math.lgamma(j + 1)) for j in range(int(k) + 1)) if k >= 0 else 0.0



RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4))
POS = RNG.uniform(1.1, 4.0, (3, 4))
DF = RNG.uniform(2.1, 6.0, (3, 4))
SCALE = RNG.uniform(0.5, 2.0, (3, 4))
U = RNG.uniform(0.05, 0.95, (3, 4))
ODD = np.array([[1.0, 3.0, 5.0, 7.0]] * 3)
EVEN = np.array([[2.0, 4.0, 6.0, 10.0]] * 3)
INT_A = np.array([[1.0, 2.0, 3.0, 6.0]] * 3)
K = np.round(RNG.uniform(0, 8, (3, 4)))

ROWS = [
    Row("t.logpdf", t.logpdf, _loop(_t_logpdf_one), (X, DF, X * 0.3, SCALE), (0, 1, 2, 3)),
    Row("t.pdf", t.pdf, _loop(lambda *a: math.exp(_t_logpdf_one(*a))), (X, DF, X * 0.3, SCALE), (0, 1, 2, 3)),
    Row("t.cdf_odd_df", t.cdf, _loop(_t_cdf_one), (X * 3, ODD), (0,)),
    Row("t.cdf_even_df", t.cdf, _loop(_t_cdf_one), (X * 3, EVEN), (0,)),
    Row("t.cdf_loc_scale", lambda x, l, s: t.cdf(x, 3.0, l, s), _loop(lambda x, l, s: _t_cdf_one((x - l) / s, 3)),
        (X, X * 0.5, SCALE), (0, 1, 2)),
    Row("t.logcdf", t.logcdf, _loop(lambda x, df: math.log(_t_cdf_one(x, df))), (X * 3, ODD), (0,)),
    Row("t.sf", t.sf, _loop(lambda x, df: _t_cdf_one(-x, df)), (X * 3, EVEN), (0,)),
    Row("chi2.logpdf", chi2.logpdf,
        _loop(lambda x, k: (k / 2 - 1) * math.log(x) - x / 2 - k / 2 * math.log(2) - math.lgamma(k / 2)), (POS, DF),
        (0, 1)),
    Row("chi2.pdf_loc_scale", chi2.pdf,
        _loop(lambda x, k, l, s: math.exp((k / 2 - 1) * math.log((x - l) / s) - (x - l) / (2 * s)
                                          - k / 2 * math.log(2) - math.lgamma(k / 2)) / s),
        (POS + 1, DF, U, SCALE), (0, 1, 2, 3)),
    Row("chi2.cdf_df2", lambda x: chi2.cdf(x, 2.0), _loop(lambda x: -math.expm1(-x / 2)), (POS,), (0,)),
    Row("chi2.cdf_df1", lambda x: chi2.cdf(x, 1.0), _loop(lambda x: math.erf(math.sqrt(x / 2))), (POS,), (0,)),
    Row("chi2.sf_df4", lambda x: chi2.sf(x, 4.0), _loop(lambda x: math.exp(-x / 2) * (1 + x / 2)), (POS * 5,), (0,)),
    Row("gamma.logpdf", gamma.logpdf, _loop(lambda x, a: (a - 1) * math.log(x) - x - math.lgamma(a)), (POS, DF),
        (0, 1)),
    Row("gamma.pdf_loc_scale", gamma.pdf,
        _loop(lambda x, a, l, s: math.exp((a - 1) * math.log((x - l) / s) - (x - l) / s - math.lgamma(a)) / s),
        (POS + 1, DF, U, SCALE), (0, 1, 2, 3)),
    Row("gamma.cdf", gamma.cdf, _loop(_gamma_cdf_integer_one), (POS, INT_A), (0,)),
    Row("gamma.sf", gamma.sf, _loop(lambda x, a: 1 - _gamma_cdf_integer_one(x, a)), (POS, INT_A), (0,), rtol=1e-12),
    Row("beta.logpdf", beta.logpdf,
        _loop(lambda x, a, b: (a - 1) * math.log(x) + (b - 1) * math.log1p(-x) - math.lgamma(a) - math.lgamma(b)
              + math.lgamma(a + b)), (U, POS, DF), (0, 1, 2)),
    Row("beta.pdf", beta.pdf,
        _loop(lambda x, a, b: math.exp((a - 1) * math.log(x) + (b - 1) * math.log1p(-x) - math.lgamma(a)
                                       - math.lgamma(b) + math.lgamma(a + b))), (U, POS, DF), (0, 1, 2)),
    Row("beta.cdf_2_2", lambda x: beta.cdf(x, 2.0, 2.0), _loop(lambda x: 3 * x * x - 2 * x ** 3), (U,), (0,)),
    Row("beta.cdf_a_1", lambda x, a: beta.cdf(x, a, 1.0), _loop(lambda x, a: x ** a), (U, POS), (0,)),
    Row("beta.sf_1_b", lambda x, b: beta.sf(x, 1.0, b), _loop(lambda x, b: (1 - x) ** b), (U, POS), (0,)),
    Row("poisson.logpmf", poisson.logpmf, _loop(lambda k, mu: k * math.log(mu) - mu - math.lgamma(k + 1)), (K, POS),
        (1,)),
    Row("poisson.pmf", poisson.pmf, _loop(lambda k, mu: math.exp(k * math.log(mu) - mu - math.lgamma(k + 1))),
        (K, POS), (1,)),
    Row("poisson.cdf", poisson.cdf, _loop(_poisson_cdf_one), (K, POS), (1,), rtol=1e-12),
]


def _in(fun, args, argnums):
    def f(*diff):
        full = list(args)
        for i, v in zip(argnums, diff):
            full[i] = v
        return fun(*full)

    return f, tuple(args[i] for i in argnums)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_values(row):
    scipy_rows.check_value(row)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_grads_both_modes(row):
    f, args = _in(row.fun, row.args, row.argnums)
    check_grads(f, args, order=row.order, modes=("fwd", "rev"), atol=row.grad_tol, rtol=row.grad_tol)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_vmap_over_each_argument(row):
    batched = tuple(np.stack([a * (1 + 0.01 * k) if a is not K else a + k for k in range(3)]) for a in row.args)
    scipy_rows.check_vmap_over_each_argument(row, batched)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_jit_matches_eager(row):
    np.testing.assert_allclose(cv.jit(row.fun)(*row.args), row.fun(*row.args), rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_float32(row):
    args32 = tuple(a.astype(np.float32) for a in row.args)
    out = row.fun(*args32)
    assert out.dtype == np.float32, (row.name, out.dtype)
    np.testing.assert_allclose(out, row.fun(*(a.astype(np.float64) for a in args32)), rtol=1e-5, atol=1e-6)


def test_supports_and_edges():
    assert t.cdf(0.0, 3.0) == 0.5
    np.testing.assert_allclose(cv.grad(lambda x: t.cdf(x, 3.0))(0.0), math.exp(_t_logpdf_one(0.0, 3.0, 0.0, 1.0)),
                               rtol=1e-15)  # the density, not 0·inf
    np.testing.assert_allclose(t.sf(40.0, 1.0), 0.5 - math.atan(40.0) / math.pi, rtol=1e-13)
    assert chi2.logpdf(-1.0, 3.0) == -np.inf and chi2.pdf(0.0, 2.0) == 0.5 and chi2.logpdf(0.0, 1.0) == np.inf
    assert chi2.cdf(-1.0, 3.0) == 0 and gamma.cdf(-2.0, 2.0) == 0 and gamma.logpdf(-1.0, 2.0) == -np.inf
    assert gamma.pdf(0.0, 1.0) == 1.0
    assert beta.logpdf(1.5, 2.0, 2.0) == -np.inf and beta.cdf(1.5, 2.0, 3.0) == 1 and beta.cdf(-1.0, 2.0, 3.0) == 0
    assert poisson.pmf(2.5, 1.0) == 0 and poisson.logpmf(-1.0, 1.0) == -np.inf and poisson.cdf(-1.0, 2.0) == 0
    np.testing.assert_allclose(poisson.cdf(2.7, 1.5), _poisson_cdf_one(2, 1.5), rtol=1e-14)
    np.testing.assert_allclose(poisson.pmf(5.0, 2.0, loc=2.0), _poisson_cdf_one(3, 2.0) - _poisson_cdf_one(2, 2.0),
                               rtol=1e-13)
    with pytest.raises(MissingRuleError, match="df"):
        cv.grad(lambda df: t.cdf(0.5, df))(3.0)


# ---------------------------------------------------------------------------------------
# multivariate_normal and dirichlet
# ---------------------------------------------------------------------------------------

D = 4
MAT = RNG.standard_normal((D, D))
COV = MAT.T @ MAT + np.eye(D)
MEAN = RNG.standard_normal(D)
XS = RNG.standard_normal((5, D))


def _mvn_logpdf_ref(x, mean, cov):
    y = x - mean
    sign, logdet = np.linalg.slogdet(cov)
    return -0.5 * np.einsum("...i,ij,...j->...", y, np.linalg.inv(cov), y) - 0.5 * D * LOG_2PI - 0.5 * logdet


def _symmetric(f, argnum):
    def g(*args):
        args = list(args)
        args[argnum] = 0.5 * (args[argnum] + args[argnum].T)
        return f(*args)

    return g


MVN_ROWS = [  # (name, function, reference, args)
    ("logpdf", multivariate_normal.logpdf, _mvn_logpdf_ref, (XS, MEAN, COV)),
    ("logpdf_one", multivariate_normal.logpdf, _mvn_logpdf_ref, (XS[0], MEAN, COV)),
    ("pdf", multivariate_normal.pdf, lambda *a: np.exp(_mvn_logpdf_ref(*a)), (XS, MEAN, COV)),
]


@pytest.mark.parametrize("name,fun,ref,args", MVN_ROWS, ids=[r[0] for r in MVN_ROWS])
def test_multivariate_normal(name, fun, ref, args):
    np.testing.assert_allclose(fun(*args), ref(*args), rtol=1e-13)
    check_grads(_symmetric(fun, 2), args, order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(cv.jit(fun)(*args), fun(*args), rtol=1e-14)
    stacked = tuple(np.stack([a * (1 + 0.01 * k) for k in range(3)]) for a in args)
    for axes in ((0, None, None), (None, 0, None), (None, None, 0), (0, 0, 0)):
        check_batching(fun, tuple(s if ax == 0 else a for s, a, ax in zip(stacked, args, axes)), in_axes=axes,
                       atol=1e-12, rtol=1e-12)
    out32 = fun(*(a.astype(np.float32) for a in args))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, ref(*args), rtol=1e-4)


def test_multivariate_normal_singular_and_scalar_forms():
    cov = np.diag([1.0, 2.0, 0.0, 0.0])
    mean = np.array([0.1, 0.2, 0.0, 0.0])
    x = np.array([0.5, -0.3, 0.0, 0.0])
    # the density on the support: a two-dimensional normal with variances 1 and 2
    want = -LOG_2PI - 0.5 * math.log(2.0) - 0.5 * (0.4 ** 2 + 0.5 ** 2 / 2)
    np.testing.assert_allclose(multivariate_normal.logpdf(x, mean, cov, allow_singular=True), want, rtol=1e-14)
    assert np.isnan(multivariate_normal.logpdf(x, mean, cov))  # not positive definite: NaN, as JAX

    def on_support(x, mean):
        x = cv.numpy.concatenate([x[:2], mean[2:]])
        return multivariate_normal.logpdf(x, mean, cov, allow_singular=True)

    check_grads(on_support, (x, mean), order=2, modes=("fwd", "rev"))
    # a scalar variance, a scalar mean
    np.testing.assert_allclose(multivariate_normal.logpdf(XS, MEAN, 2.0), _mvn_logpdf_ref(XS, MEAN, 2.0 * np.eye(D)),
                               rtol=1e-14)
    np.testing.assert_allclose(multivariate_normal.logpdf(0.3, 0.1, 2.0),
                               -0.5 * 0.2 ** 2 / 2 - 0.5 * (LOG_2PI + math.log(2.0)), rtol=1e-14)
    # entropy: ½ d (1 + log 2π) + ½ log det cov
    np.testing.assert_allclose(multivariate_normal.entropy(MEAN, COV),
                               0.5 * D * (1 + LOG_2PI) + 0.5 * np.linalg.slogdet(COV)[1], rtol=1e-14)
    check_grads(_symmetric(multivariate_normal.entropy, 1), (MEAN, COV), order=2, modes=("fwd", "rev"))
    with pytest.raises(ValueError, match="cov must have shape"):
        multivariate_normal.logpdf(XS, MEAN, np.eye(3))


ALPHA = np.array([1.5, 2.0, 3.2, 1.3])
SIMPLEX = np.array([0.1, 0.3, 0.4, 0.2])


def _dirichlet_logpdf_ref(x, alpha):
    return (math.fsum((a - 1) * math.log(v) for a, v in zip(alpha, x)) - math.fsum(math.lgamma(a) for a in alpha)
            + math.lgamma(math.fsum(alpha)))


def test_dirichlet():
    np.testing.assert_allclose(dirichlet.logpdf(SIMPLEX, ALPHA), _dirichlet_logpdf_ref(SIMPLEX, ALPHA), rtol=1e-14)
    np.testing.assert_allclose(dirichlet.pdf(SIMPLEX, ALPHA), math.exp(_dirichlet_logpdf_ref(SIMPLEX, ALPHA)),
                               rtol=1e-14)
    # x of shape (K − 1,): the last coordinate is 1 − Σ x; x of shape (K, n): n points
    np.testing.assert_allclose(dirichlet.logpdf(SIMPLEX[:3], ALPHA), _dirichlet_logpdf_ref(SIMPLEX, ALPHA),
                               rtol=1e-14)
    points = np.stack([SIMPLEX, SIMPLEX[::-1]], axis=1)
    np.testing.assert_allclose(dirichlet.logpdf(points, ALPHA),
                               [_dirichlet_logpdf_ref(points[:, j], ALPHA) for j in range(2)], rtol=1e-14)
    assert dirichlet.logpdf(SIMPLEX * 1.1, ALPHA) == -np.inf and dirichlet.pdf(-SIMPLEX, ALPHA) == 0
    normalized = lambda x, a: dirichlet.logpdf(x / cv.numpy.sum(x), a)  # noqa: E731
    check_grads(normalized, (SIMPLEX, ALPHA), order=2, modes=("fwd", "rev"))
    check_grads(dirichlet.pdf, (SIMPLEX, ALPHA), order=2, modes=("fwd", "rev"), eps=1e-7)
    check_batching(dirichlet.logpdf, (np.stack([SIMPLEX, SIMPLEX[::-1]]), np.stack([ALPHA, ALPHA + 1])))
    np.testing.assert_allclose(cv.jit(dirichlet.logpdf)(SIMPLEX, ALPHA), dirichlet.logpdf(SIMPLEX, ALPHA), rtol=1e-15)
    assert dirichlet.logpdf(SIMPLEX.astype(np.float32), ALPHA.astype(np.float32)).dtype == np.float32
    draws = dirichlet.rvs(ALPHA, size=(3,), random_state=0)
    assert draws.shape == (3, 4) and np.allclose(draws.sum(-1), 1) and (draws > 0).all()
    np.testing.assert_array_equal(draws, dirichlet.rvs(ALPHA, size=(3,), random_state=0))
    assert dirichlet.rvs(ALPHA).shape == (1, 4)
    with pytest.raises(TypeError, match="concrete"):
        cv.jit(dirichlet.rvs)(ALPHA)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet.logpdf(SIMPLEX, ALPHA[None])
