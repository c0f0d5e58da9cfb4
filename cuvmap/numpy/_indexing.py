"""Indexing: ``take``, ``take_along_axis`` and NumPy's ``x[index]`` on traced values
(basic slicing, integer arrays, booleans of concrete values), with bounds checked where
the indices have values (the ``check_index_bounds`` primitive)."""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy import _gather_modes
from cuvmap.numpy._common import _axis, shape
from cuvmap.numpy._shapes import broadcast_to, moveaxis, ravel, reshape
from cuvmap.core.bfloat16 import kind_of


def take(a, indices, axis=None, out=None, mode=None, unique_indices=False, indices_are_sorted=False,
         fill_value=None):
    """``jnp.take``: ``out[..., j..., ...] = a[..., indices[j...], ...]`` along ``axis``
    (``None``: of the flattened ``a``). Out-of-bounds indices follow ``mode`` (NOTE
    [gather modes] in cuvmap/numpy/_gather_modes.py): by default they raise IndexError
    (JAX fills them: pass ``mode='fill'`` or a ``fill_value``); ``'fill'``, ``'clip'``
    and ``'wrap'`` as JAX. ``unique_indices`` and ``indices_are_sorted`` are hints,
    accepted for JAX's signature."""
    if out is not None:
        raise NotImplementedError("take: out= is not supported (arrays are immutable)")
    mode = _gather_modes.resolve_mode("take", mode, fill_value, _gather_modes.TAKE_MODES)
    if axis is None:
        a, axis = ravel(a), 0
    else:
        axis = _axis(a, axis, "take")
    if not isinstance(indices, Tracer) and not hasattr(indices, "dtype"):
        indices = np.asarray(indices)
    if kind_of(core.dtype_of(indices)) not in "iu":
        return lax_indexing.take(a, indices, axis)  # whose shape rule refuses them, naming the transform
    n = shape(a)[axis]
    out_shape = shape(a)[:axis] + shape(indices) + shape(a)[axis + 1:]
    if n == 0:
        if builtins.all(shape(indices)):
            raise IndexError(f"take: cannot do a non-empty jnp.take() from the empty axis {axis} of shape {shape(a)}")
        return reshape(a, out_shape)  # both empty
    if mode == "raise":
        return lax_indexing.take(a, indices, axis)
    safe, valid = _gather_modes.in_bounds_indices(indices, n, mode, "take", axis, wrap_negative=(mode == "fill"))
    gathered = lax_indexing.take(a, safe, axis)
    if valid is not None:
        valid = lax_shape.reshape(valid, (1,) * axis + shape(indices) + (1,) * (len(shape(a)) - axis - 1))
    return _gather_modes.fill_out_of_bounds(gathered, valid, mode, fill_value, "take")


def take_along_axis(arr, indices, axis=-1, mode=None, fill_value=None, *, wrap_negative_indices=None):
    """``out[..., j, ...] = arr[..., indices[..., j, ...], ...]`` along ``axis`` (NumPy's
    semantics; ``indices`` broadcasts against ``arr`` on the other dims; ``axis=None``
    flattens ``arr`` first, for 1-d ``indices``). Out-of-bounds indices follow ``mode``
    (NOTE [gather modes] in cuvmap/numpy/_gather_modes.py): by default they raise
    IndexError (JAX fills them: pass ``mode='fill'`` or a ``fill_value``); ``'fill'``,
    ``'clip'``, ``'promise_in_bounds'`` and ``'one_hot'`` as JAX; negative indices count
    from the end unless ``wrap_negative_indices=False`` (default: except for
    ``'promise_in_bounds'``, as JAX). Implemented as one ``take`` on the flattened array
    with offset indices."""
    mode = _gather_modes.resolve_mode("take_along_axis", mode, fill_value, _gather_modes.TAKE_ALONG_AXIS_MODES)
    if wrap_negative_indices is None:
        wrap_negative_indices = mode != "promise_in_bounds"
    if not isinstance(indices, Tracer) and not hasattr(indices, "dtype"):
        indices = np.asarray(indices)
    if kind_of(core.dtype_of(indices)) not in "iu":
        raise TypeError(f"take_along_axis indices must be of integer type, got {core.dtype_of(indices)}")
    if axis is None:
        if len(shape(indices)) != 1:
            raise ShapeError(f"take_along_axis: with axis=None the indices must be 1-d, got shape {shape(indices)}")
        arr, axis = ravel(arr), 0
    axis = _axis(arr, axis, "take_along_axis")
    x_shape = shape(arr)
    idx_shape = shape(indices)
    if len(idx_shape) != len(x_shape):
        raise ShapeError(f"take_along_axis: indices of shape {idx_shape} must have the rank of {x_shape}")
    for i, (a, b) in enumerate(zip(x_shape, idx_shape)):
        if i != axis and a != b and a != 1 and b != 1:
            raise ShapeError(
                f"take_along_axis: indices of shape {idx_shape} do not broadcast against the array of shape "
                f"{x_shape} outside axis {axis} (dim {i}: {b} vs {a})"
            )
    other = tuple(
        builtins.max(a, b) if i != axis else None for i, (a, b) in enumerate(zip(x_shape, idx_shape))
    )
    x_target = tuple(x_shape[axis] if i == axis else other[i] for i in range(len(x_shape)))
    idx_target = tuple(idx_shape[axis] if i == axis else other[i] for i in range(len(x_shape)))
    arr = broadcast_to(arr, x_target)
    indices = broadcast_to(lax_indexing.as_index_dtype(indices), idx_target)
    x_last = moveaxis(arr, axis, -1)
    idx_last = moveaxis(indices, axis, -1)
    n = x_target[axis]
    rows = int(np.prod(shape(x_last)[:-1], dtype=np.int64))
    k = idx_target[axis]
    flat_x = reshape(x_last, (rows * n,))
    idx2 = reshape(idx_last, (rows, k))
    if n == 0:  # nothing to read: zeros (as JAX), padded onto the empty axis
        return lax_shape.pad(arr, tuple((0, k if i == axis else 0) for i in range(len(x_target))), 0)
    idx2, valid = _gather_modes.in_bounds_indices(idx2, n, mode, "take_along_axis", axis,
                                                  wrap_negative=wrap_negative_indices)
    offsets = reshape(ew.mul(lax_indexing.iota(rows, np.int64, like=indices), n), (rows, 1))
    flat = lax_indexing.take(flat_x, ew.add(idx2, offsets), 0)
    flat = _gather_modes.fill_out_of_bounds(flat, valid, mode, fill_value, "take_along_axis")
    out = reshape(flat, shape(idx_last))
    return moveaxis(out, -1, axis)


def _is_int_scalar(i):
    return isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))


def _is_index_array(i):
    return isinstance(i, (Tracer, np.ndarray, list)) or backend.is_cupy_array(i)


def getitem(x, index):
    """``x[index]`` with NumPy semantics for: ints, slices (any step), ``None``,
    ``Ellipsis`` and integer arrays (several broadcast together, placed as NumPy places
    advanced indices). Boolean masks are not supported (their result shape depends on
    the data)."""
    if not isinstance(index, tuple):
        index = (index,)
    x_shape = shape(x)
    n = len(x_shape)
    # a list or a tuple inside the index is an integer array (x[(0, 1), (2, 2)] is x[[0, 1], [2, 2]], as NumPy)
    index = [np.asarray(i) if isinstance(i, (list, tuple)) else i for i in index]
    for i in index:
        dt = getattr(i, "dtype", None)
        if (dt is not None and np.dtype(dt) == np.bool_) or isinstance(i, bool):
            raise IndexError("boolean mask indexing is not supported on traced values (the result shape would depend on the data); use cuvmap.numpy.where")
        if dt is not None and kind_of(np.dtype(dt)) not in "iu":
            raise IndexError(f"arrays used as indices must be integers, got {np.dtype(dt)}")
        if not (i is None or i is Ellipsis or isinstance(i, builtins.slice) or _is_int_scalar(i) or _is_index_array(i)):
            raise IndexError(f"unsupported index {i!r} of type {type(i).__name__}")
    n_real = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > n:
        raise IndexError(f"too many indices ({n_real}) for an array of shape {x_shape}")
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    if Ellipsis in [i for i in index if not _is_index_array(i)]:
        pos = next(k for k, i in enumerate(index) if i is Ellipsis)
        index = index[:pos] + [builtins.slice(None)] * (n - n_real) + index[pos + 1:]
    else:
        index = index + [builtins.slice(None)] * (n - n_real)

    has_array = builtins.any(_is_index_array(i) for i in index)
    # basic slicing of every dim indexed by a slice or (without arrays) an int
    slices = []
    int_dims = []
    new_axes = []
    advanced = []  # (dim, index) for arrays and, with arrays present, ints
    dim = 0
    out_pos = 0
    for i in index:
        if i is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        size_d = x_shape[dim]
        if isinstance(i, builtins.slice):
            slices.append(lax_indexing.normalize_slice(i, size_d))
            out_pos += 1
        elif _is_int_scalar(i):
            if not -size_d <= i < size_d:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size_d}")
            if has_array:
                slices.append((0, size_d, 1))
                advanced.append((dim, int(i) % size_d))
            else:
                slices.append((int(i) % size_d, int(i) % size_d + 1, 1))
                int_dims.append(dim)
        else:
            slices.append((0, size_d, 1))
            advanced.append((dim, i))
            out_pos += 1
        dim += 1
    if has_array and new_axes:
        raise IndexError("combining None (newaxis) with integer-array indexing is not supported; index in two steps")
    if builtins.any(s != (0, x_shape[d], 1) for d, s in enumerate(slices)):
        x = lax_indexing.slice(x, slices)
    if int_dims:
        x = lax_shape.squeeze(x, tuple(int_dims))
    if new_axes:
        x = lax_shape.expand_dims(x, tuple(new_axes))
    if has_array:
        x = _advanced_index(x, advanced)
    return x


def _advanced_index(x, advanced):
    """Integer-array indexing of the dims in ``advanced``, NumPy placement: in place when
    the indexed dims are adjacent, first otherwise. The indexed dims are merged into one
    and gathered with one ``take`` of the row-major linear index."""
    dims = [d for d, _ in advanced]
    x_shape = shape(x)
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if len(advanced) == 1:
        d, idx = advanced[0]
        return lax_indexing.take(x, idx if not isinstance(idx, int) else np.asarray(idx), d)
    if not adjacent:
        rest = [i for i in range(len(x_shape)) if i not in dims]
        x = lax_shape.transpose(x, tuple(dims + rest))
        x_shape = shape(x)
        dims = list(range(len(dims)))
    p = dims[0]
    sizes = [x_shape[d] for d in dims]
    merged = int(np.prod(sizes, dtype=np.int64))
    x = lax_shape.reshape(x, x_shape[:p] + (merged,) + x_shape[p + len(dims):])
    linear = None
    stride = 1
    for (dim, idx), n_d in reversed(list(zip(advanced, sizes))):
        if isinstance(idx, int):
            term = idx * stride
        else:
            idx = lax_indexing.as_index_dtype(lax_indexing.check_index_bounds(idx, n_d, "indexing", dim))
            idx = ew.select(ew.lt(idx, 0), ew.add(idx, n_d), idx)
            term = ew.mul(idx, stride) if stride != 1 else idx
        linear = term if linear is None else ew.add(linear, term)
        stride *= n_d
    if isinstance(linear, int):
        linear = np.asarray(linear)
    return lax_indexing.take(x, linear, p)
