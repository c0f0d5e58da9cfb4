"""The discrete Fourier transform: the primitive ``fft`` (JAX's ``lax.fft``), one primitive
for the four kinds of transform over the trailing ``len(fft_lengths)`` axes of its operand:

    FFT:   X[k] = Σ_j x[j] · exp(−2πi ⟨j, k / n⟩)               complex → complex
    IFFT:  x[j] = (1/N) Σ_k X[k] · exp(+2πi ⟨j, k / n⟩)         complex → complex
    RFFT:  the FFT of a real x, keeping k_last = 0 … n_last//2   real → complex
    IRFFT: the inverse of RFFT: the Hermitian half (last axis n_last//2 + 1 long) of a
           spectrum → the real signal of lengths ``fft_lengths``  complex → real

with n = ``fft_lengths``, N = Π n, j and k running over the multi-indices of the
transformed axes and ⟨j, k / n⟩ = Σ_a j_a k_a / n_a. The impls are NumPy's ``numpy.fft``
(pocketfft) and CuPy's ``cupy.fft`` (cuFFT); :mod:`cuvmap.numpy.fft` builds NumPy's
functions (``n=``, ``axes=``, ``norm=``, hfft, the 2-d and n-d forms) on this primitive.

The transform is linear: its JVP is the same transform of the tangent and its VJP the
transpose below (NOTE [the transposes of the Fourier transforms]); its batching rule keeps
a batch dim that lies before the transformed axes and moves any other to the front.
"""
import enum
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.elementwise import complex_numbers
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.shape import concatenate
from cuvmap.transforms import batching, complex_rules, vjp
from cuvmap.core import bfloat16 as _bfloat16
from cuvmap.core.bfloat16 import kind_of


class FftType(enum.IntEnum):
    """Which transform ``fft`` computes (JAX's ``lax.FftType``)."""

    FFT = 0    # forward, complex to complex
    IFFT = 1   # inverse, complex to complex
    RFFT = 2   # forward, real to complex (the Hermitian half)
    IRFFT = 3  # inverse, complex (the Hermitian half) to real


_BY_NAME = {"fft": FftType.FFT, "ifft": FftType.IFFT, "rfft": FftType.RFFT, "irfft": FftType.IRFFT}


# NOTE [fft and CUDA graphs]
# fft_p is not capturable (Primitive.capturable): CuPy makes a cuFFT plan at the first call
# of each shape (cufftMakePlan, with a work area from CuPy's memory pool), which nobody has
# checked inside a stream capture, so a jitted program with an fft replays equation by
# equation instead of as a CUDA graph. The executions themselves would capture; a plan made
# ahead of the capture is the way to allow it, when a device measures that it pays.
fft_p = Primitive("fft", owns_output=True, capturable=False)


# ---------------------------------------------------------------------------------------
# Public wrapper
# ---------------------------------------------------------------------------------------

def _fft_type(fft_type):
    if isinstance(fft_type, FftType):
        return fft_type
    if isinstance(fft_type, str):
        try:
            return _BY_NAME[fft_type.lower()]
        except KeyError:
            raise ValueError(f"lax.fft: unknown fft_type {fft_type!r}; use one of 'fft', 'ifft', 'rfft', 'irfft' "
                             "or a lax.FftType") from None
    raise TypeError(f"lax.fft: fft_type must be a lax.FftType or a string, got {fft_type!r}")


def _complex_dtype(dtype):
    """float32 (and float16) -> complex64; float64, integers and booleans -> complex128."""
    if kind_of(dtype) == "c":
        return dtype
    if kind_of(dtype) == "f":
        return _bfloat16.result_type(dtype, np.dtype(np.complex64))
    return np.dtype(np.complex128)


def _real_dtype(dtype):
    """complex64 -> float32, complex128 -> float64."""
    return np.finfo(dtype).dtype


def fft(x, fft_type, fft_lengths):
    """JAX's ``lax.fft``: the discrete Fourier transform over the trailing
    ``len(fft_lengths)`` axes of ``x`` (module docstring: the four ``fft_type``\\ s, a
    :class:`FftType` or ``'fft'``, ``'ifft'``, ``'rfft'``, ``'irfft'``).

    ``x``'s trailing dims must be ``fft_lengths`` (FFT, IFFT, RFFT), or for IRFFT
    ``fft_lengths[:-1]`` then ``fft_lengths[-1] // 2 + 1``. FFT, IFFT and IRFFT convert a real
    ``x`` to complex (float32 → complex64, float64 and integers → complex128); RFFT takes a
    real ``x`` (integers become float64) and refuses a complex one. No normalisation but
    IFFT's and IRFFT's 1/N (NumPy's ``norm="backward"``). Empty ``fft_lengths``: ``x``,
    converted."""
    typ = _fft_type(fft_type)
    if not isinstance(x, core.Tracer) and not hasattr(x, "dtype"):
        x = np.asarray(x)
    try:
        lengths = tuple(int(n) for n in fft_lengths)
    except TypeError:
        raise TypeError(f"lax.fft: fft_lengths must be a sequence of ints, got {fft_lengths!r}") from None
    dtype = core.dtype_of(x)
    if typ == FftType.RFFT:
        if kind_of(dtype) == "c":
            raise ShapeError(f"lax.fft: RFFT takes a real operand, got {dtype} of shape {core.shape_of(x)}")
        if _bfloat16.is_bfloat16(dtype):  # (jnp.fft.rfft casts it to float32 first, as JAX's)
            raise ShapeError(f"lax.fft: RFFT input must be float32 or float64, got {dtype.name}")
        want = np.dtype(np.float32) if dtype in (np.float16, np.float32) else np.dtype(np.float64)
    else:
        want = _complex_dtype(dtype)
    if dtype != want:
        x = ew.convert_element_type(x, want)
    if not lengths:
        return x
    return fft_p.bind(x, fft_type=typ, fft_lengths=lengths)


# ---------------------------------------------------------------------------------------
# Shape rule
# ---------------------------------------------------------------------------------------

def _fft_shape_rule(x, *, fft_type, fft_lengths):
    # the shape checks come first and use JAX's wording (its tests match it)
    k = len(fft_lengths)
    name = fft_type.name
    if k == 0:
        raise ShapeError(f"lax.fft: {name} needs 1 to {x.ndim} fft_lengths, got {fft_lengths}")
    if k > x.ndim:
        raise ShapeError(f"lax.fft: {name} input shape {x.shape} must have at least as many input dimensions as "
                         f"fft_lengths {fft_lengths} (it takes 1 to {x.ndim} fft_lengths)")
    if any(n < 0 for n in fft_lengths):
        raise ShapeError(f"lax.fft: fft_lengths {fft_lengths} must not be negative")
    lead, tail = x.shape[:-k], tuple(x.shape[-k:])
    if fft_type == FftType.IRFFT:
        if tail[:-1] != fft_lengths[:-1] or tail[-1] != fft_lengths[-1] // 2 + 1:
            raise ShapeError(f"lax.fft: IRFFT input shape {x.shape} minor dimensions must be equal to all except the "
                             f"last fft_length, got fft_lengths={fft_lengths} (the last dim must be "
                             f"{fft_lengths[-1] // 2 + 1}, fft_lengths[-1] // 2 + 1)")
    elif tail != fft_lengths:
        raise ShapeError(f"lax.fft: {name} input shape {x.shape} minor dimensions must be equal to fft_lengths "
                         f"{fft_lengths}")
    if fft_type == FftType.RFFT:
        if x.dtype not in (np.float32, np.float64):
            raise ShapeError(f"lax.fft: RFFT input must be float32 or float64, got {x.dtype}")
        shape, dtype = lead + fft_lengths[:-1] + (fft_lengths[-1] // 2 + 1,), _complex_dtype(x.dtype)
    elif fft_type == FftType.IRFFT:
        if kind_of(x.dtype) != "c":
            raise ShapeError(f"lax.fft: IRFFT takes a complex64 or complex128 operand, got {x.dtype}")
        shape, dtype = lead + fft_lengths, _real_dtype(x.dtype)
    else:
        if kind_of(x.dtype) != "c":
            raise ShapeError(f"lax.fft: {name} takes a complex64 or complex128 operand, got {x.dtype}")
        shape, dtype = x.shape, x.dtype
    return ShapedArray(tuple(shape), np.dtype(dtype), x.weak_type)


# ---------------------------------------------------------------------------------------
# Impl: numpy.fft on the CPU, cupy.fft (cuFFT) on the GPU
# ---------------------------------------------------------------------------------------

def _fft_impl(x, *, fft_type, fft_lengths):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    out = _fft_shape_rule(core.get_aval(x), fft_type=fft_type, fft_lengths=fft_lengths)
    if x.size == 0 or 0 in fft_lengths:
        # pocketfft and cuFFT refuse a transform of length 0; a sum over nothing is 0
        return xp.zeros(out.shape, out.dtype)
    k = len(fft_lengths)
    axes = tuple(range(x.ndim - k, x.ndim))
    if fft_type == FftType.FFT:
        y = xp.fft.fftn(x, axes=axes)
    elif fft_type == FftType.IFFT:
        y = xp.fft.ifftn(x, axes=axes)
    elif fft_type == FftType.RFFT:
        y = xp.fft.rfftn(x, axes=axes)
    elif k > 1 and xp is not np:
        # cuFFT's n-d complex-to-real transform assumes Hermitian symmetry along every axis;
        # NumPy's (and JAX's) IRFFT only along the last: inverse transforms of the outer
        # axes, then the 1-d one of the last (as JAX's GPU lowering does)
        y = xp.fft.irfft(xp.fft.ifftn(x, axes=axes[:-1]), n=fft_lengths[-1], axis=-1)
    else:
        y = xp.fft.irfftn(x, s=fft_lengths, axes=axes)
    return xp.ascontiguousarray(y.astype(out.dtype, copy=False))


fft_p.impl = _fft_impl
fft_p.shape_rule = _fft_shape_rule


# ---------------------------------------------------------------------------------------
# Batching rule
# ---------------------------------------------------------------------------------------

def _fft_batch(axis_size, vals, dims, *, fft_type, fft_lengths):
    (x,), (d,) = vals, dims
    if d >= len(x.shape) - len(fft_lengths):  # among the transformed axes: to the front
        x, d = batching.move_bdim(x, d, 0), 0
    return fft_p.bind(x, fft_type=fft_type, fft_lengths=fft_lengths), d


# ---------------------------------------------------------------------------------------
# JVP and transpose rules
# ---------------------------------------------------------------------------------------

# NOTE [the transposes of the Fourier transforms]
# Under the pairing ⟨u, v⟩ = re Σ u·v of NOTE [complex convention] (no conjugation), the
# transpose of a linear map is its plain transpose, as JAX's _fft_transpose_rule has it:
# - FFT and IFFT: the matrices exp(∓2πi jk/n) are symmetric, so each is its own transpose
#   (not the adjoint, which would be N·IFFT for the FFT).
# - RFFT (real x → the half X[0 … m−1], m = n//2 + 1): x̄_j = re Σ_k ct_k e^{−2πijk/n}.
#   IRFFT sums each inner bin k twice (k and n − k) and the DC bin (and for an even n the
#   Nyquist bin) once, taking their real parts: so x̄ = N · IRFFT(conj(ct) / w), with the
#   weights w = 1 at those bins and 2 elsewhere along the last axis.
# - IRFFT (X half → real x, x_j = (1/N) Σ_k w_k re(X_k e^{2πijk/n}) along the last axis
#   after the inverse transforms of the outer axes): X̄ = conj(w · RFFT(ct) / N). The
#   imaginary parts of the DC and Nyquist bins, which IRFFT ignores, get a zero
#   derivative: RFFT(ct) is real there.

def _hermitian_weighted(x, n, factor):
    """``x`` (whose last axis is the Hermitian half of a transform of length ``n``) with the
    bins that stand for two (all but DC and, for an even ``n``, the Nyquist bin) multiplied
    by ``factor`` (NOTE [the transposes of the Fourier transforms])."""
    axis = len(x.shape) - 1
    m = x.shape[axis]
    stop = m - 1 if n % 2 == 0 else m  # the Nyquist bin of an even n stands for one
    parts = [slice_in_dim(x, 0, 1, axis)]
    if stop > 1:
        parts.append(ew.mul(slice_in_dim(x, 1, stop, axis), factor))
    if max(stop, 1) < m:
        parts.append(slice_in_dim(x, stop, m, axis))
    return concatenate(parts, axis)


def _fft_transpose(ct, x, *, fft_type, fft_lengths):
    n_total = math.prod(fft_lengths)
    if fft_type == FftType.RFFT:
        half = _hermitian_weighted(complex_numbers.conj(ct), fft_lengths[-1], 0.5)
        return ew.mul(fft_p.bind(half, fft_type=FftType.IRFFT, fft_lengths=fft_lengths), float(n_total))
    if fft_type == FftType.IRFFT:
        spectrum = fft_p.bind(ct, fft_type=FftType.RFFT, fft_lengths=fft_lengths)
        weighted = _hermitian_weighted(spectrum, fft_lengths[-1], 2.0)
        # a transform of length 0 is the zero map, and so is its transpose
        return complex_numbers.conj(ew.mul(weighted, 1.0 / n_total if n_total else 0.0))
    return fft_p.bind(ct, fft_type=fft_type, fft_lengths=fft_lengths)


# ---------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------

batching.primitive_batchers[fft_p] = _fft_batch
vjp.deflinear(fft_p, _fft_transpose)
# complex-linear (FFT, IFFT) or real-linear with a real operand (RFFT) or output (IRFFT);
# the transposes above follow NOTE [complex convention]
complex_rules.defcomplex(fft_p)
