"""Avals: the abstract value of an operand (its shape, dtype, weak type and device), the
shape structs that stand for arrays that are not there, and what shape rules share.
"""
import numpy as np

from cuvmap.core import bfloat16 as _bfloat16
from cuvmap.errors import ShapeError


class _ShapeProperties:
    """``ndim`` and ``size`` from ``shape``, as arrays have them (avals, shape structs,
    tracers)."""

    __slots__ = ()

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))


class ShapedArray(_ShapeProperties):
    """Shape, dtype and device of a value. ``weak_type`` marks Python scalars, which adopt
    the dtype of the arrays they meet (NumPy 2's NEP 50 rule, as in JAX). ``device`` is
    ``"cpu"``, ``"gpu:<id>"``, or ``None`` where it is not known (the avals shape rules
    return). All four take part in equality and hashing: a program staged for a weak
    ``2.0`` must not be reused for a float64 array, nor one staged on the CPU for a GPU."""

    __slots__ = ("shape", "dtype", "weak_type", "device")

    def __init__(self, shape, dtype, weak_type=False, device=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = weak_type
        self.device = device

    def __eq__(self, other):
        return (
            isinstance(other, ShapedArray)
            and self.shape == other.shape
            and self.dtype == other.dtype
            and self.weak_type == other.weak_type
            and self.device == other.device
        )

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type, self.device))

    def __repr__(self):
        return f"{self.dtype.name}{list(self.shape)}"


_PY_SCALAR_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}


class ShapeDtypeStruct(_ShapeProperties):
    """A shape and a dtype standing for an array that is not there (``jax.ShapeDtypeStruct``):
    :func:`cuvmap.eval_shape` returns them, and ``eval_shape`` and ``make_jaxpr`` accept
    them wherever an array goes, so a program can be staged or its output shapes known
    without making any array (of any size). ``weak_type`` marks a Python scalar's aval;
    ``device`` is ``"cpu"`` (the default) or a GPU's (``"gpu:0"``)."""

    __slots__ = ("shape", "dtype", "weak_type", "device")

    def __init__(self, shape, dtype, *, weak_type=False, device=None):
        if dtype is None:  # (np.dtype(None) is float64: JAX refuses instead)
            raise ValueError(f"ShapeDtypeStruct(shape={shape!r}): dtype must be specified")
        if shape is None or any(d is None for d in shape):
            raise ValueError(f"ShapeDtypeStruct: `shape` {shape!r} cannot have None (JAX's dimension of unknown "
                             "size); give every dimension its size")
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = bool(weak_type)
        self.device = "cpu" if device is None else device

    @property
    def aval(self):
        return ShapedArray(self.shape, self.dtype, self.weak_type, self.device)

    def __len__(self):  # as an array's (jax.ShapeDtypeStruct's)
        if not self.shape:
            raise TypeError("len() of unsized object (a ShapeDtypeStruct of shape ())")
        return self.shape[0]

    def __bool__(self):  # a struct stands for an array but is no value: always true, whatever its len
        return True

    def __repr__(self):
        weak = ", weak_type=True" if self.weak_type else ""
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name}{weak})"

    def __eq__(self, other):
        return (type(other) is ShapeDtypeStruct and self.shape == other.shape and self.dtype == other.dtype
                and self.weak_type == other.weak_type and self.device == other.device)

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type, self.device))


def as_array(x):
    """``x`` itself when it is an array (NumPy or CuPy), else ``numpy.asarray(x)`` (impls
    that call array methods also accept Python scalars)."""
    return x if hasattr(x, "shape") else np.asarray(x)


def shape_of(x):
    """Shape of an array, tracer or Python scalar (``()``)."""
    return getattr(x, "shape", ())


def dtype_of(x):
    t = type(x)
    if t in _PY_SCALAR_DTYPES:
        return np.dtype(_PY_SCALAR_DTYPES[t])
    return np.dtype(x.dtype)


def is_float(x):
    """True for floating-point and complex arrays/tracers and Python floats and complex
    numbers (the differentiable kinds)."""
    t = type(x)
    if t is float or t is complex:
        return True
    if t is int or t is bool:
        return False
    kind = x.dtype.kind
    return kind in "fc" or (kind == "V" and _bfloat16.is_bfloat16(x.dtype))


def common_float_dtype(*avals):
    """The one floating dtype that all ``avals`` share; :class:`ShapeError` otherwise (for
    primitives without type promotion, such as the conv and pooling families)."""
    dtypes = {a.dtype for a in avals}
    if len(dtypes) != 1:
        raise ShapeError("operands must share one dtype, got " + ", ".join(str(a.dtype) for a in avals))
    dtype = dtypes.pop()
    if _bfloat16.kind_of(dtype) != "f":
        raise ShapeError(f"operands must be floating point, got {dtype}")
    return dtype
