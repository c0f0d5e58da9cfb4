"""The jax.numpy names of issue 32's polynomial / calculus / statistics round (polyadd ...
polyfit, vander, trapezoid, gradient, unwrap, cov, corrcoef, bincount, lexsort,
sort_complex, nancumsum, nancumprod) and the signature gaps closed in existing functions
(take / take_along_axis modes, pad modes, argsort dtype, ravel_multi_index dtype).

Every row is checked against NumPy (or a closed form where NumPy differs on purpose),
under ``jit``, under ``vmap`` against a loop, and, where differentiable, with
``check_grads`` in both modes in float64."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import numpy as cnp
from cuvmap.core import ConcretizationError
from name_rows import assert_results_close, assert_vmap_over_argument_is_a_loop, check_row_grads


RNG = np.random.default_rng(7)


def _r(*shape):
    return RNG.normal(size=shape)


P4, P2, X6 = _r(4), _r(2), _r(6)
Y6, Y63 = _r(6), _r(6, 3)
W6 = np.abs(_r(6)) + 0.1
M35, M53 = _r(3, 5), _r(5, 3)
F45 = _r(4, 5)
COORDS5 = np.cumsum(np.abs(_r(5)) + 0.2)
PHASES = np.cumsum(_r(12) * 2.5)
WRAPPED = np.angle(np.exp(1j * PHASES))
NANS = _r(3, 4)
NAN_MASK = RNG.random((3, 4)) < 0.3
LABELS = np.array([0, 3, 1, 3, 7, 2, 0, -1])
WEIGHTS8 = _r(8)
KEYS = RNG.integers(0, 3, size=(3, 7))
COMPLEX = RNG.integers(0, 3, size=(4, 5)) + 1j * RNG.integers(0, 3, size=(4, 5))
IDX = np.array([[0, 4, -1], [2, -6, 9]])


def _np_polydiv_padded(u, v):
    q, r = np.polydiv(u, v)
    return q, np.concatenate([np.zeros(len(u) - len(r)), r])


def _np_take_fill(x, i, axis, fill):
    n = x.shape[axis]
    i = np.where(i < 0, i + n, i)
    ok = (i >= 0) & (i < n)
    out = np.take(x, np.clip(i, 0, n - 1), axis=axis)
    mask = ok.reshape((1,) * axis + i.shape + (1,) * (x.ndim - axis - 1))
    return np.where(mask, out, fill)


def _with_nans(x):
    return cnp.where(NAN_MASK, np.nan, x)


def _np_with_nans(x):
    return np.where(NAN_MASK, np.nan, x)


# (name, cuvmap function, NumPy reference, args, indices of the args to differentiate)
ROWS = [
    ("polyadd", cnp.polyadd, np.polyadd, (P4, P2), (0, 1)),
    ("polysub", cnp.polysub, np.polysub, (P2, P4), (0, 1)),
    ("polymul", cnp.polymul, np.polymul, (P4, P2), (0, 1)),
    ("polydiv", cnp.polydiv, _np_polydiv_padded, (P4, P2), (0, 1)),
    ("polyder m=2", lambda p: cnp.polyder(p, 2), lambda p: np.polyder(p, 2), (P4,), (0,)),
    ("polyint m=2 k", lambda p: cnp.polyint(p, 2, [1.0, 2.0]), lambda p: np.polyint(p, 2, [1.0, 2.0]), (P4,), (0,)),
    ("poly", cnp.poly, np.poly, (P4,), (0,)),
    ("polyfit", lambda x, y: cnp.polyfit(x, y, 2), lambda x, y: np.polyfit(x, y, 2), (X6, Y6), (0, 1)),
    ("polyfit K fits, weights, cov", lambda x, y, w: cnp.polyfit(x, y, 2, w=w, cov=True),
     lambda x, y, w: np.polyfit(x, y, 2, w=w, cov=True), (X6, Y63, W6), (0, 1, 2)),
    ("vander", lambda x: cnp.vander(x, 4), lambda x: np.vander(x, 4), (np.append(X6[:3], 0.0),), (0,)),
    ("vander increasing", lambda x: cnp.vander(x, increasing=True), lambda x: np.vander(x, increasing=True),
     (X6[:4],), (0,)),
    ("trapezoid x", cnp.trapezoid, np.trapezoid, (M35, np.sort(X6[:5])), (0, 1)),
    ("trapezoid dx axis 0", lambda y: cnp.trapezoid(y, dx=0.5, axis=0), lambda y: np.trapezoid(y, dx=0.5, axis=0),
     (M53,), (0,)),
    ("trapezoid dx array", lambda y, d: cnp.trapezoid(y, dx=d), lambda y, d: np.trapezoid(y, dx=d),
     (M35, np.abs(_r(3, 1))), (0, 1)),
    ("gradient", cnp.gradient, np.gradient, (F45,), (0,)),
    ("gradient spacing axis", lambda f: cnp.gradient(f, 2.0, axis=1), lambda f: np.gradient(f, 2.0, axis=1),
     (F45,), (0,)),
    ("gradient coordinates", lambda f, c: cnp.gradient(f, c, axis=1), lambda f, c: np.gradient(f, c, axis=1),
     (F45, COORDS5), (0, 1)),
    ("unwrap", cnp.unwrap, np.unwrap, (WRAPPED,), (0,)),
    ("unwrap period discont", lambda p: cnp.unwrap(p, discont=2.0, period=4.0),
     lambda p: np.unwrap(p, discont=2.0, period=4.0), (_r(10) * 3,), (0,)),
    ("cov", cnp.cov, np.cov, (M35,), (0,)),
    ("cov y rowvar aweights", lambda m, y, w: cnp.cov(m, y, rowvar=False, aweights=w),
     lambda m, y, w: np.cov(m, y, rowvar=False, aweights=w), (M53, _r(5), np.abs(_r(5)) + 0.1), (0, 1, 2)),
    ("corrcoef", cnp.corrcoef, np.corrcoef, (M35,), (0,)),
    ("bincount weights length", lambda x, w: cnp.bincount(x, w, length=6),
     lambda x, w: np.bincount(np.clip(x, 0, None), w)[:6], (LABELS, WEIGHTS8), (1,)),
    ("lexsort", lambda k: cnp.lexsort(k), np.lexsort, (KEYS,), ()),
    ("lexsort axis 0", lambda k: cnp.lexsort(k, axis=0), lambda k: np.lexsort(k, axis=0), (KEYS.reshape(3, 7, 1),), ()),
    ("sort_complex", cnp.sort_complex, np.sort_complex, (COMPLEX,), ()),
    ("nancumsum", lambda x: cnp.nancumsum(_with_nans(x), axis=1), lambda x: np.nancumsum(_np_with_nans(x), axis=1),
     (NANS,), (0,)),
    ("nancumprod flat", lambda x: cnp.nancumprod(_with_nans(x)), lambda x: np.nancumprod(_np_with_nans(x)),
     (NANS,), (0,)),
    ("take fill", lambda x: cnp.take(x, IDX, axis=1, mode="fill"),
     lambda x: _np_take_fill(x, IDX, 1, np.nan), (F45,), ()),  # NaN entries: finite differences are NaN
    ("take fill_value", lambda x: cnp.take(x, IDX, axis=0, fill_value=-3.0),
     lambda x: _np_take_fill(x, IDX, 0, -3.0), (F45,), (0,)),
    ("take clip", lambda x: cnp.take(x, IDX, axis=1, mode="clip"), lambda x: np.take(x, IDX, axis=1, mode="clip"),
     (F45,), (0,)),
    ("take wrap", lambda x: cnp.take(x, IDX, mode="wrap"), lambda x: np.take(x, IDX, mode="wrap"), (F45,), (0,)),
    ("take_along_axis fill", lambda x: cnp.take_along_axis(x, np.array([[0, 7], [-1, 4], [5, 2], [-6, 1]]), 1,
                                                           mode="fill", fill_value=0.5),
     lambda x: np.array([[x[0, 0], 0.5], [x[1, 4], x[1, 4]], [0.5, x[3 - 1, 2]], [0.5, x[3, 1]]]), (F45,), (0,)),
    ("take_along_axis clip", lambda x: cnp.take_along_axis(x, np.array([[-1, 9]]), 0, mode="clip"),
     lambda x: np.stack([x[3], x[3]])[:, :2].T[:1] * 0 + np.array([[x[3, 0], x[3, 1]]]), (F45[:, :2],), (0,)),
    ("pad linear_ramp", lambda x: cnp.pad(x, ((1, 2), (3, 0)), "linear_ramp", end_values=(1.0, -2.0)),
     lambda x: np.pad(x, ((1, 2), (3, 0)), "linear_ramp", end_values=(1.0, -2.0)), (M35,), (0,)),
    ("pad mean stat_length", lambda x: cnp.pad(x, 2, "mean", stat_length=(2, 3)),
     lambda x: np.pad(x, 2, "mean", stat_length=(2, 3)), (M35,), (0,)),
    ("pad maximum", lambda x: cnp.pad(x, (1, 2), "maximum"), lambda x: np.pad(x, (1, 2), "maximum"), (M35,), (0,)),
    ("pad median", lambda x: cnp.pad(x, (2, 1), "median", stat_length=3),
     lambda x: np.pad(x, (2, 1), "median", stat_length=3), (M35,), (0,)),
    ("pad reflect odd", lambda x: cnp.pad(x, (4, 6), "reflect", reflect_type="odd"),
     lambda x: np.pad(x, (4, 6), "reflect", reflect_type="odd"), (M35,), (0,)),
    ("pad symmetric odd", lambda x: cnp.pad(x, (5, 2), "symmetric", reflect_type="odd"),
     lambda x: np.pad(x, (5, 2), "symmetric", reflect_type="odd"), (M35,), (0,)),
    ("pad constant per side", lambda x: cnp.pad(x, ((1, 2), (0, 1)), constant_values=((1, 2), (3, 4))),
     lambda x: np.pad(x, ((1, 2), (0, 1)), constant_values=((1, 2), (3, 4))), (M35,), (0,)),
    ("pad empty", lambda x: cnp.pad(x, 1, "empty")[1:-1, 1:-1], lambda x: x, (M35,), (0,)),
    ("argsort dtype", lambda x: cnp.argsort(x, dtype=np.int16),
     lambda x: np.argsort(x, kind="stable").astype(np.int16), (X6,), ()),
]
IDS = [r[0] for r in ROWS]


def _assert_close(got, want):
    assert_results_close(got, want, rtol=1e-09, atol=1e-09)


@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_values_against_numpy(name, f, ref, args, diff):
    with np.errstate(invalid="ignore"):
        want = ref(*args)
    _assert_close(f(*args), want)


@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_under_jit(name, f, ref, args, diff):
    _assert_close(cv.jit(f)(*args), f(*args))


@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_under_vmap_as_a_loop(name, f, ref, args, diff):
    k = diff[0] if diff else 0
    if np.asarray(args[k]).dtype.kind in "iu":
        batch = np.stack([args[k], args[k][::-1], np.roll(args[k], 1)])
    else:
        batch = np.stack([args[k], args[k] * 1.5, args[k] - 0.25])

    assert_vmap_over_argument_is_a_loop(f, args, k, batch, rtol=1e-09, atol=1e-09)


GRAD_ROWS = [r for r in ROWS if r[4]]


@pytest.mark.parametrize("name, f, ref, args, diff", GRAD_ROWS, ids=[r[0] for r in GRAD_ROWS])
def test_derivatives_both_modes(name, f, ref, args, diff):
    check_row_grads(f, args, diff, tol=0.0001)


def test_vander_derivative_is_exact_at_zero():
    # cumulative products, not x ** k: d/dx x^1 at 0 is 1, not NaN
    g = cv.jacfwd(lambda x: cnp.vander(x, 3))(np.array([0.0, 2.0]))
    np.testing.assert_allclose(g[:, :, 0], [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def test_polymul_and_polydiv_trim_leading_zeros_need_values():
    np.testing.assert_allclose(cnp.polymul(np.array([0.0, 2, 1]), np.array([0.0, 0, 3]), trim_leading_zeros=True),
                               np.polymul([0.0, 2, 1], [0.0, 0, 3]))
    q, r = cnp.polydiv(np.array([5.0, 7, 9]), np.array([4.0, 1]), trim_leading_zeros=True)
    np.testing.assert_allclose(r, [7.5625])
    with pytest.raises(ConcretizationError, match="polymul: trim_leading_zeros=True needs concrete"):
        cv.jit(lambda a: cnp.polymul(a, a, trim_leading_zeros=True))(np.ones(3))


def test_bincount_without_length_reads_the_values():
    np.testing.assert_array_equal(cnp.bincount(LABELS, minlength=10),
                                  np.bincount(np.clip(LABELS, 0, None), minlength=10))
    np.testing.assert_array_equal(cnp.bincount(np.array([True, False, True])), [1, 2])
    np.testing.assert_array_equal(cv.jit(lambda x: cnp.bincount(x, length=4))(LABELS), [3, 1, 1, 2])
    with pytest.raises(ConcretizationError, match="bincount: without length="):
        cv.jit(cnp.bincount)(LABELS)


def test_take_modes_and_their_errors():
    x = np.arange(10.0)
    idx = np.array([-11, -10, -9, -5, -1, 0, 1, 5, 9, 10, 11])
    np.testing.assert_array_equal(cnp.take_along_axis(x, idx, 0, mode="fill"),
                                  [np.nan, 0, 1, 5, 9, 0, 1, 5, 9, np.nan, np.nan])
    np.testing.assert_array_equal(cnp.take_along_axis(x, idx, 0, mode="clip"), [0, 0, 1, 5, 9, 0, 1, 5, 9, 9, 9])
    np.testing.assert_array_equal(cnp.take_along_axis(x, np.array([-1, -2]), 0, mode="clip",
                                                      wrap_negative_indices=False), [0, 0])
    # integers fill with the most negative value, booleans with True (JAX's defaults)
    assert cnp.take(np.arange(3), np.array([5]), mode="fill")[0] == np.iinfo(np.int64).min
    assert bool(cnp.take(np.zeros(3, bool), np.array([5]), mode="fill")[0])
    # cuvmap's default stays the checked gather (NOTE [gather modes])
    with pytest.raises(IndexError, match="take: index 10 is out of bounds"):
        cnp.take(x, np.array([10]))
    with pytest.raises(IndexError, match="take_along_axis: index 11 is out of bounds"):
        cnp.take_along_axis(x, idx, 0)
    with pytest.raises(IndexError, match="non-empty jnp.take"):
        cnp.take(np.ones((2, 0)), np.array([0]), axis=1)
    with pytest.raises(TypeError, match="take_along_axis indices must be of integer type, got float64"):
        cnp.take_along_axis(x, np.array([1.0]), 0)
    with pytest.raises(ValueError, match="take: invalid mode 'bogus'"):
        cnp.take(x, np.array([1]), mode="bogus")
    assert cnp.take_along_axis(np.ones((4, 0, 3)), np.ones((4, 2, 3), np.int64), axis=1).shape == (4, 2, 3)


def test_pad_keywords_are_checked_per_mode():
    with pytest.raises(ValueError, match="unsupported keyword arguments for mode 'edge'"):
        cnp.pad(np.ones(3), 1, "edge", end_values=0)
    with pytest.raises(ValueError, match="stat_length"):
        cnp.pad(np.ones(3), 1, "mean", stat_length=0)
    with pytest.raises(TypeError, match="callable mode returned None; JAX's protocol returns the padded vector"):
        cnp.pad(np.ones(3), 1, lambda *a: None)  # NumPy's protocol (writes in place)
    np.testing.assert_array_equal(cnp.pad(np.arange(5), 2, "mean"), np.pad(np.arange(5), 2, "mean"))
    np.testing.assert_array_equal(cnp.pad(np.arange(5), (3, 2), "linear_ramp", end_values=(9, -4)),
                                  np.pad(np.arange(5), (3, 2), "linear_ramp", end_values=(9, -4)))


def test_ravel_multi_index_dtype():
    idx = np.array([0, 1], np.int8)
    assert cnp.ravel_multi_index((idx, idx), (2, 3), mode="ignore").dtype == np.int8
    assert cnp.ravel_multi_index((idx, idx), (2, 3), dtype=np.int32).dtype == np.int32
    # a narrow index dtype that cannot hold the flat index: int64 (JAX raises), and clip/wrap
    # compute in int64 (they overflowed int8)
    got = cnp.ravel_multi_index((idx, np.array([250, -1], np.int16)), (200, 300), mode="clip")
    np.testing.assert_array_equal(got, np.ravel_multi_index(([0, 1], [250, 0]), (200, 300)))
    with pytest.raises(ValueError, match="cannot hold the flat indices"):
        cnp.ravel_multi_index((idx, idx), (200, 300), dtype=np.int8)
