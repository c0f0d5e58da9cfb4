"""Writing into copies and packing bits, as ``jax.numpy`` names them: ``place``, ``put``
and ``fill_diagonal`` (``inplace=False``, as JAX requires: arrays are never modified),
``mask_indices``, ``packbits`` and ``unpackbits``. Each is a composite of ``select``,
``take``, ``scatter``, the shifts and the reductions of :mod:`cuvmap.lax`, so it
differentiates (in the written array and the written values), batches and stages as
those do."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import bitwise as lax_bitwise
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import slicing
from cuvmap.lax.cumulative import cumsum
from cuvmap.numpy._common import _axis, ndim, shape, size
from cuvmap.numpy._creation import asarray, ones
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._searching import nonzero
from cuvmap.numpy._shapes import ravel, reshape, swapaxes
from cuvmap.numpy._stacking import tile
from cuvmap.core.bfloat16 import kind_of

_FLAT = slicing.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                        scatter_dims_to_operand_dims=(0,))


def _operand(x):
    return x if isinstance(x, Tracer) else asarray(x)


def _refuse_inplace(name, inplace):
    if inplace:
        raise ValueError(f"{name}: cuvmap arrays are immutable (as JAX's), so {name} cannot modify its input; pass "
                         "inplace=False to get an updated copy")


def _tile_to_size(v, n):
    """The 1-d ``v`` repeated (and cut) to length ``n``."""
    if shape(v)[0] < n:
        v = tile(v, -(-n // shape(v)[0]))
    return lax_indexing.slice_in_dim(v, 0, n, 0) if shape(v)[0] > n else v


def place(arr, mask, vals, *, inplace=True):
    """``jnp.place(arr, mask, vals, inplace=False)``: a copy of ``arr`` whose ``k``-th
    position where ``mask`` holds (in row-major order) is ``vals.ravel()[k mod len(vals)]``
    (``vals`` repeats as often as needed). The ``k`` of each position is the running count
    of ``mask``, so the result is one gather of ``vals`` and one select: differentiable in
    ``arr`` and ``vals``, and ``mask`` may be traced."""
    _refuse_inplace("place", inplace)
    arr, mask = _operand(arr), _operand(mask)
    vals = astype(ravel(_operand(vals)), core.dtype_of(arr))
    if size(arr) != size(mask):
        raise ShapeError(f"place: arr of shape {shape(arr)} and mask of shape {shape(mask)} must have the same size")
    if size(vals) == 0:
        raise ValueError("place: cannot place values from an empty array vals")
    if size(arr) == 0:
        return arr
    flat_mask = ravel(mask)
    if core.dtype_of(flat_mask) != np.bool_:
        flat_mask = ew.ne(flat_mask, 0)
    count = ew.sub(cumsum(astype(flat_mask, np.int64), 0), 1)
    k = ew.max(count, 0)
    chosen = lax_indexing.take(_tile_to_size(vals, size(arr)), k, 0)
    return reshape(ew.select(flat_mask, chosen, ravel(arr)), shape(arr))


def put(a, ind, v, mode=None, *, inplace=True):
    """``jnp.put(a, ind, v, mode=None, inplace=False)``: a copy of ``a`` with
    ``ravel(a)[ind[k]] = v[k]`` (``ind`` and ``v`` flattened, ``v`` repeated to the length
    of ``ind``; where an index repeats, the last ``k`` wins). ``mode``: ``None`` (JAX's
    default: negative indices count from the end and out-of-range ones are dropped),
    ``'clip'`` (to ``[0, size - 1]``) or ``'wrap'`` (modulo ``size``); NumPy's
    ``'raise'`` is not supported, as in JAX. One scatter: differentiable in ``a`` and
    ``v``."""
    _refuse_inplace("put", inplace)
    a, ind = _operand(a), _operand(ind)
    if kind_of(core.dtype_of(ind)) not in "iu":
        raise TypeError(f"put: the indices ind must be integers, got dtype {core.dtype_of(ind)}")
    ind = astype(ravel(ind), np.int64)
    v = astype(ravel(_operand(v)), core.dtype_of(a))
    n = size(a)
    if n == 0 or size(ind) == 0 or size(v) == 0:
        return a
    v = _tile_to_size(v, size(ind))
    if mode is None:
        ind = ew.select(ew.lt(ind, 0), ew.add(ind, n), ind)
        scatter_mode = "drop"
    elif mode == "clip":
        ind = ew.max(ew.min(ind, n - 1), 0)
        scatter_mode = "promise_in_bounds"
    elif mode == "wrap":
        ind = ew.remainder(ind, n)
        scatter_mode = "promise_in_bounds"
    elif mode == "raise":
        raise NotImplementedError("put: mode='raise' is not supported (as in JAX); use None, 'clip' or 'wrap'")
    else:
        raise ValueError(f"put: mode={mode!r} is not one of None, 'clip', 'wrap'")
    out = slicing.scatter(ravel(a), lax_shape.expand_dims(ind, (1,)), v, _FLAT, mode=scatter_mode)
    return reshape(out, shape(a))


def fill_diagonal(a, val, wrap=False, *, inplace=True):
    """``jnp.fill_diagonal(a, val, inplace=False)``: a copy of ``a`` (2-d, or with every
    dim of one length) with its main diagonal ``a[i, i, ..., i]`` set to ``val`` (a scalar,
    or an array whose flattened entries repeat along the diagonal). ``wrap=True`` is not
    supported (as in JAX). One scatter of flat positions: differentiable in ``a`` (zero
    on the diagonal) and ``val``."""
    _refuse_inplace("fill_diagonal", inplace)
    if wrap:
        raise NotImplementedError("fill_diagonal: wrap=True is not supported (as in JAX); use wrap=False")
    a, val = _operand(a), _operand(val)
    s = shape(a)
    if len(s) < 2:
        raise ShapeError(f"fill_diagonal: the array must have at least 2 dims, got shape {s}")
    if len(s) > 2 and len(set(s)) != 1:
        raise ShapeError(f"fill_diagonal: every dim of an array with more than 2 dims must have one length, got "
                         f"shape {s}")
    n = min(s)
    val = astype(val, core.dtype_of(a))
    if n == 0:
        return a
    values = lax_shape.broadcast_in_dim(val, (n,), ()) if ndim(val) == 0 else _tile_to_size(ravel(val), n)
    step = sum(int(np.prod(s[k + 1:], dtype=np.int64)) for k in range(len(s)))  # one step along every dim
    like = a if isinstance(a, Tracer) or not isinstance(values, Tracer) else values
    positions = lax_shape.reshape(ew.mul(lax_indexing.iota(n, np.int64, like=like), step), (n, 1))
    out = slicing.scatter(ravel(a), positions, values, _FLAT, unique_indices=True, mode="promise_in_bounds")
    return reshape(out, s)


def mask_indices(n, mask_func, k=0, *, size=None):
    """``jnp.mask_indices``: the ``(rows, cols)`` where ``mask_func(ones((n, n)), k)`` is
    nonzero (``mask_func`` is e.g. ``triu`` or ``tril``), in row-major order; ``size``
    (static) pads or cuts them to that length, as :func:`nonzero`'s."""
    rows, cols = nonzero(mask_func(ones((int(n), int(n))), k), size=size)
    return rows, cols


def _bit_axis(arr, axis, name):
    if axis is None:
        return ravel(arr), 0
    return arr, _axis(arr, axis, name)


def packbits(a, axis=None, bitorder="big"):
    """``jnp.packbits``: the truth values of ``a`` (integer or boolean) packed eight to a
    ``uint8`` along ``axis`` (the flattened ``a`` for ``None``), zero-padded to a multiple
    of 8: byte ``j`` is ``Σ_b (a[8j + b] != 0) · 2^(7 - b)`` for ``bitorder='big'``,
    ``2^b`` for ``'little'``. Integer-valued: no derivative."""
    arr = _operand(a)
    if kind_of(core.dtype_of(arr)) not in "iub":
        raise TypeError(f"packbits: expected an integer or boolean array, got dtype {core.dtype_of(arr)}")
    if bitorder not in ("big", "little"):
        raise ValueError(f"packbits: bitorder must be 'big' or 'little', got {bitorder!r}")
    arr, axis = _bit_axis(astype(ew.ne(arr, 0), np.uint8), axis, "packbits")
    arr = swapaxes(arr, axis, -1)
    remainder = shape(arr)[-1] % 8
    if remainder:
        arr = lax_shape.pad(arr, ((0, 0),) * (ndim(arr) - 1) + ((0, 8 - remainder),), np.uint8(0))
    arr = reshape(arr, shape(arr)[:-1] + (shape(arr)[-1] // 8, 8))
    shifts = np.arange(8, dtype=np.uint8)
    if bitorder == "big":
        shifts = shifts[::-1].copy()
    packed = lax_reduction.reduce_sum(lax_bitwise.shift_left(arr, shifts), (ndim(arr) - 1,))
    return swapaxes(astype(packed, np.uint8), axis, -1)


def unpackbits(a, axis=None, count=None, bitorder="big"):
    """``jnp.unpackbits``: each ``uint8`` of ``a`` as its eight bits (``0``/``1``, ``uint8``)
    along ``axis`` (the flattened ``a`` for ``None``), most significant first for
    ``bitorder='big'``; ``count`` keeps the first ``count`` bits (padding with zeros past
    the end; a negative ``count`` drops bits from the end). Integer-valued: no derivative."""
    arr = _operand(a)
    if core.dtype_of(arr) != np.uint8:
        raise TypeError(f"unpackbits: expected an array of uint8, got dtype {core.dtype_of(arr)}")
    if bitorder not in ("big", "little"):
        raise ValueError(f"unpackbits: bitorder must be 'big' or 'little', got {bitorder!r}")
    arr, axis = _bit_axis(arr, axis, "unpackbits")
    arr = swapaxes(arr, axis, -1)
    shifts = np.arange(8, dtype=np.uint8)
    if bitorder == "big":
        shifts = shifts[::-1].copy()
    bits = lax_bitwise.bitwise_and(lax_bitwise.shift_right_logical(lax_shape.expand_dims(arr, (ndim(arr),)), shifts),
                                   np.uint8(1))
    bits = reshape(bits, shape(arr)[:-1] + (shape(arr)[-1] * 8,))
    if count is not None:
        total = shape(bits)[-1]
        count = int(count)
        keep = count if count >= 0 else max(total + count, 0)
        if keep > total:
            bits = lax_shape.pad(bits, ((0, 0),) * (ndim(bits) - 1) + ((0, keep - total),), np.uint8(0))
        else:
            bits = lax_indexing.slice_in_dim(bits, 0, keep, ndim(bits) - 1)
    return swapaxes(bits, axis, -1)
