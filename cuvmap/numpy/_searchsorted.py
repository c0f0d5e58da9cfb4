"""``jnp.searchsorted`` with JAX's four ``method`` choices, and ``jnp.digitize`` on it.

The algorithms are described in NOTE [searchsorted methods].
"""
import math

import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError, bfloat16
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._creation import asarray, zeros_like
from cuvmap.numpy._elementwise import astype, logical_and, logical_not, logical_or
from cuvmap.numpy._elementwise import where as _where3
from cuvmap.numpy._elementwise_composites import isnan
from cuvmap.numpy._shapes import concatenate, flip, ravel, reshape

# NOTE [searchsorted methods]
# JAX offers four algorithms with one answer: ``'scan'`` (its default) and
# ``'scan_unrolled'`` run a binary search, ``'sort'`` co-sorts the queries with the sorted
# array and reads ranks, ``'compare_all'`` compares every query with every entry. cuvmap
# runs them as follows, each on the whole batch of queries at once:
#
# - ``'scan'`` and ``'scan_unrolled'``: one binary search of ``⌈log2(n+1)⌉`` steps, each a
#   gather of the middle entries and a comparison for all queries (the steps are unrolled:
#   their number is static, and a ``lax.scan`` would run the same steps one at a time);
#   ``O(m log n)`` work and ``O(m)`` memory for ``m`` queries;
# - ``'sort'``: stable ranks of ``[queries, a]`` (``'left'``) or ``[a, queries]``
#   (``'right'``) minus the queries' ranks among themselves (JAX's co-sorting);
# - ``'compare_all'``: an ``(m, n)`` comparison table summed along ``n``: fastest for a
#   short ``a``, ``O(m n)`` memory.
#
# Entries and queries are ordered as NumPy sorts: NaNs last, ``-0.0 == 0.0``, complex
# numbers lexicographically. The result has ``v``'s shape and JAX's index dtype: int32,
# or int64 where ``len(a)`` exceeds int32's range (JAX's ``int_dtype_for_dim``).
METHODS = ("scan", "scan_unrolled", "sort", "compare_all")


def index_dtype_for_dim(n):
    """JAX's index dtype for positions ``0..n`` of an axis of length ``n``: int32, or
    int64 where ``n`` exceeds int32's range."""
    return np.dtype(np.int64) if n > np.iinfo(np.int32).max else np.dtype(np.int32)


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


def _compare_all(a, v, side, dtype):
    vs = shape(v)
    before = _before(reshape(a, (1,) * len(vs) + shape(a)), reshape(v, vs + (1,)), side)
    return lax_reduction.reduce_sum(astype(before, dtype), (len(vs),))


def _binary_search(a, v, side, dtype):
    # the answer lies in [lo, hi]; each step halves the candidates (NOTE [searchsorted methods])
    n = shape(a)[0]
    lo = zeros_like(v, dtype)
    hi = ew.add(lo, n)
    for _ in range(math.ceil(math.log2(n + 1))):
        mid = ew.floor_divide(ew.add(lo, hi), 2)
        entry = lax_indexing.take(a, ew.min(mid, n - 1), 0)
        right = logical_and(_before(entry, v, side), ew.lt(mid, hi))
        lo, hi = _where3(right, ew.add(mid, 1), lo), _where3(right, hi, mid)
    return lo


def _rank(x):
    """The position of each entry of the 1-D ``x`` in its stable sort."""
    return lax_sorting.argsort(lax_sorting.argsort(x, 0), 0)


def _by_sorting(a, v, side, dtype):
    q = ravel(v)
    m = shape(q)[0]
    if side == "left":
        index = lax_indexing.slice_in_dim(_rank(concatenate([q, a], 0)), 0, m, 0)
    else:
        n = shape(a)[0]
        index = lax_indexing.slice_in_dim(_rank(concatenate([a, q], 0)), n, n + m, 0)
    return reshape(astype(ew.sub(index, _rank(q)), dtype), shape(v))


def searchsorted(a, v, side="left", sorter=None, *, method="scan"):
    """``jnp.searchsorted``: for each query in ``v``, the index at which inserting it keeps
    the 1-D sorted ``a`` sorted: the number of entries of ``a`` less than it
    (``side='left'``) or less than or equal to it (``'right'``), in NumPy's order (NaNs
    last). ``sorter`` sorts ``a`` first (``a[sorter]``). ``method`` is JAX's choice of
    algorithm, ``'scan'``, ``'scan_unrolled'``, ``'sort'`` or ``'compare_all'``; all give
    the same indices (NOTE [searchsorted methods]). The result has ``v``'s shape and
    JAX's dtype, int32 (int64 past int32's range); it has no derivative."""
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if method not in METHODS:
        raise ValueError(f"searchsorted: method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    a, v = asarray(a), asarray(v)
    if ndim(a) != 1:
        raise ShapeError(f"searchsorted: a must be 1-D, got shape {shape(a)}")
    if sorter is not None:
        a = lax_indexing.take(a, asarray(sorter), 0)
    common = bfloat16.result_type(core.dtype_of(a), core.dtype_of(v))
    a, v = astype(a, common), astype(v, common)
    n = shape(a)[0]
    dtype = index_dtype_for_dim(n)
    if n == 0:
        return zeros_like(v, dtype)
    if method == "compare_all":
        return _compare_all(a, v, side, dtype)
    if method == "sort":
        return _by_sorting(a, v, side, dtype)
    return _binary_search(a, v, side, dtype)


def digitize(x, bins, right=False, *, method=None):
    """``jnp.digitize``: the index of the bin of ``bins`` (1-D, increasing or decreasing)
    each ``x`` falls in: for increasing bins ``i`` with ``bins[i-1] ≤ x < bins[i]``
    (``bins[i-1] < x ≤ bins[i]`` with ``right``), 0 below and ``len(bins)`` above.
    ``method`` is :func:`searchsorted`'s; the dtype is JAX's (int32)."""
    x, bins = asarray(x), asarray(bins)
    if ndim(bins) != 1:
        raise ShapeError(f"digitize: bins must be 1-D, got shape {shape(bins)}")
    n = shape(bins)[0]
    if n == 0:
        return zeros_like(x, np.int32)
    side = "left" if right else "right"
    method = "scan" if method is None else method
    increasing = searchsorted(bins, x, side, method=method)
    decreasing = ew.sub(n, searchsorted(flip(bins, 0), x, side, method=method))
    first = lax_indexing.slice_in_dim(bins, 0, 1, 0)
    last = lax_indexing.slice_in_dim(bins, n - 1, n, 0)
    up = reshape(ew.ge(last, first), ())
    return _where3(up, increasing, decreasing)
