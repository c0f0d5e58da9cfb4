"""Joining, repeating and removing, as ``jax.numpy`` names them: ``atleast_2d``,
``atleast_3d``, ``vstack``, ``hstack``, ``dstack``, ``column_stack``, ``append``,
``repeat`` (with ``total_repeat_length``), ``tile``, ``delete``, ``diff``, ``ediff1d``
and the index tricks ``r_`` and ``c_``. Every result is a composite of ``reshape``,
``broadcast_in_dim``, ``concatenate``, ``slice`` and ``take``, so it differentiates and
batches as those do. Operands may be lists and Python scalars; mixed dtypes promote as
NumPy's do."""
import builtins
import warnings

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ConcretizationError, ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import _axis, ndim, shape, size
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._elementwise import where as _where3
from cuvmap.numpy._ranges import linspace
from cuvmap.numpy._shapes import broadcast_to, concatenate, moveaxis, ravel, reshape
from cuvmap.core.bfloat16 import kind_of


def _arrays(xs, name):
    """The operands as arrays or tracers in their common (NumPy-promoted) dtype."""
    if not xs:
        raise ValueError(f"{name}: needs at least one array")
    # Python scalars take part weakly (NEP 50), so r_[float32_array, 0.5] stays float32
    dtype = np.result_type(*(x if isinstance(x, (int, float, bool)) else core.dtype_of(asarray(x)) for x in xs))
    xs = [asarray(x) for x in xs]
    return [astype(x, dtype) for x in xs]


def atleast_1d(*arys):
    """``jnp.atleast_1d``: each input with at least one dim (a scalar becomes shape (1,))."""
    out = [reshape(x, (1,)) if ndim(x) == 0 else x for x in (asarray(a) for a in arys)]
    return out[0] if len(out) == 1 else out


def atleast_2d(*arys):
    """``jnp.atleast_2d``: each input with at least two dims (shape ``(n,)`` becomes ``(1, n)``)."""
    out = [reshape(x, (1,) * (2 - ndim(x)) + shape(x)) if ndim(x) < 2 else x for x in (asarray(a) for a in arys)]
    return out[0] if len(out) == 1 else out


def atleast_3d(*arys):
    """``jnp.atleast_3d``: each input with at least three dims: ``()`` → ``(1, 1, 1)``,
    ``(n,)`` → ``(1, n, 1)``, ``(m, n)`` → ``(m, n, 1)``."""
    def three(x):
        if ndim(x) == 0:
            return reshape(x, (1, 1, 1))
        if ndim(x) == 1:
            return reshape(x, (1, shape(x)[0], 1))
        if ndim(x) == 2:
            return reshape(x, shape(x) + (1,))
        return x
    out = [three(asarray(a)) for a in arys]
    return out[0] if len(out) == 1 else out


def _as_list(tup, name):
    if isinstance(tup, Tracer) or hasattr(tup, "shape"):
        return [tup[i] for i in range(shape(tup)[0])]
    return list(tup)


def vstack(tup, dtype=None):
    """``jnp.vstack``: the arrays stacked row-wise: 1-D ones become rows (``atleast_2d``),
    joined along axis 0."""
    xs = _arrays(_as_list(tup, "vstack"), "vstack")
    out = concatenate([atleast_2d(x) for x in xs], 0)
    return out if dtype is None else astype(out, dtype)


def row_stack(tup, dtype=None):
    """NumPy's deprecated alias of :func:`vstack` (NumPy 2 warns; so does this, with its
    text), for code written against NumPy 1."""
    warnings.warn("`row_stack` alias is deprecated. Use `np.vstack` directly.", DeprecationWarning, stacklevel=2)
    return vstack(tup, dtype)


def hstack(tup, dtype=None):
    """``jnp.hstack``: the arrays joined along axis 1 (axis 0 when they are 1-D)."""
    xs = [atleast_1d(x) for x in _arrays(_as_list(tup, "hstack"), "hstack")]
    out = concatenate(xs, 0 if ndim(xs[0]) == 1 else 1)
    return out if dtype is None else astype(out, dtype)


def dstack(tup, dtype=None):
    """``jnp.dstack``: the arrays joined along axis 2 after ``atleast_3d``."""
    xs = _arrays(_as_list(tup, "dstack"), "dstack")
    out = concatenate([atleast_3d(x) for x in xs], 2)
    return out if dtype is None else astype(out, dtype)


def column_stack(tup):
    """``jnp.column_stack``: 1-D arrays become columns (shape ``(n, 1)``), and everything
    is joined along axis 1."""
    xs = _arrays(_as_list(tup, "column_stack"), "column_stack")
    xs = [reshape(x, (-1, 1)) if ndim(x) < 2 else x for x in xs]
    return concatenate(xs, 1)


def append(arr, values, axis=None):
    """``jnp.append``: ``values`` after ``arr``: both flattened for ``axis=None``, else
    joined along ``axis`` (``values`` must then have ``arr``'s rank)."""
    arr, values = _arrays([arr, values], "append")
    if axis is None:
        return concatenate([ravel(arr), ravel(values)], 0)
    return concatenate([arr, values], axis)


def _static_repeats(repeats):
    if isinstance(repeats, Tracer):
        return None
    if backend.is_cupy_array(repeats):
        repeats = repeats.get()
    return np.asarray(repeats)


def repeat(a, repeats, axis=None, *, total_repeat_length=None):
    """``jnp.repeat``: each element of ``a`` (flattened for ``axis=None``) repeated
    ``repeats`` times along ``axis``; ``repeats`` is an int or one count per element.
    Traced counts need ``total_repeat_length``, the static length of the result; with it
    the result is cut to that length, or padded by repeating the last element."""
    a = asarray(a)
    if axis is None or (ndim(a) == 0 and axis in (0, -1)):  # a 0-d array repeats as 1-d (NumPy's)
        a, axis = ravel(a), 0
    axis = _axis(a, axis, "repeat")
    n = shape(a)[axis]
    static = _static_repeats(repeats)
    if static is not None and static.ndim == 0 and total_repeat_length is None:
        r = int(static)
        if r < 0:
            raise ValueError(f"repeat: repeats must be non-negative, got {r}")
        s = shape(a)
        expanded = lax_shape.broadcast_in_dim(a, s[:axis + 1] + (r,) + s[axis + 1:],
                                              tuple(range(axis + 1)) + tuple(range(axis + 2, len(s) + 1)))
        return reshape(expanded, s[:axis] + (n * r,) + s[axis + 1:])
    if static is not None:
        counts = np.broadcast_to(static, (n,)).astype(np.int64)
        if (counts < 0).any():
            raise ValueError("repeat: repeats must be non-negative")
        index = np.repeat(np.arange(n), counts)
        if total_repeat_length is not None:
            length = int(total_repeat_length)
            index = index[:length]
            if len(index) < length:
                index = np.concatenate([index, np.full(length - len(index), builtins.max(n - 1, 0))])
        return lax_indexing.take(a, backend.xp_of(a).asarray(index), axis)
    if total_repeat_length is None:
        raise ConcretizationError(
            "repeat: traced repeats give a result whose length depends on their values; pass "
            "total_repeat_length=, the static length of the result (as jax.numpy.repeat)"
        )
    length = int(total_repeat_length)
    counts = broadcast_to(astype(repeats, np.int64), (n,))
    ends = lax_indexing.take(ravel(_cumsum(counts)), lax_indexing.iota(n, like=a), 0)
    # out[j] = a[i] for the i with ends[i-1] <= j < ends[i]: i is the number of ends <= j
    j = reshape(lax_indexing.iota(length, like=a), (length, 1))
    index = lax_reduction.reduce_sum(astype(ew.le(reshape(ends, (1, n)), j), np.int64), (1,))
    index = ew.min(index, builtins.max(n - 1, 0))
    return lax_indexing.take(a, index, axis)


def _cumsum(x):
    from cuvmap.lax import cumulative as lax_cumulative  # the cumulative family (no cycle)
    return lax_cumulative.cumsum(x, 0)


def tile(A, reps):
    """``jnp.tile``: ``A`` repeated ``reps[i]`` times along dim ``i`` (``reps`` an int or a
    tuple; the shorter of ``A``'s shape and ``reps`` is padded with leading 1s)."""
    A = asarray(A)
    reps = (int(reps),) if isinstance(reps, (int, np.integer)) else tuple(int(r) for r in reps)
    d = builtins.max(ndim(A), len(reps))
    reps = (1,) * (d - len(reps)) + reps
    s = (1,) * (d - ndim(A)) + shape(A)
    A = reshape(A, s)
    target = tuple(v for r, n in zip(reps, s) for v in (r, n))
    spread = lax_shape.broadcast_in_dim(A, target, tuple(range(1, 2 * d, 2)))
    return reshape(spread, tuple(r * n for r, n in zip(reps, s)))


def delete(arr, obj, axis=None, *, assume_unique_indices=False):
    """``jnp.delete``: ``arr`` without the entries ``obj`` (an int, a slice or a sequence of
    ints, negative ones counted from the end) along ``axis`` (flattened for ``None``).
    What stays is gathered with one ``take``. ``obj`` must be static, unless it is integer
    and ``assume_unique_indices=True`` (JAX's promise that no index repeats, so that the
    result's length is ``len(arr) − obj.size``): then it may be traced (indices out of range
    are clipped to the ends; repeated ones give a wrong result, as in JAX)."""
    arr = asarray(arr)
    if axis is None:
        arr, axis = ravel(arr), 0
    axis = _axis(arr, axis, "delete")
    n = shape(arr)[axis]
    if isinstance(obj, Tracer):
        if assume_unique_indices and core.dtype_of(obj).kind in "iu":
            return _delete_unique(arr, obj, axis, n)
        raise ConcretizationError(
            "delete: the indices obj must be static (a traced obj would give a data-dependent shape); "
            "pass assume_unique_indices=True for traced integer indices that do not repeat")
    keep = np.ones(n, dtype=bool)
    if isinstance(obj, builtins.slice):
        keep[obj] = False
    else:
        index = np.asarray(obj.get() if backend.is_cupy_array(obj) else obj)
        if index.dtype == np.bool_:
            if index.shape != (n,):
                raise ShapeError(f"delete: a boolean obj must have shape ({n},), got {index.shape}")
            keep = ~index
        else:
            if index.size and kind_of(index.dtype) not in "iu":
                raise IndexError(f"delete: obj must be integers, got {index.dtype}")
            index = index.astype(np.int64).ravel()
            if index.size and ((index < -n) | (index >= n)).any():
                raise IndexError(f"delete: index out of bounds for axis {axis} with size {n}: {index.tolist()}")
            keep[index] = False
    return lax_indexing.take(arr, backend.xp_of(arr).asarray(np.flatnonzero(keep)), axis)


def _delete_unique(arr, obj, axis, n):
    """``delete`` of traced, unique integer indices: with the sorted indices ``d_j``, kept
    position ``i`` of the result is ``i + #{j : d_j − j ≤ i}`` (each deleted entry at or
    before it shifts it one place on)."""
    d = ravel(astype(obj, np.int64))
    d = ew.clamp(0, _where3(ew.lt(d, 0), ew.add(d, n), d), n)
    m = shape(d)[0]
    d = ew.sub(lax_sorting.sort(d, 0), lax_indexing.iota(m, like=d))
    i = lax_indexing.iota(n - m, like=arr)
    shift = lax_reduction.reduce_sum(astype(ew.ge(reshape(i, (1, n - m)), reshape(d, (m, 1))), np.int64), (0,))
    return lax_indexing.take(arr, ew.add(i, shift), axis)


def diff(a, n=1, axis=-1, prepend=None, append=None):
    """``jnp.diff``: the ``n``-th forward difference along ``axis``,
    ``out[i] = a[i+1] − a[i]`` applied ``n`` times, after joining ``prepend`` and
    ``append`` (scalars are broadcast to one slice) at the ends. Booleans differ by ``!=``."""
    a = asarray(a)
    if n < 0:
        raise ValueError(f"diff: order n must be non-negative, got {n}")
    axis = _axis(a, axis, "diff")
    if n == 0:
        return a  # NumPy's and JAX's: prepend and append are not joined

    parts = [p for p in ([_piece(prepend, a, axis), a, _piece(append, a, axis)]) if p is not None]
    if len(parts) > 1:
        parts = _arrays(parts, "diff")
        a = concatenate(parts, axis)
    for _ in range(n):
        length = shape(a)[axis]
        hi = lax_indexing.slice_in_dim(a, 1, length, axis)
        lo = lax_indexing.slice_in_dim(a, 0, builtins.max(length - 1, 0), axis)
        a = ew.ne(hi, lo) if core.dtype_of(a) == np.bool_ else ew.sub(hi, lo)
    return a


def _piece(extra, a, axis):
    if extra is None:
        return None
    extra = asarray(extra)
    if ndim(extra) == 0:
        extra = broadcast_to(extra, shape(a)[:axis] + (1,) + shape(a)[axis + 1:])
    return extra


def ediff1d(ary, to_end=None, to_begin=None):
    """``jnp.ediff1d``: the differences of consecutive elements of the flattened ``ary``,
    with ``to_begin`` and ``to_end`` (flattened) joined at the ends."""
    ary = ravel(asarray(ary))
    out = diff(ary)
    parts = [ravel(asarray(to_begin))] if to_begin is not None else []
    parts.append(out)
    if to_end is not None:
        parts.append(ravel(asarray(to_end)))
    if len(parts) == 1:
        return out
    parts = [astype(p, core.dtype_of(ary)) for p in parts]
    return concatenate(parts, 0)


class _AxisConcatenator:
    """NumPy's ``r_`` and ``c_``: ``r_[a, b, 1:4, ...]`` joins its items along an axis.
    A slice ``start:stop:step`` becomes ``arange``, or ``linspace`` when ``step`` is
    complex (``0:1:5j`` is 5 points); a leading string ``'axis[,ndmin[,trans1d]]'`` sets
    the axis, the minimum rank each item is raised to and where a raised 1-D item's
    dims go (``'r'`` / ``'c'`` make a row or column matrix)."""

    def __init__(self, axis, ndmin, trans1d, name):
        self.axis, self.ndmin, self.trans1d, self.name = axis, ndmin, trans1d, name

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        axis, ndmin, trans1d, matrix = self.axis, self.ndmin, self.trans1d, None
        items = []
        for k, item in enumerate(key):
            if isinstance(item, str):
                if k != 0:
                    raise ValueError(f"{self.name}: a directive string must come first, got {item!r}")
                if item in ("r", "c"):
                    matrix = item
                    continue
                try:
                    parts = [int(p) for p in item.split(",")]
                except ValueError:
                    raise ValueError(f"{self.name}: could not understand directive {item!r} (expected 'axis', "
                                     "'axis,ndmin', 'axis,ndmin,trans1d', 'r' or 'c')") from None
                axis = parts[0]
                if len(parts) > 1:
                    ndmin = parts[1]
                if len(parts) > 2:
                    trans1d = parts[2]
                continue
            if isinstance(item, builtins.slice):
                items.append(_slice_range(item, self.name))
                continue
            items.append(item)  # Python scalars stay weakly typed for _arrays
        items = _arrays(items, self.name)
        items = [_raise_rank(x, ndmin, trans1d) if ndmin > ndim(x) else x for x in items]
        out = concatenate(items, axis)
        if matrix is not None and ndim(out) == 1:
            out = reshape(out, (1, -1) if matrix == "r" else (-1, 1))
        return out

    def __len__(self):
        return 0


def _slice_range(s, name):
    for part in ("start", "stop", "step"):
        if isinstance(getattr(s, part), Tracer):
            raise ConcretizationError(f"{name}: a traced value was given as the slice {part} of jnp.{name}; a "
                                      "slice's bounds and step set the result's length and must be concrete (static)")
    start = 0 if s.start is None else s.start
    step = 1 if s.step is None else s.step
    if isinstance(step, complex):
        return linspace(start, s.stop, int(builtins.abs(step)))
    return np.arange(start, s.stop, step)


def _raise_rank(x, ndmin, trans1d):
    """NumPy's placement of an item raised to ``ndmin`` dims: ``array(x, ndmin=ndmin)``
    (leading 1s), then the item's own dims moved to start at position ``trans1d`` of the
    result (``-1``: they stay last; negative positions count from the end)."""
    k = ndim(x)
    x = reshape(x, (1,) * (ndmin - k) + shape(x))
    if trans1d == -1:
        return x
    k2 = ndmin - k
    k1 = trans1d + k2 + 1 if trans1d < 0 else trans1d
    dims = list(range(ndmin))
    return lax_shape.transpose(x, tuple(dims[:k1] + dims[k2:] + dims[k1:k2]))


r_ = _AxisConcatenator(0, 1, -1, "r_")
c_ = _AxisConcatenator(-1, 2, 0, "c_")
