"""``jax.numpy``'s weighted averages, ranges, array-API cumulatives and whole-array
comparisons: ``average``, ``ptp``, ``cumulative_sum``, ``cumulative_prod``, ``isin``,
``array_equal``, ``array_equiv``, ``isposinf``, ``isneginf``.

All are compositions of cuvmap.numpy's functions, so every transform applies; the
comparisons give booleans (no derivative)."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._common import _axes, _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype, logical_and, logical_not, logical_or
from cuvmap.numpy._elementwise_composites import isnan
from cuvmap.numpy._pad_modes import pad
from cuvmap.numpy._reductions import all, any, cumprod, cumsum, max, min, sum
from cuvmap.numpy._shapes import broadcast_to, ravel, reshape
from cuvmap.core.bfloat16 import kind_of


def _no_out(name, out):
    if out is not None:
        raise NotImplementedError(f"{name}: out= is not supported (arrays are immutable)")


def average(a, axis=None, weights=None, returned=False, keepdims=False):
    """``jnp.average``: ``Σ w·a / Σ w`` over ``axis`` (all entries for ``None``); without
    ``weights`` the mean. ``weights`` has ``a``'s shape, or is 1-D along a single ``axis``
    (NumPy's rule). With ``returned`` also ``Σ w`` (broadcast to the average's shape)."""
    a = asarray(a)
    if not core.is_float(a) and kind_of(core.dtype_of(a)) != "c":
        a = astype(a, np.float64)
    axes = _axes(a, axis, "average")
    if weights is None:
        total = sum(a, axes, keepdims=keepdims)
        count = int(np.prod([shape(a)[i] for i in axes], dtype=np.int64))
        avg = ew.div(total, count)
        weight_sum = ew.add(ew.mul(avg, 0), count) if returned else None
    else:
        w = asarray(weights)
        if shape(w) != shape(a):
            if axis is None:
                raise ShapeError(f"average: weights of shape {shape(w)} differ from a's {shape(a)}; give axis")
            if ndim(w) != 1 or len(axes) != 1 or shape(w)[0] != shape(a)[axes[0]]:
                raise ShapeError(f"average: 1-D weights must have the length {shape(a)[axes[0]]} of axis "
                                 f"{axis}, got shape {shape(w)}")
            w = reshape(w, tuple(shape(w)[0] if i == axes[0] else 1 for i in range(ndim(a))))
            w = broadcast_to(w, shape(a))
        dtype = np.result_type(core.dtype_of(a), core.dtype_of(w))
        a, w = astype(a, dtype), astype(w, dtype)
        weight_sum = sum(w, axes, keepdims=keepdims)
        avg = ew.div(sum(ew.mul(a, w), axes, keepdims=keepdims), weight_sum)
    if returned:
        return avg, broadcast_to(astype(weight_sum, core.dtype_of(avg)), shape(avg))
    return avg


def ptp(a, axis=None, out=None, keepdims=False):
    """``jnp.ptp``: ``max − min`` over ``axis`` ("peak to peak"); the derivative goes to the
    maximum and the minimum entries (as ``max``'s and ``min``'s)."""
    _no_out("ptp", out)
    a = asarray(a)
    return ew.sub(max(a, axis, keepdims=keepdims), min(a, axis, keepdims=keepdims))


def _cumulative(name, op, identity, x, axis, dtype, include_initial):
    x = asarray(x)
    if axis is None:
        if ndim(x) > 1:
            raise ValueError(f"{name}: axis must be given for an array of {ndim(x)} dims, as the array API asks")
        axis = 0
    if ndim(x) == 0:
        raise ValueError(f"{name}: needs an array of at least 1 dim")
    axis = _axis(x, axis, name)
    out = op(x, axis=axis, dtype=dtype)
    if include_initial:
        out = pad(out, tuple((1, 0) if i == axis else (0, 0) for i in range(ndim(out))), constant_values=identity)
    return out


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    """``jnp.cumulative_sum`` (the array API's): running sums along ``axis`` (needed unless
    ``x`` is 1-D); ``include_initial`` starts with a 0."""
    return _cumulative("cumulative_sum", cumsum, 0, x, axis, dtype, include_initial)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    """``jnp.cumulative_prod`` (the array API's): running products along ``axis`` (needed
    unless ``x`` is 1-D); ``include_initial`` starts with a 1."""
    return _cumulative("cumulative_prod", cumprod, 1, x, axis, dtype, include_initial)


def isin(element, test_elements, assume_unique=False, invert=False, *, method="auto"):
    """``jnp.isin``: whether each entry of ``element`` equals some entry of
    ``test_elements`` (``invert``: equals none), as one comparison of every entry with
    every test value (JAX's ``method='compare_all'``; the other methods are accepted)."""
    if method not in ("auto", "compare_all", "binary_search", "sort"):
        raise ValueError(f"isin: method must be 'auto', 'compare_all', 'binary_search' or 'sort', got {method!r}")
    element, tests = asarray(element), ravel(asarray(test_elements))
    if not shape(tests)[0]:
        return broadcast_to(asarray(bool(invert)), shape(element))
    found = any(ew.eq(reshape(element, shape(element) + (1,)), tests), -1)
    return logical_not(found) if invert else found


def array_equal(a1, a2, equal_nan=False):
    """``jnp.array_equal``: a boolean, true when ``a1`` and ``a2`` have one shape and equal
    entries (``equal_nan``: NaNs in the same places count as equal)."""
    a1, a2 = asarray(a1), asarray(a2)
    if shape(a1) != shape(a2):
        return asarray(False)
    same = ew.eq(a1, a2)
    if equal_nan and (core.is_float(a1) or kind_of(core.dtype_of(a1)) == "c"):
        same = logical_or(same, logical_and(isnan(a1), isnan(a2)))
    return all(same)


def array_equiv(a1, a2):
    """``jnp.array_equiv``: a boolean, true when ``a1`` and ``a2`` broadcast to one shape
    with equal entries."""
    a1, a2 = asarray(a1), asarray(a2)
    try:
        np.broadcast_shapes(shape(a1), shape(a2))
    except ValueError:
        return asarray(False)
    return all(ew.eq(a1, a2))


def isposinf(x, /, out=None):
    """``jnp.isposinf``: ``x == +inf`` (false for integers)."""
    _no_out("isposinf", out)
    x = asarray(x)
    return ew.eq(x, np.inf) if core.is_float(x) else ew.ne(x, x)


def isneginf(x, /, out=None):
    """``jnp.isneginf``: ``x == −inf`` (false for integers)."""
    _no_out("isneginf", out)
    x = asarray(x)
    return ew.eq(x, -np.inf) if core.is_float(x) else ew.ne(x, x)
