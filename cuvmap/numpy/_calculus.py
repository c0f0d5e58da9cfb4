"""Numerical calculus on sampled arrays, as ``jax.numpy`` names it: ``trapezoid`` (the
trapezoidal rule), ``gradient`` (central differences) and ``unwrap`` (phase unwrapping).

Each is a composite of slices, differences, sums and a cumulative sum along one axis, so
it differentiates, batches and stages under ``jit`` like those."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError, bfloat16
from cuvmap.lax import cumulative as lax_cumulative
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.numpy._common import _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._creation import promote_inexact as _inexact
from cuvmap.numpy._elementwise import astype, logical_and, where
from cuvmap.numpy._reductions import sum
from cuvmap.numpy._shapes import concatenate, moveaxis, reshape
from cuvmap.numpy._stacking import diff
from cuvmap.core.bfloat16 import kind_of




def _slice(x, start, stop, axis):
    """``x[start:stop]`` along ``axis`` (negative bounds count from the end; ``None``: the end)."""
    n = shape(x)[axis]
    start = start + n if start < 0 else start
    stop = n if stop is None else (stop + n if stop < 0 else stop)
    return lax_indexing.slice_in_dim(x, start, stop, axis)


def trapezoid(y, x=None, dx=1.0, axis=-1):
    """``jnp.trapezoid``: the trapezoidal rule along ``axis``,
    ``Σ_i (y[i] + y[i+1]) / 2 · Δ_i`` with ``Δ_i = x[i+1] − x[i]`` (``x`` 1-D, or shaped
    like ``y`` / broadcasting against it) or the constant (or broadcasting array) ``dx``,
    in a floating dtype."""
    if x is None:
        y, dx = _inexact(y, dx)
        if ndim(dx) > 0:
            dx = reshape(dx, (1,) * (ndim(y) - ndim(dx)) + shape(dx))
            dx = moveaxis(dx, axis, -1)
    else:
        y, x = _inexact(y, x)
        dx = diff(x) if ndim(x) == 1 else moveaxis(diff(x, axis=axis), axis, -1)
    y = moveaxis(y, _axis(y, axis, "trapezoid"), -1)
    n = shape(y)[-1]
    if n == 0:
        raise ShapeError(f"trapezoid: the integration axis of y (shape {shape(y)} after moving it last) is empty")
    first, last = _slice(y, 0, 1, -1), _slice(y, -1, None, -1)
    if ndim(dx) == 0 or shape(dx)[-1] == 1:
        # a constant step: Δ · (Σ y − (y_0 + y_{n−1}) / 2)
        step = dx if ndim(dx) == 0 else reshape(_slice(dx, 0, 1, -1), shape(dx)[:-1])
        ends = reshape(ew.add(first, last), shape(y)[:-1])
        return ew.mul(step, ew.sub(sum(y, axis=-1), ew.mul(ends, 0.5)))
    pairs = ew.add(_slice(y, 1, None, -1), _slice(y, 0, -1, -1))
    return ew.mul(sum(ew.mul(dx, pairs), axis=-1), 0.5)


def _gradient_along(f, h, axis):
    """``∂f/∂x`` along ``axis``: central differences inside, one-sided ones (first order)
    at the two ends; ``h`` a scalar step or the 1-D sample coordinates (NumPy's second
    order formula for uneven spacing)."""
    upper = ew.sub(_slice(f, 1, 2, axis), _slice(f, 0, 1, axis))
    lower = ew.sub(_slice(f, -1, None, axis), _slice(f, -2, -1, axis))
    if ndim(h) == 0:
        inner = ew.div(ew.mul(ew.sub(_slice(f, 2, None, axis), _slice(f, 0, -2, axis)), 0.5), h)
        upper, lower = ew.div(upper, h), ew.div(lower, h)
    elif ndim(h) == 1:
        if shape(h)[0] != shape(f)[axis]:
            raise ShapeError(f"gradient: the coordinates along axis {axis} have length {shape(h)[0]}, "
                             f"the array {shape(f)[axis]} (shape {shape(f)})")
        h = reshape(h, tuple(shape(h)[0] if i == axis else 1 for i in range(ndim(f))))
        upper = ew.div(upper, ew.sub(_slice(h, 1, 2, axis), _slice(h, 0, 1, axis)))
        lower = ew.div(lower, ew.sub(_slice(h, -1, None, axis), _slice(h, -2, -1, axis)))
        dx1 = ew.sub(_slice(h, 1, -1, axis), _slice(h, 0, -2, axis))
        dx2 = ew.sub(_slice(h, 2, None, axis), _slice(h, 1, -1, axis))
        a = ew.div(ew.neg(dx2), ew.mul(dx1, ew.add(dx1, dx2)))
        b = ew.div(ew.sub(dx2, dx1), ew.mul(dx1, dx2))
        c = ew.div(dx1, ew.mul(dx2, ew.add(dx1, dx2)))
        inner = ew.add(ew.add(ew.mul(a, _slice(f, 0, -2, axis)), ew.mul(b, _slice(f, 1, -1, axis))),
                       ew.mul(c, _slice(f, 2, None, axis)))
    else:
        raise ShapeError(f"gradient: a spacing must be a scalar or 1-D coordinates, got shape {shape(h)}")
    return concatenate((upper, inner, lower), axis=axis)


def gradient(f, *varargs, axis=None, edge_order=None):
    """``jnp.gradient``: the derivative of the sampled ``f`` along each axis in ``axis``
    (default: all), ``(f[i+1] − f[i−1]) / (2h)`` inside and one-sided differences at the
    ends; ``varargs``: one spacing for all axes or one per axis (a scalar step or 1-D
    coordinates). One axis gives an array, several a list (as NumPy); ``edge_order`` is
    not supported (as in JAX)."""
    if edge_order is not None:
        raise NotImplementedError("gradient: edge_order is not supported (JAX's jnp.gradient neither)")
    f, *spacing = _inexact(f, *varargs)
    axes = tuple(range(ndim(f))) if axis is None else tuple(
        _axis(f, a, "gradient") for a in ((axis,) if isinstance(axis, (int, np.integer)) else axis))
    if not axes:
        return []
    if min(shape(f)[a] for a in axes) < 2:
        raise ShapeError(f"gradient: each differentiated axis needs at least 2 samples, got shape {shape(f)} "
                         f"along axes {axes}")
    if len(spacing) == 0:
        spacing = [asarray(np.asarray(1.0, dtype=core.dtype_of(f)))] * len(axes)
    elif len(spacing) == 1:
        spacing = spacing * len(axes)
    elif len(spacing) != len(axes):
        raise TypeError(f"gradient: {len(spacing)} spacings for {len(axes)} axes {axes}")
    grads = [_gradient_along(f, h, a) for a, h in zip(axes, spacing)]
    return grads[0] if len(axes) == 1 else grads


def unwrap(p, discont=None, axis=-1, period=2 * np.pi):
    """``jnp.unwrap``: ``p`` with each jump ``d = p[i+1] − p[i]`` along ``axis`` larger than
    ``discont`` (default ``period / 2``) replaced by its representative in
    ``[−period/2, period/2)`` (the running sum of the corrections added from there on),
    in the promoted dtype of ``p`` and ``period`` (integers stay integers, as NumPy)."""
    p = asarray(p)
    # a Python period is weakly typed (JAX's): it takes p's dtype
    weak = type(period) in (int, float) and not isinstance(period, bool)
    period_ = period if weak else asarray(period)
    dtype = bfloat16.result_type(core.dtype_of(p), period if weak else core.dtype_of(period_))
    if kind_of(dtype) == "c":
        raise TypeError("unwrap: complex inputs are not supported (as in JAX)")
    if dtype == np.bool_:
        dtype = np.dtype(np.int64)
    p, period_ = astype(p, dtype), astype(period_, dtype)
    axis = _axis(p, axis, "unwrap")
    if shape(p)[axis] == 0:
        return p
    integer = kind_of(dtype) in "iu"
    interval = ew.floor_divide(period_, 2) if integer else ew.div(period_, 2)
    discont = interval if discont is None else discont
    dd = diff(p, axis=axis)
    ddmod = ew.sub(ew.remainder(ew.add(dd, interval), period_), interval)
    # a jump of exactly −period/2 upwards stays +period/2 (NumPy's rule)
    ddmod = where(logical_and(ew.eq(ddmod, ew.neg(interval)), ew.gt(dd, 0)), interval, ddmod)
    correct = where(ew.lt(ew.abs(dd), discont), 0, ew.sub(ddmod, dd))
    head = _slice(p, 0, 1, axis)
    tail = ew.add(_slice(p, 1, None, axis), lax_cumulative.cumsum(correct, axis))
    return concatenate((head, tail), axis=axis)
