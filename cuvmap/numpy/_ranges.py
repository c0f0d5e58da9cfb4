"""Evenly spaced values and coordinate grids, as ``jax.numpy`` names them: ``linspace``,
``logspace``, ``geomspace`` and ``meshgrid``. The end points may be arrays or traced
values (then the result is differentiable in them); the number of points is static."""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ConcretizationError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._shapes import broadcast_to, concatenate, moveaxis, ravel, reshape
from cuvmap.core.bfloat16 import kind_of


def _static_count(num, name):
    if isinstance(num, Tracer):
        raise ConcretizationError(f"{name}: the number of samples num must be a static int, got a traced value")
    return int(num)


def _float_operand(x, dtype):
    x = asarray(x)
    if not core.is_float(x):
        x = astype(x, np.float64)
    return astype(x, dtype)


def _weak(x):
    """A Python scalar as itself (weakly typed for promotion), else its dtype."""
    return x if isinstance(x, (int, float, bool)) else core.dtype_of(asarray(x))


def _range_dtype(start, stop, dtype):
    """NumPy's dtype for a range: that of ``start``, ``stop`` and a float; the computation
    runs in it (or in float64 for an integer ``dtype``, which floors at the end)."""
    computed = np.result_type(_weak(start), _weak(stop), 0.0)  # a Python float: weakly typed (NEP 50)
    out = computed if dtype is None else np.dtype(dtype)
    if kind_of(out) == "f":
        computed = out
    return computed, out


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *, device=None):
    """``jnp.linspace``: ``num`` evenly spaced values from ``start`` to ``stop``:
    ``start + k·step`` with ``step = (stop − start) / (num − 1)`` (``/ num`` without the
    endpoint); with ``endpoint`` the last value is ``stop`` exactly. Array end points
    broadcast, and the new axis of length ``num`` goes at ``axis``. ``retstep`` also
    returns ``step``. An integer ``dtype`` floors the values, as NumPy does."""
    num = _static_count(num, "linspace")
    if num < 0:
        raise ValueError(f"linspace: number of samples, {num}, must be non-negative")
    computed, out_dtype = _range_dtype(start, stop, dtype)
    start, stop = _float_operand(start, computed), _float_operand(stop, computed)
    bshape = ew.broadcast_shapes(shape(start), shape(stop))
    start, stop = broadcast_to(start, bshape), broadcast_to(stop, bshape)
    div = num - 1 if endpoint else num
    delta = ew.sub(stop, start)
    step = ew.div(delta, div) if div > 0 else ew.mul(delta, np.nan)
    count = num - 1 if endpoint and num > 1 else num
    k = reshape(astype(lax_indexing.iota(count, like=start), computed), (count,) + (1,) * len(bshape))
    spacing = step if div > 0 else ew.mul(delta, 0)  # one sample: start itself
    out = ew.add(lax_shape.expand_dims(start, (0,)), ew.mul(k, lax_shape.expand_dims(spacing, (0,))))
    if endpoint and num > 1:
        out = concatenate([out, lax_shape.expand_dims(stop, (0,))], 0)
    out = moveaxis(out, 0, axis) if ndim(out) > 1 else out
    if kind_of(out_dtype) in "iu":
        out = ew.floor(out)
    out = astype(out, out_dtype)
    return (out, step) if retstep else out


def logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None, axis=0):
    """``jnp.logspace``: ``base ** linspace(start, stop, num)``: ``num`` values spaced
    evenly on a log scale from ``base**start`` to ``base**stop``."""
    computed, out_dtype = _range_dtype(start, stop, dtype)
    exponents = linspace(start, stop, num, endpoint, dtype=computed, axis=axis)
    out = ew.pow(_float_operand(base, computed), exponents)
    if kind_of(out_dtype) in "iu":
        out = ew.floor(out)
    return astype(out, out_dtype)


def geomspace(start, stop, num=50, endpoint=True, dtype=None, axis=0):
    """``jnp.geomspace``: ``num`` values in geometric progression from ``start`` to
    ``stop`` (each a constant multiple of the one before): ``sign · 10**linspace(
    log10|start|, log10(stop / sign))`` with the end points exactly ``start`` and ``stop``
    (NumPy's rotation: ``sign = start / |start|``, so complex end points give the
    logarithmic spiral between them). Real ``start`` and ``stop`` must be nonzero and of
    one sign."""
    computed, out_dtype = _range_dtype(start, stop, dtype)
    start, stop = _float_operand(start, computed), _float_operand(stop, computed)
    num = _static_count(num, "geomspace")
    bshape = ew.broadcast_shapes(shape(start), shape(stop))
    start, stop = broadcast_to(start, bshape), broadcast_to(stop, bshape)
    sign = ew.sign(start)
    if kind_of(np.dtype(computed)) == "c":  # rotated so that start is |start| (NumPy's): a principal-branch log
        low, high = ew.log10(ew.div(start, sign)), ew.log10(ew.div(stop, sign))
    else:
        low, high = ew.log10(ew.abs(start)), ew.log10(ew.abs(stop))
    out = linspace(low, high, num, endpoint, dtype=computed, axis=0)
    out = ew.mul(lax_shape.expand_dims(sign, (0,)), ew.pow(astype(asarray(10.0), computed), out))
    if num > 0:
        pieces = [lax_shape.expand_dims(start, (0,))]
        middle_end = num - 1 if endpoint and num > 1 else num
        if middle_end > 1:
            pieces.append(lax_indexing.slice_in_dim(out, 1, middle_end, 0))
        if endpoint and num > 1:
            pieces.append(lax_shape.expand_dims(stop, (0,)))
        out = concatenate(pieces, 0)
    out = moveaxis(out, 0, axis) if ndim(out) > 1 else out
    if kind_of(out_dtype) in "iu":
        out = ew.floor(out)
    return astype(out, out_dtype)


def meshgrid(*xi, copy=True, sparse=False, indexing="xy"):
    """``jnp.meshgrid``: coordinate arrays from 1-D coordinate vectors: with ``n`` inputs
    of lengths ``N1 … Nn``, ``indexing='ij'`` gives arrays of shape ``(N1, …, Nn)`` where
    ``out[k][i1, …, in] = xi[k][ik]``; ``'xy'`` (the default) swaps the first two dims
    (``(N2, N1, …)``). ``sparse`` keeps each broadcastable (size 1 off its own dim)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    xs = [ravel(asarray(x)) for x in xi]
    n = len(xs)
    sizes = [shape(x)[0] for x in xs]
    if indexing == "xy" and n > 1:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for k, x in enumerate(xs):
        dim = k
        if indexing == "xy" and n > 1 and k < 2:
            dim = 1 - k
        target = [1] * n
        target[dim] = shape(x)[0]
        x = reshape(x, tuple(target))
        out.append(x if sparse else broadcast_to(x, tuple(sizes)))
    return out
