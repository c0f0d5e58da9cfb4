"""``jnp.pad`` and its modes: the gathered ones (``edge``, ``wrap``, ``reflect``/``symmetric``
with ``reflect_type='even'``: one ``take`` per axis of the index vectors of
``cuvmap/numpy/_shapes.py``), per-side ``constant_values``, ``linear_ramp``
(``end_values``), the statistics ``maximum``, ``minimum``, ``mean`` and ``median``
(``stat_length``), ``empty`` and ``reflect_type='odd'``.

Each pads one axis at a time with slices, reductions and concatenations (no primitive of
its own), so it differentiates, batches and stages under ``jit``; widths, lengths and end
values are static, as in JAX."""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy._common import _holds_tracer, ndim, shape
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._reductions import max, mean, min
from cuvmap.numpy._shapes import _pad_indices as pad_indices
from cuvmap.numpy._shapes import broadcast_to, concatenate, flip
from cuvmap.numpy._statistics import median
from cuvmap.core.bfloat16 import kind_of

# the keyword arguments each mode takes (JAX's table: any other raises ValueError)
_ALLOWED_KWARGS = {
    "empty": (), "edge": (), "wrap": (),
    "constant": ("constant_values",),
    "linear_ramp": ("end_values",),
    "maximum": ("stat_length",), "mean": ("stat_length",), "median": ("stat_length",), "minimum": ("stat_length",),
    "reflect": ("reflect_type",), "symmetric": ("reflect_type",),
}


def pad(array, pad_width, mode="constant", **kwargs):
    """``jnp.pad``: ``pad_width`` is an int, a ``(low, high)`` pair or one pair per dim;
    ``mode`` is one of NumPy's: ``'constant'`` (``constant_values``: a scalar, a pair or
    one pair per dim), ``'edge'``, ``'wrap'``, ``'reflect'`` and ``'symmetric'``
    (``reflect_type`` ``'even'`` or ``'odd'``), ``'linear_ramp'`` (``end_values``),
    ``'maximum'``, ``'minimum'``, ``'mean'``, ``'median'`` (``stat_length``) and
    ``'empty'`` (zeros, as JAX); another keyword for a mode raises ValueError, as JAX. The
    even gathered modes gather each padded axis once with a fixed index vector, so their
    derivative sums the cotangents of the copies into the elements they copy; the others
    are built from slices, reductions and concatenations (cuvmap/numpy/py).
    A callable ``mode`` is not supported."""
    n = ndim(array)
    if _holds_tracer(pad_width):
        raise TypeError("pad: pad_width must be static (ints), not a traced value")
    widths = np.asarray(pad_width)
    if widths.size and kind_of(widths.dtype) not in "iu":
        raise TypeError(f"pad: `pad_width` must be of integral type, got {pad_width!r}")
    widths = widths.astype(np.int64)
    try:
        pw = np.broadcast_to(widths, (n, 2))
    except ValueError:
        raise ShapeError(f"pad: pad_width {pad_width!r} must be an int, a (low, high) pair or {n} pairs "
                         f"for an array of shape {shape(array)}") from None
    if (pw < 0).any():
        raise ShapeError(f"pad: pad_width {pad_width!r} has negative entries")
    if callable(mode):
        raise NotImplementedError("pad: a callable mode is not supported (it needs vmap, above cuvmap.numpy)")
    if not isinstance(mode, str) or mode not in _ALLOWED_KWARGS:
        raise NotImplementedError(f"Unimplemented padding mode '{mode}' for np.pad.")
    unsupported = set(kwargs) - set(_ALLOWED_KWARGS[mode])
    if unsupported:
        raise ValueError(f"pad: unsupported keyword arguments for mode '{mode}': {sorted(unsupported)}")
    if n == 0:
        return array
    if mode == "constant":
        return pad_constant(array, pw, kwargs.get("constant_values", 0))
    if mode == "linear_ramp":
        return pad_linear_ramp(array, pw, kwargs.get("end_values", 0))
    if mode in ("maximum", "minimum", "mean", "median"):
        return pad_statistic(array, pw, mode, kwargs.get("stat_length"))
    if mode == "empty":
        return pad_empty(array, pw)
    reflect_type = kwargs.get("reflect_type", "even")
    if reflect_type not in ("even", "odd"):
        raise ValueError(f"pad: reflect_type must be 'even' or 'odd', got {reflect_type!r}")
    if reflect_type == "odd":
        return pad_reflect_odd(array, pw, mode)
    xp = backend.xp_of(array)
    for axis, (lo, hi) in enumerate(pw):
        if lo == 0 and hi == 0:
            continue
        size = shape(array)[axis]
        if size == 0:
            raise ShapeError(f"pad: cannot extend the empty axis {axis} of shape {shape(array)} with mode {mode!r} "
                             "(only 'constant' can pad an empty axis)")
        idx = xp.asarray(pad_indices(size, int(lo), int(hi), mode))
        array = lax_indexing.take(array, idx, axis)
    return array


def static_pairs(value, nd, name, what):
    """``value`` (a scalar, a ``(before, after)`` pair or one pair per dim) as an
    ``(nd, 2)`` NumPy array; traced values raise TypeError."""
    if isinstance(value, Tracer) or (isinstance(value, (list, tuple)) and any(
            isinstance(v, Tracer) or (isinstance(v, (list, tuple)) and any(isinstance(w, Tracer) for w in v))
            for v in value)):
        raise TypeError(f"{name}: {what} must be static, not a traced value")
    arr = np.asarray(value)
    if arr.ndim == 1 and arr.shape[0] == 1:
        arr = arr[0]
    try:
        return np.broadcast_to(arr, (nd, 2))
    except ValueError:
        raise ValueError(f"{name}: {what} {value!r} must be a scalar, a (before, after) pair or {nd} pairs") from None


def _axis_slice(x, start, stop, axis):
    return lax_indexing.slice_in_dim(x, start, stop, axis)


def _widths(nd, axis, lo, hi):
    return tuple((int(lo), int(hi)) if i == axis else (0, 0) for i in range(nd))


def pad_constant(x, pad_width, constant_values):
    """Each side of each axis padded with its own constant (``constant_values`` a scalar,
    a pair or one pair per dim), axis by axis."""
    nd = ndim(x)
    values = static_pairs(constant_values, nd, "pad", "constant_values")
    if np.all(values == values.flat[0]):
        return lax_shape.pad(x, tuple((int(lo), int(hi)) for lo, hi in pad_width), values.flat[0].item())
    for axis in range(nd):
        lo, hi = pad_width[axis]
        if lo:
            x = lax_shape.pad(x, _widths(nd, axis, lo, 0), values[axis, 0].item())
        if hi:
            x = lax_shape.pad(x, _widths(nd, axis, 0, hi), values[axis, 1].item())
    return x


def _ramp(edge, end, width, axis, dtype):
    """``width`` values from ``end`` towards ``edge`` (excluded), NumPy's ``linspace``
    ``end + j · (edge − end) / width``, floored for integer dtypes (as NumPy)."""
    compute = dtype if kind_of(np.dtype(dtype)) in "fc" else np.dtype(np.float64)
    edge = astype(edge, compute)
    step = ew.div(ew.sub(edge, end), width)
    j = np.arange(width, dtype=compute).reshape(tuple(width if i == axis else 1 for i in range(ndim(edge))))
    ramp = ew.add(ew.mul(step, j), end)
    if kind_of(np.dtype(dtype)) in "iu":
        ramp = ew.floor(ramp)
    return astype(ramp, dtype)


def pad_linear_ramp(x, pad_width, end_values):
    """``linear_ramp``: each side ramps linearly from its end value (outermost) to the
    edge value of the array (excluded)."""
    nd = ndim(x)
    ends = static_pairs(end_values, nd, "pad", "end_values")
    dtype = core.dtype_of(x)
    for axis in range(nd):
        lo, hi = (int(w) for w in pad_width[axis])
        n = shape(x)[axis]
        if (lo or hi) and n == 0:
            raise ValueError(f"pad: cannot ramp from the empty axis {axis} of shape {shape(x)}")
        parts = []
        if lo:
            parts.append(_ramp(_axis_slice(x, 0, 1, axis), ends[axis, 0].item(), lo, axis, dtype))
        parts.append(x)
        if hi:
            parts.append(flip(_ramp(_axis_slice(x, n - 1, n, axis), ends[axis, 1].item(), hi, axis, dtype), axis))
        if len(parts) > 1:
            x = concatenate(parts, axis=axis)
    return x


_STATISTICS = {"maximum": max, "minimum": min, "mean": mean, "median": median}


def pad_statistic(x, pad_width, mode, stat_length):
    """``maximum``, ``minimum``, ``mean``, ``median``: each side repeats the statistic of
    the ``stat_length`` entries nearest to it (default: the whole axis), rounded for
    integer dtypes (as NumPy)."""
    nd = ndim(x)
    lengths = None if stat_length is None else static_pairs(stat_length, nd, "pad", "stat_length")
    stat = _STATISTICS[mode]
    dtype = core.dtype_of(x)
    for axis in range(nd):
        lo, hi = (int(w) for w in pad_width[axis])
        if not (lo or hi):
            continue
        n = shape(x)[axis]
        if n == 0:
            raise ValueError(f"pad: mode {mode!r} cannot pad the empty axis {axis} of shape {shape(x)}")
        if lengths is None:
            before = after = stat(x, axis=axis, keepdims=True)
        else:
            len_lo, len_hi = (int(v) for v in lengths[axis])
            if len_lo <= 0 or len_hi <= 0:
                raise ValueError(f"pad: stat_length {lengths[axis].tolist()} for axis {axis} yields no value")
            len_lo, len_hi = min_int(len_lo, n), min_int(len_hi, n)
            before = stat(_axis_slice(x, 0, len_lo, axis), axis=axis, keepdims=True)
            after = stat(_axis_slice(x, n - len_hi, n, axis), axis=axis, keepdims=True)
        if kind_of(np.dtype(dtype)) in "iub":
            before, after = ew.round(before, ew.RoundingMethod.TO_NEAREST_EVEN), ew.round(
                after, ew.RoundingMethod.TO_NEAREST_EVEN)
        before, after = astype(before, dtype), astype(after, dtype)
        target = lambda w: tuple(w if i == axis else s for i, s in enumerate(shape(x)))  # noqa: E731
        x = concatenate([broadcast_to(before, target(lo)), x, broadcast_to(after, target(hi))], axis=axis)
    return x


def min_int(a, b):
    return a if a < b else b


def pad_empty(x, pad_width):
    """``empty``: unspecified values; zeros here (as JAX, whose ``empty`` is ``zeros``)."""
    return lax_shape.pad(x, tuple((int(lo), int(hi)) for lo, hi in pad_width), 0)


def pad_reflect_odd(x, pad_width, mode):
    """``reflect``/``symmetric`` with ``reflect_type='odd'``: each reflected copy is
    mirrored about the edge value, ``2 · edge − x`` (NumPy's odd extension), built in
    pieces of at most the axis length, outward, each about the edge of the last."""
    nd = ndim(x)
    for axis in range(nd):
        n = shape(x)[axis]
        lo, hi = (int(w) for w in pad_width[axis])
        if not (lo or hi):
            continue
        if n == 0:
            raise ValueError(f"pad: mode {mode!r} cannot pad the empty axis {axis} of shape {shape(x)}")
        offset = 1 if (mode == "reflect" and n > 1) else 0
        for before, width in ((True, lo), (False, hi)):
            size = shape(x)[axis]
            edge = _axis_slice(x, 0, 1, axis) if before else _axis_slice(x, size - 1, size, axis)
            while width > 0:
                size = shape(x)[axis]
                piece = min_int(width, n - offset)
                width -= piece
                if before:
                    start, stop = offset, offset + piece
                else:
                    start = size - piece - offset
                    stop = size if (mode == "symmetric" or n == 1) else size - 1
                chunk = flip(_axis_slice(x, start, stop, axis), axis)
                chunk = ew.sub(ew.mul(edge, 2), chunk)
                if n > 1:
                    k = shape(chunk)[axis]
                    edge = _axis_slice(chunk, 0, 1, axis) if before else _axis_slice(chunk, k - 1, k, axis)
                x = concatenate([chunk, x] if before else [x, chunk], axis=axis)
    return x
