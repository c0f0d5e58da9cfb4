"""Rearranging arrays, as ``jax.numpy`` names them: ``rot90``, ``rollaxis``,
``apply_over_axes``, ``block``, ``diagflat``, ``resize``,
``unstack``, ``vsplit``, ``hsplit``, ``dsplit``, ``ix_``, ``trim_zeros``, ``insert`` and
the index tricks ``s_`` and ``index_exp``. Each result is a composite of ``transpose``,
``slice``, ``reshape``, ``broadcast_in_dim``, ``concatenate``, ``select`` and ``take``
(the primitives of :mod:`cuvmap.lax`), so it differentiates, batches and stages as those
do. Sizes, axes and counts are static (Python ints), as in JAX."""
import builtins
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ConcretizationError, ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import _axis, _holds_tracer, ndim, shape, size
from cuvmap.numpy._creation import asarray, zeros_like
from cuvmap.numpy._elementwise import astype, logical_and, logical_or
from cuvmap.numpy._shapes import (
    _split, concatenate, expand_dims, flip, moveaxis, ravel, reshape, transpose,
)
from cuvmap.numpy._stacking import tile
from cuvmap.core.bfloat16 import kind_of

s_ = np.s_
index_exp = np.index_exp


def _count_true(mask, axis):
    """The number of true entries of ``mask`` along ``axis`` (int64)."""
    return lax_reduction.reduce_sum(astype(mask, np.int64), (axis,))


def _static_int(value, name, what):
    """``value`` as a Python int; a traced value raises :class:`ConcretizationError`."""
    if isinstance(value, Tracer):
        raise ConcretizationError(f"{name}: {what} must be a static int, got a traced value")
    return int(value)


# ---------------------------------------------------------------------------------------
# Rotating and moving axes
# ---------------------------------------------------------------------------------------


def rot90(m, k=1, axes=(0, 1)):
    """``jnp.rot90``: ``m`` rotated by ``k`` quarter turns in the plane of ``axes``, from
    the first axis towards the second: one turn is ``flip`` along ``axes[1]`` then a swap
    of the two axes (``rot90(m)[i, j] = m[j, n - 1 - i]`` for a square ``m`` of side ``n``);
    ``k`` counts modulo 4 and may be negative."""
    m = asarray(m)
    if ndim(m) < 2:
        raise ShapeError(f"rot90 requires its first argument to have ndim at least two, but got first argument of "
                         f"shape {shape(m)}, which has ndim {ndim(m)}")
    if len(axes) != 2:
        raise ValueError(f"rot90: axes must be two axes, got {axes!r}")
    ax1, ax2 = _axis(m, axes[0], "rot90"), _axis(m, axes[1], "rot90")
    if ax1 == ax2:
        raise ValueError(f"rot90: the axes must be different, got {axes!r} for shape {shape(m)}")
    k = _static_int(k, "rot90", "k") % 4
    if k == 0:
        return m
    if k == 2:
        return flip(flip(m, ax1), ax2)
    perm = list(range(ndim(m)))
    perm[ax1], perm[ax2] = perm[ax2], perm[ax1]
    if k == 1:
        return transpose(flip(m, ax2), perm)
    return flip(transpose(m, perm), ax2)


def rollaxis(a, axis, start=0):
    """``jnp.rollaxis``: ``a`` with dim ``axis`` moved to sit before dim ``start`` (the
    older form of :func:`moveaxis`; ``start`` may be ``ndim``, the end)."""
    a = asarray(a)
    n = ndim(a)
    axis = _axis(a, _static_int(axis, "rollaxis", "axis"), "rollaxis")
    start = _static_int(start, "rollaxis", "start")
    if not -n <= start <= n:
        raise ShapeError(f"rollaxis: start={start} must satisfy {-n} <= start <= {n} (shape {shape(a)})")
    if start < 0:
        start += n
    if start > axis:
        start -= 1
    return moveaxis(a, axis, start)


def apply_over_axes(func, a, axes):
    """``jnp.apply_over_axes``: ``func(a, axis)`` applied for each of ``axes`` in turn, each
    time to the previous result; a result with one dim fewer gets it back as a dim of
    size 1 (so ``apply_over_axes(sum, a, (0, 2))`` is ``sum(a, (0, 2), keepdims=True)``)."""
    a = asarray(a)
    for axis in np.atleast_1d(axes).tolist():
        b = func(a, axis)
        if ndim(b) == ndim(a):
            a = b
        elif ndim(b) == ndim(a) - 1:
            a = expand_dims(b, axis)
        else:
            raise ShapeError(f"apply_over_axes: func returned shape {shape(b)} for an operand of shape {shape(a)} "
                             f"and axis {axis}; it must keep the rank or drop one dim")
    return a


# ---------------------------------------------------------------------------------------
# Joining and splitting
# ---------------------------------------------------------------------------------------


def _atleast_nd(x, n):
    return reshape(x, (1,) * (n - ndim(x)) + shape(x)) if ndim(x) < n else x


def _block(xs):
    """``(array, depth)`` of a nested list: the innermost lists join along the last axis,
    the next ones along the one before, ... (every operand raised to the common rank)."""
    if isinstance(xs, tuple):
        raise TypeError(f"block: nested sequences must be lists, got a tuple {xs!r}")
    if isinstance(xs, list):
        if not xs:
            raise ValueError("block: an empty list is not allowed")
        parts = [_block(x) for x in xs]
        depths = {d for _, d in parts}
        if len(depths) != 1:
            raise ValueError(f"block: the lists are nested to different depths {sorted(depths)}")
        depth = depths.pop()
        rank = builtins.max(depth, builtins.max(ndim(x) for x, _ in parts))
        return concatenate([_atleast_nd(x, rank) for x, _ in parts], axis=-depth), depth + 1
    return asarray(xs), 1


def block(arrays):
    """``jnp.block``: one array assembled from nested lists of blocks: the innermost lists
    join along the last axis, the lists around them along the one before, and so on (each
    block first raised to the common rank with leading dims of size 1)."""
    return _block(arrays)[0]




def unstack(x, /, *, axis=0):
    """``jnp.unstack``: the slices of ``x`` along ``axis``, as a tuple (the inverse of
    :func:`stack`)."""
    x = asarray(x)
    if ndim(x) == 0:
        raise ShapeError("unstack: the array must have at least 1 dim, got a 0-d array")
    axis = _axis(x, _static_int(axis, "unstack", "axis"), "unstack")
    return tuple(lax_shape.squeeze(lax_indexing.slice_in_dim(x, i, i + 1, axis), (axis,))
                 for i in range(shape(x)[axis]))


def vsplit(ary, indices_or_sections):
    """``jnp.vsplit``: :func:`split` along axis 0 of an array of at least 2 dims."""
    ary = asarray(ary)
    if ndim(ary) < 2:
        raise ShapeError(f"vsplit: the array must have at least 2 dims, got shape {shape(ary)}")
    return _split("vsplit", ary, indices_or_sections, 0, equal=True)


def hsplit(ary, indices_or_sections):
    """``jnp.hsplit``: :func:`split` along axis 1 (axis 0 of a 1-d array)."""
    ary = asarray(ary)
    if ndim(ary) == 0:
        raise ShapeError("hsplit: the array must have at least 1 dim, got a 0-d array")
    return _split("hsplit", ary, indices_or_sections, 1 if ndim(ary) > 1 else 0, equal=True)


def dsplit(ary, indices_or_sections):
    """``jnp.dsplit``: :func:`split` along axis 2 of an array of at least 3 dims."""
    ary = asarray(ary)
    if ndim(ary) < 3:
        raise ShapeError(f"dsplit: the array must have at least 3 dims, got shape {shape(ary)}")
    return _split("dsplit", ary, indices_or_sections, 2, equal=True)


# ---------------------------------------------------------------------------------------
# Building from a vector; resizing
# ---------------------------------------------------------------------------------------


def diagflat(v, k=0):
    """``jnp.diagflat``: the square matrix of side ``len(ravel(v)) + |k|`` with the
    flattened ``v`` on diagonal ``k`` (above the main one for ``k > 0``) and zeros
    elsewhere."""
    v = ravel(asarray(v))
    k = _static_int(k, "diagflat", "k")
    n = size(v) + builtins.abs(k)
    zero = False if core.dtype_of(v) == np.bool_ else 0
    padded = lax_shape.pad(v, ((0, builtins.abs(k)),), zero)
    # row i holds v[i] (k >= 0: at column i + k), or column j holds v[j] (k < 0: at row j - k)
    spread = lax_shape.broadcast_in_dim(padded, (n, n), (0,) if k >= 0 else (1,))
    mask = backend.xp_of(v).eye(n, n, k, dtype=bool)
    return ew.select(mask, spread, zero)


def resize(a, new_shape):
    """``jnp.resize``: an array of ``new_shape`` filled with the entries of ``a`` in
    row-major order, repeated as often as needed (zeros when ``a`` is empty). NumPy's
    function; the method ``ndarray.resize`` pads with zeros instead."""
    a = asarray(a)
    new_shape = (new_shape,) if np.ndim(new_shape) == 0 else tuple(new_shape)
    new_shape = tuple(_static_int(d, "resize", "new_shape") for d in new_shape)
    if builtins.any(d < 0 for d in new_shape):
        raise ValueError(f"resize: all entries of new_shape must be non-negative, got {new_shape}")
    flat = ravel(a)
    new_size = math.prod(new_shape)
    if size(flat) == 0 or new_size == 0:
        return zeros_like(flat, shape=new_shape)
    repeats = -(-new_size // size(flat))
    flat = tile(flat, repeats) if repeats > 1 else flat
    return reshape(lax_indexing.slice_in_dim(flat, 0, new_size, 0), new_shape)


def ix_(*args):
    """``jnp.ix_``: an open mesh of the 1-d index arrays ``args``: the ``i``-th comes back
    with shape ``(1, ..., len(args[i]), ..., 1)`` (its entries along dim ``i``), so that
    ``x[ix_(rows, cols)]`` is the cross product of the rows and the columns. Boolean
    arrays are refused (as in JAX)."""
    out = []
    n = len(args)
    for i, a in enumerate(args):
        a = asarray(a)
        if ndim(a) != 1:
            raise ShapeError(f"ix_: the arguments must be 1-d, argument {i} has shape {shape(a)}")
        if core.dtype_of(a) == np.bool_:
            raise NotImplementedError("ix_: boolean arguments are not supported (as in JAX); use nonzero first")
        target = [1] * n
        target[i] = shape(a)[0]
        if shape(a)[0] == 0:
            a = astype(a, np.intp)  # NumPy's index type for an empty argument
        out.append(lax_shape.broadcast_in_dim(a, tuple(target), (i,)))
    return tuple(out)


# ---------------------------------------------------------------------------------------
# trim_zeros (concrete values) and insert
# ---------------------------------------------------------------------------------------


def trim_zeros(filt, trim="fb", axis=None):
    """``jnp.trim_zeros``: ``filt`` without its leading (``'f'`` in ``trim``) and trailing
    (``'b'``) zeros along each of ``axis`` (every axis for ``None``): an index along an
    axis is trimmed when the slice at it is all zeros. The result's length depends on the
    values, so ``filt`` must be concrete (a traced value raises
    :class:`ConcretizationError`, as in JAX); the result is a slice of ``filt``."""
    if isinstance(filt, Tracer):
        raise ConcretizationError("trim_zeros: the length of the result depends on the values of filt, which must "
                                  "be concrete (not traced)")
    filt = asarray(filt)
    if ndim(filt) == 0:
        return filt  # no axis to trim (NumPy 2.2's answer)
    axes = range(ndim(filt)) if axis is None else [_axis(filt, a, "trim_zeros") for a in np.atleast_1d(axis)]
    trim = trim.lower()
    front, back = "f" in trim, "b" in trim
    host = np.asarray(filt.get() if backend.is_cupy_array(filt) else filt) != 0
    bounds = [(0, n, 1) for n in shape(filt)]
    for ax in set(axes):
        other = tuple(i for i in range(ndim(filt)) if i != ax)
        nonzero = np.flatnonzero(host.any(axis=other)) if other else np.flatnonzero(host)
        if not nonzero.size:
            if front or back:
                bounds[ax] = (0, 0, 1)
            continue
        lo = int(nonzero[0]) if front else 0
        hi = int(nonzero[-1]) + 1 if back else shape(filt)[ax]
        bounds[ax] = (lo, hi, 1)
    return lax_indexing.slice(filt, bounds)


def _insert_indices(obj, n):
    """``obj`` of :func:`insert` as an int array (a slice, a scalar or a 1-d array) and
    whether it was a scalar."""
    if isinstance(obj, builtins.slice):
        return np.arange(*obj.indices(n)), False
    if isinstance(obj, Tracer):
        idx = obj
    else:
        idx = asarray(obj)
        if size(idx) == 0 and kind_of(core.dtype_of(idx)) not in "iu":
            idx = astype(idx, np.int64)
    if ndim(idx) > 1:
        raise ShapeError(f"insert: obj must be a slice, a scalar or a 1-d array, got shape {shape(idx)}")
    if kind_of(core.dtype_of(idx)) not in "iu":
        raise TypeError(f"insert: the indices must be integers, got dtype {core.dtype_of(idx)}")
    return idx, ndim(idx) == 0


def insert(arr, obj, values, axis=None):
    """``jnp.insert``: ``arr`` with ``values`` inserted along ``axis`` (the flattened
    ``arr`` for ``None``) before the indices ``obj`` (a slice, an int or a 1-d int array,
    traced or not; negative ones count from the end, and out-of-range ones are clipped to
    ``[0, n]``, as in JAX). ``values`` are cast to ``arr``'s dtype and broadcast to the
    inserted block. Values inserted at the same index keep their order.

    The result is one gather from ``concatenate([arr, values], axis)``: original entry
    ``i`` lands at ``i + #{j : index_j <= i}`` and inserted value ``j`` at ``index_j +
    rank_j`` (its place among the sorted indices); the gather reads the inverse of that
    permutation, so ``insert`` differentiates in ``arr`` and ``values``."""
    a = asarray(arr)
    if axis is None:
        a = ravel(a)
        axis = 0
    axis = _axis(a, _static_int(axis, "insert", "axis"), "insert")
    n = shape(a)[axis]
    indices, scalar_obj = _insert_indices(obj, n)
    if _holds_tracer(values):
        values = astype(values, core.dtype_of(a))
    else:
        values = astype(asarray(values), core.dtype_of(a))
    values = _atleast_nd(values, ndim(a))
    if size(indices) == 1:
        index = reshape(indices, ())
        if scalar_obj:
            values = moveaxis(values, 0, axis)
        indices = lax_shape.broadcast_in_dim(index, (shape(values)[axis],), ())
    try:
        n_insert = np.broadcast_shapes(tuple(shape(indices)), (shape(values)[axis],))[0]
    except ValueError:
        raise ShapeError(f"insert: {shape(indices)[0]} indices for values of length {shape(values)[axis]} "
                         f"along axis {axis}") from None
    block_shape = tuple(n_insert if d == axis else s for d, s in enumerate(shape(a)))
    try:
        values = lax_shape.broadcast_to(values, block_shape)
    except ShapeError:
        raise ShapeError(f"insert: values of shape {shape(values)} do not broadcast to the inserted block "
                         f"{block_shape}") from None
    indices = lax_shape.broadcast_to(indices, (n_insert,))
    indices = astype(indices, np.int64)
    indices = ew.select(ew.lt(indices, 0), ew.add(indices, n), indices)
    indices = ew.max(ew.min(indices, n), 0)
    like = a if isinstance(a, Tracer) or not isinstance(indices, Tracer) else indices
    own = lax_indexing.iota(n, np.int64, like=like)
    order = lax_indexing.iota(n_insert, np.int64, like=like)
    # original i moves by the inserted indices <= i; inserted j sits after the equal ones before it
    shift = _count_true(ew.le(lax_shape.expand_dims(indices, (0,)), lax_shape.expand_dims(own, (1,))), 1)
    earlier = logical_or(
        ew.lt(lax_shape.expand_dims(indices, (0,)), lax_shape.expand_dims(indices, (1,))),
        logical_and(ew.eq(lax_shape.expand_dims(indices, (0,)), lax_shape.expand_dims(indices, (1,))),
                       ew.lt(lax_shape.expand_dims(order, (0,)), lax_shape.expand_dims(order, (1,)))))
    rank = _count_true(earlier, 1)
    destination = lax_shape.concatenate([ew.add(own, shift), ew.add(indices, rank)], 0)
    source = lax_sorting.argsort(destination, 0)  # the inverse permutation
    joined = lax_shape.concatenate([a, values], axis)
    return lax_indexing.take(joined, source, axis)
