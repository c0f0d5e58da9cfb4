"""jax.numpy / jax.scipy names the issue-32 audit found missing: ``average``, ``ptp``,
``cumulative_sum``, ``cumulative_prod``, ``isin``, ``array_equal``, ``array_equiv``,
``isposinf``, ``isneginf``, ``nanquantile``, ``nanpercentile``, ``nanmedian``,
``vectorize``, ``apply_along_axis``; ``scipy.linalg.cholesky`` and ``eigh``;
``scipy.special.entr``, ``rel_entr``, ``kl_div``, ``i0``, ``i0e``, ``i1``, ``i1e``;
``var``/``std`` ``mean=``; ``union1d``, ``intersect1d``, ``setdiff1d``, ``setxor1d``,
``unique_values``, ``unique_counts``, ``unique_inverse``, ``unique_all`` (with ``size=``:
under ``jit`` and ``vmap``), ``spacing``, ``i0``; ``lax.reduce_prod``, ``reduce_and``, ``reduce_or``,
``reduce_xor``, ``full``, ``broadcasted_iota``, ``collapse``.

Every row is checked against NumPy or a closed form, under ``jit``, under ``vmap`` over
each argument against a loop, and, where differentiable, with ``check_grads`` in both
modes in float64."""
import math

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.lax as lax
import cuvmap.numpy as cnp
import cuvmap.scipy.linalg as sla
import cuvmap.scipy.special as special
from name_rows import assert_results_close, assert_vmap_over_argument_is_a_loop, check_row_grads


RNG = np.random.default_rng(320)
A34 = RNG.normal(size=(3, 4))
W34 = RNG.uniform(0.2, 2.0, size=(3, 4))
W4 = RNG.uniform(0.2, 2.0, size=4)
V5 = RNG.normal(size=5)
P5 = RNG.uniform(0.1, 1.0, size=5)
Q5 = RNG.uniform(0.1, 1.0, size=5)
NAN_MASK = np.array([[False, True, False, False], [False, False, False, False], [True, False, True, False]])
M3 = RNG.normal(size=(3, 3))
SPD = M3 @ M3.T + 3 * np.eye(3)
Q3 = np.array([0.0, 0.3, 1.0])
INTS = RNG.integers(0, 256, size=(3, 4)).astype(np.uint8)
BOOLS = RNG.random((3, 4)) < 0.6
SET1 = np.array([5, 1, 3, 3, 7, 1])
SET2 = np.array([3, 8, 1, 1, 9, 0])
SPECIAL_FLOATS = np.array([0.0, -0.0, 1.0, -1.0, 1e300, -3.5, 5e-324, np.finfo(float).max])


def _padded(values, size, fill):
    return np.concatenate([values, np.full(size - len(values), fill, values.dtype)])


def _nans(x):
    return cnp.where(NAN_MASK, np.nan, x)


def _np_nans(x):
    return np.where(NAN_MASK, np.nan, x)


def _bessel_series(x, order):
    """``I_order(x) = Σ_k (x/2)^(2k+order) / (k! (k+order)!)``, 40 terms."""
    return sum((x / 2) ** (2 * k + order) / (math.factorial(k) * math.factorial(k + order)) for k in range(40))


def _np_entr(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, -x * np.log(np.where(x > 0, x, 1)), np.where(x == 0, 0.0, -np.inf))


def _np_eigh_lower(a):
    w, v = np.linalg.eigh(np.tril(a) + np.tril(a, -1).T)
    return w, np.abs(v)


# (name, cuvmap function, reference, args, indices of the args to differentiate)
ROWS = [
    ("average", cnp.average, np.average, (A34,), (0,)),
    ("average weights axis returned", lambda a, w: cnp.average(a, 1, w, returned=True),
     lambda a, w: np.average(a, 1, w, returned=True), (A34, W34), (0, 1)),
    ("average 1-d weights keepdims", lambda a, w: cnp.average(a, 1, w, keepdims=True),
     lambda a, w: np.average(a, 1, w, keepdims=True), (A34, W4), (0, 1)),
    ("ptp", lambda a: cnp.ptp(a, axis=0), lambda a: np.ptp(a, axis=0), (A34,), (0,)),
    ("cumulative_sum include_initial", lambda a: cnp.cumulative_sum(a, axis=1, include_initial=True),
     lambda a: np.cumulative_sum(a, axis=1, include_initial=True), (A34,), (0,)),
    ("cumulative_prod", lambda a: cnp.cumulative_prod(a), lambda a: np.cumulative_prod(a), (V5,), (0,)),
    ("isin", lambda e, t: cnp.isin(e, t), lambda e, t: np.isin(e, t), (np.array([[1, 2], [3, 4]]), np.array([4, 1])),
     ()),
    ("isin invert", lambda e, t: cnp.isin(e, t, invert=True), lambda e, t: np.isin(e, t, invert=True),
     (np.array([1.0, 2.0, 3.0]), np.array([2.0])), ()),
    ("array_equal", lambda a, b: cnp.array_equal(a, b), lambda a, b: np.array_equal(a, b), (A34, A34), ()),
    ("array_equal equal_nan", lambda a: cnp.array_equal(_nans(a), _nans(a), equal_nan=True),
     lambda a: np.array_equal(_np_nans(a), _np_nans(a), equal_nan=True), (A34,), ()),
    ("array_equiv", lambda a, b: cnp.array_equiv(a, b), lambda a, b: np.array_equiv(a, b), (A34[:1], A34[:1]), ()),
    ("isposinf", lambda x: cnp.isposinf(x / 0.0), lambda x: np.isposinf(x / 0.0), (V5,), ()),
    ("isneginf", lambda x: cnp.isneginf(x / 0.0), lambda x: np.isneginf(x / 0.0), (V5,), ()),
    ("nanquantile", lambda a: cnp.nanquantile(_nans(a), Q3, axis=1), lambda a: np.nanquantile(_np_nans(a), Q3, axis=1),
     (A34,), (0,)),
    ("nanquantile nearest all", lambda a: cnp.nanquantile(_nans(a), 0.4, method="nearest"),
     lambda a: np.nanquantile(_np_nans(a), 0.4, method="nearest"), (A34,), (0,)),
    ("nanpercentile midpoint", lambda a: cnp.nanpercentile(_nans(a), 35.0, axis=0, method="midpoint"),
     lambda a: np.nanpercentile(_np_nans(a), 35.0, axis=0, method="midpoint"), (A34,), (0,)),
    ("nanmedian keepdims", lambda a: cnp.nanmedian(_nans(a), axis=1, keepdims=True),
     lambda a: np.nanmedian(_np_nans(a), axis=1, keepdims=True), (A34,), (0,)),
    ("vectorize", lambda a, b: cnp.vectorize(lambda x, y: x * cnp.sin(y))(a, b),
     lambda a, b: a * np.sin(b), (A34, W4), (0, 1)),
    ("vectorize signature", lambda m, v: cnp.vectorize(lambda m, v: m @ v, signature="(m,n),(n)->(m)")(m, v),
     lambda m, v: m @ v, (np.stack([A34, W34]), W4), (0, 1)),
    ("vectorize excluded", lambda a: cnp.vectorize(lambda x, p: x ** p, excluded={1})(a, 3),
     lambda a: a ** 3, (A34,), (0,)),
    ("apply_along_axis", lambda a: cnp.apply_along_axis(lambda r: cnp.outer(r, r[:2]), 1, a),
     lambda a: np.apply_along_axis(lambda r: np.outer(r, r[:2]), 1, a), (A34,), (0,)),
    ("scipy.linalg.cholesky", sla.cholesky, lambda a: np.linalg.cholesky(a).T, (SPD,), (0,)),
    ("scipy.linalg.cholesky lower", lambda a: sla.cholesky(a, lower=True), np.linalg.cholesky, (SPD,), (0,)),
    ("scipy.linalg.eigh lower triangle", lambda a: (sla.eigh(a)[0], cnp.abs(sla.eigh(a)[1])), _np_eigh_lower,
     (SPD + np.triu(M3, 1),), (0,)),
    ("scipy.linalg.eigh eigvals_only upper", lambda a: sla.eigh(a, lower=False, eigvals_only=True),
     lambda a: np.linalg.eigvalsh(np.triu(a) + np.triu(a, 1).T), (SPD,), (0,)),
    ("entr", special.entr, _np_entr, (np.array([0.5, 0.0, -1.0, 2.0]),), ()),
    ("entr positive", special.entr, _np_entr, (P5,), (0,)),
    ("rel_entr", special.rel_entr, lambda p, q: p * np.log(p / q), (P5, Q5), (0, 1)),
    ("kl_div", special.kl_div, lambda p, q: p * np.log(p / q) - p + q, (P5, Q5), (0, 1)),
    ("rel_entr kl_div edges", lambda p, q: (special.rel_entr(p, q), special.kl_div(p, q)),
     lambda p, q: (np.array([0.0, np.inf, np.inf]), np.array([2.0, np.inf, np.inf])),
     (np.array([0.0, -1.0, 1.0]), np.array([2.0, 1.0, -1.0])), ()),
    ("i0", special.i0, lambda x: _bessel_series(x, 0), (V5 * 2,), (0,)),
    ("i1", special.i1, lambda x: _bessel_series(x, 1), (V5 * 2,), (0,)),
    ("i0e", special.i0e, lambda x: np.exp(-np.abs(x)) * _bessel_series(x, 0), (V5 * 2,), (0,)),
    ("i1e", special.i1e, lambda x: np.exp(-np.abs(x)) * _bessel_series(x, 1), (V5 * 2,), (0,)),
    ("var mean", lambda a, m: cnp.var(a, axis=1, mean=m), lambda a, m: np.var(a, axis=1, mean=m),
     (A34, A34.mean(1, keepdims=True) + 0.2), (0, 1)),
    ("std mean", lambda a, m: cnp.std(a, axis=0, mean=m), lambda a, m: np.std(a, axis=0, mean=m),
     (A34, A34.mean(0, keepdims=True)), (0, 1)),
    ("lax.reduce_prod", lambda a: lax.reduce_prod(a, (1,)), lambda a: np.prod(a, 1), (A34,), (0,)),
    ("lax.reduce_and uint8", lambda a: lax.reduce_and(a, (0,)), lambda a: np.bitwise_and.reduce(a, 0), (INTS,), ()),
    ("lax.reduce_or bool", lambda a: lax.reduce_or(a, (1,)), lambda a: np.any(a, 1), (BOOLS,), ()),
    ("lax.reduce_xor", lambda a: lax.reduce_xor(a, (0, 1)), lambda a: np.bitwise_xor.reduce(a.ravel()), (INTS,), ()),
    ("lax.full traced fill", lambda x: lax.full((2, 3), x[1]), lambda x: np.full((2, 3), x[1]), (V5,), (0,)),
    ("lax.broadcasted_iota", lambda a: a * lax.broadcasted_iota(np.float64, (3, 4), 1),
     lambda a: a * np.arange(4.0), (A34,), (0,)),
    ("lax.collapse", lambda a: lax.collapse(a, 0), lambda a: a.reshape(-1), (A34,), (0,)),
    ("union1d size", lambda a, b: cnp.union1d(a, b, size=9), lambda a, b: _padded(np.union1d(a, b), 9, 0),
     (SET1, SET2), ()),
    ("intersect1d size fill", lambda a, b: cnp.intersect1d(a, b, size=4, fill_value=-1),
     lambda a, b: _padded(np.intersect1d(a, b), 4, -1), (SET1, SET2), ()),
    ("intersect1d return_indices size", lambda a, b: cnp.intersect1d(a, b, return_indices=True, size=2),
     lambda a, b: np.intersect1d(a, b, return_indices=True), (SET1, SET2), ()),
    ("setdiff1d size", lambda a, b: cnp.setdiff1d(a, b, size=4), lambda a, b: _padded(np.setdiff1d(a, b), 4, 0),
     (SET1, SET2), ()),
    ("setxor1d size fill", lambda a, b: cnp.setxor1d(a, b, size=7, fill_value=99),
     lambda a, b: _padded(np.setxor1d(a, b), 7, 99), (SET1, SET2), ()),
    ("unique_all size", lambda x: tuple(cnp.unique_all(x, size=4)), lambda x: tuple(np.unique_all(x)),
     (SET1,), ()),
    ("unique_counts size", lambda x: tuple(cnp.unique_counts(x, size=4)), lambda x: tuple(np.unique_counts(x)),
     (SET1,), ()),
    ("unique_inverse size", lambda x: tuple(cnp.unique_inverse(x.reshape(2, 3), size=4)),
     lambda x: tuple(np.unique_inverse(x.reshape(2, 3))), (SET1,), ()),
    ("unique_values size", lambda x: cnp.unique_values(x, size=4), np.unique, (SET1,), ()),   # sorted, as JAX
    ("spacing", cnp.spacing, np.spacing, (SPECIAL_FLOATS,), ()),
    ("i0", cnp.i0, np.i0, (V5 * 2,), (0,)),
]
IDS = [r[0] for r in ROWS]


def _assert_close(got, want):
    assert_results_close(got, want, rtol=1e-09, atol=1e-10)


@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_values(name, f, ref, args, diff):
    with np.errstate(divide="ignore", invalid="ignore"):
        want = ref(*args)
    _assert_close(f(*args), want)


@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_under_jit(name, f, ref, args, diff):
    _assert_close(cv.jit(f)(*args), f(*args))


VMAP_CASES = [(r, k) for r in ROWS for k in range(len(r[3]))]


@pytest.mark.parametrize("row, k", VMAP_CASES, ids=[f"{r[0]}-arg{k}" for r, k in VMAP_CASES])
def test_under_vmap_over_each_argument(row, k):
    name, f, ref, args, diff = row
    x = np.asarray(args[k])
    if x.dtype.kind in "iub":
        batch = np.stack([x, x[::-1], np.roll(x, 1)])
    elif name.startswith(("scipy.linalg", "rel_entr", "kl_div", "entr positive")):
        batch = np.stack([x, x * 1.5, x + 0.25 * (x > 0)])       # keeps positive definiteness / positivity
    else:
        batch = np.stack([x, x * 1.5 - 0.1, x[::-1]])

    assert_vmap_over_argument_is_a_loop(f, args, k, batch, rtol=1e-09, atol=1e-10)


GRAD_ROWS = [r for r in ROWS if r[4]]


@pytest.mark.parametrize("name, f, ref, args, diff", GRAD_ROWS, ids=[r[0] for r in GRAD_ROWS])
def test_derivatives_both_modes(name, f, ref, args, diff):
    check_row_grads(f, args, diff, tol=1e-05)


def test_refusals():
    with pytest.raises(ValueError, match="axis must be given"):
        cnp.cumulative_sum(A34)
    with pytest.raises(NotImplementedError, match="standard eigenproblem"):
        sla.eigh(SPD, SPD)
    with pytest.raises(ValueError, match="core dim 'n'"):
        cnp.vectorize(lambda a, b: a @ b, signature="(n),(n)->()")(V5, W4)
    with pytest.raises(ValueError, match="signature"):
        cnp.vectorize(lambda a: a, signature="(n)->")
    assert not cnp.array_equal(A34, A34[:2]) and not cnp.array_equiv(A34, A34[:, :2])


@pytest.mark.parametrize("name", ["union1d", "intersect1d", "setdiff1d", "setxor1d"])
def test_set_operations_without_size(name):
    np.testing.assert_array_equal(getattr(cnp, name)(SET1, SET2), getattr(np, name)(SET1, SET2))
    with pytest.raises(cv.errors.ConcretizationError):
        cv.jit(getattr(cnp, name))(SET1, SET2)


def test_index_grids_are_numpys():
    np.testing.assert_array_equal(cnp.mgrid[0:2, 0:3], np.mgrid[0:2, 0:3])
    for got, want in zip(cnp.ogrid[0:2, 0:3], np.ogrid[0:2, 0:3]):
        np.testing.assert_array_equal(got, want)
