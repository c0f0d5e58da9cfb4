"""``numpy.fft``'s functions on arrays and tracers, as ``jax.numpy.fft`` has them: ``fft``,
``ifft``, ``rfft``, ``irfft``, ``hfft``, ``ihfft`` (one axis, ``n=``, ``axis=``), ``fft2``,
``ifft2``, ``rfft2``, ``irfft2`` (two axes), ``fftn``, ``ifftn``, ``rfftn``, ``irfftn``
(``s=``, ``axes=``), each with ``norm=`` (``"backward"``, the default, ``"ortho"`` or
``"forward"``), and ``fftfreq``, ``rfftfreq``, ``fftshift``, ``ifftshift``.

    from cuvmap.numpy import fft         # or cuvmap.numpy.fft, cnp.fft
    fft.rfft(x, n=16, norm="ortho")

Each transform is a composite of one :func:`cuvmap.lax.fft` (the primitive, in
cuvmap/lax/fourier.py: ``numpy.fft`` on the CPU, cuFFT through ``cupy.fft`` on the GPU):
the transformed axes are moved to the end, cropped or zero-padded to ``n``/``s``, and the
result is scaled for ``norm`` and moved back. So ``grad``, ``vmap`` and ``jit`` work on all
of them, and their derivatives follow JAX's complex convention (NOTE [complex convention]):
for a real-valued ``f`` of a complex ``z``, ``grad(f)(z) = ∂f/∂x − i ∂f/∂y``. The definitions
(n the length of a transformed axis, N the product of the lengths):

    fft:   X[k] = Σ_j x[j] · exp(−2πi jk / n)         ifft: x[j] = (1/n) Σ_k X[k] · exp(+2πi jk / n)
    rfft:  X[0 … n//2] of a real x                     irfft: the real x of length n from that half
    hfft(a, n) = n · irfft(conj(a), n)                 ihfft(x, n) = conj(rfft(x, n)) / n

and ``norm`` moves the 1/N: ``"backward"`` puts it on the inverse transforms, ``"forward"``
on the forward ones, ``"ortho"`` puts 1/√N on both. As JAX (and unlike NumPy), an axis may
not be repeated in ``axes``, and an axis of length 0 gives an empty (or zero) result
instead of an error; ``n`` and ``s`` must be positive.
"""
import math
import operator

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.elementwise import complex_numbers
from cuvmap.lax.fourier import FftType
from cuvmap.lax.fourier import fft as lax_fft
from cuvmap.lax.indexing import iota, slice_in_dim
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._shapes import moveaxis, roll
from cuvmap.core import bfloat16 as _bfloat16
from cuvmap.core.bfloat16 import kind_of

__all__ = [
    "fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn",
    "irfftn", "fftfreq", "rfftfreq", "fftshift", "ifftshift",
]

_NORMS = (None, "backward", "ortho", "forward")


# ---------------------------------------------------------------------------------------
# The core: axes to the end, crop or pad, one lax.fft, scale, axes back
# ---------------------------------------------------------------------------------------

def _norm_scale(name, norm, lengths, inverse):
    """The factor that turns the primitive's result (1/N on the inverse transforms: NumPy's
    "backward") into ``norm``'s."""
    if norm not in _NORMS:
        raise ValueError(f"jax.numpy.fft.{name}: invalid norm {norm!r}; use 'backward', 'ortho' or 'forward'")
    if norm in (None, "backward"):
        return 1.0
    n = float(math.prod(lengths))
    if norm == "ortho":
        return math.sqrt(n) if inverse else 1.0 / math.sqrt(n)
    return n if inverse else 1.0 / n  # "forward"


def _as_operand(a):
    if isinstance(a, Tracer) or hasattr(a, "dtype"):
        return a
    return asarray(a)


def _normalized_axes(name, x, axes):
    n = ndim(x)
    out = []
    for a in axes:
        a = operator.index(a)
        if not -n <= a < n:
            raise ShapeError(f"jax.numpy.fft.{name}: axis {a} is out of range for an array of shape {shape(x)}")
        out.append(a % n)
    if len(set(out)) != len(out):
        raise ValueError(f"jax.numpy.fft.{name} does not support repeated axes. Got axes {axes}.")
    return out


def _resized(x, sizes):
    """``x`` cropped or zero-padded at the end of each axis to ``sizes``."""
    for axis, (have, want) in enumerate(zip(shape(x), sizes)):
        if want < have:
            x = slice_in_dim(x, 0, want, axis)
        elif want > have:
            pads = [(0, 0)] * ndim(x)
            pads[axis] = (0, want - have)
            x = lax_shape.pad(x, tuple(pads), 0)
    return x


def _fft_core(name, fft_type, a, s, axes, norm, inverse):
    a = _as_operand(a)
    if norm not in _NORMS:
        raise ValueError(f"jax.numpy.fft.{name}: invalid norm {norm!r}; use 'backward', 'ortho' or 'forward'")
    if s is not None:
        s = tuple(operator.index(n) for n in s)
        if any(n <= 0 for n in s):
            raise ValueError(f"jax.numpy.fft.{name}: the lengths s={s} must be positive")
        if axes is not None and len(s) != len(axes):
            raise ValueError(f"jax.numpy.fft.{name}: s={s} and axes={tuple(axes)} have different lengths")
        if len(s) > ndim(a):
            raise ShapeError(f"jax.numpy.fft.{name}: s={s} has more lengths than the array of shape {shape(a)} "
                             "has dims")
    if axes is None:
        axes = range(ndim(a)) if s is None else range(ndim(a) - len(s), ndim(a))
    axes = _normalized_axes(name, a, axes)
    k = len(axes)
    trailing = list(range(ndim(a) - k, ndim(a)))
    x = moveaxis(a, axes, trailing) if axes != trailing else a
    dims = list(shape(x))
    if s is not None:
        in_sizes = dims[:ndim(x) - k] + list(s)
        if fft_type == FftType.IRFFT:
            in_sizes[-1] = s[-1] // 2 + 1
        x = _resized(x, in_sizes)
        lengths = tuple(s)
    elif fft_type == FftType.IRFFT and k:
        lengths = tuple(dims[ndim(x) - k:-1]) + (max(0, 2 * (dims[-1] - 1)),)
    else:
        lengths = tuple(dims[ndim(x) - k:])
    if _bfloat16.is_bfloat16(core.dtype_of(x)):
        x = ew.convert_element_type(x, np.dtype(np.float32))  # (lax.fft's RFFT refuses bfloat16, as JAX's; jnp's functions upcast)
    out = lax_fft(x, fft_type, lengths)
    scale = _norm_scale(name, norm, lengths, inverse)
    if scale != 1.0:
        out = ew.mul(out, scale)
    return moveaxis(out, trailing, axes) if axes != trailing else out


def _one_axis(name, axis):
    if isinstance(axis, (list, tuple)):
        raise ValueError(f"jax.numpy.fft.{name} does not support multiple axes. Please use jax.numpy.fft.{name}n. "
                         f"Got axis = {axis!r}.")
    return [axis]


def _two_axes(name, axes):
    if len(axes) != 2:
        raise ValueError(f"jax.numpy.fft.{name} only supports 2 axes. Got axes = {axes!r}.")
    return axes


# ---------------------------------------------------------------------------------------
# One axis
# ---------------------------------------------------------------------------------------

def fft(a, n=None, axis=-1, norm=None):
    """``jax.numpy.fft.fft``: the discrete Fourier transform along ``axis``,
    ``X[k] = Σ_j a[j] exp(−2πi jk/n)``, with ``a`` cropped or zero-padded to ``n``."""
    return _fft_core("fft", FftType.FFT, a, None if n is None else [n], _one_axis("fft", axis), norm, False)


def ifft(a, n=None, axis=-1, norm=None):
    """``jax.numpy.fft.ifft``: the inverse transform along ``axis``,
    ``x[j] = (1/n) Σ_k a[k] exp(+2πi jk/n)``."""
    return _fft_core("ifft", FftType.IFFT, a, None if n is None else [n], _one_axis("ifft", axis), norm, True)


def rfft(a, n=None, axis=-1, norm=None):
    """``jax.numpy.fft.rfft``: the transform of a real ``a`` along ``axis``, its
    non-negative frequencies ``X[0 … n//2]`` (the others are their conjugates)."""
    return _fft_core("rfft", FftType.RFFT, a, None if n is None else [n], _one_axis("rfft", axis), norm, False)


def irfft(a, n=None, axis=-1, norm=None):
    """``jax.numpy.fft.irfft``: the real signal of length ``n`` (default ``2·(m − 1)``)
    whose ``rfft`` is ``a`` (cropped or zero-padded to ``n//2 + 1`` bins); the imaginary
    parts of the zero (and, for an even ``n``, the Nyquist) bin are ignored."""
    return _fft_core("irfft", FftType.IRFFT, a, None if n is None else [n], _one_axis("irfft", axis), norm, True)


def hfft(a, n=None, axis=-1, norm=None):
    """``jax.numpy.fft.hfft``: the (real) transform of a signal with Hermitian symmetry
    given by its first half ``a``: ``n · irfft(conj(a), n)`` for ``norm="backward"``."""
    a = _as_operand(a)
    conj_a = complex_numbers.conj(a)
    # NumPy's hfft is irfft with the opposite normalisation: the 1/N goes to the forward side
    return _fft_core("hfft", FftType.IRFFT, conj_a, None if n is None else [n], _one_axis("hfft", axis),
                     _swapped(norm), True)


def ihfft(a, n=None, axis=-1, norm=None):
    """``jax.numpy.fft.ihfft``: the inverse of ``hfft`` for a real ``a``:
    ``conj(rfft(a, n)) / n`` for ``norm="backward"``."""
    out = _fft_core("ihfft", FftType.RFFT, a, None if n is None else [n], _one_axis("ihfft", axis),
                    _swapped(norm), False)
    return complex_numbers.conj(out)


def _swapped(norm):
    if norm not in _NORMS:
        return norm  # _fft_core names the bad value
    return {None: "forward", "backward": "forward", "ortho": "ortho", "forward": "backward"}[norm]


# ---------------------------------------------------------------------------------------
# Two and n axes
# ---------------------------------------------------------------------------------------

def fft2(a, s=None, axes=(-2, -1), norm=None):
    """``jax.numpy.fft.fft2``: ``fftn`` over two ``axes`` (the last two by default)."""
    return _fft_core("fft2", FftType.FFT, a, s, _two_axes("fft2", axes), norm, False)


def ifft2(a, s=None, axes=(-2, -1), norm=None):
    """``jax.numpy.fft.ifft2``: ``ifftn`` over two ``axes``."""
    return _fft_core("ifft2", FftType.IFFT, a, s, _two_axes("ifft2", axes), norm, True)


def rfft2(a, s=None, axes=(-2, -1), norm=None):
    """``jax.numpy.fft.rfft2``: ``rfftn`` over two ``axes``."""
    return _fft_core("rfft2", FftType.RFFT, a, s, _two_axes("rfft2", axes), norm, False)


def irfft2(a, s=None, axes=(-2, -1), norm=None):
    """``jax.numpy.fft.irfft2``: ``irfftn`` over two ``axes``."""
    return _fft_core("irfft2", FftType.IRFFT, a, s, _two_axes("irfft2", axes), norm, True)


def fftn(a, s=None, axes=None, norm=None):
    """``jax.numpy.fft.fftn``: the n-dimensional transform
    ``X[k] = Σ_j a[j] exp(−2πi Σ_d j_d k_d / s_d)`` over ``axes`` (all axes, or the last
    ``len(s)``), each cropped or zero-padded to ``s``."""
    return _fft_core("fftn", FftType.FFT, a, s, axes, norm, False)


def ifftn(a, s=None, axes=None, norm=None):
    """``jax.numpy.fft.ifftn``: the n-dimensional inverse transform (1/N Σ with
    exp(+2πi …), N = Π s)."""
    return _fft_core("ifftn", FftType.IFFT, a, s, axes, norm, True)


def rfftn(a, s=None, axes=None, norm=None):
    """``jax.numpy.fft.rfftn``: the n-dimensional transform of a real ``a``, keeping the
    non-negative frequencies ``0 … s[-1]//2`` of the last axis."""
    return _fft_core("rfftn", FftType.RFFT, a, s, axes, norm, False)


def irfftn(a, s=None, axes=None, norm=None):
    """``jax.numpy.fft.irfftn``: the inverse of ``rfftn``: inverse transforms of all but
    the last of ``axes``, then ``irfft`` along the last (length ``s[-1]``, by default
    ``2·(m − 1)``); Hermitian symmetry is assumed along the last axis only, as NumPy."""
    return _fft_core("irfftn", FftType.IRFFT, a, s, axes, norm, True)


# ---------------------------------------------------------------------------------------
# Frequencies and shifts
# ---------------------------------------------------------------------------------------

def _static_length(name, n):
    if isinstance(n, (list, tuple)):
        raise ValueError(f"jax.numpy.fft.{name}: n takes one int, got {n!r} (The n argument of "
                         f"jax.numpy.fft.{name} only takes an int. Got n = {list(n)}.)")
    return operator.index(n)


def _frequencies(name, count, n, d, dtype, wrap):
    """``k / (d·n)`` for ``k = 0 … count − 1`` (``wrap``: those from ``⌈n/2⌉`` on less
    ``n``), in ``dtype`` (float64 by default): on the host for a static ``d``, else on
    ``d``'s device and differentiable in ``d``."""
    if isinstance(d, (list, tuple)):
        raise ValueError(f"The d argument of jax.numpy.fft.{name} only takes a single value. Got d = {list(d)}.")
    dtype = np.dtype(np.float64 if dtype is None else dtype)
    compute = dtype if kind_of(dtype) in "fc" else np.dtype(np.float64)
    if isinstance(d, Tracer) or backend.is_cupy_array(d):
        k = iota(count, np.int64, like=d)
        if wrap:
            k = ew.select(ew.ge(k, (n + 1) // 2), ew.sub(k, n), k)
        out = ew.div(ew.convert_element_type(k, compute), ew.mul(ew.convert_element_type(d, compute), n))
        return out if compute == dtype else ew.convert_element_type(out, dtype)
    k = np.arange(count)
    if wrap:
        k = np.where(k >= (n + 1) // 2, k - n, k)
    return (k.astype(compute) / np.asarray(d * n, dtype=compute)).astype(dtype)


def fftfreq(n, d=1.0, *, dtype=None, device=None):
    """``jax.numpy.fft.fftfreq``: the sample frequencies of an ``n``-point transform with
    sample spacing ``d``: ``[0, 1, …, ⌈n/2⌉ − 1, −⌊n/2⌋, …, −1] / (d·n)`` (float64 unless
    ``dtype``). ``device`` is accepted for JAX's signature; the device is ``d``'s."""
    n = _static_length("fftfreq", n)
    return _frequencies("fftfreq", n, n, d, dtype, wrap=True)


def rfftfreq(n, d=1.0, *, dtype=None, device=None):
    """``jax.numpy.fft.rfftfreq``: the non-negative frequencies of ``rfft``:
    ``[0, 1, …, n//2] / (d·n)``."""
    n = _static_length("rfftfreq", n)
    return _frequencies("rfftfreq", n // 2 + 1, n, d, dtype, wrap=False)


def _shift_axes(x, axes):
    if axes is None:
        return tuple(range(ndim(x)))
    if isinstance(axes, (int, np.integer)):
        return (int(axes),)
    return tuple(int(a) for a in axes)


def fftshift(x, axes=None):
    """``jax.numpy.fft.fftshift``: the zero frequency moved to the centre: a roll by
    ``n//2`` along each of ``axes`` (all by default)."""
    x = _as_operand(x)
    axes = _shift_axes(x, axes)
    if not axes:
        return x
    return roll(x, tuple(shape(x)[a] // 2 for a in axes), axes)


def ifftshift(x, axes=None):
    """``jax.numpy.fft.ifftshift``: the inverse of ``fftshift``: a roll by ``−(n//2)``."""
    x = _as_operand(x)
    axes = _shift_axes(x, axes)
    if not axes:
        return x
    return roll(x, tuple(-(shape(x)[a] // 2) for a in axes), axes)
