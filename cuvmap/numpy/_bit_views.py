"""``jax.Array.view(dtype)`` and ``jax.Array.byteswap()`` on tracers (issue 32, the mirror's
gaps): the bits of an array read as another dtype, and each entry's bytes reversed, built
from ``bitcast_convert_type`` between equal sizes, shifts and masks. Importing this module
attaches them to :class:`cuvmap.core.Tracer` (concrete arrays have NumPy's own).

Sizes differ: a wide entry splits into little-endian chunks along a new last axis (chunk
``j`` is ``(x >> j·b) & (2^b − 1)``), a run of narrow entries joins into one
(``Σ_j x_j << j·b``), so the last axis scales by the ratio of the sizes, as NumPy's
(little-endian) and JAX's. Booleans are bytes (0 or 1, and a byte read as bool is
``!= 0``, JAX's rule); complex numbers are their (real, imag) pairs. Bits carry no
derivative.
"""
import numpy as np

from cuvmap import core
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax.bitwise import bitcast_convert_type, bitwise_and, bitwise_or, shift_left, shift_right_logical
from cuvmap.numpy._shapes import reshape, stack
from cuvmap.core.bfloat16 import kind_of


def _uint(nbytes):
    return np.dtype(f"u{nbytes}")


def view(x, dtype=None, type=None):  # noqa: A002 - NumPy's name
    """``x.view(dtype)``: ``x``'s bits read as ``dtype`` (JAX's ``jax.Array.view``). Equal
    sizes keep the shape; otherwise the last axis is scaled by the ratio of the sizes
    (its bytes must divide evenly); a 0-d ``x`` needs equal sizes."""
    if type is not None:
        raise NotImplementedError("`type` argument of array.view() is not supported.")
    if dtype is None:
        return x
    src, dst = np.dtype(core.dtype_of(x)), np.dtype(dtype)
    shape = tuple(core.shape_of(x))
    if not shape:
        if src.itemsize != dst.itemsize:
            raise ValueError("view() of a 0d array is only supported if the itemsize is unchanged.")
        return reshape(view(reshape(x, (1,)), dst), ())
    if (shape[-1] * src.itemsize) % dst.itemsize:
        raise ValueError(f"view: when changing to a larger dtype, its size must be a divisor of the total size in "
                         f"bytes of the last axis of the array (shape {shape}, {src} -> {dst})")
    if src == dst:
        return x
    if kind_of(src) == "b":
        return view(ew.convert_element_type(x, np.uint8), dst)
    if kind_of(src) == "c":
        part = ew.real(x), ew.imag(x)
        return view(reshape(stack(part, axis=-1), shape[:-1] + (2 * shape[-1],)), dst)
    if kind_of(dst) == "b":
        return ew.ne(view(x, np.uint8), np.uint8(0))
    if kind_of(dst) == "c":
        half = np.dtype(f"f{dst.itemsize // 2}")
        flat = view(x, half)
        n = core.shape_of(flat)[-1] // 2
        pairs = reshape(flat, core.shape_of(flat)[:-1] + (n, 2))
        return ew.complex(pairs[..., 0], pairs[..., 1])
    bits = bitcast_convert_type(x, _uint(src.itemsize))
    if src.itemsize > dst.itemsize:
        return bitcast_convert_type(_split(bits, src.itemsize // dst.itemsize, dst.itemsize), dst)
    return bitcast_convert_type(_join(bits, dst.itemsize // src.itemsize, dst.itemsize), dst)


def _split(bits, factor, nbytes):
    """uint entries split into ``factor`` little-endian uint chunks of ``nbytes`` each."""
    wide = core.dtype_of(bits).type
    width, mask = 8 * nbytes, wide((1 << 8 * nbytes) - 1)
    chunks = [ew.convert_element_type(bitwise_and(shift_right_logical(bits, wide(j * width)), mask), _uint(nbytes))
              for j in range(factor)]
    out = stack(chunks, axis=-1)
    shape = tuple(core.shape_of(bits))
    return reshape(out, shape[:-1] + (shape[-1] * factor,))


def _join(bits, factor, nbytes):
    """Runs of ``factor`` uint entries joined, little-endian, into uint entries of ``nbytes``."""
    shape = tuple(core.shape_of(bits))
    wide = _uint(nbytes)
    width = 8 * core.dtype_of(bits).itemsize
    runs = reshape(ew.convert_element_type(bits, wide), shape[:-1] + (shape[-1] // factor, factor))
    out = runs[..., 0]
    for j in range(1, factor):
        out = bitwise_or(out, shift_left(runs[..., j], wide.type(j * width)))
    return out


def byteswap(x, inplace=False):
    """``x.byteswap()``: each entry's bytes in reverse order, in ``x``'s dtype (JAX's
    ``jax.Array.byteswap``; ``inplace=True`` is refused: arrays are immutable)."""
    if inplace:
        raise ValueError("byteswap: inplace=True is not supported (arrays are immutable)")
    dt = np.dtype(core.dtype_of(x))
    if dt.itemsize == 1:
        return x
    if kind_of(dt) == "c":
        return ew.complex(byteswap(ew.real(x)), byteswap(ew.imag(x)))
    shape = tuple(core.shape_of(x))
    flat = reshape(x, shape + (1,))
    chunks = reshape(view(flat, np.uint8), shape + (dt.itemsize,))
    swapped = chunks[..., ::-1]
    return reshape(view(swapped, dt), shape)


def _attach():
    for name, fn in (("view", view), ("byteswap", byteswap)):
        if not hasattr(Tracer, name):
            setattr(Tracer, name, fn)


_attach()
