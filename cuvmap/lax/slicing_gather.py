"""``lax.gather`` (XLA's Gather, JAX's dimension numbers and modes) and the index
arithmetic it shares with the scatters of :mod:`cuvmap.lax.slicing_scatter`.

With ``indices`` of shape ``batch_shape + (K,)`` (the last dim holds the index vector, as
in JAX) and ``dimension_numbers = GatherDimensionNumbers(offset_dims,
collapsed_slice_dims, start_index_map, operand_batching_dims,
start_indices_batching_dims)``, the output has rank ``len(batch_shape) +
len(offset_dims)``; its dims at ``offset_dims`` are the window dims (the operand dims
neither collapsed nor batching, sized by ``slice_sizes``), the others the batch dims in
order. For an output position with batch part ``G`` and window part ``O``:

    start[start_index_map[k]] = indices[G, k]
    start[operand_batching_dims[i]] = G[start_indices_batching_dims[i]]
    out[G, O] = operand[start + O]           (O is 0 on collapsed and batching dims)

``mode`` says what an out-of-bounds window does (:class:`GatherScatterMode`): ``clip``
(and ``promise_in_bounds``, as XLA does on every backend) clamps each start to
``[0, shape[d] - slice_sizes[d]]``; ``fill`` returns ``fill_value`` for the whole window
when any part of it would fall outside. Negative indices are out of bounds (lax does not
wrap them, unlike NumPy).
"""
import enum
from typing import NamedTuple

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax.shape import broadcast_in_dim
from cuvmap.transforms import batching, jvp
from cuvmap.transforms.batching import move_bdim, not_mapped
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# dimension numbers and modes
# ---------------------------------------------------------------------------------------


class GatherDimensionNumbers(NamedTuple):
    """How a gather's operand, indices and output dims relate (JAX's
    ``lax.GatherDimensionNumbers``; the module docstring states the math).

    - ``offset_dims``: the output dims that hold the window (sorted);
    - ``collapsed_slice_dims``: operand dims of window size 1 that the output drops;
    - ``start_index_map``: ``indices[..., k]`` is the start along operand dim
      ``start_index_map[k]``;
    - ``operand_batching_dims`` / ``start_indices_batching_dims``: paired dims that index
      together (example ``b`` of the indices reads example ``b`` of the operand)."""

    offset_dims: tuple
    collapsed_slice_dims: tuple
    start_index_map: tuple
    operand_batching_dims: tuple = ()
    start_indices_batching_dims: tuple = ()


class ScatterDimensionNumbers(NamedTuple):
    """How a scatter's operand, indices and updates dims relate (JAX's
    ``lax.ScatterDimensionNumbers``): ``update_window_dims`` are the updates dims that hold
    a window, ``inserted_window_dims`` the operand dims of window size 1 absent from the
    updates, ``scatter_dims_to_operand_dims[k]`` the operand dim that ``indices[..., k]``
    starts, and ``operand_batching_dims`` / ``scatter_indices_batching_dims`` paired
    batch dims (the gather's transpose maps each field onto its gather counterpart)."""

    update_window_dims: tuple
    inserted_window_dims: tuple
    scatter_dims_to_operand_dims: tuple
    operand_batching_dims: tuple = ()
    scatter_indices_batching_dims: tuple = ()


class GatherScatterMode(enum.Enum):
    """What an out-of-bounds index does (JAX's ``lax.GatherScatterMode``).

    - ``CLIP``: each start is clamped so that the whole window lies in bounds;
    - ``FILL_OR_DROP``: a gather returns ``fill_value`` for a window that would leave the
      operand, a scatter drops such a window's updates;
    - ``PROMISE_IN_BOUNDS``: the caller promises in-bounds indices; out of bounds, a
      gather clamps and a scatter drops (what XLA does, and what cuvmap does too, so its
      derivatives stay consistent with its values).

    ``from_any`` reads the strings ``"clip"``, ``"fill"``, ``"drop"``,
    ``"promise_in_bounds"`` and ``None`` (``FILL_OR_DROP``, the scatters' default; the
    gather's default is ``PROMISE_IN_BOUNDS``, as in JAX)."""

    CLIP = enum.auto()
    FILL_OR_DROP = enum.auto()
    PROMISE_IN_BOUNDS = enum.auto()

    @staticmethod
    def from_any(s):
        if isinstance(s, GatherScatterMode):
            return s
        if s == "clip":
            return GatherScatterMode.CLIP
        if s is None or s == "fill" or s == "drop":
            return GatherScatterMode.FILL_OR_DROP
        if s == "promise_in_bounds":
            return GatherScatterMode.PROMISE_IN_BOUNDS
        raise ValueError(f'Unknown gather mode "{s}"')


def gather_dnums_of_scatter(dnums):
    """The gather that reads what a scatter with ``dnums`` writes (its transpose's)."""
    return GatherDimensionNumbers(
        offset_dims=tuple(dnums.update_window_dims), collapsed_slice_dims=tuple(dnums.inserted_window_dims),
        start_index_map=tuple(dnums.scatter_dims_to_operand_dims),
        operand_batching_dims=tuple(dnums.operand_batching_dims),
        start_indices_batching_dims=tuple(dnums.scatter_indices_batching_dims))


def scatter_dnums_of_gather(dnums):
    """The scatter that writes where a gather with ``dnums`` reads (its transpose's)."""
    return ScatterDimensionNumbers(
        update_window_dims=tuple(dnums.offset_dims), inserted_window_dims=tuple(dnums.collapsed_slice_dims),
        scatter_dims_to_operand_dims=tuple(dnums.start_index_map),
        operand_batching_dims=tuple(dnums.operand_batching_dims),
        scatter_indices_batching_dims=tuple(dnums.start_indices_batching_dims))


def _tuple_fields(nt):
    return type(nt)(*(tuple(int(d) for d in f) for f in nt))


# ---------------------------------------------------------------------------------------
# the index arithmetic (shared with the scatters)
# ---------------------------------------------------------------------------------------

# NOTE [gathers and scatters as fancy indexing]
# A gather or scatter visits a *frame*: the gather's output, or the scatter's updates.
# Each frame dim is either a batch dim (one of the indices' batch dims, in order) or a
# window dim (one of the operand's window dims, in order). For each operand dim d the
# operand index read (or written) at a frame position is start[d] + offset[d], where
# start[d] comes from the indices (a batch-shaped array, reshaped so that its dims sit at
# the frame's batch positions), from the frame position itself on a batching dim (an
# iota at the paired batch position) or is 0, and offset[d] is an iota at the frame's
# window position of d (0 on collapsed / inserted dims). The operand dims' index arrays
# broadcast to the frame, so one fancy-indexing read is the whole gather and one
# ``ufunc.at`` the whole scatter: no loop over indices or windows. Indices are
# converted to int64 first, so narrow index dtypes never overflow the arithmetic.


def window_operand_dims(operand_rank, dropped, batching_dims):
    """The operand dims that carry a window (neither collapsed/inserted nor batching)."""
    skip = set(dropped) | set(batching_dims)
    return tuple(d for d in range(operand_rank) if d not in skip)


def frame_index_arrays(xp, operand_shape, indices, frame_rank, window_positions, window_sizes, start_map,
                       operand_batching_dims, indices_batching_dims, dropped, mode):
    """The operand index arrays of a gather/scatter (NOTE [gathers and scatters as fancy
    indexing]), one per operand dim, each broadcastable to the frame, and the in-bounds
    mask of the windows (batch-shaped, placed at the frame's batch positions; ``None``
    unless ``mode`` drops or fills). ``window_sizes[d]``: the window's size along operand
    dim ``d``; ``clip`` mode clamps the starts into ``[0, shape[d] - window_sizes[d]]``."""
    rank = len(operand_shape)
    indices = indices.astype(np.int64, copy=False)
    batch_shape = indices.shape[:-1]
    window_positions = tuple(window_positions)
    batch_positions = tuple(p for p in range(frame_rank) if p not in window_positions)
    placed = [1] * frame_rank
    for j, p in enumerate(batch_positions):
        placed[p] = batch_shape[j]

    def at_batch(a):
        return a.reshape(placed)

    starts = [None] * rank
    mask = None
    for k, d in enumerate(start_map):
        s = indices[..., k]
        hi = operand_shape[d] - window_sizes[d]
        if mode is GatherScatterMode.FILL_OR_DROP:
            ok = (s >= 0) & (s <= hi)
            mask = ok if mask is None else mask & ok
        starts[d] = xp.minimum(xp.maximum(s, 0), max(hi, 0))
    for od, bd in zip(operand_batching_dims, indices_batching_dims):
        starts[od] = xp.arange(batch_shape[bd], dtype=np.int64)
        shape = [1] * len(batch_shape)
        shape[bd] = batch_shape[bd]
        starts[od] = starts[od].reshape(shape)
    windows = window_operand_dims(rank, dropped, operand_batching_dims)
    arrays = []
    for d in range(rank):
        a = at_batch(xp.broadcast_to(starts[d], batch_shape)) if starts[d] is not None else None
        if d in windows:
            shape = [1] * frame_rank
            shape[window_positions[windows.index(d)]] = window_sizes[d]
            offset = xp.arange(window_sizes[d], dtype=np.int64).reshape(shape)
            a = offset if a is None else a + offset
        arrays.append(xp.zeros((1,) * frame_rank, np.int64) if a is None else a)
    return arrays, (None if mask is None else at_batch(mask))


def _check_dims(op, name, dims, rank, sort=False):
    if any(not 0 <= d < rank for d in dims):
        raise ShapeError(f"{op}: {name} {dims} must lie in [0, {rank})")
    if len(set(dims)) != len(dims):
        raise ShapeError(f"{op}: {name} {dims} has a repeated dim")
    if sort and list(dims) != sorted(dims):
        raise ShapeError(f"{op}: {name} {dims} must be sorted")


def check_index_structure(op, operand_shape, indices_shape, dropped, dropped_name, start_map, operand_batching,
                          indices_batching):
    """The checks the gather and the scatters share on the operand and indices dims."""
    rank = len(operand_shape)
    if len(indices_shape) < 1:
        raise ShapeError(f"{op}: indices must have at least one dim (the last holds the index vector), "
                         f"got shape {tuple(indices_shape)}")
    if indices_shape[-1] != len(start_map):
        raise ShapeError(f"{op}: the last dim of indices {tuple(indices_shape)} must equal the length of the "
                         f"start map {tuple(start_map)}")
    _check_dims(op, dropped_name, dropped, rank, sort=True)
    _check_dims(op, "the start map", start_map, rank)
    _check_dims(op, "operand_batching_dims", operand_batching, rank, sort=True)
    _check_dims(op, "the indices' batching dims", indices_batching, len(indices_shape) - 1)
    if len(operand_batching) != len(indices_batching):
        raise ShapeError(f"{op}: operand_batching_dims {tuple(operand_batching)} and the indices' batching dims "
                         f"{tuple(indices_batching)} must pair up")
    if set(dropped) & set(operand_batching) or set(start_map) & set(operand_batching):
        raise ShapeError(f"{op}: operand_batching_dims {tuple(operand_batching)} must be disjoint from "
                         f"{dropped_name} and the start map")
    for od, bd in zip(operand_batching, indices_batching):
        if operand_shape[od] != indices_shape[bd]:
            raise ShapeError(f"{op}: batching dims of unequal sizes: operand dim {od} ({operand_shape[od]}) "
                             f"and indices dim {bd} ({indices_shape[bd]})")


# ---------------------------------------------------------------------------------------
# gather
# ---------------------------------------------------------------------------------------


gather_p = Primitive("gather")


def default_fill_value(dtype):
    """JAX's fill of an out-of-bounds gather: NaN for inexact dtypes, the most negative
    value for signed integers, the largest for unsigned ones, True for booleans."""
    dtype = np.dtype(dtype)
    if kind_of(dtype) in "fc":
        return np.nan
    if kind_of(dtype) == "i":
        return int(np.iinfo(dtype).min)
    if kind_of(dtype) == "u":
        return int(np.iinfo(dtype).max)
    if dtype == np.bool_:
        return True
    raise TypeError(f"gather: no fill value for dtype {dtype}")


def as_indices(indices):
    """A non-traced index operand as an array (lists and scalars become NumPy arrays)."""
    if isinstance(indices, core.Tracer) or hasattr(indices, "dtype"):
        return indices
    return np.asarray(indices)


def gather(operand, start_indices, dimension_numbers, slice_sizes, *, unique_indices=False,
           indices_are_sorted=False, mode=None, fill_value=None):
    """XLA's Gather with JAX's signature (``jax.lax.gather``): windows of ``operand`` of
    size ``slice_sizes`` starting at ``start_indices`` (math in the module docstring).

    ``mode`` (:class:`GatherScatterMode` or a string; default ``promise_in_bounds``, which
    clamps) handles out-of-bounds starts; with ``"fill"``, windows that would leave the
    operand hold ``fill_value`` (default :func:`default_fill_value`).
    ``unique_indices`` and ``indices_are_sorted`` are hints (the transpose's scatter reads
    ``unique_indices``). Linear in ``operand``: the JVP gathers the tangent and the
    transpose is :func:`cuvmap.lax.scatter_add`."""
    dnums = dimension_numbers
    if not isinstance(dnums, GatherDimensionNumbers):
        raise TypeError(f"gather: dimension_numbers must be a GatherDimensionNumbers, got {type(dnums).__name__}")
    mode = GatherScatterMode.PROMISE_IN_BOUNDS if mode is None else GatherScatterMode.from_any(mode)
    if mode is GatherScatterMode.FILL_OR_DROP:
        fill_value = default_fill_value(core.dtype_of(operand)) if fill_value is None else fill_value
    else:
        fill_value = None
    return gather_p.bind(operand, as_indices(start_indices), dimension_numbers=_tuple_fields(dnums),
                         slice_sizes=tuple(int(s) for s in slice_sizes), unique_indices=bool(unique_indices),
                         indices_are_sorted=bool(indices_are_sorted), mode=mode, fill_value=fill_value)


def _gather_shape_rule(operand, indices, *, dimension_numbers, slice_sizes, unique_indices, indices_are_sorted,
                       mode, fill_value):
    d = dimension_numbers
    if kind_of(indices.dtype) not in "iu":
        raise ShapeError(f"gather: indices must be integers, got {indices.dtype}")
    check_index_structure("gather", operand.shape, indices.shape, d.collapsed_slice_dims, "collapsed_slice_dims",
                          d.start_index_map, d.operand_batching_dims, d.start_indices_batching_dims)
    if len(slice_sizes) != operand.ndim:
        raise ShapeError(f"gather: slice_sizes {slice_sizes} must have one entry per dim of the operand "
                         f"{operand.shape}")
    for i, (s, n) in enumerate(zip(slice_sizes, operand.shape)):
        if not 0 <= s <= n:
            raise ShapeError(f"gather: slice_sizes {slice_sizes} exceed the operand {operand.shape} in dim {i}")
    for dim in tuple(d.collapsed_slice_dims) + tuple(d.operand_batching_dims):
        if slice_sizes[dim] > 1:
            raise ShapeError(f"gather: slice_sizes {slice_sizes} must be 0 or 1 on collapsed and batching dim {dim}")
    windows = window_operand_dims(operand.ndim, d.collapsed_slice_dims, d.operand_batching_dims)
    batch_shape = tuple(indices.shape[:-1])
    out_rank = len(batch_shape) + len(d.offset_dims)
    _check_dims("gather", "offset_dims", d.offset_dims, out_rank, sort=True)
    if len(d.offset_dims) != len(windows):
        raise ShapeError(f"gather: offset_dims {d.offset_dims} must name one output dim per window dim "
                         f"{windows} of the operand {operand.shape}")
    out, bi, wi = [], 0, 0
    for p in range(out_rank):
        if p in d.offset_dims:
            out.append(slice_sizes[windows[wi]])
            wi += 1
        else:
            out.append(batch_shape[bi])
            bi += 1
    return ShapedArray(tuple(out), operand.dtype, operand.weak_type)


def _gather_impl(operand, indices, *, dimension_numbers, slice_sizes, unique_indices, indices_are_sorted, mode,
                 fill_value):
    d = dimension_numbers
    operand, indices = core.as_array(operand), core.as_array(indices)
    xp = backend.xp_of(operand, indices)
    out_aval = _gather_shape_rule(core.get_aval(operand), core.get_aval(indices), dimension_numbers=d,
                                  slice_sizes=slice_sizes, unique_indices=unique_indices,
                                  indices_are_sorted=indices_are_sorted, mode=mode, fill_value=fill_value)
    out_shape = out_aval.shape
    if 0 in out_shape or 0 in operand.shape:
        return xp.zeros(out_shape, operand.dtype)
    if xp is np and indices.ndim == 1 and not d.operand_batching_dims and 0 not in slice_sizes:
        return _gather_one_window(operand, indices, d.start_index_map, slice_sizes, mode, fill_value, out_shape)
    arrays, mask = frame_index_arrays(xp, operand.shape, xp.asarray(indices), len(out_shape), d.offset_dims,
                                      slice_sizes, d.start_index_map, d.operand_batching_dims,
                                      d.start_indices_batching_dims, d.collapsed_slice_dims, mode)
    out = operand[tuple(arrays)] if operand.ndim else operand
    if tuple(out.shape) != out_shape:
        out = xp.broadcast_to(out, out_shape)
    if mask is not None:
        out = xp.where(mask, out, xp.asarray(fill_value, dtype=operand.dtype))
    return xp.ascontiguousarray(out)


def one_window(operand_shape, indices, start_map, sizes, mode):
    """The basic slices of the one window that a vector of indices starts (NumPy: the
    indices are on the host), or None when ``mode`` drops or fills an out-of-bounds one:
    a dynamic_slice or dynamic_update_slice runs as a view, not as fancy indexing."""
    starts = [0] * len(operand_shape)
    for k, dim in enumerate(start_map):
        s, hi = int(indices[k]), operand_shape[dim] - sizes[dim]
        if mode is GatherScatterMode.FILL_OR_DROP and not 0 <= s <= hi:
            return None
        starts[dim] = min(max(s, 0), hi)
    return tuple(slice(s, s + n) for s, n in zip(starts, sizes))


def _gather_one_window(operand, indices, start_map, slice_sizes, mode, fill_value, out_shape):
    window = one_window(operand.shape, indices, start_map, slice_sizes, mode)
    if window is None:
        return np.full(out_shape, fill_value, operand.dtype)
    return np.array(operand[window].reshape(out_shape))


gather_p.impl = _gather_impl
gather_p.shape_rule = _gather_shape_rule


def _add_one(dims):
    return tuple(d + 1 for d in dims)


def _gather_batch(axis_size, vals, dims, *, dimension_numbers, slice_sizes, unique_indices, indices_are_sorted,
                  mode, fill_value):
    """JAX's ``_gather_batching_rule``: the vmap dim, moved to the front, becomes a window
    dim of full size (operand batched), a batch dim of the indices (indices batched) or a
    pair of batching dims (both): one gather serves every example."""
    operand, indices = vals
    d_op, d_idx = dims
    d = dimension_numbers
    params = dict(unique_indices=unique_indices, indices_are_sorted=indices_are_sorted, mode=mode,
                  fill_value=fill_value)
    if d_idx is not_mapped:
        operand = move_bdim(operand, d_op, 0)
        dnums = GatherDimensionNumbers(
            offset_dims=(0,) + _add_one(d.offset_dims), collapsed_slice_dims=_add_one(d.collapsed_slice_dims),
            start_index_map=_add_one(d.start_index_map), operand_batching_dims=_add_one(d.operand_batching_dims),
            start_indices_batching_dims=d.start_indices_batching_dims)
        return gather_p.bind(operand, indices, dimension_numbers=dnums,
                             slice_sizes=(operand.shape[0],) + slice_sizes, **params), 0
    indices = move_bdim(indices, d_idx, 0)
    if d_op is not_mapped:
        dnums = d._replace(offset_dims=_add_one(d.offset_dims),
                           start_indices_batching_dims=_add_one(d.start_indices_batching_dims))
        params.update(unique_indices=False, indices_are_sorted=False)
        return gather_p.bind(operand, indices, dimension_numbers=dnums, slice_sizes=slice_sizes, **params), 0
    operand = move_bdim(operand, d_op, 0)
    dnums = GatherDimensionNumbers(
        offset_dims=_add_one(d.offset_dims), collapsed_slice_dims=_add_one(d.collapsed_slice_dims),
        start_index_map=_add_one(d.start_index_map),
        operand_batching_dims=(0,) + _add_one(d.operand_batching_dims),
        start_indices_batching_dims=(0,) + _add_one(d.start_indices_batching_dims))
    size = 0 if operand.shape[0] == 0 else 1
    return gather_p.bind(operand, indices, dimension_numbers=dnums, slice_sizes=(size,) + slice_sizes,
                         **params), 0


def _gather_jvp(t, out, operand, indices, *, fill_value, **params):
    return gather_p.bind(t, indices, fill_value=None if fill_value is None else 0, **params)


def transpose_mode(mode, of):
    """The mode of a gather's or scatter's transpose: a gather clamps where the promise
    breaks, a scatter drops (GatherScatterMode), and the transpose does the same."""
    if mode is GatherScatterMode.PROMISE_IN_BOUNDS:
        return GatherScatterMode.CLIP if of == "gather" else GatherScatterMode.FILL_OR_DROP
    return mode


def zeros_of(like, shape, dtype):
    """Zeros of ``shape`` on ``like``'s backend, as a primitive's result (NOTE in
    :func:`cuvmap.transforms.jvp.zeros_like`)."""
    return broadcast_in_dim(core.full_like_concrete(like, 0, shape=(), dtype=dtype), tuple(shape), ())


batching.primitive_batchers[gather_p] = _gather_batch
jvp.defjvp(gather_p, _gather_jvp, None)
# gather's transpose, a scatter_add, is registered with the scatters in
# cuvmap/lax/slicing_scatter.py (NOTE [gather's transpose lives with the scatters])

