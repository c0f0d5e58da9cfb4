"""``jnp.nanquantile``, ``jnp.nanpercentile`` and ``jnp.nanmedian``: the quantiles of the
entries that are not NaN.

Each slice is sorted with its NaNs last (``lax.sort`` puts NaN after every number), so its
``m`` numbers are its first ``m`` entries; quantile ``q`` sits at position ``p = q·(m − 1)``
of the slice, a per-slice position read with ``take_along_axis``, and interpolated by
``method`` as :func:`cuvmap.numpy.quantile` does. An all-NaN slice gives NaN. The derivative
goes to the one or two entries interpolated, as ``quantile``'s."""
import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import _axes, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._indexing import take_along_axis
from cuvmap.numpy._reductions import sum
from cuvmap.numpy._shapes import moveaxis, ravel, reshape, transpose
from cuvmap.numpy._statistics import _METHODS, _float, _unsupported


def nanquantile(a, q, axis=None, out=None, overwrite_input=False, method="linear", keepdims=False, *,
                weights=None):
    """``jnp.nanquantile``: :func:`cuvmap.numpy.quantile` of the entries of ``a`` that are
    not NaN over ``axis`` (``method`` ``linear``, ``lower``, ``higher``, ``midpoint`` or
    ``nearest``); NaN where a slice holds no number. The result has ``q``'s shape followed
    by the reduced shape. ``weights`` (JAX's, with ``method='inverted_cdf'``) is refused
    (``NotImplementedError``): :func:`cuvmap.numpy.quantile` takes them, without NaNs."""
    _unsupported("nanquantile", out=out, weights=weights)
    if method not in _METHODS or method == "inverted_cdf":
        raise ValueError(f"nanquantile: method must be one of {_METHODS[:-1]}, got {method!r}")
    a = _float(a)
    q = astype(asarray(q), core.dtype_of(a))
    if not isinstance(q, core.Tracer) and hasattr(q, "dtype"):
        host = q.get() if hasattr(q, "get") else np.asarray(q)
        if ((host < 0) | (host > 1)).any():
            raise ValueError(f"nanquantile: q must be in [0, 1], got {host}")
    axes = _axes(a, axis, "nanquantile")
    kept = tuple(i for i in range(ndim(a)) if i not in axes)
    s = shape(a)
    n = int(np.prod([s[i] for i in axes], dtype=np.int64))
    x = reshape(transpose(a, kept + axes), tuple(s[i] for i in kept) + (n,))
    x = lax_sorting.sort(x, ndim(x) - 1)                                   # NaNs last
    count = sum(astype(ew.eq(x, x), core.dtype_of(a)), -1, keepdims=True)  # kept + (1,)
    q_shape = shape(q)
    flat_q = ravel(q)                                                     # (k,)
    position = ew.mul(flat_q, ew.sub(count, 1))                           # kept + (k,)
    low, high = ew.floor(position), ew.ceil(position)
    if method == "lower":
        high = low
    elif method == "higher":
        low = high
    elif method == "nearest":
        low = high = ew.round(position, ew.RoundingMethod.TO_NEAREST_EVEN)
    fraction = ew.sub(position, low)
    if method == "midpoint":
        fraction = ew.select(ew.eq(low, high), ew.mul(fraction, 0.0), ew.add(ew.mul(fraction, 0.0), 0.5))
    elif method != "linear":
        fraction = ew.mul(fraction, 0.0)
    top = max(n - 1, 0)
    low_i = ew.min(ew.max(astype(low, np.int64), 0), top)
    high_i = ew.min(ew.max(astype(high, np.int64), 0), top)
    lo = take_along_axis(x, low_i, -1)
    hi = take_along_axis(x, high_i, -1)
    result = ew.add(lo, ew.mul(ew.sub(hi, lo), fraction))
    result = ew.select(ew.gt(ew.add(ew.mul(result, 0.0), count), 0.0), result, np.nan)
    result = moveaxis(result, -1, 0)
    result = reshape(result, q_shape + tuple(s[i] for i in kept))
    if keepdims:
        result = reshape(result, q_shape + tuple(1 if i in axes else s[i] for i in range(len(s))))
    return result


def nanpercentile(a, q, axis=None, out=None, overwrite_input=False, method="linear", keepdims=False, *,
                  weights=None):
    """``jnp.nanpercentile``: :func:`nanquantile` at ``q / 100``."""
    q = asarray(q)
    q = ew.div(q if core.is_float(q) else astype(q, np.float64), 100)
    return nanquantile(a, q, axis, out, overwrite_input, method, keepdims, weights=weights)


def nanmedian(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """``jnp.nanmedian``: the median of the entries that are not NaN (:func:`nanquantile`
    at 0.5)."""
    return nanquantile(a, 0.5, axis, out, overwrite_input, "linear", keepdims)
