"""``associative_scan`` (cuvmap/lax/scan_ops.py) and the cumulative reductions
``cumsum``/``cumprod``/``cummax``/``cummin``/``cumlogsumexp`` with ``axis`` and ``reverse``
(cuvmap/lax/cumulative.py) against NumPy's accumulations and loops; every length from 1 to
9 (the odd/even recursion's cases); pytrees and a non-commutative operator (matrix
products); derivatives to second order (float64, both modes); vmap against a loop; jit."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.test_util import check_batching, check_grads


def _logaddexp_accumulate(x, axis):
    return np.logaddexp.accumulate(x, axis=axis)


# (name, function, NumPy accumulation along an axis)
CUMULATIVE = [
    ("cumsum", lax.cumsum, np.cumsum),
    ("cumprod", lax.cumprod, np.cumprod),
    ("cummax", lax.cummax, lambda x, axis: np.maximum.accumulate(x, axis=axis)),
    ("cummin", lax.cummin, lambda x, axis: np.minimum.accumulate(x, axis=axis)),
    ("cumlogsumexp", lax.cumlogsumexp, _logaddexp_accumulate),
]
CUM_IDS = [c[0] for c in CUMULATIVE]


def _reference(np_fn, x, axis, reverse):
    if reverse:
        return np.flip(np_fn(np.flip(x, axis), axis=axis), axis)
    return np_fn(x, axis=axis)


@pytest.mark.parametrize("name,fn,np_fn", CUMULATIVE, ids=CUM_IDS)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumulative_values(name, fn, np_fn, axis, reverse):
    x = np.random.default_rng(0).standard_normal((5, 4, 3))
    np.testing.assert_allclose(fn(x, axis=axis, reverse=reverse), _reference(np_fn, x, axis, reverse), rtol=1e-12)


@pytest.mark.parametrize("n", range(1, 10))
def test_associative_scan_every_length(n):
    x = np.random.default_rng(n).standard_normal((n, 3))
    np.testing.assert_allclose(lax.associative_scan(lax.add, x), np.cumsum(x, 0), rtol=1e-12)
    np.testing.assert_allclose(lax.associative_scan(lax.add, x, reverse=True), np.cumsum(x[::-1], 0)[::-1], rtol=1e-12)
    np.testing.assert_allclose(lax.associative_scan(lax.max, x.T, axis=1), np.maximum.accumulate(x.T, 1))


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("reverse", [False, True])
def test_associative_scan_non_commutative(n, reverse):
    """Matrix products keep their order: [a, ab, abc, ...]; reversed [.., zy x.., zy, z]."""
    m = np.random.default_rng(1).standard_normal((n, 3, 3))
    out = lax.associative_scan(lambda a, b: cnp.matmul(a, b), m, reverse=reverse)
    order = range(n - 1, -1, -1) if reverse else range(n)
    acc, expected = None, {}
    for i in order:
        acc = m[i] if acc is None else acc @ m[i]
        expected[i] = acc
    np.testing.assert_allclose(out, np.stack([expected[i] for i in range(n)]), rtol=1e-10)


def test_associative_scan_pytree():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((6, 2)), rng.standard_normal((6, 2))
    out = lax.associative_scan(lambda a, b: {"s": a["s"] + b["s"], "p": a["p"] * b["p"]}, {"s": x, "p": y})
    np.testing.assert_allclose(out["s"], np.cumsum(x, 0), rtol=1e-12)
    np.testing.assert_allclose(out["p"], np.cumprod(y, 0), rtol=1e-12)


def test_cumlogsumexp_infinities_and_dtype():
    np.testing.assert_array_equal(lax.cumlogsumexp(np.array([-np.inf, -np.inf, 0.0, np.inf, np.inf])),
                                  [-np.inf, -np.inf, 0.0, np.inf, np.inf])
    assert lax.cumlogsumexp(np.ones(3, np.float32)).dtype == np.float32
    np.testing.assert_allclose(cv.grad(lambda x: lax.cumlogsumexp(x)[-1])(np.array([-np.inf, 0.0, 1.0])),
                               [0.0, 1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-12)


@pytest.mark.parametrize("name,fn,np_fn", CUMULATIVE, ids=CUM_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_cumulative_grads_both_modes(name, fn, np_fn, reverse):
    x = np.random.default_rng(3).standard_normal((5, 3))
    check_grads(lambda x: fn(x, axis=0, reverse=reverse), (x,), order=2)


def test_associative_scan_grads():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((7, 2)), rng.standard_normal((7, 2))
    check_grads(lambda x, y: lax.associative_scan(lambda a, b: (a[0] + b[0], a[1] * b[1]), (x, y), reverse=True),
                (x, y), order=2)


@pytest.mark.parametrize("name,fn,np_fn", CUMULATIVE, ids=CUM_IDS)
@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_cumulative_vmap_against_loop(name, fn, np_fn, in_axis):
    x = np.random.default_rng(5).standard_normal((5, 4, 3))
    check_batching(lambda x: fn(x, axis=0, reverse=True), (x,), in_axes=in_axis, atol=1e-12, rtol=1e-12)
    check_batching(lambda x: fn(x, axis=-1), (x,), in_axes=in_axis, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name,fn,np_fn", CUMULATIVE, ids=CUM_IDS)
def test_cumulative_jit(name, fn, np_fn):
    x = np.random.default_rng(6).standard_normal((7, 3))
    f = cv.jit(lambda x: fn(x, axis=0, reverse=True))
    np.testing.assert_allclose(f(x), _reference(np_fn, x, 0, True), rtol=1e-12)


def test_errors():
    with pytest.raises(ShapeError, match="associative_scan: every leaf"):
        lax.associative_scan(lambda a, b: (a[0] + b[0], a[1] + b[1]), (np.ones(3), np.ones(4)))
    with pytest.raises(ShapeError, match="associative_scan: fn must return the structure"):
        lax.associative_scan(lambda a, b: a[0] + b[0], (np.ones(3), np.ones(3)))
    with pytest.raises(ShapeError, match="cummax: axis 2"):
        lax.cummax(np.ones((3, 4)), axis=2)
    with pytest.raises(ShapeError, match="cumlogsumexp: needs a floating"):
        lax.cumlogsumexp(np.ones(3, np.int32))
