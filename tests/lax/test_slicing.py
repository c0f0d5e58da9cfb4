"""lax.gather, the scatters and their front ends (dynamic_slice, dynamic_update_slice, the
_in_dim forms, index_in_dim, index_take): values against loop references
(tests/slicing_references.py) and closed forms, each mode's out-of-bounds behaviour,
derivatives against finite differences in both modes (float64), vmap over each argument
against a loop, jit. The op table (tests/op_table.py) runs the generic checks on more
cases; here are the cases it cannot state."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend as cv_backend
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.test_util import check_batching, check_grads

from slicing_references import gather_reference, scatter_reference

GDN = lax.GatherDimensionNumbers
SDN = lax.ScatterDimensionNumbers
ROWS = GDN(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
ROWS_S = SDN(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
POINTS_S = SDN(update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
WINDOW = GDN(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1))
WINDOW_S = SDN(update_window_dims=(1, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=(0, 1))

rng = np.random.default_rng(0)


def to_numpy(x):
    return x.get() if cv_backend.is_cupy_array(x) else np.asarray(x)


def put(x, backend):
    return cv.device_put(x, "gpu") if backend == "gpu" else x


# ---------------------------------------------------------------------------------------
# gather: values and modes
# ---------------------------------------------------------------------------------------


def test_gather_modes_out_of_bounds(backend):
    x = np.arange(12.0).reshape(4, 3)
    idx = np.array([[1], [-1], [3], [4], [9]])
    xb, ib = put(x, backend), put(idx, backend)
    # the default, promise_in_bounds, clamps (as XLA does), and so does clip
    want_clip = x[[1, 0, 3, 3, 3]]
    np.testing.assert_array_equal(to_numpy(lax.gather(xb, ib, ROWS, (1, 3))), want_clip)
    np.testing.assert_array_equal(to_numpy(lax.gather(xb, ib, ROWS, (1, 3), mode="clip")), want_clip)
    np.testing.assert_array_equal(to_numpy(lax.gather(xb, ib, ROWS, (1, 3), mode="promise_in_bounds")), want_clip)
    # fill: a whole window out of bounds becomes the fill value (NaN for floats by default)
    filled = to_numpy(lax.gather(xb, ib, ROWS, (1, 3), mode="fill"))
    np.testing.assert_array_equal(filled[[0, 2]], x[[1, 3]])
    assert np.isnan(filled[[1, 3, 4]]).all()
    got = to_numpy(lax.gather(xb, ib, ROWS, (1, 3), mode=lax.GatherScatterMode.FILL_OR_DROP, fill_value=-7.0))
    np.testing.assert_array_equal(got, gather_reference(x, idx, ROWS, (1, 3), "fill", -7.0))


def test_gather_fill_marks_a_window_that_leaves_the_operand():
    """A window of size 2 starting at the last row is out of bounds as a whole."""
    x = np.arange(20.0).reshape(4, 5)
    idx = np.array([[0, 0], [3, 1], [2, 3], [-1, 0]])
    got = lax.gather(x, idx, WINDOW, (2, 2), mode="fill", fill_value=0.0)
    np.testing.assert_array_equal(got, gather_reference(x, idx, WINDOW, (2, 2), "fill", 0.0))
    np.testing.assert_array_equal(got[1], 0.0)
    np.testing.assert_array_equal(got[0], x[0:2, 0:2])
    clipped = lax.gather(x, idx, WINDOW, (2, 2), mode="clip")
    np.testing.assert_array_equal(clipped[1], x[2:4, 1:3])


@pytest.mark.parametrize("dtype,fill", [(np.int32, np.iinfo(np.int32).min), (np.uint8, 255), (np.bool_, True)])
def test_gather_default_fill_values(dtype, fill):
    x = np.ones((3, 2), dtype)
    got = lax.gather(x, np.array([[5]]), ROWS, (1, 2), mode="fill")
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.full((1, 2), fill, dtype))


def test_gather_with_batching_dims_matches_the_loop():
    dn = GDN(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1,), operand_batching_dims=(0,),
             start_indices_batching_dims=(0,))
    x = rng.standard_normal((3, 5, 4))
    idx = rng.integers(0, 5, (3, 2, 1))
    np.testing.assert_allclose(lax.gather(x, idx, dn, (1, 1, 4)), gather_reference(x, idx, dn, (1, 1, 4)))
    np.testing.assert_allclose(lax.gather(x, idx, dn, (1, 1, 4)), np.stack([x[b][idx[b, :, 0]] for b in range(3)]))


def test_gather_errors_name_the_op_and_shapes():
    x = np.zeros((4, 3))
    with pytest.raises(ShapeError, match="gather: the last dim of indices"):
        lax.gather(x, np.zeros((2, 2), np.int64), ROWS, (1, 3))
    with pytest.raises(ShapeError, match="gather: slice_sizes"):
        lax.gather(x, np.zeros((2, 1), np.int64), ROWS, (1, 4))
    with pytest.raises(ShapeError, match="gather: indices must be integers"):
        lax.gather(x, np.zeros((2, 1)), ROWS, (1, 3))
    with pytest.raises(ValueError, match="Unknown gather mode"):
        lax.gather(x, np.zeros((2, 1), np.int64), ROWS, (1, 3), mode="wrap")
    with pytest.raises(TypeError, match="GatherDimensionNumbers"):
        lax.gather(x, np.zeros((2, 1), np.int64), (1,), (1, 3))


# ---------------------------------------------------------------------------------------
# scatters: values and modes
# ---------------------------------------------------------------------------------------

SCATTERS = {"replace": lax.scatter, "add": lax.scatter_add, "mul": lax.scatter_mul, "min": lax.scatter_min,
            "max": lax.scatter_max}


@pytest.mark.parametrize("kind", sorted(SCATTERS))
@pytest.mark.parametrize("mode", [None, "clip", "fill", "promise_in_bounds"])
def test_scatters_with_repeats_and_out_of_bounds(kind, mode, backend):
    x = rng.standard_normal((5, 3))
    idx = np.array([[1], [4], [1], [-1], [7], [1], [0]])
    u = rng.standard_normal((7, 3))
    got = SCATTERS[kind](put(x, backend), put(idx, backend), put(u, backend), ROWS_S, mode=mode)
    want = scatter_reference(kind, x, idx, u, ROWS_S, "clip" if mode == "clip" else "drop")
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-12)


def test_scatter_last_update_wins():
    got = lax.scatter(np.zeros(4), np.array([[2], [1], [2], [2]]), np.array([1.0, 2.0, 3.0, 4.0]), POINTS_S)
    np.testing.assert_array_equal(got, [0.0, 2.0, 4.0, 0.0])


def test_scatter_add_accumulates_repeats_and_drops_out_of_bounds():
    got = lax.scatter_add(np.zeros(4), np.array([[2], [2], [-1], [4], [0]]), np.ones(5), POINTS_S)
    np.testing.assert_array_equal(got, [1.0, 0.0, 2.0, 0.0])
    got = lax.scatter_add(np.zeros(4), np.array([[2], [2], [-1], [4], [0]]), np.ones(5), POINTS_S, mode="clip")
    np.testing.assert_array_equal(got, [2.0, 0.0, 2.0, 1.0])


def test_scatter_window_clip_and_drop():
    x = np.zeros((4, 5))
    idx = np.array([[3, 4]])  # a 2x2 window there leaves the operand
    u = np.arange(1.0, 5.0).reshape(1, 2, 2)
    np.testing.assert_array_equal(lax.scatter_add(x, idx, u, WINDOW_S), x)  # dropped as a whole
    got = lax.scatter_add(x, idx, u, WINDOW_S, mode="clip")
    want = x.copy()
    want[2:4, 3:5] = u[0]
    np.testing.assert_array_equal(got, want)


def test_scatter_errors():
    with pytest.raises(ShapeError, match="scatter_add: the updates' scatter dims"):
        lax.scatter_add(np.zeros((5, 3)), np.zeros((2, 1), np.int64), np.zeros((3, 3)), ROWS_S)
    with pytest.raises(TypeError, match="scatter: updates of dtype int64"):
        lax.scatter(np.zeros((5, 3)), np.zeros((2, 1), np.int64), np.zeros((2, 3), np.int64), ROWS_S)
    with pytest.raises(TypeError, match="ScatterDimensionNumbers"):
        lax.scatter(np.zeros((5, 3)), np.zeros((2, 1), np.int64), np.zeros((2, 3)), ROWS)


def test_scatter_apply_applies_once_per_update():
    x = np.full(5, 2.0)
    idx = np.array([[1], [1], [3], [9]])
    got = lax.scatter_apply(x, idx, lambda v: v * v, POINTS_S, update_shape=(4,))
    np.testing.assert_array_equal(got, [2.0, 16.0, 2.0, 4.0, 2.0])  # index 1 twice, 9 dropped
    jitted = cv.jit(lambda x, i: lax.scatter_apply(x, i, cnp.sin, POINTS_S, update_shape=(4,)))(x, idx)
    np.testing.assert_allclose(jitted, [2.0, np.sin(np.sin(2.0)), 2.0, np.sin(2.0), 2.0])
    idxs = np.array([[[0], [0], [1], [2]], [[4], [4], [4], [3]]])
    batched = cv.vmap(lambda i: lax.scatter_apply(x, i, lambda v: v + 1.0, POINTS_S, update_shape=(4,)))(idxs)
    np.testing.assert_array_equal(batched, [[4.0, 3.0, 3.0, 2.0, 2.0], [2.0, 2.0, 2.0, 3.0, 5.0]])


# ---------------------------------------------------------------------------------------
# derivatives (float64, both modes)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [None, "clip", "fill"])
def test_gather_grads(mode):
    x = rng.standard_normal((5, 4))
    idx = np.array([[1, 0], [4, 2], [1, 0], [-1, 1], [3, 3]])
    check_grads(lambda x: lax.gather(x, idx, WINDOW, (2, 2), mode=mode, fill_value=0.25), (x,))


@pytest.mark.parametrize("mode", [None, "clip"])
def test_scatter_add_and_scatter_grads(mode):
    x = rng.standard_normal((5, 3))
    idx = np.array([[1], [4], [1], [-1], [7], [1]])
    u = rng.standard_normal((6, 3))
    check_grads(lambda x, u: lax.scatter_add(x, idx, u, ROWS_S, mode=mode), (x, u))
    check_grads(lambda x, u: lax.scatter(x, idx, u, ROWS_S, mode=mode), (x, u))


def test_scatter_grads_go_to_the_winning_update():
    idx = np.array([[2], [1], [2]])
    _, pullback = cv.vjp(lambda x, u: lax.scatter(x, idx, u, POINTS_S), np.zeros(4), np.zeros(3))
    ct_x, ct_u = pullback(np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(ct_x, [1.0, 0.0, 0.0, 4.0])
    np.testing.assert_array_equal(ct_u, [0.0, 2.0, 3.0])


def test_scatter_mul_grads():
    x = rng.standard_normal((5, 3))
    unique = np.array([[3], [0], [4]])
    u = rng.standard_normal((3, 3))
    check_grads(lambda x, u: lax.scatter_mul(x, unique, u, ROWS_S, unique_indices=True), (x, u))
    repeated = np.array([[3], [3]])
    check_grads(lambda x: lax.scatter_mul(x, repeated, u[:2], ROWS_S), (x,))
    with pytest.raises(NotImplementedError, match="unique_indices=True"):
        cv.grad(lambda u: lax.scatter_mul(x, repeated, u, ROWS_S).sum())(u[:2])


@pytest.mark.parametrize("op", [lax.scatter_min, lax.scatter_max])
def test_extremal_scatter_grads(op):
    x = rng.standard_normal((5, 3))
    idx = np.array([[1], [4], [1], [2]])
    u = rng.standard_normal((4, 3))
    check_grads(lambda x, u: op(x, idx, u, ROWS_S), (x, u))


def test_extremal_scatter_shares_ties_evenly():
    """A tie between the operand and one update splits the derivative in half."""
    g_x, g_u = cv.grad(lambda x, u: lax.scatter_max(x, np.array([[0], [1]]), u, POINTS_S).sum(),
                       argnums=(0, 1))(np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0]))
    np.testing.assert_array_equal(g_x, [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(g_u, [0.5, 1.0])


def test_dynamic_slice_and_update_grads():
    x = rng.standard_normal((4, 5))
    u = rng.standard_normal((2, 3))
    check_grads(lambda x: lax.dynamic_slice(x, (np.int32(3), -2), (2, 3)), (x,))
    check_grads(lambda x, u: lax.dynamic_update_slice(x, u, (1, np.int64(4))), (x, u))


# ---------------------------------------------------------------------------------------
# vmap over each argument, jit
# ---------------------------------------------------------------------------------------


def test_gather_vmap_over_each_argument():
    x = rng.standard_normal((3, 5, 4))
    idx = rng.integers(-1, 6, (3, 2, 2))
    f = lambda x, i: lax.gather(x, i, WINDOW, (2, 3), mode="fill", fill_value=0.0)  # noqa: E731
    for in_axes in [(0, None), (None, 0), (0, 0), (1, 2)]:
        args = (x if in_axes[0] != 1 else np.moveaxis(x, 0, 1),
                idx[0] if in_axes[1] is None else (idx if in_axes[1] == 0 else np.moveaxis(idx, 0, 2)))
        args = (args[0][0] if in_axes[0] is None else args[0], args[1])
        check_batching(f, args, in_axes=in_axes)


@pytest.mark.parametrize("kind", sorted(SCATTERS))
def test_scatter_vmap_over_each_argument(kind):
    x = rng.standard_normal((3, 5, 4))
    idx = rng.integers(-1, 6, (3, 4, 1))
    u = rng.standard_normal((3, 4, 4))
    f = lambda x, i, u: SCATTERS[kind](x, i, u, ROWS_S)  # noqa: E731
    for in_axes in [(0, None, None), (None, 0, None), (None, None, 0), (0, 0, 0), (None, 0, 0)]:
        args = tuple(a if ax == 0 else a[0] for a, ax in zip((x, idx, u), in_axes))
        check_batching(f, args, in_axes=in_axes)


def test_dynamic_slice_vmap_of_grad_and_grad_of_vmap():
    x = rng.standard_normal((4, 5))
    starts = np.array([0, 2, 3, -1])
    per_start = cv.vmap(cv.grad(lambda x, i: lax.dynamic_index_in_dim(x, i, 0, False).sum()), in_axes=(None, 0))
    want = np.zeros((4, 4, 5))
    for b, i in enumerate(starts):
        want[b, i] = 1.0
    np.testing.assert_array_equal(per_start(x, starts), want)
    total = cv.grad(lambda x: cv.vmap(lambda i: lax.dynamic_slice_in_dim(x, i, 2, 1), in_axes=0)(starts).sum())(x)
    want_total = np.zeros((4, 5))
    for i in starts:
        s = min(max(i + (5 if i < 0 else 0), 0), 3)
        want_total[:, s:s + 2] += 1.0
    np.testing.assert_array_equal(total, want_total)


def test_jit_matches_eager():
    x = rng.standard_normal((5, 4))
    idx = np.array([[1], [-1], [4]])
    u = rng.standard_normal((3, 4))

    def f(x, idx, u, i):
        g = lax.gather(x, idx, ROWS, (1, 4), mode="fill", fill_value=0.0)
        s = lax.scatter_add(x, idx, u, ROWS_S, mode="clip")
        d = lax.dynamic_update_slice(x, lax.dynamic_slice(x, (i, 0), (2, 4)), (0, 0))
        return g, s, d, lax.dynamic_index_in_dim(x, i, 1, keepdims=False)

    eager = f(x, idx, u, np.int64(3))
    jitted = cv.jit(f)(x, idx, u, np.int64(3))
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(a, b)


# ---------------------------------------------------------------------------------------
# front ends
# ---------------------------------------------------------------------------------------


def test_dynamic_slice_clamps_and_wraps():
    x = np.arange(20.0).reshape(4, 5)
    np.testing.assert_array_equal(lax.dynamic_slice(x, (3, 4), (2, 2)), x[2:4, 3:5])  # clamped into range
    np.testing.assert_array_equal(lax.dynamic_slice(x, (-1, -2), (1, 2)), x[3:4, 3:5])  # negative wraps
    np.testing.assert_array_equal(lax.dynamic_slice(x, np.array([-1, 0]), (1, 2), allow_negative_indices=False),
                                  x[0:1, 0:2])
    np.testing.assert_array_equal(lax.dynamic_slice_in_dim(x, 1, 2, axis=1), x[:, 1:3])
    np.testing.assert_array_equal(lax.dynamic_index_in_dim(x, -1), x[3:4])
    np.testing.assert_array_equal(lax.dynamic_index_in_dim(x, 2, 1, keepdims=False), x[:, 2])
    np.testing.assert_array_equal(lax.dynamic_slice(np.float64(3.0), (), ()), 3.0)


def test_dynamic_update_slice_front_ends():
    x = np.zeros((3, 4))
    want = x.copy()
    want[1:3, 2:4] = 1.0
    np.testing.assert_array_equal(lax.dynamic_update_slice(x, np.ones((2, 2)), (5, 2)), want)
    want = x.copy()
    want[:, 1] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(lax.dynamic_update_index_in_dim(x, np.array([1.0, 2.0, 3.0]), 1, 1), want)
    want = x.copy()
    want[1:3] = 7.0
    np.testing.assert_array_equal(lax.dynamic_update_slice_in_dim(x, np.full((2, 4), 7.0), -2, 0), want)
    scalar = lax.dynamic_update_slice(np.float64(1.0), 7, [])
    assert scalar.shape == () and scalar == 7.0


def test_index_in_dim_and_index_take():
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(lax.index_in_dim(x, -1, 1), x[:, 2:3])
    np.testing.assert_array_equal(lax.index_in_dim(x, 1, 2, keepdims=False), x[:, :, 1])
    with pytest.raises(IndexError, match="index_in_dim: index 3 is out of bounds for axis 1 with size 3"):
        lax.index_in_dim(x, 3, 1)
    i, j = np.array([0, 1, -1]), np.array([3, 5, 0])
    np.testing.assert_array_equal(lax.index_take(x, (i, j), (0, 2)), np.moveaxis(x, 1, -1)[i % 2, j % 4])


# ---------------------------------------------------------------------------------------
# narrow index dtypes (the offset arithmetic of the take paths)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_take_along_axis_with_narrow_index_dtypes(dtype):
    """The row offsets (row · n) used to be computed in the indices' dtype, so int8
    indices on 300 rows wrapped around and read other rows without an error."""
    x = rng.standard_normal((300, 2))
    idx = (np.arange(300) % 2).astype(dtype).reshape(300, 1)
    np.testing.assert_array_equal(cnp.take_along_axis(x, idx, 1), np.take_along_axis(x, idx, 1))
    np.testing.assert_array_equal(cnp.take_along_axis(x.T, idx.T, 0), np.take_along_axis(x.T, idx.T, 0))


def test_narrow_index_dtypes_in_getitem_and_batched_take():
    y = np.arange(400.0).reshape(20, 20)
    a, b = np.array([19, 3], np.int8), np.array([19, -2], np.int8)
    np.testing.assert_array_equal(cnp.getitem(y, (a, b)), y[a, b])
    x = rng.standard_normal((200, 3))
    idx = (np.arange(200) % 3).astype(np.int8).reshape(200, 1)
    got = cv.vmap(lambda x, i: lax.take(x, i, 0))(x, idx)
    np.testing.assert_array_equal(got[:, 0], x[np.arange(200), idx[:, 0]])
    neg = np.full((200, 1), -1, np.int8)
    np.testing.assert_array_equal(cv.vmap(lambda x, i: lax.take(x, i, 0))(x, neg)[:, 0], x[:, -1])


def test_take_along_axis_none_flattens():
    x = rng.standard_normal((3, 4))
    idx = np.array([11, 0, 5, -1])
    np.testing.assert_array_equal(cnp.take_along_axis(x, idx, None), np.take_along_axis(x, idx, None))


def test_jit_of_grad_matches_eager():
    x = rng.standard_normal((5, 3))
    idx = np.array([[1], [4], [1], [-1]])
    u = rng.standard_normal((4, 3))

    def loss(x, u):
        out = lax.scatter_max(x, idx, u, ROWS_S) + lax.scatter(x, idx, u, ROWS_S)
        return (lax.gather(out, idx, ROWS, (1, 3), mode="fill", fill_value=0.0) ** 2).sum()

    eager = cv.grad(loss, argnums=(0, 1))(x, u)
    jitted = cv.jit(cv.grad(loss, argnums=(0, 1)))(x, u)
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(a, b, rtol=1e-12)


# ---------------------------------------------------------------------------------------
# x.at[...] on traced values (cuvmap/numpy/_at.py): scatters of flat positions
# ---------------------------------------------------------------------------------------

AT_INDICES = [(1,), (slice(None), 2), (np.array([0, 2, 0]),), (Ellipsis, np.array([[1], [3]])),
              (slice(None, None, -2), -1)]


def _at_reference(method, x, index, values):
    out = x.copy()
    if method == "set":
        out[index] = values
        return out
    ufunc = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}[method]
    ufunc.at(out, index, values)
    return out


@pytest.mark.parametrize("method", ["set", "add", "multiply", "min", "max"])
@pytest.mark.parametrize("index", AT_INDICES, ids=repr)
def test_at_methods_match_numpy(method, index):
    x = rng.standard_normal((3, 4))
    values = rng.standard_normal(x[index].shape)
    got = cv.jit(lambda x, v: getattr(x.at[index], method)(v))(x, values)
    np.testing.assert_allclose(got, _at_reference(method, x, index, values), rtol=1e-12)


def test_at_grads_vmap_and_traced_indices():
    x = rng.standard_normal((3, 4))
    v = rng.standard_normal(3)
    # under jit, as the finite differences evaluate the function on concrete (NumPy) arrays
    check_grads(cv.jit(lambda x, v: x.at[np.array([0, 2, 0]), 1].add(v)), (x, v))
    check_grads(cv.jit(lambda x, v: x.at[:, 3].set(v)), (x, v))
    check_grads(cv.jit(lambda x: x.at[1].multiply(2.0).at[0, 1:].divide(3.0).at[2].power(2.0)), (x,))
    xs = rng.standard_normal((5, 3, 4))
    idx = np.array([0, 2, 1, -1, 0])
    # the loop references in NumPy (a concrete array has NumPy's methods, no .at)
    got = cv.vmap(lambda x, i: x.at[i].add(1.0))(xs, idx)
    np.testing.assert_allclose(got, np.stack([_at_reference("add", xs[b], idx[b], 1.0) for b in range(5)]))
    got = cv.jit(lambda x, idx: cv.vmap(lambda i: x.at[:, i].set(0.0))(idx))(x, idx)  # x traced by jit
    np.testing.assert_array_equal(got, np.stack([_at_reference("set", x, (slice(None), i), 0.0) for i in idx]))
    np.testing.assert_array_equal(cv.jit(lambda x: x.at[1, ::2].get())(x), x[1, ::2])
    np.testing.assert_allclose(cv.jit(lambda x: x.at[0].apply(cnp.exp))(x), np.vstack([np.exp(x[0]), x[1:]]))


def test_scatter_apply_derivatives():
    x = rng.standard_normal(5)
    idx = np.array([[1], [3]])
    f = lambda x: lax.scatter_apply(x, idx, cnp.sin, POINTS_S, update_shape=(2,), unique_indices=True)  # noqa: E731
    check_grads(f, (x,))
    repeated = np.array([[1], [1]])
    g = lambda x: lax.scatter_apply(x, repeated, cnp.sin, POINTS_S, update_shape=(2,))  # noqa: E731
    check_grads(g, (x,), modes=("fwd",))
    np.testing.assert_allclose(g(x)[1], np.sin(np.sin(x[1])))
