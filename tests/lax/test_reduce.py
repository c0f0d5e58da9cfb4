"""``lax.reduce`` (cuvmap/lax/reducers.py): the reducer recognised on each monoid, by
identity and by probing, against NumPy's reductions; non-identity init values; variadic
reducers as a tree; the refusal of a reducer that is not associative and commutative;
derivatives to second order (float64, both modes); vmap against a loop; jit."""
import operator

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.lax.reducers import identify_monoid
from cuvmap.test_util import check_batching, check_grads

# (name, reducer, init, NumPy reduction, monoid it is recognised as)
MONOIDS = [
    ("lax.add", lax.add, 0.0, np.sum, "add"),
    ("operator.add", operator.add, 0.0, np.sum, "add"),
    ("lambda-mul", lambda a, b: a * b, 1.0, np.prod, "mul"),
    ("lax.max", lax.max, -np.inf, np.max, "max"),
    ("cnp.maximum", cnp.maximum, -np.inf, np.max, "max"),
    ("where-min", lambda a, b: cnp.where(a < b, a, b), np.inf, np.min, "min"),
    ("lax.min", lax.min, np.inf, np.min, "min"),
]
IDS = [m[0] for m in MONOIDS]
DIMS = [(0,), (1, 2), (0, 2), (0, 1, 2), ()]


@pytest.mark.parametrize("name,op,init,ref,monoid", MONOIDS, ids=IDS)
@pytest.mark.parametrize("dims", DIMS, ids=str)
def test_value(name, op, init, ref, monoid, dims):
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    assert identify_monoid(op, x.dtype) == monoid
    got = lax.reduce(x, init, op, dims)
    np.testing.assert_allclose(got, ref(x, axis=dims) if dims else x, rtol=1e-12)
    got32 = lax.reduce(x.astype(np.float32), np.float32(init), op, dims)
    assert got32.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_integers_and_a_non_identity_init(dtype):
    x = np.random.default_rng(1).integers(0 if dtype == np.uint32 else -9, 9, (3, 4, 5)).astype(dtype)
    np.testing.assert_array_equal(lax.reduce(x, dtype(0), lax.add, (1,)), x.sum(1, dtype=dtype))
    got = lax.reduce(x, dtype(3), lax.max, (0, 2))  # init 3 is not max's identity: max(3, max x)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.maximum(x.max((0, 2)), 3))
    np.testing.assert_array_equal(lax.reduce(x, dtype(5), lax.add, (1,)), x.sum(1, dtype=dtype) + 5)


def test_booleans():
    b = np.random.default_rng(2).integers(0, 2, (4, 6)).astype(bool)
    np.testing.assert_array_equal(lax.reduce(b, False, lax.bitwise_or, (1,)), b.any(1))
    np.testing.assert_array_equal(lax.reduce(b, True, lambda p, q: p & q, (0,)), b.all(0))
    np.testing.assert_array_equal(lax.reduce(b, False, lax.max, (0, 1)), b.any())


def test_variadic():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 5))

    def op(a, b):
        return a[0] + b[0], a[1] * b[1]

    s, p = lax.reduce((x, y), (0.0, 1.0), op, (0, 2))
    np.testing.assert_allclose(s, x.sum((0, 2)), rtol=1e-12)
    np.testing.assert_allclose(p, y.prod((0, 2)), rtol=1e-12)


def test_variadic_argmax():
    rng = np.random.default_rng(4)
    v = rng.standard_normal((5, 7))
    idx = np.broadcast_to(np.arange(7), v.shape)

    def op(a, b):
        keep = a[0] >= b[0]
        return cnp.where(keep, a[0], b[0]), cnp.where(keep, a[1], b[1])

    m, i = lax.reduce((v, idx), (-np.inf, np.int64(-1)), op, (1,))
    np.testing.assert_array_equal(i, v.argmax(1))
    np.testing.assert_allclose(m, v.max(1))


def test_empty_reduction_is_the_init():
    np.testing.assert_array_equal(lax.reduce(np.zeros((0, 3)), 5.0, lax.add, (0,)), [5.0, 5.0, 5.0])


@pytest.mark.parametrize("op", [lambda a, b: a - b, lambda a, b: 2 * a + b, lambda a, b: a / b],
                         ids=["sub", "affine", "div"])
def test_a_reducer_that_is_no_monoid_raises(op):
    with pytest.raises(ShapeError, match="reduce: the reducer .* must be associative and commutative"):
        lax.reduce(np.ones((3, 4)), 0.0, op, (0,))


@pytest.mark.parametrize("name,op,init,ref,monoid", MONOIDS, ids=IDS)
def test_grads_both_modes(name, op, init, ref, monoid):
    x = np.random.default_rng(5).standard_normal((3, 4, 5))
    check_grads(lambda x: lax.reduce(x, init, op, (0, 2)), (x,), order=2)


def test_grads_variadic_and_non_identity_init():
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    check_grads(lambda x, y: lax.reduce((x, y), (0.0, 1.0), lambda a, b: (a[0] + b[0], a[1] * b[1]), (1,)), (x, y),
                order=2)
    check_grads(lambda x: lax.reduce(x, 2.0, lax.mul, (0,)), (x,), order=2)


@pytest.mark.parametrize("name,op,init,ref,monoid", MONOIDS, ids=IDS)
@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap_against_loop(name, op, init, ref, monoid, in_axis):
    x = np.random.default_rng(7).standard_normal((3, 4, 5))
    check_batching(lambda x: lax.reduce(x, init, op, (0,)), (x,), in_axes=in_axis, atol=1e-12, rtol=1e-12)
    check_batching(lambda x, y: lax.reduce((x, y), (0.0, 1.0), lambda a, b: (a[0] + b[0], a[1] * b[1]), (1,)),
                   (x, x + 1), in_axes=in_axis, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name,op,init,ref,monoid", MONOIDS, ids=IDS)
def test_jit(name, op, init, ref, monoid):
    x = np.random.default_rng(8).standard_normal((3, 4, 5))
    f = cv.jit(lambda x: lax.reduce(x, init, op, (1,)))
    np.testing.assert_allclose(f(x), ref(x, axis=1), rtol=1e-12)


def test_errors():
    with pytest.raises(ShapeError, match="reduce: dimensions"):
        lax.reduce(np.ones((3, 4)), 0.0, lax.add, (2,))
    with pytest.raises(ShapeError, match="reduce: init values must be scalars"):
        lax.reduce(np.ones((3, 4)), np.zeros(3), lax.add, (0,))
    with pytest.raises(ShapeError, match="reduce: the operands must have one shape"):
        lax.reduce((np.ones((3, 4)), np.ones((4, 3))), (0.0, 0.0), lambda a, b: (a[0] + b[0], a[1] + b[1]), (0,))
