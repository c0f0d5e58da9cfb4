"""``cupy.fft`` of the stand-in: the transforms cuvmap's ``lax.fft`` calls (cuFFT in CuPy,
NumPy's pocketfft here; single precision stays single, as in CuPy). As CuPy, a transform of
length 0 raises. ``irfftn`` over more than one axis raises here although CuPy runs it:
cuFFT's n-d complex-to-real plan assumes Hermitian symmetry along every axis, NumPy's (and
JAX's) ``irfftn`` only along the last, so CuPy's result differs from NumPy's for a spectrum
that is not symmetric along the others, and cuvmap must not call it (cuvmap/lax/fourier.py
decomposes). NOTE [the stand-in's surface] in cupy/_functions.py."""
import numpy as np

from cupy._functions import _function


def _checked(name, np_fn):
    def fn(a, *args, **kwargs):
        if 0 in a.shape:
            raise ValueError(f"cupy.fft.{name}: Invalid number of FFT data points (0) specified.")
        if name == "irfftn":
            axes = kwargs.get("axes")
            count = a.ndim if axes is None else len(axes)
            if count > 1:
                raise NotImplementedError(
                    "strict CuPy stand-in: cupy.fft.irfftn over several axes runs cuFFT's n-d C2R plan, which "
                    "assumes Hermitian symmetry along every axis (NumPy's irfftn: the last only); decompose it")
        return np_fn(a, *args, **kwargs)

    return fn


_NAMES = ("fft", "ifft", "rfft", "irfft", "fftn", "ifftn", "rfftn", "irfftn")
for _name in _NAMES:
    globals()[_name] = _function(_name, _checked(_name, getattr(np.fft, _name)), module="cupy.fft")

__all__ = list(_NAMES)
