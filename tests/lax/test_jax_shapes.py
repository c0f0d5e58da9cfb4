"""The cuvmap.lax shape and product names with JAX's signatures (issue 32): pad with
(low, high, interior) including negative and interior padding, slice with strides,
slice_in_dim, broadcast, reshape(dimensions=), rev, squeeze/expand_dims with negative dims,
dot, dot_general(precision=, preferred_element_type=), Precision, platform_dependent.
Each row: the value against a NumPy reference, check_grads in both modes (float64), vmap
against a loop over every argument, jit against eager."""
from dataclasses import dataclass

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.test_util import check_batching, check_grads


def _pad_ref(x, value, config):
    """np.pad of the interior-dilated operand, then the negative ends cropped."""
    for axis, (_, _, interior) in enumerate(config):
        if interior and x.shape[axis]:
            n = x.shape[axis]
            shape = list(x.shape)
            shape[axis] = n + (n - 1) * interior
            out = np.full(shape, value, dtype=x.dtype)
            index = [slice(None)] * x.ndim
            index[axis] = slice(None, None, interior + 1)
            out[tuple(index)] = x
            x = out
    x = np.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi, _ in config], constant_values=value)
    index = tuple(slice(max(-lo, 0), x.shape[i] - max(-hi, 0)) for i, (lo, hi, _) in enumerate(config))
    return x[index]


@dataclass
class Row:
    name: str
    fun: object
    ref: object
    args: tuple


RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4))
X3 = RNG.standard_normal((2, 3, 4))
V = RNG.standard_normal(4)
M = RNG.standard_normal((4, 5))

PAD_CONFIGS = [
    ((1, 2, 0), (0, 1, 0)),
    ((1, 2, 1), (0, 0, 2)),
    ((-1, 2, 0), (1, -2, 0)),
    ((-2, -1, 1), (2, -3, 1)),
    ((0, 0, 3), (-1, -1, 0)),
]

ROWS = [
    *[Row(f"pad_{i}", lambda x, c=c: lax.pad(x, 0.5, c), lambda x, c=c: _pad_ref(x, 0.5, c), (X,))
      for i, c in enumerate(PAD_CONFIGS)],
    Row("pad_traced_value", lambda x, v: lax.pad(x, v, ((1, -1, 1), (2, 0, 0))),
        lambda x, v: _pad_ref(x, float(v), ((1, -1, 1), (2, 0, 0))), (X, np.array(0.25))),
    Row("slice", lambda x: lax.slice(x, (0, 1), (3, 4)), lambda x: x[0:3, 1:4], (X,)),
    Row("slice_strides", lambda x: lax.slice(x, (1, 0, 1), (2, 3, 4), (1, 2, 2)), lambda x: x[1:2, 0:3:2, 1:4:2],
        (X3,)),
    Row("slice_in_dim", lambda x: lax.slice_in_dim(x, 1, 4, 2, axis=1), lambda x: x[:, 1:4:2], (X,)),
    Row("slice_in_dim_negative", lambda x: lax.slice_in_dim(x, -3, None, axis=-1), lambda x: x[..., -3:], (X3,)),
    Row("broadcast", lambda x: lax.broadcast(x, (2, 1)), lambda x: np.broadcast_to(x, (2, 1) + x.shape), (X,)),
    Row("reshape_dimensions", lambda x: lax.reshape(x, (4, 6), dimensions=(2, 0, 1)),
        lambda x: np.transpose(x, (2, 0, 1)).reshape(4, 6), (X3,)),
    Row("rev", lambda x: lax.rev(x, (0, 2)), lambda x: x[::-1, :, ::-1], (X3,)),
    Row("squeeze_negative", lambda x: lax.squeeze(lax.expand_dims(x, (-1,)), (-1,)), lambda x: x, (X,)),
    Row("expand_dims_negative", lambda x: lax.expand_dims(x, (-1, 0)), lambda x: x[None, :, :, None], (X,)),
    Row("dot_vv", lambda a, b: lax.dot(a, b), lambda a, b: a @ b, (V, V * 2)),
    Row("dot_mv", lambda a, b: lax.dot(a, b), lambda a, b: a @ b, (X, V)),
    Row("dot_mm", lambda a, b: lax.dot(a, b, precision=lax.Precision.HIGHEST), lambda a, b: a @ b, (X, M)),
    Row("dot_general_batch", lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))), precision="highest"),
        lambda a, b: np.einsum("bij,bjk->bik", a, b), (X3, RNG.standard_normal((2, 4, 3)))),
    Row("dot_general_preferred", lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                              preferred_element_type=np.float64),
        lambda a, b: a @ b, (X, M)),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_values(row):
    got = row.fun(*row.args)
    want = row.ref(*row.args)
    assert np.shape(got) == np.shape(want), row.name
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14, err_msg=row.name)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_grads_both_modes(row):
    check_grads(row.fun, row.args, order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_vmap_over_each_argument(row):
    for i in range(len(row.args)):
        batched = tuple(np.stack([a, a * 1.5, a - 1]) if j == i else a for j, a in enumerate(row.args))
        in_axes = tuple(0 if j == i else None for j in range(len(row.args)))
        check_batching(row.fun, batched, in_axes=in_axes, atol=1e-13, rtol=1e-13)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_jit_matches_eager(row):
    np.testing.assert_allclose(cv.jit(row.fun)(*row.args), row.fun(*row.args), rtol=1e-15, atol=0)


def test_pad_of_an_empty_dim_and_errors():
    assert lax.pad(np.zeros((0, 2)), 1.0, ((1, 1, 2), (0, 0, 0))).shape == (2, 2)
    with pytest.raises(ShapeError, match="interior"):
        lax.pad(X, 0.0, ((0, 0, -1), (0, 0, 0)))
    with pytest.raises(ShapeError, match="negative size"):
        lax.pad(X, 0.0, ((-5, 0, 0), (0, 0, 0)))
    with pytest.raises(ShapeError, match="one \\(low, high, interior\\)"):
        lax.pad(X, 0.0, ((1, 1), (0, 0)))
    with pytest.raises(ShapeError, match="lax.slice"):
        lax.slice(X, (0, 0), (4, 4))
    with pytest.raises(ShapeError, match="rank 1 or 2"):
        lax.dot(X3, X)


def test_pad_transpose_is_a_strided_slice():
    config = ((1, -1, 2), (0, 2, 1))
    ct = RNG.standard_normal(_pad_ref(X, 0.0, config).shape)
    _, pullback = cv.vjp(lambda x, v: lax.pad(x, v, config), X, np.array(0.0))
    gx, gv = pullback(ct)
    # the operand's elements sit at every third row (offset 1, the last cropped) and every other column
    want = np.zeros_like(X)
    rows = np.arange(3) * 3 + 1
    keep = rows < ct.shape[0]
    want[keep] = ct[rows[keep]][:, ::2][:, :4]
    np.testing.assert_allclose(gx, want)
    np.testing.assert_allclose(gv, ct.sum() - want.sum())


def test_precision_names():
    assert lax.Precision("highest") is lax.Precision.HIGHEST
    assert lax.Precision("bfloat16") is lax.Precision.DEFAULT
    with pytest.raises(ValueError, match="precision"):
        lax.dot(V, V, precision="fast-ish")
    lax.dot(V, V, precision=(lax.Precision.HIGH, None))


def test_platform_dependent_picks_the_cpu_branch():
    out = lax.platform_dependent(X, cpu=lambda x: x + 1, default=lambda x: x - 1)
    np.testing.assert_array_equal(out, X + 1)
    np.testing.assert_array_equal(lax.platform_dependent(X, default=lambda x: x * 2, cuda=lambda x: x), X * 2)
    assert cv.grad(lambda x: lax.platform_dependent(x, cpu=lambda y: (y * y).sum()))(X).shape == X.shape
    with pytest.raises(NotImplementedError, match=r"no branch .*translation rule .* not found for platform cpu"):
        lax.platform_dependent(X, cuda=lambda x: x)
    # any platform name is a branch (JAX's **per_platform), never chosen unless it is cuvmap's
    np.testing.assert_array_equal(lax.platform_dependent(X, default=lambda x: x * 3, other=lambda x: x), X * 3)
    with pytest.raises(TypeError, match="the branch tpu= must be callable"):
        lax.platform_dependent(X, default=lambda x: x, tpu=3)
