"""A strict stand-in for CuPy 14 that runs on the CPU (tests/strict_cupy, installed by
tests/conftest.py): its arrays wrap NumPy arrays and refuse what ``cupy.ndarray`` refuses,
so that a device-discipline defect fails the tests without a GPU. It is not a GPU: cuDNN
and NCCL are unavailable under it, its kernels are NumPy's (so it proves nothing about
speed, numerics of CUDA's math functions or compilation), and the real-device tests stay
the truth. What it checks: ``tests/strict_cupy/__init__.py``."""
import numpy as _np

from cupy import _functions
from cupy._kernel import ElementwiseKernel
from cupy._strict import ndarray

__version__ = "14.2.0"

# dtypes and constants: NumPy's own objects, as in CuPy
for _name in ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
              "float32", "float64", "complex64", "complex128", "intp", "uintp", "byte", "ubyte", "short",
              "ushort", "intc", "uintc", "longlong", "ulonglong", "half", "single", "double", "csingle",
              "cdouble", "int_", "uint", "float_", "complex_", "number", "integer", "signedinteger",
              "unsignedinteger", "floating", "complexfloating", "inexact", "generic", "dtype", "finfo", "iinfo",
              "promote_types", "issubdtype", "isscalar", "newaxis", "pi", "e", "inf", "nan", "euler_gamma",
              "broadcast_shapes", "mintypecode", "typename"):
    if hasattr(_np, _name):
        globals()[_name] = getattr(_np, _name)
bool = _np.bool_  # noqa: A001 - cupy.bool is NumPy's bool_



# CuPy's own versions of NumPy's dtype and shape queries (NumPy's would dispatch back here)
def result_type(*arrays_and_dtypes):
    return _np.result_type(*[a.dtype if isinstance(a, ndarray) else a for a in arrays_and_dtypes])


def can_cast(from_, to, casting="safe"):
    return _np.can_cast(from_.dtype if isinstance(from_, ndarray) else from_, to, casting=casting)


def common_type(*arrays):
    if not arrays:
        return _np.float16
    dtypes = []
    for a in arrays:
        if a.dtype.kind == "b":
            raise TypeError("can't get common type for non-numeric array")
        dtypes.append(_np.dtype("float64") if a.dtype.kind in "iu" else a.dtype)
    import functools
    return functools.reduce(_np.promote_types, dtypes).type


def min_scalar_type(a):
    return a.dtype if isinstance(a, ndarray) else _np.min_scalar_type(a)


def ndim(a):
    try:
        return a.ndim
    except AttributeError:
        return _np.ndim(a)


def shape(a):
    return a.shape if isinstance(a, ndarray) else _np.shape(a)


def size(a, axis=None):
    if isinstance(a, ndarray):
        return a.size if axis is None else a.shape[axis]
    return _np.size(a, axis)


globals().update(_functions.UFUNCS)
globals().update(_functions.FUNCTIONS)
ufunc = _functions.ufunc

from cupy import cuda, lib, linalg, random  # noqa: E402
from cupy import fft  # noqa: E402  (cuvmap's lax.fft: cuFFT through cupy.fft)
from cupy.cuda import Device, Stream  # noqa: E402,F401


def get_default_memory_pool():
    return cuda._default_pool


def get_default_pinned_memory_pool():
    return cuda._default_pinned_pool


def is_available():
    return True


def show_config():
    print("strict CuPy stand-in (tests/strict_cupy): NumPy", _np.__version__)


def __getattr__(name):
    raise AttributeError(f"module 'cupy' (the strict CuPy stand-in in tests/strict_cupy) has no attribute "
                         f"{name!r}; if CuPy 14 has it and cuvmap needs it, add it to the stand-in")
