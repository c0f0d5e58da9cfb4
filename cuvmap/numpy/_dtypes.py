"""Dtypes and the questions asked about them, as ``jax.numpy`` names them: the scalar
types (``float16`` … ``uint64``, ``bool``), the constants ``nan``, ``e`` and
``euler_gamma``, and ``dtype``, ``finfo``, ``iinfo``, ``issubdtype``, ``result_type``,
``promote_types``, ``can_cast`` and ``isdtype``. Each accepts arrays, tracers and Python
scalars where NumPy's accepts arrays: a tracer answers with its dtype, never its value.

Promotion is NumPy's (NEP 50: Python scalars are weak and take the array's dtype), which
is JAX's with 64-bit types enabled, and JAX's lattice for ``bfloat16`` (ml_dtypes' type,
which JAX, and cuvmap here, call floating: NOTE [bfloat16 computes in float32] in
cuvmap/core/bfloat16.py)."""
import numpy as np

from cuvmap import core
from cuvmap.core import Tracer
from cuvmap.core import bfloat16 as _bfloat16


float16 = np.float16
int8 = np.int8
int16 = np.int16
uint8 = np.uint8
uint16 = np.uint16
uint32 = np.uint32
uint64 = np.uint64
bool = np.bool_  # noqa: A001 - jax.numpy's name
int_ = np.int_
uint = np.uint
float_ = np.float64
floating = np.floating
integer = np.integer
signedinteger = np.signedinteger
unsignedinteger = np.unsignedinteger
inexact = np.inexact
complexfloating = np.complexfloating
flexible = np.flexible
character = np.character
number = np.number
generic = np.generic
nan = np.nan
e = np.e
euler_gamma = np.euler_gamma


def _dtype_or_value(x):
    """What NumPy's dtype functions may receive for ``x``: a tracer's dtype, else ``x``."""
    if isinstance(x, Tracer):
        return np.dtype(core.dtype_of(x))
    return x


def dtype(obj, align=False, copy=False):
    """``jnp.dtype``: the :class:`numpy.dtype` of a dtype-like, an array or a tracer."""
    if isinstance(obj, Tracer) or (hasattr(obj, "dtype") and not isinstance(obj, (type, np.dtype))):
        return np.dtype(obj.dtype)
    return np.dtype(obj, align=align, copy=copy)


def finfo(dtype_or_array):
    """``jnp.finfo``: the machine limits (``eps``, ``tiny``, ``max``, ``resolution``, ...)
    of a floating dtype, or of an array's or tracer's dtype."""
    return np.finfo(dtype(dtype_or_array))


def iinfo(dtype_or_array):
    """``jnp.iinfo``: the ``min``, ``max`` and ``bits`` of an integer dtype, or of an
    array's or tracer's dtype."""
    return np.iinfo(dtype(dtype_or_array))


def _is_bfloat16(x):
    try:
        return _bfloat16.is_bfloat16(np.dtype(x))
    except TypeError:
        return False


def issubdtype(arg1, arg2):
    """``jnp.issubdtype``: whether dtype ``arg1`` is lower than ``arg2`` in NumPy's type
    hierarchy (``issubdtype(float32, floating)`` is true). bfloat16 is floating, as in JAX
    (NumPy files it under ``np.void``)."""
    arg1, arg2 = _dtype_or_value(arg1), _dtype_or_value(arg2)
    if not isinstance(arg1, (np.ndarray, np.generic)) and _is_bfloat16(arg1):
        if isinstance(arg2, type) and issubclass(arg2, np.generic) and not _is_bfloat16(arg2):
            return arg2 in (np.floating, np.inexact, np.number, np.generic)
        return _is_bfloat16(arg2)
    return np.issubdtype(arg1, arg2)


_BFLOAT16_KINDS = ("real floating", "numeric")


def isdtype(dtype_, kind):
    """``jnp.isdtype`` (the array API's): whether ``dtype_`` is of ``kind``, a dtype or one
    of ``'bool'``, ``'signed integer'``, ``'unsigned integer'``, ``'integral'``,
    ``'real floating'``, ``'complex floating'``, ``'numeric'``, or a tuple of these
    (bfloat16 is a real floating type, as in JAX)."""
    dtype_ = np.dtype(_dtype_or_value(dtype_))
    if _bfloat16.is_bfloat16(dtype_):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        return any(k in _BFLOAT16_KINDS if isinstance(k, str) else _is_bfloat16(k) for k in kinds)
    return np.isdtype(dtype_, kind)


def _promotion_operand(x):
    """What :func:`_bfloat16.result_type` takes for ``x``: a Python scalar as is (weak), a
    dtype for anything else (an array, a tracer, a dtype-like)."""
    if type(x) in (int, float, complex, bool):
        return x
    x = _dtype_or_value(x)
    if isinstance(x, (np.ndarray, np.generic)) or (hasattr(x, "dtype") and not isinstance(x, type)):
        return np.dtype(x.dtype)
    try:
        return np.dtype(x)
    except TypeError:  # a list or another array-like
        return np.asarray(x).dtype


def result_type(*arrays_and_dtypes):
    """``jnp.result_type``: the dtype NumPy's promotion gives these operands (tracers by
    their dtypes; Python scalars weakly, so ``result_type(float32_array, 2.0)`` is float32),
    with JAX's lattice for bfloat16 (``result_type(bfloat16, int32)`` is bfloat16)."""
    operands = [_dtype_or_value(x) for x in arrays_and_dtypes]
    if not any(_is_bfloat16(_promotion_operand(o)) for o in operands if type(o) not in (int, float, complex, bool)):
        return np.result_type(*operands)
    return _bfloat16.result_type(*(_promotion_operand(x) for x in arrays_and_dtypes))


_WEAK_BUILTINS = {int: 0, float: 0.0, complex: 0j}


def promote_types(type1, type2):
    """``jnp.promote_types``: the smallest dtype both ``type1`` and ``type2`` cast to safely.
    As in JAX, the built-in types ``int``, ``float`` and ``complex`` are weak: they keep
    the other type's width (``promote_types(float32, complex)`` is complex64, NumPy's
    complex128); two built-ins give the 64-bit type."""
    weak = [_WEAK_BUILTINS.get(t) if isinstance(t, type) else None for t in (type1, type2)]
    if any(w is not None for w in weak):
        operands = [w if w is not None else np.dtype(_dtype_or_value(t)) for w, t in zip(weak, (type1, type2))]
        return result_type(*operands)
    return _bfloat16.promote_types(_dtype_or_value(type1), _dtype_or_value(type2))


def can_cast(from_, to, casting="safe"):
    """``jnp.can_cast``: whether a value of dtype ``from_`` (or a tracer's dtype) casts to
    ``to`` under the ``casting`` rule."""
    from_ = _dtype_or_value(from_)
    if casting == "safe" and (_is_bfloat16(_promotion_operand(from_)) or _is_bfloat16(to)):
        # JAX's rule: a safe cast is one whose promotion with the target is the target
        return _bfloat16.promote_types(_promotion_operand(from_), np.dtype(to)) == np.dtype(to)
    return np.can_cast(from_, to, casting=casting)
