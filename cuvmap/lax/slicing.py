"""JAX's ``lax`` slicing names: ``gather`` and the scatters (the primitives, in
:mod:`cuvmap.lax.slicing_gather` and :mod:`cuvmap.lax.slicing_scatter`) and the
front ends built on them, each a case of a gather or scatter so that batching and
derivatives live in one place:

- ``dynamic_slice(x, starts, sizes)`` = ``x[s_0 : s_0 + n_0, ...]`` with traced starts,
  clamped to ``[0, shape[d] - n_d]`` (negative starts count from the end first, as JAX's
  ``allow_negative_indices=True``): a gather whose window is the whole slice;
- ``dynamic_update_slice(x, u, starts)``: ``x`` with ``x[s : s + u.shape] = u``, starts
  clamped the same way: a scatter with ``unique_indices``;
- ``dynamic_slice_in_dim``, ``dynamic_index_in_dim``, ``dynamic_update_slice_in_dim``,
  ``dynamic_update_index_in_dim``: the same along one axis;
- ``index_in_dim(x, i, axis)``: ``x[..., i, ...]`` with a static ``i``;
- ``index_take(src, idxs, axes)``: ``src[idxs[0], idxs[1], ...]`` on ``axes`` (indices
  taken modulo the sizes), a gather.
"""
import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.shape import concatenate, expand_dims, reshape, squeeze
from cuvmap.lax.slicing_gather import (  # noqa: F401 - the public names of the family
    GatherDimensionNumbers, GatherScatterMode, ScatterDimensionNumbers, gather, gather_p,
)
from cuvmap.lax.slicing_scatter import (  # noqa: F401
    scatter, scatter_add, scatter_add_p, scatter_apply, scatter_max, scatter_max_p, scatter_min, scatter_min_p,
    scatter_mul, scatter_mul_p, scatter_p,
)
from cuvmap.core.bfloat16 import kind_of


def _as_int64(i):
    if isinstance(i, core.Tracer):
        if kind_of(core.dtype_of(i)) not in "iu":
            raise TypeError(f"start indices must be integers, got {core.dtype_of(i)}")
        return ew.convert_element_type(i, np.int64) if core.dtype_of(i) != np.int64 else i
    a = np.asarray(i) if not hasattr(i, "dtype") else i
    if kind_of(np.dtype(a.dtype)) not in "iu":
        raise TypeError(f"start indices must be integers, got {a.dtype}")
    return a.astype(np.int64)


def _start_vector(op, operand, start_indices, allow_negative_indices):
    """The starts as one int64 vector, negative ones wrapped where allowed."""
    shape = core.shape_of(operand)
    rank = len(shape)
    if isinstance(start_indices, (list, tuple)):
        if len(start_indices) != rank:
            raise _shape_error(op, f"needs one start index per dim of the operand {shape}, got {len(start_indices)}")
        parts = [reshape(_as_int64(s), (1,)) for s in start_indices]
        if any(core.shape_of(s) != () for s in start_indices):
            raise _shape_error(op, "start indices must be scalars")
        vector = concatenate(parts, 0) if parts else np.zeros((0,), np.int64)
    else:
        vector = _as_int64(start_indices)
        if core.shape_of(vector) != (rank,):
            raise _shape_error(op, f"start indices of shape {core.shape_of(vector)} must be a vector of length {rank}")
    allow = ((allow_negative_indices,) * rank if isinstance(allow_negative_indices, bool)
             else tuple(bool(a) for a in allow_negative_indices))
    if rank and any(allow):
        sizes = np.array([n if a else 0 for n, a in zip(shape, allow)], np.int64)
        vector = ew.select(ew.lt(vector, np.int64(0)), ew.add(vector, sizes), vector)
    return vector


def _shape_error(op, message):
    return core.ShapeError(f"{op}: {message}")


def _whole_window(rank):
    return tuple(range(rank))


def dynamic_slice(operand, start_indices, slice_sizes, *, allow_negative_indices=True):
    """``jax.lax.dynamic_slice``: ``operand[s_0 : s_0 + n_0, s_1 : s_1 + n_1, ...]`` for
    ``start_indices`` ``s`` (scalars, traced or not, or one vector) and static
    ``slice_sizes`` ``n``; each start is clamped to ``[0, shape[d] - n_d]`` after negative
    ones are wrapped (``allow_negative_indices``, a bool or one per dim). A gather; its
    transpose writes the cotangent into zeros at the slice."""
    rank = len(core.shape_of(operand))
    if len(slice_sizes) != rank:
        raise _shape_error("dynamic_slice", f"slice_sizes {tuple(slice_sizes)} must have one entry per dim of the "
                                           f"operand {core.shape_of(operand)}")
    vector = _start_vector("dynamic_slice", operand, start_indices, allow_negative_indices)
    dnums = GatherDimensionNumbers(offset_dims=_whole_window(rank), collapsed_slice_dims=(),
                                   start_index_map=_whole_window(rank))
    return gather(operand, vector, dnums, tuple(slice_sizes), indices_are_sorted=True, unique_indices=True,
                  mode=GatherScatterMode.CLIP)


def dynamic_update_slice(operand, update, start_indices, *, allow_negative_indices=True):
    """``jax.lax.dynamic_update_slice``: ``operand`` with ``update`` written at
    ``start_indices`` (clamped so that it fits, negative ones wrapped first, as
    :func:`dynamic_slice`). A scatter: differentiable in ``operand`` (zero under the
    update) and ``update`` (the cotangent's slice)."""
    rank = len(core.shape_of(operand))
    if len(core.shape_of(update)) != rank:
        raise _shape_error("dynamic_update_slice", f"the update of shape {core.shape_of(update)} must have the rank "
                                                  f"of the operand {core.shape_of(operand)}")
    vector = _start_vector("dynamic_update_slice", operand, start_indices, allow_negative_indices)
    dnums = ScatterDimensionNumbers(update_window_dims=_whole_window(rank), inserted_window_dims=(),
                                    scatter_dims_to_operand_dims=_whole_window(rank))
    return scatter(operand, vector, update, dnums, indices_are_sorted=True, unique_indices=True,
                   mode=GatherScatterMode.CLIP)


def _axis(op, operand, axis):
    rank = len(core.shape_of(operand))
    if not -rank <= int(axis) < rank:
        raise _shape_error(op, f"axis {axis} is out of range for an operand of shape {core.shape_of(operand)}")
    return int(axis) % rank


def dynamic_slice_in_dim(operand, start_index, slice_size=1, axis=0, *, allow_negative_indices=True):
    """``jax.lax.dynamic_slice_in_dim``: ``operand[..., s : s + slice_size, ...]`` along
    ``axis`` with a traced ``start_index`` (clamped as :func:`dynamic_slice`)."""
    axis = _axis("dynamic_slice_in_dim", operand, axis)
    shape = core.shape_of(operand)
    starts = [np.int64(0)] * len(shape)
    starts[axis] = start_index
    sizes = list(shape)
    sizes[axis] = int(slice_size)
    return dynamic_slice(operand, starts, sizes, allow_negative_indices=allow_negative_indices)


def dynamic_index_in_dim(operand, index, axis=0, keepdims=True, *, allow_negative_indices=True):
    """``jax.lax.dynamic_index_in_dim``: ``operand[..., index, ...]`` along ``axis`` with a
    traced ``index`` (clamped into range), keeping the axis with size 1 when
    ``keepdims``."""
    axis = _axis("dynamic_index_in_dim", operand, axis)
    out = dynamic_slice_in_dim(operand, index, 1, axis, allow_negative_indices=allow_negative_indices)
    return out if keepdims else squeeze(out, (axis,))


def dynamic_update_slice_in_dim(operand, update, start_index, axis, *, allow_negative_indices=True):
    """``jax.lax.dynamic_update_slice_in_dim``: ``update`` written into ``operand`` from
    ``start_index`` along ``axis`` (0 along the other dims)."""
    axis = _axis("dynamic_update_slice_in_dim", operand, axis)
    starts = [np.int64(0)] * len(core.shape_of(operand))
    starts[axis] = start_index
    return dynamic_update_slice(operand, update, starts, allow_negative_indices=allow_negative_indices)


def dynamic_update_index_in_dim(operand, update, index, axis, *, allow_negative_indices=True):
    """``jax.lax.dynamic_update_index_in_dim``: ``operand`` with ``operand[..., index, ...]
    = update`` along ``axis``; ``update`` may lack that axis (it is then added)."""
    axis = _axis("dynamic_update_index_in_dim", operand, axis)
    if len(core.shape_of(update)) == len(core.shape_of(operand)) - 1:
        update = expand_dims(update, (axis,))
    return dynamic_update_slice_in_dim(operand, update, index, axis, allow_negative_indices=allow_negative_indices)


def index_in_dim(operand, index, axis=0, keepdims=True):
    """``jax.lax.index_in_dim``: ``operand[..., index, ...]`` along ``axis`` for a static
    int ``index`` (negative counts from the end; out of range raises IndexError), keeping
    the axis with size 1 when ``keepdims``."""
    axis = _axis("index_in_dim", operand, axis)
    n = core.shape_of(operand)[axis]
    index = int(index)
    if not -n <= index < n:
        raise IndexError(f"index_in_dim: index {index} is out of bounds for axis {axis} with size {n}")
    index %= n
    out = slice_in_dim(operand, index, index + 1, axis)
    return out if keepdims else squeeze(out, (axis,))


def index_take(src, idxs, axes):
    """``jax.lax.index_take``: ``out[j, ...] = src[..., idxs[0][j], ..., idxs[1][j], ...]``
    with ``idxs[k]`` indexing ``src``'s axis ``axes[k]`` (taken modulo its size); the
    remaining axes of ``src`` follow the indices' dim. A gather."""
    shape = core.shape_of(src)
    axes = tuple(int(a) for a in axes)
    columns = [reshape(_as_int64(i), core.shape_of(i) + (1,)) for i in idxs]
    indices = concatenate(columns, 1) if len(columns) > 1 else columns[0]
    sizes = np.array([shape[a] for a in axes], np.int64)
    indices = ew.remainder(indices, sizes)
    slice_sizes = tuple(1 if d in axes else n for d, n in enumerate(shape))
    offset_dims = tuple(range(1, len(shape) - len(axes) + 1))
    dnums = GatherDimensionNumbers(offset_dims=offset_dims, collapsed_slice_dims=tuple(sorted(axes)),
                                   start_index_map=axes)
    return gather(src, indices, dnums, slice_sizes)
