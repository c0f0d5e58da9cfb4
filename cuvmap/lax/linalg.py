"""``dot_general``: the contraction behind matmul, batched matmul, tensordot and einsum.

``dot_general(x, y, ((x_contract, y_contract), (x_batch, y_batch)))`` contracts the
paired ``contract`` dims and pairs the ``batch`` dims; the output's dims are the batch
dims, then the free dims of ``x``, then those of ``y``:

    out[b, i, j] = Σ_k x[b, i, k] · y[b, k, j]     (dims grouped and flattened)

The impl transposes and reshapes both operands to ``(B, M, K)`` and ``(B, K, N)`` and calls
one (batched) BLAS matmul. The batching rule turns a batch dim of one operand into a free
dim of it, and a batch dim of both into one more paired batch dim. It is bilinear, so the
JVP is the sum of ``dot_general(t_x, y)`` and ``dot_general(x, t_y)``, and each VJP is a
``dot_general`` of the cotangent with the other operand followed by a transpose (the
derivation follows JAX's ``_dot_general_transpose_lhs``).
"""
import numpy as np

from cuvmap import core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax.shape import transpose
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.transforms.batching import move_bdim, not_mapped, physical_axis


def _free_dims(ndim, contract, batch):
    return [i for i in range(ndim) if i not in contract and i not in batch]


def _dot_general_shape_rule(x, y, *, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    if len(xc) != len(yc) or len(xb) != len(yb):
        raise ShapeError(f"dimension_numbers {dimension_numbers} pair unequal numbers of dims")
    for dims, a in ((xc + xb, x), (yc + yb, y)):
        if any(not 0 <= d < a.ndim for d in dims) or len(set(dims)) != len(dims):
            raise ShapeError(f"dimension_numbers {dimension_numbers} out of range or repeated for {x.shape} and {y.shape}")
    for i, j in list(zip(xc, yc)) + list(zip(xb, yb)):
        if x.shape[i] != y.shape[j]:
            raise ShapeError(
                f"dim {i} of {x.shape} (size {x.shape[i]}) does not match dim {j} of {y.shape} (size {y.shape[j]})"
            )
    if x.dtype.kind == "b" or y.dtype.kind == "b":
        raise ShapeError("boolean operands")
    shape = (
        tuple(x.shape[i] for i in xb)
        + tuple(x.shape[i] for i in _free_dims(x.ndim, xc, xb))
        + tuple(y.shape[i] for i in _free_dims(y.ndim, yc, yb))
    )
    return ShapedArray(shape, np.result_type(x.dtype, y.dtype))


def _dot_general_impl(x, y, *, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    x_free = _free_dims(x.ndim, xc, xb)
    y_free = _free_dims(y.ndim, yc, yb)
    batch_shape = tuple(x.shape[i] for i in xb)
    m_shape = tuple(x.shape[i] for i in x_free)
    n_shape = tuple(y.shape[i] for i in y_free)
    b = int(np.prod(batch_shape, dtype=np.int64))
    m = int(np.prod(m_shape, dtype=np.int64))
    n = int(np.prod(n_shape, dtype=np.int64))
    k = int(np.prod([x.shape[i] for i in xc], dtype=np.int64))
    xt = x.transpose(tuple(xb) + tuple(x_free) + tuple(xc))
    yt = y.transpose(tuple(yb) + tuple(yc) + tuple(y_free))
    if k == 1:
        # an outer product (per-example gradients of a dense layer): a broadcast multiply
        # writes the output once; a stack of rank-1 GEMMs is several times slower. NumPy's
        # inner loop runs along the last axis, so the longer of m and n goes last: with
        # n < m the product is written as (b, n, m) and returned as its transposed view
        # (12800 × 10 per example: 11 ms against 27 ms at batch 128).
        if n < m:
            out = (yt.reshape(b, n, 1) * xt.reshape(b, 1, m)).transpose(0, 2, 1)
        else:
            out = xt.reshape(b, m, 1) * yt.reshape(b, 1, n)
    elif xb:
        out = xt.reshape(b, m, k) @ yt.reshape(b, k, n)
    else:
        out = xt.reshape(m, k) @ yt.reshape(k, n)
    return out.reshape(batch_shape + m_shape + n_shape)


dot_general_p = Primitive("dot_general")
dot_general_p.impl = _dot_general_impl
dot_general_p.shape_rule = _dot_general_shape_rule


def dot_general(x, y, dimension_numbers):
    """General tensor contraction (see the module docstring).

    Args:
      x, y: arrays.
      dimension_numbers: ``((x_contract, y_contract), (x_batch, y_batch))``, tuples of dims.
    Returns:
      an array of shape ``batch + x_free + y_free``.

    Example: ``dot_general(a, b, (((1,), (0,)), ((), ())))`` is ``a @ b`` for matrices.
    """
    (xc, yc), (xb, yb) = dimension_numbers
    dn = ((tuple(int(i) for i in xc), tuple(int(i) for i in yc)), (tuple(int(i) for i in xb), tuple(int(i) for i in yb)))
    return dot_general_p.bind(x, y, dimension_numbers=dn)


# ---------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------


def _dot_general_batch(axis_size, vals, dims, *, dimension_numbers):
    x, y = vals
    dx, dy = dims
    (xc, yc), (xb, yb) = dimension_numbers
    if dx is not not_mapped and dy is not not_mapped:
        x = move_bdim(x, dx, 0)
        y = move_bdim(y, dy, 0)
        shift = lambda ds: tuple(d + 1 for d in ds)  # noqa: E731
        dn = ((shift(xc), shift(yc)), ((0,) + shift(xb), (0,) + shift(yb)))
        return dot_general(x, y, dn), 0
    if dx is not not_mapped:
        xc2 = tuple(physical_axis(d, dx) for d in xc)
        xb2 = tuple(physical_axis(d, dx) for d in xb)
        x_free = _free_dims(len(x.shape), xc2, xb2)
        out_dim = len(xb) + x_free.index(dx)
        return dot_general(x, y, ((xc2, yc), (xb2, yb))), out_dim
    yc2 = tuple(physical_axis(d, dy) for d in yc)
    yb2 = tuple(physical_axis(d, dy) for d in yb)
    y_free = _free_dims(len(y.shape), yc2, yb2)
    x_ndim = len(core.shape_of(x))
    out_dim = len(xb) + len(_free_dims(x_ndim, xc, xb)) + y_free.index(dy)
    return dot_general(x, y, ((xc, yc2), (xb, yb2))), out_dim


batching.primitive_batchers[dot_general_p] = _dot_general_batch


# ---------------------------------------------------------------------------------------
# JVP and VJP
# ---------------------------------------------------------------------------------------


def _ranges_like(*xs):
    start = 0
    for x in xs:
        yield tuple(range(start, start + len(x)))
        start += len(x)


def _transpose_lhs(ct, x_ndim, y, dimension_numbers, swap_ans=False):
    """Cotangent of ``x`` in ``dot_general(x, y)`` (or of ``y`` with ``swap_ans``)."""
    (xc, yc), (xb, yb) = dimension_numbers
    x_kept = _free_dims(x_ndim, xc, xb)
    y_kept = _free_dims(len(core.shape_of(y)), yc, yb)
    if swap_ans:
        ans_batch, ans_y, _ = _ranges_like(xb, y_kept, x_kept)
    else:
        ans_batch, _, ans_y = _ranges_like(xb, x_kept, y_kept)
    dims = ((ans_y, tuple(y_kept)), (ans_batch, tuple(yb)))
    xc_sorted_by_y = tuple(np.take(np.asarray(xc, dtype=int), np.argsort(yc))) if xc else ()
    out_axes = np.argsort(tuple(xb) + tuple(x_kept) + tuple(int(i) for i in xc_sorted_by_y))
    return transpose(dot_general(ct, y, dims), tuple(int(i) for i in out_axes))


def _dot_general_vjp_lhs(ct, out, x, y, *, dimension_numbers):
    return _transpose_lhs(ct, len(core.shape_of(x)), y, dimension_numbers)


def _dot_general_vjp_rhs(ct, out, x, y, *, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    swapped = ((yc, xc), (yb, xb))
    return _transpose_lhs(ct, len(core.shape_of(y)), x, swapped, swap_ans=True)


jvp.defjvp(
    dot_general_p,
    lambda t, out, x, y, *, dimension_numbers: dot_general(t, y, dimension_numbers),
    lambda t, out, x, y, *, dimension_numbers: dot_general(x, t, dimension_numbers),
)
vjp.defvjp(dot_general_p, _dot_general_vjp_lhs, _dot_general_vjp_rhs, reads=(0, 1))
