"""A strict stand-in for CuPy 14 that runs on the CPU (tests/strict_cupy, installed by
tests/conftest.py): its arrays wrap NumPy arrays and refuse what ``cupy.ndarray`` refuses,
so that a device-discipline defect fails the tests without a GPU. It is not a GPU: cuDNN
and NCCL are unavailable under it, its kernels are NumPy's (so it proves nothing about
speed, numerics of CUDA's math functions or compilation), and the real-device tests stay
the truth. What it checks: ``tests/strict_cupy/__init__.py``."""
import numpy as _np

from cupy import _functions, _strict
from cupy._kernel import ElementwiseKernel
from cupy._strict import ndarray

__version__ = "14.2.0"

# dtypes and constants: NumPy's own objects, as in CuPy
for _name in ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
              "float32", "float64", "complex64", "complex128", "intp", "uintp", "byte", "ubyte", "short",
              "ushort", "intc", "uintc", "longlong", "ulonglong", "half", "single", "double", "csingle",
              "cdouble", "int_", "uint", "float_", "complex_", "number", "integer", "signedinteger",
              "unsignedinteger", "floating", "complexfloating", "inexact", "generic", "dtype", "finfo", "iinfo",
              "result_type", "promote_types", "can_cast", "issubdtype", "min_scalar_type", "common_type",
              "isscalar", "ndim", "shape", "size", "newaxis", "pi", "e", "inf", "nan", "euler_gamma",
              "broadcast_shapes", "mintypecode", "obj2sctype", "typename"):
    if hasattr(_np, _name):
        globals()[_name] = getattr(_np, _name)
bool = _np.bool_  # noqa: A001 - cupy.bool is NumPy's bool_

globals().update(_functions.UFUNCS)
globals().update(_functions.FUNCTIONS)
ufunc = _functions.ufunc

from cupy import cuda, linalg, random  # noqa: E402
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
