"""JAX's sorting names (cuvmap/lax/sorting.py, cuvmap/lax/reduction.py): ``sort`` of several
operands by ``num_keys`` against ``numpy.lexsort``, ``sort_key_val``, ``top_k`` against a
stable NumPy sort, ``argmax``/``argmin`` with ``index_dtype``; derivatives to second order
(float64, both modes); vmap against a loop; jit."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.test_util import check_batching, check_grads


def _lexsort_reference(operands, dimension, num_keys):
    keys = [np.moveaxis(k, dimension, -1) for k in operands[:num_keys]]
    perm = np.lexsort(tuple(reversed(keys)), axis=-1)
    return tuple(np.moveaxis(np.take_along_axis(np.moveaxis(x, dimension, -1), perm, -1), -1, dimension)
                 for x in operands)


def _operands(rng, n, shape=(3, 6)):
    keys = [rng.integers(0, 3, shape).astype(np.float64) for _ in range(2)]  # ties, so later keys matter
    return tuple(keys + [rng.standard_normal(shape) for _ in range(n - 2)])


@pytest.mark.parametrize("num_keys", [1, 2, 3])
@pytest.mark.parametrize("dimension", [0, 1, -1])
def test_sort_several_operands(num_keys, dimension):
    ops = _operands(np.random.default_rng(0), 3)
    got = lax.sort(ops, dimension=dimension, num_keys=num_keys)
    assert isinstance(got, tuple) and len(got) == 3
    for g, r in zip(got, _lexsort_reference(ops, dimension, num_keys)):
        np.testing.assert_array_equal(g, r)


def test_sort_one_operand_and_nans():
    x = np.array([[3.0, np.nan, -1.0, 2.0], [0.0, -0.5, np.nan, -2.0]])
    np.testing.assert_array_equal(lax.sort(x, dimension=1, is_stable=False), np.sort(x, 1))
    np.testing.assert_array_equal(lax.sort(x, 0), np.sort(x, 0))


def test_sort_key_val():
    rng = np.random.default_rng(1)
    k, v = rng.integers(0, 4, (2, 7)), rng.standard_normal((2, 7))
    sk, sv = lax.sort_key_val(k, v)
    perm = np.argsort(k, axis=-1, kind="stable")
    np.testing.assert_array_equal(sk, np.take_along_axis(k, perm, -1))
    np.testing.assert_array_equal(sv, np.take_along_axis(v, perm, -1))


def _top_k_reference(x, k, axis):
    moved = np.moveaxis(x, axis, -1)
    idx = np.argsort(-moved, axis=-1, kind="stable")[..., :k]  # descending, ties by ascending index
    return np.moveaxis(np.take_along_axis(moved, idx, -1), -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("k", [0, 1, 3, 5])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
def test_top_k(k, axis, dtype):
    x = np.random.default_rng(2).integers(-3, 3, (5, 4, 5)).astype(dtype)  # many ties
    values, idx = lax.top_k(x, k, axis=axis)
    ref_values, ref_idx = _top_k_reference(x, k, axis)
    assert idx.dtype == np.int32 and values.dtype == dtype
    np.testing.assert_array_equal(values, ref_values)
    np.testing.assert_array_equal(idx, ref_idx)


def test_top_k_nan_is_largest():
    values, idx = lax.top_k(np.array([1.0, np.nan, 3.0]), 2)
    np.testing.assert_array_equal(idx, [1, 2])


@pytest.mark.parametrize("op,np_op", [(lax.argmax, np.argmax), (lax.argmin, np.argmin)], ids=["argmax", "argmin"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_argmax_index_dtype(op, np_op, index_dtype, axis):
    x = np.random.default_rng(3).integers(0, 3, (4, 5, 3)).astype(np.float32)
    got = op(x, axis, index_dtype)
    assert got.dtype == index_dtype
    np.testing.assert_array_equal(got, np_op(x, axis=axis))


def test_grads_both_modes():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    check_grads(lambda x, y: lax.sort((x, y), dimension=1), (x, y), order=2)
    check_grads(lambda x, y: lax.sort((x, y), dimension=0, num_keys=2), (x, y), order=2)
    check_grads(lambda x: lax.top_k(x, 3)[0], (x,), order=2)
    check_grads(lambda x: lax.top_k(x, 2, axis=0)[0], (x,), order=2)
    check_grads(lambda y: lax.sort_key_val(x, y)[1], (y,), order=2)


@pytest.mark.parametrize("in_axes", [(0, 0), (1, None), (None, 2)])
def test_vmap_against_loop(in_axes):
    rng = np.random.default_rng(5)
    a = rng.integers(0, 3, (3, 4, 5)).astype(np.float64)
    b = rng.standard_normal((3, 4, 5))
    # an unmapped operand has the logical shape of one example of the mapped one
    a_arg = a if in_axes[0] is not None else np.take(a, 0, axis=in_axes[1])
    b_arg = b if in_axes[1] is not None else np.take(b, 0, axis=in_axes[0])
    check_batching(lambda a, b: lax.sort((a, b), dimension=-1, num_keys=2), (a_arg, b_arg), in_axes=in_axes)
    check_batching(lambda a, b: lax.sort_key_val(a, b, dimension=0), (a_arg, b_arg), in_axes=in_axes)
    for ax in (0, 1, 2):
        check_batching(lambda a: lax.top_k(a, 2), (a,), in_axes=ax)
        check_batching(lambda a: lax.argmax(a, 0, np.int32), (a,), in_axes=ax)


def test_jit():
    rng = np.random.default_rng(6)
    a, b = rng.integers(0, 3, (4, 5)).astype(np.float64), rng.standard_normal((4, 5))
    f = cv.jit(lambda a, b: (lax.sort((a, b), num_keys=2), lax.top_k(b, 3), lax.argmin(b, 1, np.int32)))
    (sa, sb), (v, i), am = f(a, b)
    ref = _lexsort_reference((a, b), -1, 2)
    np.testing.assert_array_equal(sa, ref[0])
    np.testing.assert_array_equal(sb, ref[1])
    np.testing.assert_array_equal(i, _top_k_reference(b, 3, -1)[1])
    np.testing.assert_array_equal(am, b.argmin(1))


def test_errors():
    with pytest.raises(ShapeError, match="sort: the operands must have one shape"):
        lax.sort((np.ones(3), np.ones(4)))
    with pytest.raises(ShapeError, match="sort: num_keys 3"):
        lax.sort((np.ones(3), np.ones(3)), num_keys=3)
    with pytest.raises(ShapeError, match="top_k: k=4"):
        lax.top_k(np.ones(3), 4)
    with pytest.raises(ShapeError, match="argmax: index_dtype"):
        lax.argmax(np.ones(3), 0, np.float32)
