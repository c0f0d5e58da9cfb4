"""Searching, selecting by condition and scattering along an axis, as ``jax.numpy``
names them: ``searchsorted``, ``digitize``, ``interp``, ``nonzero``, ``flatnonzero``,
``argwhere``, ``where`` (one argument too), ``compress``, ``extract``, ``unique`` and
``put_along_axis``.

The functions whose result length depends on the data (``nonzero``, ``unique``,
``compress``, ...) take JAX's static ``size=`` (and ``fill_value=``) under a transform:
the result is cut or padded to ``size`` and is then an ordinary traced value. On
concrete arrays without ``size`` they return NumPy's (or CuPy's) answer; on a traced
value without ``size`` they raise :class:`ConcretizationError`, as JAX does."""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ConcretizationError, ShapeError, Tracer, bfloat16
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype, logical_and, logical_not, logical_or
from cuvmap.numpy._elementwise import where as _where3
from cuvmap.numpy._elementwise_composites import isnan
from cuvmap.numpy._indexing import take_along_axis
from cuvmap.numpy._shapes import broadcast_to, concatenate, flip, moveaxis, ravel, reshape
from cuvmap.lax.cumulative import cumsum as _cumsum


def _host(x):
    """A concrete array's values on the host."""
    return x.get() if backend.is_cupy_array(x) else np.asarray(x)


def _count_true(mask, axis):
    return lax_reduction.reduce_sum(astype(mask, np.int64), (axis,))


# ---------------------------------------------------------------------------------------
# searchsorted, digitize, interp
# ---------------------------------------------------------------------------------------


def _before(a, v, side):
    """Whether each sorted entry ``a`` goes before the query ``v`` (``a < v`` for
    ``side='left'``, ``a ≤ v`` for ``'right'``), in NumPy's order where NaNs sort last."""
    if side == "left":
        out = ew.lt(a, v)
        if core.is_float(a) or core.is_float(v):
            out = logical_or(out, logical_and(isnan(v), logical_not(isnan(a))))
        return out
    out = ew.le(a, v)
    if core.is_float(a) or core.is_float(v):
        out = logical_or(out, isnan(v))
    return out


def searchsorted(a, v, side="left", sorter=None, *, method="scan"):
    """``jnp.searchsorted``: for each query in ``v``, the index at which inserting it keeps
    the 1-D sorted ``a`` sorted: the number of entries of ``a`` less than it
    (``side='left'``) or less than or equal to it (``'right'``); NaNs sort last. Every
    query is compared with every entry at once (JAX's ``method='compare_all'``, whatever
    ``method`` says; an int64 result with ``v``'s shape, no derivative)."""
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if method not in ("scan", "scan_unrolled", "sort", "compare_all"):
        raise ValueError(f"searchsorted: unknown method {method!r}")
    a, v = asarray(a), asarray(v)
    if ndim(a) != 1:
        raise ShapeError(f"searchsorted: a must be 1-D, got shape {shape(a)}")
    if sorter is not None:
        a = lax_indexing.take(a, asarray(sorter), 0)
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(v))
    a, v = astype(a, dtype), astype(v, dtype)
    vs = shape(v)
    before = _before(reshape(a, (1,) * len(vs) + shape(a)), reshape(v, vs + (1,)), side)
    return _count_true(before, len(vs))


def digitize(x, bins, right=False, *, method=None):
    """``jnp.digitize``: the index of the bin of ``bins`` (1-D, increasing or decreasing)
    each ``x`` falls in: for increasing bins ``i`` with ``bins[i-1] ≤ x < bins[i]``
    (``bins[i-1] < x ≤ bins[i]`` with ``right``), 0 below and ``len(bins)`` above."""
    x, bins = asarray(x), asarray(bins)
    if ndim(bins) != 1:
        raise ShapeError(f"digitize: bins must be 1-D, got shape {shape(bins)}")
    n = shape(bins)[0]
    if n == 0:
        return astype(ew.mul(x, 0), np.int64) if not core.is_float(x) else astype(ew.ne(x, x), np.int64)
    side = "left" if right else "right"
    increasing = searchsorted(bins, x, side)
    decreasing = ew.sub(n, searchsorted(flip(bins, 0), x, side))
    first = lax_indexing.slice_in_dim(bins, 0, 1, 0)
    last = lax_indexing.slice_in_dim(bins, n - 1, n, 0)
    up = reshape(ew.ge(last, first), ())
    return _where3(up, increasing, decreasing)


def interp(x, xp, fp, left=None, right=None, period=None):
    """``jnp.interp``: the piecewise-linear interpolant through the points ``(xp, fp)``
    (``xp`` increasing) at ``x``: ``fp[i-1] + (x − xp[i-1])·(fp[i] − fp[i-1]) /
    (xp[i] − xp[i-1])`` on ``[xp[i-1], xp[i]]``; ``left`` (default ``fp[0]``) below
    ``xp[0]`` and ``right`` (default ``fp[-1]``) above ``xp[-1]``, or the first / last
    segment's line continued for ``'extrapolate'`` (JAX's option). With ``period`` the
    points repeat with that period (and ``left``/``right`` are ignored, as NumPy's).
    Differentiable in ``x``, ``xp`` and ``fp``."""
    x, xp, fp = asarray(x), asarray(xp), asarray(fp)
    if ndim(xp) != 1 or ndim(fp) != 1 or shape(xp) != shape(fp):
        raise ShapeError(f"interp: xp and fp must be 1-D of one length, got shapes {shape(xp)} and {shape(fp)}")
    dtype = bfloat16.result_type(core.dtype_of(x), core.dtype_of(xp), core.dtype_of(fp))
    if bfloat16.kind_of(dtype) not in "fc":
        dtype = np.result_type(dtype, np.float16)
    x, xp, fp = astype(x, dtype), astype(xp, dtype), astype(fp, dtype)
    for name, v in (("left", left), ("right", right)):
        if isinstance(v, str) and v != "extrapolate":
            raise ValueError(f"interp: {name} must be a number or 'extrapolate', got {v!r}")
    if period is not None:
        left = right = None
        period = ew.abs(astype(asarray(period), dtype))
        x = ew.remainder(x, period)
        xp = ew.remainder(xp, period)
        order = lax_sorting.argsort(xp, 0)
        xp, fp = lax_indexing.take(xp, order, 0), lax_indexing.take(fp, order, 0)
        m = shape(xp)[0]
        xp = concatenate([ew.sub(lax_indexing.slice_in_dim(xp, m - 1, m, 0), period), xp,
                          ew.add(lax_indexing.slice_in_dim(xp, 0, 1, 0), period)], 0)
        fp = concatenate([lax_indexing.slice_in_dim(fp, m - 1, m, 0), fp, lax_indexing.slice_in_dim(fp, 0, 1, 0)], 0)
    n = shape(xp)[0]
    if n == 0:
        raise ValueError("interp: xp and fp must not be empty")
    if n == 1:
        f = ew.add(ew.mul(x, 0), reshape(fp, ()))
    else:
        i = ew.min(ew.max(searchsorted(xp, x, "right"), 1), n - 1)
        x_lo, x_hi = lax_indexing.take(xp, ew.sub(i, 1), 0), lax_indexing.take(xp, i, 0)
        f_lo, f_hi = lax_indexing.take(fp, ew.sub(i, 1), 0), lax_indexing.take(fp, i, 0)
        dx = ew.sub(x_hi, x_lo)
        safe_dx = _where3(ew.eq(dx, 0), 1.0, dx)
        slope = _where3(ew.eq(dx, 0), 0.0, ew.div(ew.sub(f_hi, f_lo), safe_dx))
        f = ew.add(f_lo, ew.mul(ew.sub(x, x_lo), slope))
    if period is None:
        first = reshape(lax_indexing.slice_in_dim(xp, 0, 1, 0), ())
        last = reshape(lax_indexing.slice_in_dim(xp, n - 1, n, 0), ())
        left = reshape(lax_indexing.slice_in_dim(fp, 0, 1, 0), ()) if left is None else left
        right = reshape(lax_indexing.slice_in_dim(fp, n - 1, n, 0), ()) if right is None else right
        if not (isinstance(left, str) and n > 1):
            f = _where3(ew.lt(x, first), left, f)
        if not (isinstance(right, str) and n > 1):
            f = _where3(ew.gt(x, last), right, f)
    return f


# ---------------------------------------------------------------------------------------
# nonzero and the functions built on it
# ---------------------------------------------------------------------------------------


def _require_size(name, size, x):
    if size is None and isinstance(x, Tracer):
        raise ConcretizationError(
            f"{name}: the length of the result depends on the values of a traced array of shape "
            f"{shape(x)}; pass size= (a static length; the result is cut or padded with fill_value), "
            f"as in jax.numpy.{name}"
        )


def _first_true(mask, size):
    """``(positions, valid)``: the flat positions of the first ``size`` true entries of
    the 1-D ``mask`` in order (padded with 0), and which of them exist. A stable argsort
    of ``not mask`` puts the true positions first."""
    n = shape(mask)[0]
    if n == 0:
        zeros = lax_indexing.iota(size, like=mask)
        return ew.mul(zeros, 0), ew.lt(zeros, 0)
    order = lax_sorting.argsort(astype(logical_not(mask), np.int8), 0)
    if size > n:
        order = lax_shape.pad(order, ((0, size - n),), 0)
    order = lax_indexing.slice_in_dim(order, 0, size, 0)
    valid = ew.lt(lax_indexing.iota(size, like=mask), _count_true(mask, 0))
    return _where3(valid, order, 0), valid


def nonzero(a, *, size=None, fill_value=None):
    """``jnp.nonzero``: a tuple with, for each dim, the indices of the nonzero entries of
    ``a`` in row-major order. With ``size`` the first ``size`` are kept, and missing ones
    are ``fill_value`` (0 by default; a scalar or one per dim)."""
    a = asarray(a)
    _require_size("nonzero", size, a)
    if ndim(a) == 0:
        raise ValueError("nonzero: calling nonzero on 0-d arrays is not allowed; use atleast_1d(a).nonzero()")
    if size is None:
        return tuple(backend.xp_of(a).nonzero(a))
    size = int(size)
    positions, valid = _first_true(ravel(ew.ne(a, 0)), size)
    s = shape(a)
    fills = fill_value if isinstance(fill_value, (tuple, list)) else (fill_value,) * len(s)
    if len(fills) != len(s):
        raise ValueError(f"nonzero: fill_value must be a scalar or have one entry per dim ({len(s)}), got {fill_value}")
    out = []
    strides = [int(np.prod(s[k + 1:], dtype=np.int64)) for k in range(len(s))]
    for dim, stride, fill in zip(s, strides, fills):
        # the row-major unravelling of the flat positions (an empty array has none valid)
        index = ew.remainder(ew.floor_divide(positions, stride), dim) if dim > 0 and stride > 0 else positions
        out.append(_where3(valid, index, 0 if fill is None else fill))
    return tuple(out)


def flatnonzero(a, *, size=None, fill_value=None):
    """``jnp.flatnonzero``: the indices of the nonzero entries of the flattened ``a``."""
    return nonzero(ravel(asarray(a)), size=size, fill_value=fill_value)[0]


def argwhere(a, *, size=None, fill_value=None):
    """``jnp.argwhere``: the indices of the nonzero entries as rows, shape ``(count, ndim)``."""
    a = asarray(a)
    if ndim(a) == 0:
        rows = nonzero(reshape(a, (1,)), size=size, fill_value=fill_value)[0]
        return lax_indexing.slice_in_dim(reshape(rows, (-1, 1)), 0, 0, 1)  # NumPy's (count, 0)
    indices = nonzero(a, size=size, fill_value=fill_value)
    return lax_shape.concatenate([lax_shape.expand_dims(i, (1,)) for i in indices], 1)


def where(condition, x=None, y=None, /, *, size=None, fill_value=None):
    """``jnp.where``: ``x`` where ``condition`` holds, else ``y`` (the three broadcast); with
    ``condition`` alone, :func:`nonzero` of it (``size`` and ``fill_value`` as there)."""
    if x is None and y is None:
        return nonzero(condition, size=size, fill_value=fill_value)
    if x is None or y is None:
        raise ValueError("where: give both x and y, or neither")
    if size is not None or fill_value is not None:
        raise ValueError("where: size and fill_value are only for the one-argument form")
    condition = asarray(condition) if isinstance(condition, (list, tuple)) else condition
    if core.dtype_of(condition) != np.bool_:
        condition = ew.ne(condition, 0)
    return _where3(condition, asarray(x) if isinstance(x, (list, tuple)) else x,
                   asarray(y) if isinstance(y, (list, tuple)) else y)


def compress(condition, a, axis=None, *, size=None, fill_value=0, out=None):
    """``jnp.compress``: the slices of ``a`` along ``axis`` (flattened for ``None``) where
    the 1-D ``condition`` is true (a shorter ``condition`` counts as false beyond its
    end). A traced ``condition`` needs ``size``; missing slices are ``fill_value``, cast
    to ``a``'s dtype as in JAX (a Python 1 does not make a bool array int64)."""
    if out is not None:
        raise NotImplementedError("compress: out= is not supported")
    a, condition = asarray(a), asarray(condition)
    if ndim(condition) != 1:
        raise ShapeError(f"compress: condition must be 1-D, got shape {shape(condition)}")
    if axis is None:
        a, axis = ravel(a), 0
    axis = _axis(a, axis, "compress")
    n = shape(a)[axis]
    _require_size("compress", size, condition)
    if size is None:
        cond = _host(condition).astype(bool)
        if len(cond) > n and cond[n:].any():
            raise IndexError(f"compress: condition has a true entry beyond the length {n} of axis {axis}")
        return lax_indexing.take(a, backend.xp_of(a).asarray(np.flatnonzero(cond[:n])), axis)
    k = shape(condition)[0]
    if k > n:
        condition = lax_indexing.slice_in_dim(condition, 0, n, 0)
    elif k < n:
        condition = lax_shape.pad(ew.ne(condition, 0), ((0, n - k),), False)
    positions, valid = _first_true(ew.ne(condition, 0), int(size))
    picked = lax_indexing.take(a, positions, axis)
    valid = reshape(valid, tuple(int(size) if d == axis else 1 for d in range(ndim(a))))
    return _where3(valid, picked, astype(asarray(fill_value), core.dtype_of(a)))


def extract(condition, arr, *, size=None, fill_value=0):
    """``jnp.extract``: the entries of the flattened ``arr`` where the flattened
    ``condition`` is nonzero (:func:`compress` of both flattened)."""
    return compress(ravel(ew.ne(asarray(condition), 0)), ravel(asarray(arr)), size=size, fill_value=fill_value)


def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None, *, equal_nan=True,
           size=None, fill_value=None, sorted=True):  # noqa: A002 - NumPy's name
    """``jnp.unique``: the sorted distinct entries of ``ar`` (flattened), and optionally the
    index of each one's first occurrence, the inverse (for each entry of ``ar``, the
    position of its value in the result; ``ar``'s shape) and the counts. NaNs count as
    one value with ``equal_nan``. Under a transform ``size`` is needed: the result is cut
    or padded to ``size`` entries, padded with ``fill_value`` (default: the smallest
    value), indices of 0 and counts of 0. Differentiable in the values returned."""
    ar = asarray(ar)
    if axis is not None:
        if isinstance(ar, Tracer) or size is not None:
            raise NotImplementedError("unique: axis= is supported on concrete arrays without size= only")
        return backend.xp_of(ar).unique(ar, return_index, return_inverse, return_counts, axis=axis,
                                        equal_nan=equal_nan)
    _require_size("unique", size, ar)
    flags = (return_index, return_inverse, return_counts)
    if size is None:
        xp = backend.xp_of(ar)
        kw = {"equal_nan": equal_nan} if xp is np else {}
        return xp.unique(ar, *flags, **kw)
    size = int(size)
    x = ravel(ar)
    n = shape(x)[0]
    perm = lax_sorting.argsort(x, 0)
    s = lax_indexing.take(x, perm, 0)
    if n:
        different = ew.ne(lax_indexing.slice_in_dim(s, 1, n, 0), lax_indexing.slice_in_dim(s, 0, n - 1, 0))
        if equal_nan and core.is_float(s):
            both_nan = logical_and(isnan(lax_indexing.slice_in_dim(s, 1, n, 0)),
                                   isnan(lax_indexing.slice_in_dim(s, 0, n - 1, 0)))
            different = logical_and(different, logical_not(both_nan))
        first = lax_shape.pad(different, ((1, 0),), True)
    else:
        first = ew.ne(s, s) if core.is_float(s) else ew.lt(s, s)
    starts, valid = _first_true(first, size)
    values = lax_indexing.take(s, starts, 0) if n else broadcast_to(asarray(0, core.dtype_of(x)), (size,))
    if fill_value is None:
        fill_value = reshape(lax_indexing.slice_in_dim(s, 0, 1, 0), ()) if n else 0
    out = [_where3(valid, values, fill_value)]
    if return_index:
        out.append(_where3(valid, lax_indexing.take(perm, starts, 0), 0) if n else astype(starts, np.int64))
    if return_inverse:
        group = ew.sub(_cumsum(astype(first, np.int64), 0), 1)
        out.append(reshape(lax_indexing.take(group, lax_sorting.argsort(perm, 0), 0), shape(ar)) if n
                   else reshape(astype(group, np.int64), shape(ar)))
    if return_counts:
        count = _count_true(first, 0)
        following = concatenate([lax_indexing.slice_in_dim(starts, 1, size, 0), reshape(asarray(n), (1,))], 0) \
            if size else starts
        next_exists = ew.lt(ew.add(lax_indexing.iota(size, like=x), 1), count)
        following = _where3(next_exists, following, n)
        out.append(_where3(valid, ew.sub(following, starts), 0))
    return out[0] if len(out) == 1 else tuple(out)


# ---------------------------------------------------------------------------------------
# put_along_axis
# ---------------------------------------------------------------------------------------


def put_along_axis(arr, indices, values, axis, inplace=True, *, mode=None):
    """``jnp.put_along_axis`` (``inplace=False``, as JAX requires): a copy of ``arr`` with
    ``out[..., indices[..., k, ...], ...] = values[..., k, ...]`` along ``axis``
    (``indices`` and ``values`` broadcast against ``arr`` off ``axis``; negative indices
    count from the end; where an index repeats, the last ``k`` wins, as in NumPy).
    Each index is matched against every position of the axis, so the cost is
    (entries of ``indices``) × (length of the axis). Differentiable in ``arr`` and
    ``values``."""
    if inplace:
        raise ValueError("put_along_axis: cuvmap arrays are immutable; pass inplace=False to get the result")
    if mode not in (None, "clip", "fill", "promise_in_bounds"):
        raise ValueError(f"put_along_axis: unknown mode {mode!r}")
    arr, indices, values = asarray(arr), asarray(indices), asarray(values)
    if axis is None:
        shape_ = shape(arr)
        return reshape(put_along_axis(ravel(arr), ravel(indices), ravel(values), 0, inplace=False, mode=mode), shape_)
    axis = _axis(arr, axis, "put_along_axis")
    if ndim(indices) != ndim(arr):
        raise ShapeError(f"put_along_axis: indices of shape {shape(indices)} must have the rank of arr {shape(arr)}")
    n = shape(arr)[axis]
    k = shape(indices)[axis]
    if k == 0 or n == 0:
        return arr
    other = [builtins.max(a, b) for a, b in zip(shape(arr), shape(indices))]
    idx_shape = tuple(k if d == axis else other[d] for d in range(ndim(arr)))
    arr_shape = tuple(n if d == axis else other[d] for d in range(ndim(arr)))
    indices = broadcast_to(indices, idx_shape)
    values = broadcast_to(astype(values, core.dtype_of(arr)), idx_shape)
    arr = broadcast_to(arr, arr_shape)
    idx = moveaxis(indices, axis, -1)
    idx = _where3(ew.lt(idx, 0), ew.add(idx, n), idx)
    vals = moveaxis(values, axis, -1)
    base = moveaxis(arr, axis, -1)
    lead = shape(idx)[:-1]
    positions = reshape(lax_indexing.iota(n, like=arr), (1,) * len(lead) + (1, n))
    match = ew.eq(reshape(idx, lead + (k, 1)), positions)           # lead + (k, n)
    hit = ew.gt(_count_true(match, len(lead)), 0)                    # lead + (n,)
    last = ew.sub(k - 1, lax_reduction.argmax(astype(flip(match, len(lead)), np.int8), len(lead)))
    chosen = take_along_axis(vals, last, -1)
    out = _where3(hit, chosen, base)
    return moveaxis(out, -1, axis)
