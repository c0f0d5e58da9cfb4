"""``jax.numpy``'s set operations: ``union1d``, ``intersect1d``, ``setdiff1d``,
``setxor1d`` and the array API's ``unique_values``, ``unique_counts``, ``unique_inverse``,
``unique_all``.

NOTE [set operations as masks of a sorted array]
Each operation sorts the candidate values once (``ar1``'s, or both operands'), marks the
first entry of each run of equal values, and keeps those whose membership test holds
(``isin``: every entry compared with every test value). The kept entries are read with
``nonzero``: without ``size`` the count must be concrete (as in JAX, a ConcretizationError
under ``jit``/``vmap``); with ``size`` the result has that length, padded with
``fill_value`` (JAX's defaults: 0 for ``setdiff1d``, the smallest result otherwise), so it
stages and batches. The values carry no derivative."""
import collections

import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.numpy._averages import isin
from cuvmap.numpy._common import shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype, logical_and, logical_not, logical_xor
from cuvmap.numpy._indexing import take
from cuvmap.numpy._reductions import argsort, sum
from cuvmap.numpy._reductions import min as amin
from cuvmap.numpy._searching import nonzero, unique
from cuvmap.numpy._shapes import concatenate, ravel, reshape

UniqueAllResult = collections.namedtuple("UniqueAllResult", ["values", "indices", "inverse_indices", "counts"])
UniqueCountsResult = collections.namedtuple("UniqueCountsResult", ["values", "counts"])
UniqueInverseResult = collections.namedtuple("UniqueInverseResult", ["values", "inverse_indices"])


def _first_of_runs(s):
    """True at the first entry of each run of equal values of the sorted 1-D ``s``."""
    n = shape(s)[0]
    if n == 0:
        return ew.ne(s, s)
    head = ew.ne(s[:1], s[:1])
    return concatenate((logical_not(head), ew.ne(s[1:], s[:-1])))


def _kept(s, keep, size, fill_value, default_fill):
    """The entries of ``s`` where ``keep`` (NOTE [set operations as masks of a sorted array])."""
    if size is None:
        return take(s, nonzero(keep)[0])
    size = int(size)
    (idx,) = nonzero(keep, size=size, fill_value=0)
    vals = take(s, idx) if shape(s)[0] else astype(ew.mul(idx, 0), core.dtype_of(s))
    count = sum(astype(keep, np.int64))
    inside = ew.lt(lax_indexing.iota(size, like=keep), count)
    if fill_value is None:
        fill = default_fill if default_fill is not None else ew.select(ew.gt(count, 0), vals[0] if size else 0, 0)
    else:
        fill = fill_value
    return ew.select(inside, vals, astype(ew.add(ew.mul(vals, 0), fill), core.dtype_of(vals)))


def _operands(ar1, ar2):
    a, b = ravel(asarray(ar1)), ravel(asarray(ar2))
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(b))
    return astype(a, dtype), astype(b, dtype)


def _sorted(x):
    order = argsort(x, stable=True)
    return take(x, order), order


def union1d(ar1, ar2, *, size=None, fill_value=None):
    """``jnp.union1d``: the sorted unique values of both arrays (flattened)."""
    a, b = _operands(ar1, ar2)
    s, _ = _sorted(concatenate((a, b)))
    return _kept(s, _first_of_runs(s), size, fill_value, None)


def setdiff1d(ar1, ar2, assume_unique=False, *, size=None, fill_value=None):
    """``jnp.setdiff1d``: the sorted unique values of ``ar1`` that are not in ``ar2``."""
    a, b = _operands(ar1, ar2)
    s, _ = _sorted(a)
    keep = logical_and(_first_of_runs(s), isin(s, b, invert=True))
    return _kept(s, keep, size, fill_value, 0)


def setxor1d(ar1, ar2, assume_unique=False, *, size=None, fill_value=None):
    """``jnp.setxor1d``: the sorted unique values that are in exactly one of the arrays."""
    a, b = _operands(ar1, ar2)
    s, _ = _sorted(concatenate((a, b)))
    keep = logical_and(_first_of_runs(s), logical_xor(isin(s, a), isin(s, b)))
    return _kept(s, keep, size, fill_value, None)


def intersect1d(ar1, ar2, assume_unique=False, return_indices=False, *, size=None, fill_value=None):
    """``jnp.intersect1d``: the sorted unique values in both arrays; with
    ``return_indices`` also the index of each value's first occurrence in ``ar1`` and in
    ``ar2`` (padded entries: ``len(ar1)`` and the first match of the fill value, or
    ``len(ar2)``)."""
    a, b = _operands(ar1, ar2)
    s, order = _sorted(a)
    keep = logical_and(_first_of_runs(s), isin(s, b))
    values = _kept(s, keep, size, fill_value, None)
    if not return_indices:
        return values
    positions = _kept(order, keep, size, shape(a)[0], shape(a)[0])
    hits = ew.eq(reshape(values, shape(values) + (1,)), b)                       # (k, len(b))
    first_b = _first_true(hits, shape(b)[0])
    return values, positions, first_b


def _first_true(hits, n):
    """The index of the first True of each row of ``hits`` (``n`` where none)."""
    if n == 0:
        return astype(sum(hits, -1), np.int64)
    ranks = ew.select(hits, ew.add(ew.mul(astype(hits, np.int64), 0), lax_indexing.iota(n, like=hits)), n)
    return amin(ranks, -1)


def unique_values(x, *, size=None, fill_value=None):
    """``jnp.unique_values`` (the array API's): the sorted unique values of ``x``, flattened."""
    return unique(x, size=size, fill_value=fill_value)


def unique_counts(x, *, size=None, fill_value=None):
    """``jnp.unique_counts``: ``(values, counts)``."""
    values, counts = unique(x, return_counts=True, size=size, fill_value=fill_value)
    return UniqueCountsResult(values, counts)


def unique_inverse(x, *, size=None, fill_value=None):
    """``jnp.unique_inverse``: ``(values, inverse_indices)``, ``values[inverse_indices]``
    being ``x`` (the indices have ``x``'s shape)."""
    x = asarray(x)
    values, inverse = unique(x, return_inverse=True, size=size, fill_value=fill_value)
    return UniqueInverseResult(values, reshape(inverse, shape(x)))


def unique_all(x, *, size=None, fill_value=None):
    """``jnp.unique_all``: ``(values, indices, inverse_indices, counts)``; ``indices`` are
    the first occurrences in the flattened ``x``."""
    x = asarray(x)
    values, indices, inverse, counts = unique(x, return_index=True, return_inverse=True, return_counts=True,
                                              size=size, fill_value=fill_value)
    return UniqueAllResult(values, indices, reshape(inverse, shape(x)), counts)
