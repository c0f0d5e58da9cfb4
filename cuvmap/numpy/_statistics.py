"""Statistics, as ``jax.numpy`` names them: the NaN-ignoring reductions (``nansum``,
``nanprod``, ``nanmax``, ``nanmin``, ``nanmean``, ``nanvar``, ``nanstd``,
``nanargmax``, ``nanargmin``), order statistics (``quantile``, ``percentile``,
``median``) and ``histogram``. The NaN-ignoring ones replace NaNs by the reduction's
identity with ``where``, so NaN entries get a zero derivative; the order statistics
sort (whose derivative follows the permutation) and interpolate."""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import cumulative as lax_cumulative
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import _axes, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._elementwise_composites import isnan
from cuvmap.numpy._ranges import linspace
from cuvmap.numpy._reductions import argmax, argmin, max, min, prod, sum
from cuvmap.numpy._shapes import moveaxis, ravel, reshape, transpose
from cuvmap.core.bfloat16 import kind_of


def _float(a):
    a = asarray(a)
    return a if core.is_float(a) else astype(a, np.float64)


def _count(a, axis, keepdims):
    """How many entries over ``axis`` are not NaN (in ``a``'s dtype)."""
    return sum(astype(ew.eq(a, a), core.dtype_of(a)), axis, keepdims=keepdims)


def nansum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    """``jnp.nansum``: the sum over ``axis`` with NaNs counted as zero."""
    _unsupported("nansum", out=out, where=where)
    a = asarray(a)
    if core.is_float(a):
        a = ew.select(isnan(a), 0, a)
    total = sum(a, axis, dtype, keepdims=keepdims)
    return total if initial is None else ew.add(total, initial)


def nanprod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    """``jnp.nanprod``: the product over ``axis`` with NaNs counted as one."""
    _unsupported("nanprod", out=out, where=where)
    a = asarray(a)
    if core.is_float(a):
        a = ew.select(isnan(a), 1, a)
    total = prod(a, axis, dtype, keepdims=keepdims)
    return total if initial is None else ew.mul(total, initial)


def _nan_extremum(name, reduce, identity):
    def fn(a, axis=None, out=None, keepdims=False, initial=None, where=None):
        _unsupported(name, out=out, where=where)
        a = asarray(a)
        if not core.is_float(a):
            result = reduce(a, axis, keepdims=keepdims)
        else:
            nan = isnan(a)
            result = reduce(ew.select(nan, identity, a), axis, keepdims=keepdims)
            # an all-NaN slice gives NaN, as NumPy's (which also warns) and JAX's
            all_nan = ew.eq(sum(astype(ew.eq(nan, False), np.int64), axis, keepdims=keepdims), 0)
            result = ew.select(all_nan, np.nan, result)
        if initial is not None:
            result = (ew.max if identity == -np.inf else ew.min)(result, initial)
        return result
    fn.__name__ = name
    what = "largest" if identity == -np.inf else "smallest"
    fn.__doc__ = (f"``jnp.{name}``: the {what} entry over ``axis``, ignoring NaNs (NaN where a "
                  f"slice is all NaN). The derivative goes to the {what} entry (shared at ties).")
    return fn


nanmax = _nan_extremum("nanmax", max, -np.inf)
nanmin = _nan_extremum("nanmin", min, np.inf)


def nanmean(a, axis=None, dtype=None, out=None, keepdims=False, where=None):
    """``jnp.nanmean``: the mean over ``axis`` of the entries that are not NaN
    (``nansum / count``; NaN for an all-NaN slice)."""
    _unsupported("nanmean", out=out, where=where)
    a = _float(a)
    if dtype is not None:
        a = astype(a, dtype)
    return ew.div(nansum(a, axis, keepdims=keepdims), _count(a, axis, keepdims))


def nanvar(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None, mean=None):
    """``jnp.nanvar``: the variance over ``axis`` of the entries that are not NaN,
    ``Σ |a − mean|² / (count − ddof)`` over those entries (real for complex ``a``);
    ``mean`` (with the reduced dims kept, as JAX and NumPy take it) replaces the computed
    ``nanmean``."""
    _unsupported("nanvar", out=out, where=where)
    a = _float(a)
    if dtype is not None:
        a = astype(a, dtype)
    # NaN entries are zeroed before squaring: a NaN there would turn the zero cotangent
    # that nansum sends back into 0 · NaN = NaN in the derivative of the square
    center = nanmean(a, axis, keepdims=True) if mean is None else asarray(mean)
    centered = ew.select(isnan(a), 0.0, ew.sub(a, center))
    count = _count(a, axis, keepdims)
    if kind_of(core.dtype_of(centered)) == "c":  # |a − mean|², real (numpy.nanvar of complex numbers)
        squares = ew.real(ew.mul(ew.conj(centered), centered))
        count = ew.real(count)
    else:
        squares = ew.mul(centered, centered)
    return ew.div(nansum(squares, axis, keepdims=keepdims), ew.sub(count, ddof))


def nanstd(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None, mean=None):
    """``jnp.nanstd``: ``sqrt(nanvar(a))``, with a zero derivative where the variance is
    zero (as :func:`cuvmap.numpy.std`)."""
    v = nanvar(a, axis, dtype, out, ddof, keepdims, where, mean)
    positive = ew.gt(v, 0)
    return ew.select(positive, ew.sqrt(ew.select(positive, v, 1)), ew.select(isnan(v), v, ew.mul(v, 0)))


def nanargmax(a, axis=None, out=None, keepdims=None):
    """``jnp.nanargmax``: the index of the largest entry ignoring NaNs; ``-1`` for an
    all-NaN slice (JAX's answer; NumPy raises)."""
    return _nan_arg(a, axis, argmax, -np.inf, keepdims)


def nanargmin(a, axis=None, out=None, keepdims=None):
    """``jnp.nanargmin``: the index of the smallest entry ignoring NaNs; ``-1`` for an
    all-NaN slice."""
    return _nan_arg(a, axis, argmin, np.inf, keepdims)


def _nan_arg(a, axis, arg, identity, keepdims):
    a = asarray(a)
    if not core.is_float(a):
        index = arg(a, axis)
    else:
        nan = isnan(a)
        index = arg(ew.select(nan, identity, a), axis)
        flat_nan = ravel(nan) if axis is None else nan
        all_nan = ew.eq(sum(astype(ew.eq(flat_nan, False), np.int64), None if axis is None else axis), 0)
        index = ew.select(all_nan, -1, index)
    if keepdims:
        if axis is None:
            index = reshape(index, (1,) * ndim(a))
        else:
            axis = _axes(a, axis, "nanargmax")[0]
            index = reshape(index, shape(index)[:axis] + (1,) + shape(index)[axis:])
    return index


def _unsupported(name, **kw):
    for key, value in kw.items():
        if value is not None:
            raise NotImplementedError(f"{name}: {key}= is not supported")


_METHODS = ("linear", "lower", "higher", "midpoint", "nearest", "inverted_cdf")


def quantile(a, q, axis=None, out=None, overwrite_input=False, method="linear", keepdims=False, *,
             weights=None, interpolation=None):
    """``jnp.quantile``: the ``q``-th quantiles (``0 ≤ q ≤ 1``, a scalar or an array,
    static or traced) of ``a`` over ``axis`` (an int, a tuple or ``None``: all). With the
    ``n`` entries sorted, quantile ``q`` sits at position ``p = q·(n − 1)``; ``method``
    picks ``linear`` interpolation between ``⌊p⌋`` and ``⌈p⌉`` (NumPy's default),
    ``lower``, ``higher``, ``midpoint`` or ``nearest`` (halves to even), or, with
    ``inverted_cdf``, the first sorted entry whose cumulative share of ``weights`` (default
    1 each; ``a``'s shape or the reduced dims' shape) reaches ``q``; ``weights`` need
    ``method='inverted_cdf'``, as in JAX and NumPy. A slice holding a NaN gives NaN. The result has ``q``'s shape followed by the reduced shape. The
    derivative goes to the one or two entries interpolated."""
    _unsupported("quantile", out=out)
    if interpolation is not None:
        method = interpolation
    if method not in _METHODS:
        raise ValueError(f"quantile: method must be one of {_METHODS}, got {method!r}")
    if weights is not None and method != "inverted_cdf":
        raise NotImplementedError(f"quantile: method {method!r} does not take weights; only 'inverted_cdf' does")
    a = _float(a)
    q = astype(asarray(q), core.dtype_of(a))  # the result has a's dtype, as in JAX
    if not isinstance(q, Tracer) and hasattr(q, "dtype"):
        host = q.get() if hasattr(q, "get") else np.asarray(q)
        if ((host < 0) | (host > 1)).any():
            raise ValueError(f"quantile: q must be in [0, 1], got {host}")
        q = backend.device_put(q, backend.backend_name(a))   # a host q meets a's device once, here
    axes = _axes(a, axis, "quantile")
    kept = tuple(i for i in range(ndim(a)) if i not in axes)
    s = shape(a)
    n = int(np.prod([s[i] for i in axes], dtype=np.int64))
    x = reshape(transpose(a, kept + axes), tuple(s[i] for i in kept) + (n,))
    q_shape = shape(q)
    flat_q = ravel(q)
    if method == "inverted_cdf":
        result = _inverted_cdf(x, a, weights, axes, kept, flat_q)
    else:
        result = _interpolated(x, flat_q, n, method)
    has_nan = ew.ne(sum(astype(isnan(x), np.int64), -1), 0)
    result = ew.select(reshape(has_nan, shape(has_nan) + (1,)), np.nan, result)
    result = moveaxis(result, -1, 0)
    result = reshape(result, q_shape + tuple(s[i] for i in kept))
    if keepdims:
        result = reshape(result, q_shape + tuple(1 if i in axes else s[i] for i in range(len(s))))
    return result


def _inverted_cdf(x, a, weights, axes, kept, flat_q):
    """The entries of ``x`` (``kept + (n,)``) at the first sorted position whose share of
    the cumulative weights reaches each ``q``: ``kept + (len(q),)``."""
    s, n = shape(a), shape(x)[-1]
    if weights is None:
        w = ew.add(ew.mul(x, 0.0), 1.0)
    else:
        w = astype(asarray(weights), core.dtype_of(a))
        if shape(w) != s:
            if shape(w) != tuple(s[i] for i in axes):
                raise ValueError(f"quantile: weights of shape {shape(w)} must have a's shape {s} or the reduced "
                                 f"dims' {tuple(s[i] for i in axes)}")
            w = reshape(w, tuple(s[i] if i in axes else 1 for i in range(len(s))))
        w = reshape(transpose(ew.add(w, ew.mul(a, 0.0)), kept + axes), shape(x))
    x, w = lax_sorting.sort((x, w), ndim(x) - 1, num_keys=1)
    cumulative = lax_cumulative.cumsum(w, ndim(w) - 1)
    cdf = ew.div(cumulative, sum(w, -1, keepdims=True))
    flat_q = reshape(flat_q, (shape(flat_q)[0], 1))
    below = ew.lt(reshape(cdf, shape(cdf)[:-1] + (1, n)), flat_q)      # kept + (len(q), n)
    position = ew.min(sum(astype(below, np.int64), -1), n - 1)             # kept + (len(q),)
    chosen = ew.eq(reshape(position, shape(position) + (1,)), np.arange(n))
    values = reshape(x, shape(x)[:-1] + (1, n))
    return sum(ew.select(chosen, ew.add(values, ew.mul(chosen, 0.0)), 0.0), -1)


def _interpolated(x, flat_q, n, method):
    """Quantiles ``flat_q`` of the rows of ``x`` interpolated between sorted entries:
    ``kept + (len(q),)``."""
    x = lax_sorting.sort(x, ndim(x) - 1)
    position = ew.mul(flat_q, n - 1)
    low = ew.floor(position)
    high = ew.ceil(position)
    if method == "lower":
        high = low
    elif method == "higher":
        low = high
    elif method == "nearest":
        low = high = ew.round(position, ew.RoundingMethod.TO_NEAREST_EVEN)   # NumPy: halves to even
    fraction = ew.sub(position, low)
    if method == "midpoint":
        fraction = ew.select(ew.eq(low, high), 0.0, 0.5)
    elif method != "linear":
        fraction = ew.mul(fraction, 0.0)
    low_i = ew.min(ew.max(astype(low, np.int64), 0), n - 1)
    high_i = ew.min(ew.max(astype(high, np.int64), 0), n - 1)
    lo = lax_indexing.take(x, low_i, ndim(x) - 1)   # kept + (len(flat_q),)
    hi = lax_indexing.take(x, high_i, ndim(x) - 1)
    return ew.add(lo, ew.mul(ew.sub(hi, lo), fraction))


def percentile(a, q, axis=None, out=None, overwrite_input=False, method="linear", keepdims=False, *,
               weights=None, interpolation=None):
    """``jnp.percentile``: :func:`quantile` at ``q / 100``."""
    q = asarray(q)
    q = ew.div(q if core.is_float(q) else astype(q, np.float64), 100)
    return quantile(a, q, axis, out, overwrite_input, method, keepdims, weights=weights,
                    interpolation=interpolation)


def median(a, axis=None, out=None, overwrite_input=False, keepdims=False):
    """``jnp.median``: the middle of the sorted entries over ``axis`` (the mean of the two
    middle ones for an even count): :func:`quantile` at 0.5."""
    return quantile(a, 0.5, axis, out, overwrite_input, "linear", keepdims)


def histogram(a, bins=10, range=None, weights=None, density=None):  # noqa: A002 - NumPy's name
    """``jnp.histogram``: ``(hist, bin_edges)``: how many entries of the flattened ``a``
    (or the sum of their ``weights``) fall in each bin. ``bins`` is a number of equal
    bins over ``range`` (default: ``a``'s min to max) or the increasing edges; bins are
    half-open ``[e_i, e_{i+1})`` except the last, which includes its right edge; entries
    outside are not counted. ``density`` divides by the total and the bin widths. The
    counts have no derivative (forward only); each entry is compared with every edge."""
    a = ravel(_float(a))
    edges = _bin_edges(a, bins, range, "histogram")
    in_bin = _in_bins(a, edges)
    n_bins = shape(edges)[0] - 1
    if weights is None:
        hist = lax_reduction.reduce_sum(astype(in_bin, np.int64), (0,))
    else:
        w = reshape(ravel(asarray(weights)), (-1, 1))
        hist = lax_reduction.reduce_sum(ew.select(in_bin, w, 0), (0,))
    if density:
        widths = ew.sub(lax_indexing.slice_in_dim(edges, 1, n_bins + 1, 0), lax_indexing.slice_in_dim(edges, 0, n_bins, 0))
        hist = astype(hist, core.dtype_of(edges))
        hist = ew.div(hist, ew.mul(sum(hist), widths))
    return hist, edges


def _bin_edges(a, bins, range, where):  # noqa: A002 - NumPy's name
    """The bin edges of the flat float ``a``: ``bins`` equal bins over ``range`` (default:
    ``a``'s min to max; an empty range widened to ``(lo − 0.5, hi + 0.5)``, NumPy's rule),
    or the increasing edges ``bins`` themselves."""
    if isinstance(bins, (int, np.integer)):
        if range is None:
            lo, hi = min(a), max(a)
        else:
            lo, hi = range
            if not isinstance(lo, Tracer) and not isinstance(hi, Tracer) and lo > hi:
                raise ValueError(f"{where}: range must be increasing, got {range}")
        lo, hi = asarray(lo), asarray(hi)
        same = ew.eq(lo, hi)
        lo = ew.select(same, ew.sub(lo, 0.5), lo)
        hi = ew.select(same, ew.add(hi, 0.5), hi)
        return linspace(astype(lo, core.dtype_of(a)), astype(hi, core.dtype_of(a)), int(bins) + 1)
    if isinstance(bins, str):
        raise NotImplementedError(f"{where}: bins={bins!r} (a rule for the number of bins) is not supported")
    return _float(bins)


def _in_bins(a, edges):
    """``(len(a), n_bins)`` booleans: entry ``i`` of the flat ``a`` lies in bin ``j``,
    ``[e_j, e_{j+1})``, the last bin closed; each entry is compared with every edge."""
    n_bins = shape(edges)[0] - 1
    a_col = reshape(a, (-1, 1))
    lower = reshape(lax_indexing.slice_in_dim(edges, 0, n_bins, 0), (1, n_bins))
    upper = reshape(lax_indexing.slice_in_dim(edges, 1, n_bins + 1, 0), (1, n_bins))
    bin_index = reshape(lax_indexing.iota(n_bins, like=a), (1, n_bins))
    above_lower = ew.ge(a_col, lower)
    below_upper = ew.select(ew.eq(bin_index, n_bins - 1), ew.le(a_col, upper), ew.lt(a_col, upper))
    return ew.select(above_lower, below_upper, False)
