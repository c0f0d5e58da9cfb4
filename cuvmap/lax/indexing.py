"""Indexing primitives: strided slices, integer-array gathers along one axis, and their
transposes (scatters), plus ``iota``.

- ``slice(x, slices)`` is basic slicing with static ``(start, stop, step)`` per dim
  (negative steps included). Its transpose ``slice_transpose(ct, slices, shape)`` writes
  ``ct`` into zeros of ``shape`` at the same positions.
- ``take(x, idx, axis)`` is ``numpy.take``: ``out[..., j..., ...] = x[..., idx[j...], ...]``.
  Its transpose ``take_transpose(ct, idx, axis, shape)`` scatter-adds ``ct`` into zeros of
  ``shape`` (repeated indices accumulate).

Both pairs are linear in the array operand and transpose to each other. When the indices
and the array are both batched, the batch dim is folded into the indexed axis and the
indices are offset by ``b * n`` (functorch's trick for ``index`` with batched indices), so
one gather serves every example.
"""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.cuda import device_errors
from cuvmap.lax import elementwise as ew
from cuvmap.lax.shape import broadcast_in_dim, reshape
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.transforms.batching import move_bdim, not_mapped
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# iota
# ---------------------------------------------------------------------------------------


def _iota_impl(*, size, dtype, device):
    return backend.xp_for(device).arange(size, dtype=dtype)


iota_p = Primitive("iota", differentiable=False)
iota_p.impl = _iota_impl
iota_p.shape_rule = lambda *, size, dtype, device: ShapedArray((size,), dtype)


# iota has no operands, so no transform ever owns one of them: its output is a constant,
# unbatched and without derivative. The rule completes the registry.
batching.primitive_batchers[iota_p] = lambda axis_size, vals, dims, **params: (iota_p.bind(**params), not_mapped)


def iota(size, dtype=np.int64, like=None):
    """``arange(size)`` on the backend of ``like`` (a constant to every transform)."""
    device = backend.backend_name(like) if like is not None else "cpu"
    return iota_p.bind(size=int(size), dtype=np.dtype(dtype), device=device)


# ---------------------------------------------------------------------------------------
# slice and its transpose
# ---------------------------------------------------------------------------------------


def _slice_len(start, stop, step):
    return len(range(start, -1 if stop is None else stop, step))


def normalize_slice(s, n):
    """A Python ``slice`` on a dim of size ``n`` as a static ``(start, stop, step)``;
    ``stop`` is ``None`` when a negative step runs past index 0."""
    start, stop, step = s.indices(n)
    return (start, None if stop < 0 else stop, step)


def _slice_shape_rule(x, *, slices):
    if len(slices) != x.ndim:
        raise ShapeError(f"needs one slice per dim of {x.shape}, got {len(slices)}")
    return ShapedArray(tuple(_slice_len(*s) for s in slices), x.dtype, x.weak_type)


def _slice_impl(x, *, slices):
    return core.as_array(x)[tuple(_pyslice(*s) for s in slices)]


slice_p = Primitive("slice", layout=lambda strided, *_: (False, True))  # a view, maybe strided
slice_p.impl = _slice_impl
slice_p.shape_rule = _slice_shape_rule


def slice(x, slices):  # noqa: A001 - lax vocabulary
    """Basic slicing: ``slices`` holds one ``(start, stop, step)`` per dim, normalized by
    :func:`normalize_slice`."""
    return slice_p.bind(x, slices=tuple(tuple(s) for s in slices))


def slice_in_dim(x, start, stop, axis, step=1):
    """``x[..., start:stop:step, ...]`` along ``axis``."""
    shape = core.shape_of(x)
    slices = [(0, n, 1) for n in shape]
    slices[axis] = normalize_slice(_pyslice(start, stop, step), shape[axis])
    return slice_p.bind(x, slices=tuple(slices))


_pyslice = builtins.slice


def _slice_batch(axis_size, vals, dims, *, slices):
    (x,), (d,) = vals, dims
    full = (0, x.shape[d], 1)
    return slice_p.bind(x, slices=slices[:d] + (full,) + slices[d:]), d


def _slice_transpose_shape_rule(ct, *, slices, shape):
    expected = tuple(_slice_len(*s) for s in slices)
    if tuple(ct.shape) != expected:
        raise ShapeError(f"cotangent shape {ct.shape} does not match the slice shape {expected}")
    return ShapedArray(shape, ct.dtype)


def _slice_transpose_impl(ct, *, slices, shape):
    ct = core.as_array(ct)
    out = backend.xp_of(ct).zeros(shape, dtype=ct.dtype)
    out[tuple(_pyslice(*s) for s in slices)] = ct
    return out


slice_transpose_p = Primitive("slice_transpose")
slice_transpose_p.impl = _slice_transpose_impl
slice_transpose_p.shape_rule = _slice_transpose_shape_rule


def _slice_transpose_batch(axis_size, vals, dims, *, slices, shape):
    (ct,), (d,) = vals, dims
    size = axis_size
    full = (0, size, 1)
    return (
        slice_transpose_p.bind(ct, slices=slices[:d] + (full,) + slices[d:], shape=shape[:d] + (size,) + shape[d:]),
        d,
    )


batching.primitive_batchers[slice_p] = _slice_batch
batching.primitive_batchers[slice_transpose_p] = _slice_transpose_batch
vjp.deflinear(slice_p, lambda ct, x, *, slices: slice_transpose_p.bind(ct, slices=slices, shape=x.shape))
vjp.deflinear(slice_transpose_p, lambda ct, x, *, slices, shape: slice_p.bind(ct, slices=slices))


# ---------------------------------------------------------------------------------------
# take and its transpose
# ---------------------------------------------------------------------------------------


class _ChecksIndices(Primitive):
    """A primitive whose impl checks its indices (the bounds check, take): ``host_sync``
    when the GPU's checks read them on the host (``config.device_bounds_check`` off; NOTE
    [device-side bounds checks] in cuvmap/cuda/device_errors.py)."""

    __slots__ = ()

    @property
    def host_sync(self):
        return not device_errors.on_device()


def _check_index_dtype(idx):
    if kind_of(idx.dtype) not in "iu":
        raise ShapeError(f"indices must be integers, got {idx.dtype}")


def _take_shape_rule(x, idx, *, axis):
    _check_index_dtype(idx)
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"axis {axis} out of range for shape {x.shape}")
    return ShapedArray(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype, x.weak_type)


def _take_impl(x, idx, *, axis):
    x = core.as_array(x)
    # NumPy's own message would name the physical axis (under vmap, not the user's): the
    # op and the logical shapes come in the note bind adds (NOTE [errors keep their kind])
    _check_index_bounds_impl(idx, n=x.shape[axis], op="take", where="the gathered axis")
    return x.take(idx, axis=axis)


take_p = _ChecksIndices("take")
take_p.impl = _take_impl
take_p.shape_rule = _take_shape_rule


def take(x, idx, axis):
    """``numpy.take(x, idx, axis)`` with integer indices of any shape (negative ones count
    from the end)."""
    if not isinstance(idx, core.Tracer) and not hasattr(idx, "dtype"):
        idx = np.asarray(idx)
    return take_p.bind(x, idx, axis=int(axis))


def _take_transpose_shape_rule(ct, idx, *, axis, shape):
    _check_index_dtype(idx)
    expected = tuple(shape[:axis]) + tuple(idx.shape) + tuple(shape[axis + 1:])
    if tuple(ct.shape) != expected:
        raise ShapeError(f"cotangent shape {ct.shape} does not match the gather shape {expected}")
    return ShapedArray(shape, ct.dtype)


def _take_transpose_impl(ct, idx, *, axis, shape):
    ct = core.as_array(ct)
    xp = backend.xp_of(ct, idx)
    out = xp.zeros(shape, dtype=ct.dtype)
    index = (_pyslice(None),) * axis + (idx,)
    if xp is np:
        np.add.at(out, index, ct)
    else:  # CuPy: cupyx.scatter_add is the long-standing spelling of add.at
        import cupyx

        cupyx.scatter_add(out, index, ct)
    return out


take_transpose_p = Primitive("take_transpose")
take_transpose_p.impl = _take_transpose_impl
take_transpose_p.shape_rule = _take_transpose_shape_rule


def _check_index_bounds_impl(idx, *, n, op, where, negative=True):
    idx = core.as_array(idx)
    if backend.is_cupy_array(idx) and device_errors.on_device():  # NOTE [device-side bounds checks] in
        device_errors.check_on_device(idx, n, f"{op}: an index is out of bounds for {where} with size {n}",
                                      negative)                     # cuvmap/cuda/device_errors.py
        return idx
    if idx.size == 0:
        return idx
    lo, hi = int(idx.min()), int(idx.max())
    if lo < (-n if negative else 0) or hi >= n:
        bad = hi if hi >= n else lo
        raise IndexError(f"{op}: index {bad} is out of bounds for {where} with size {n}")
    return idx


# The bounds check is a primitive (an identity on the indices that raises IndexError), so
# that it runs where the indices have values: eagerly at once, in a staged program when the
# program runs, under vmap on the whole batch of indices. On the CPU it reads the indices
# on the host and raises at once; on the GPU it reads nothing on the host (so a CUDA graph
# captures it): its kernels set an error word that a later call raises (NOTE [device-side
# bounds checks] in cuvmap/cuda/device_errors.py).
check_index_bounds_p = _ChecksIndices("check_index_bounds", differentiable=False,
                                      layout=lambda strided, *_: (False, strided[0]))  # its operand itself
check_index_bounds_p.impl = _check_index_bounds_impl
check_index_bounds_p.shape_rule = lambda idx, **params: ShapedArray(idx.shape, idx.dtype, idx.weak_type)
batching.primitive_batchers[check_index_bounds_p] = (
    lambda axis_size, vals, dims, **params: (check_index_bounds_p.bind(vals[0], **params), dims[0]))


def check_index_bounds(idx, n, op, axis, negative=True):
    """``idx``, checked to lie in ``[-n, n)`` (in ``[0, n)`` where ``negative`` is False:
    class labels, where a negative value is a missing label, never the last class): the
    check raises IndexError (when the indices have values) naming ``op`` and ``axis``.

    Gathers that fold several rows into one axis (batched indices, ``take_along_axis``,
    several index arrays) add ``row · n`` offsets, so an index of ``n`` would silently read
    the next row; the check runs on the indices before the offsets."""
    where = f"axis {axis}" if isinstance(axis, int) else axis
    if not negative:
        return check_index_bounds_p.bind(idx, n=int(n), op=op, where=where, negative=False)
    return check_index_bounds_p.bind(idx, n=int(n), op=op, where=where)


def as_index_dtype(idx):
    """``idx`` as int64: offset arithmetic (``idx + n``, ``idx + row · n``) in a narrow
    index dtype (int8, uint8, int16, ...) would overflow and read the wrong element."""
    return idx if core.dtype_of(idx) == np.int64 else ew.convert_element_type(idx, np.int64)


def _normalize_indices(idx, n):
    """Indices in ``[-n, n)`` (checked) as ``[0, n)``: ``idx + n`` for the negative ones,
    which is ``idx mod n`` (the floor modulo, ``numpy.remainder``): one primitive where
    ``select(idx < 0, idx + n, idx)`` bound three."""
    return ew.remainder(idx, n)


def _offset_indices(idx, size, n):
    """For indices batched at dim 0: ``idx[b] + b * n``, addressing a folded ``(B*n)`` axis."""
    idx = _normalize_indices(as_index_dtype(check_index_bounds(idx, n, "take", "the gathered axis")), n)
    offsets = ew.mul(iota(size, core.dtype_of(idx), like=idx), n)
    rank = len(core.shape_of(idx))
    return ew.add(idx, reshape(offsets, (size,) + (1,) * (rank - 1)))


def _take_batch(axis_size, vals, dims, *, axis):
    x, idx = vals
    dx, di = dims
    if di is not_mapped:
        a = batching.physical_axis(axis, dx)
        idx_rank = len(core.shape_of(idx))
        out_dim = dx if dx < a else dx - 1 + idx_rank
        return take_p.bind(x, idx, axis=a), out_dim
    if dx is not_mapped:
        return take_p.bind(x, idx, axis=axis), axis + di
    size = axis_size
    n = x.shape[batching.physical_axis(axis, dx)]
    x = batching.fold_bdim_into(x, dx, axis)
    idx = _offset_indices(move_bdim(idx, di, 0), size, n)
    return take_p.bind(x, idx, axis=axis), axis


def _take_transpose_batch(axis_size, vals, dims, *, axis, shape):
    ct, idx = vals
    dc, di = dims
    if di is not_mapped:
        ct = move_bdim(ct, dc, 0)
        size = axis_size
        return take_transpose_p.bind(ct, idx, axis=axis + 1, shape=(size,) + shape), 0
    size = axis_size
    n = shape[axis]
    idx = _offset_indices(move_bdim(idx, di, 0), size, n)
    if dc is not_mapped:
        ct_shape = core.shape_of(ct)
        out_shape = ct_shape[:axis] + (size,) + ct_shape[axis:]
        dims_kept = tuple(i for i in range(len(out_shape)) if i != axis)
        ct = broadcast_in_dim(ct, out_shape, dims_kept)
    else:
        ct = move_bdim(ct, dc, axis)
    folded_shape = shape[:axis] + (size * n,) + shape[axis + 1:]
    out = take_transpose_p.bind(ct, idx, axis=axis, shape=folded_shape)
    return batching.split_bdim_out_of(out, axis, size, n), axis


batching.primitive_batchers[take_p] = _take_batch
batching.primitive_batchers[take_transpose_p] = _take_transpose_batch
jvp.defjvp(take_p, lambda t, out, x, idx, *, axis: take_p.bind(t, idx, axis=axis), None)
jvp.defjvp(
    take_transpose_p,
    lambda t, out, ct, idx, *, axis, shape: take_transpose_p.bind(t, idx, axis=axis, shape=shape),
    None,
)
vjp.defvjp(
    take_p,
    lambda ct, out, x, idx, *, axis: take_transpose_p.bind(ct, idx, axis=axis, shape=core.shape_of(x)),
    None,
    reads=(1,),
)
vjp.defvjp(
    take_transpose_p,
    lambda ct, out, c, idx, *, axis, shape: take_p.bind(ct, idx, axis=axis),
    None,
    reads=(1,),
)


# linear: their transposes need no conjugate (NOTE [complex convention])
complex_rules.defcomplex(slice_p, slice_transpose_p, take_p, take_transpose_p)
