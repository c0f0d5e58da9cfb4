"""JAX's lax names of issue 32 (apisurf): the ``<name>_p`` primitives, optimization_barrier,
full_like, empty, broadcast_shapes, axis_size, and div / rem with JAX's integer semantics."""
import itertools

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.core import Primitive
from cuvmap.lax import jax_primitives
from cuvmap.test_util import check_grads

# ---------------------------------------------------------------------------------------
# <name>_p
# ---------------------------------------------------------------------------------------


def test_primitive_names_are_the_staged_primitives():
    for name in jax_primitives.JAX_PRIMITIVE_NAMES:
        prim = getattr(lax, name)
        assert isinstance(prim, Primitive), name
        alias = {"and_p": "bitwise_and", "or_p": "bitwise_or", "xor_p": "bitwise_xor", "not_p": "bitwise_not"}
        assert prim.name == alias.get(name, name[:-2]), name
    closed = cv.make_jaxpr(lambda x, y: cnp.cos(cnp.sin(x) + y))(1.0, 2.0)
    assert [e.primitive for e in closed.eqns] == [lax.sin_p, lax.add_p, lax.cos_p]


def test_bind_computes_jax_values():
    x = np.array([0.3, -1.2])
    np.testing.assert_allclose(lax.sin_p.bind(x), np.sin(x))
    np.testing.assert_allclose(lax.atan2_p.bind(x, x[::-1]), np.arctan2(x, x[::-1]))
    np.testing.assert_array_equal(lax.and_p.bind(np.array([6]), np.array([3])), [2])
    np.testing.assert_array_equal(lax.not_p.bind(np.array([0], np.int8)), [-1])
    np.testing.assert_allclose(lax.reduce_sum_p.bind(np.ones((2, 3)), axes=(1,)), [3.0, 3.0])
    np.testing.assert_allclose(lax.transpose_p.bind(np.arange(6.0).reshape(2, 3), permutation=(1, 0)),
                               np.arange(6.0).reshape(2, 3).T)
    assert float(cv.grad(lambda v: lax.sin_p.bind(v))(0.5)) == pytest.approx(np.cos(0.5), rel=1e-15)
    with pytest.raises(TypeError):
        lax.sin_p.bind(x, accuracy=None)  # a JAX param cuvmap does not know raises


def test_def_impl_replaces_the_eager_impl():
    calls = []
    impl = lax.sin_p.impl
    try:
        lax.sin_p.def_impl(lambda v, **kw: calls.append(1) or impl(v, **kw))
        np.testing.assert_allclose(cnp.sin(np.ones(2)), np.sin(np.ones(2)))
    finally:
        lax.sin_p.def_impl(impl)
    assert calls == [1]
    assert lax.sin_p.impl is impl


# ---------------------------------------------------------------------------------------
# optimization_barrier
# ---------------------------------------------------------------------------------------


def test_optimization_barrier_is_the_identity_under_every_transform():
    x, y = np.array([0.5, -1.0]), np.array(2.0)
    a, b = lax.optimization_barrier((x, y))
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, y)
    f = lambda v: cnp.sum(lax.optimization_barrier(cnp.sin(v)) ** 2)  # noqa: E731
    np.testing.assert_allclose(cv.grad(f)(x), 2 * np.sin(x) * np.cos(x), rtol=1e-14)
    check_grads(f, (x,))
    np.testing.assert_allclose(cv.jit(f)(x), np.sum(np.sin(x) ** 2))
    out = cv.vmap(lax.optimization_barrier, in_axes=((0, 1),), out_axes=(1, 0))((np.ones((2, 3)), np.zeros((3, 2))))
    assert out[0].shape == (3, 2) and out[1].shape == (2, 3)
    assert "optimization_barrier" in str(cv.make_jaxpr(cv.grad(f))(x))  # kept in the derived program


# ---------------------------------------------------------------------------------------
# full_like, empty, broadcast_shapes, axis_size
# ---------------------------------------------------------------------------------------


def test_full_like_shapes_dtypes_and_derivative_of_a_traced_fill():
    x = np.ones((2, 3), np.float32)
    out = lax.full_like(x, 2)
    assert out.dtype == np.float32 and out.shape == (2, 3) and np.all(out == 2)
    out = lax.full_like(x, 1.7, dtype=np.int32, shape=(4,))
    assert out.dtype == np.int32 and out.shape == (4,) and np.all(out == 1)
    # d/dv Σ full_like(x, v) = number of elements
    assert float(cv.grad(lambda v: cnp.sum(lax.full_like(x.astype(np.float64), v)))(0.5)) == 6.0
    check_grads(lambda v: lax.full_like(np.ones(3), v) * np.arange(3.0), (np.array(0.7),))
    np.testing.assert_array_equal(cv.vmap(lambda r: lax.full_like(r, 0))(np.ones((4, 2))), np.zeros((4, 2)))
    with pytest.raises(cv.ShapeError, match="scalar"):
        cv.jit(lambda v: lax.full_like(np.ones(3), v))(np.ones(2))


def test_empty_and_broadcast_shapes():
    e = lax.empty((2, 2), np.float32)
    assert e.shape == (2, 2) and e.dtype == np.float32
    assert cv.jit(cv.vmap(lambda r: lax.empty(r.shape, r.dtype)))(np.ones((4, 2), np.int32)).shape == (4, 2)
    for shapes in [((1, 2, 3), (2, 3)), ((5, 1), (1, 4), ()), ((0, 1), (3,)), ((2,),)]:
        out = lax.broadcast_shapes(*shapes)
        assert out == np.broadcast_shapes(*shapes) and all(type(d) is int for d in out)
    with pytest.raises(TypeError, match="Only non-negative indices"):
        lax.broadcast_shapes((-1,))
    with pytest.raises(TypeError, match="Shapes must be 1D sequences"):
        lax.broadcast_shapes("hello")
    with pytest.raises(ValueError, match="Incompatible shapes"):
        lax.broadcast_shapes((2, 3), (4, 3))


def test_axis_size_of_named_axes():
    f = lambda: lax.axis_size("i")  # noqa: E731
    assert cv.vmap(f, axis_name="i", axis_size=3, out_axes=None)() == 3
    g = cv.jit(f)
    assert int(cv.vmap(g, axis_name="i", axis_size=2, out_axes=None)()) == 2
    assert int(cv.vmap(g, axis_name="i", axis_size=5, out_axes=None)()) == 5  # the cache sees the axis size
    nested = cv.vmap(cv.vmap(lambda x: x * lax.axis_size(("i", "j")), axis_name="j"), axis_name="i")
    np.testing.assert_array_equal(nested(np.ones((2, 3))), np.full((2, 3), 6.0))
    with pytest.raises(Exception, match="not bound"):
        lax.axis_size("k")


# ---------------------------------------------------------------------------------------
# div and rem: JAX's integer semantics
# ---------------------------------------------------------------------------------------

_SIGNED = [(a, b) for a, b in itertools.product([-7, -6, -1, 0, 1, 6, 7], [-3, -2, 2, 3])]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_integer_div_rounds_toward_zero_and_rem_has_the_dividend_sign(dtype):
    x = np.array([a for a, _ in _SIGNED], dtype)
    y = np.array([b for _, b in _SIGNED], dtype)
    expected_q = np.array([int(a / b) for a, b in _SIGNED], dtype)  # C's truncation
    expected_r = np.array([a - b * int(a / b) for a, b in _SIGNED], dtype)
    q, r = lax.div(x, y), lax.rem(x, y)
    assert q.dtype == dtype and r.dtype == dtype
    np.testing.assert_array_equal(q, expected_q)
    np.testing.assert_array_equal(r, expected_r)
    np.testing.assert_array_equal(cv.jit(lax.div)(x, y), expected_q)
    np.testing.assert_array_equal(cv.vmap(lax.rem)(x, y), expected_r)
    np.testing.assert_array_equal(q * y + r, x)


def test_float_div_and_rem():
    x = np.array([-7.5, 7.5, -7.5, 7.5, 0.25, -3.0])
    y = np.array([2.0, 2.0, -2.0, -2.0, 0.5, 1.5])
    np.testing.assert_allclose(lax.div(x, y), x / y, rtol=1e-15)
    np.testing.assert_array_equal(lax.rem(x, y), np.fmod(x, y))
    np.testing.assert_array_equal(cv.jit(lax.rem)(x, y), np.fmod(x, y))
    # derivatives away from the jumps: d/dx = 1, d/dy = -trunc(x / y)
    xs, ys = np.array([-7.3, 7.3, -2.9]), np.array([2.0, -2.0, 1.3])
    check_grads(lax.rem, (xs, ys))
    gx, gy = cv.grad(lambda a, b: cnp.sum(lax.rem(a, b)), argnums=(0, 1))(xs, ys)
    np.testing.assert_array_equal(gx, np.ones(3))
    np.testing.assert_allclose(gy, -np.trunc(xs / ys))


def test_iota_takes_jax_order_and_cuvmaps():
    x = lax.iota(np.int32, 3)
    assert x.dtype == np.int32 and type(x.shape[0]) is int
    np.testing.assert_array_equal(x, [0, 1, 2])
    np.testing.assert_array_equal(lax.iota(4, np.float32), np.arange(4, dtype=np.float32))
    assert lax.iota(5).dtype == np.int64
    np.testing.assert_array_equal(cv.jit(lambda v: v + lax.iota(np.float64, 3))(np.ones(3)), [1.0, 2.0, 3.0])


def test_stack_and_unstack_are_inverses():
    xs = [np.arange(6.0).reshape(2, 3) + k for k in range(4)]
    for axis in (0, 1, 2, -1):
        s = lax.stack(xs, axis)
        np.testing.assert_array_equal(s, np.stack(xs, axis))
        for a, b in zip(lax.unstack(s, axis), xs):
            np.testing.assert_array_equal(a, b)
    out = cv.vmap(lambda x, y: lax.stack([x, y], axis=0), in_axes=(1, 0))(np.ones((3, 5)), np.zeros((5, 3)))
    assert out.shape == (5, 2, 3)
    check_grads(lambda x: lax.stack(lax.unstack(x, 1)[::-1], 0) * np.arange(6.0).reshape(3, 2), (np.ones((2, 3)),))
    with pytest.raises(cv.ShapeError, match="out of range"):
        lax.stack(xs, 3)
