"""The dtype helpers JAX exports from ``jax.dtypes`` beyond the dtypes themselves:
``itemsize_bits``, ``scalar_type_of`` and ``canonicalize_dtype`` (re-exported by
:mod:`cuvmap.dtypes`).

cuvmap computes in the dtypes it is given (JAX with ``jax_enable_x64`` on), so
``canonicalize_dtype`` is the identity on NumPy's dtypes: it never narrows 64-bit types."""
import numpy as np

try:  # optional dependency (the bfloat16 extra): ml_dtypes' finfo/iinfo know its types
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None


def _ml_dtype_bits(dtype):
    """The bits of one of ml_dtypes' types (bfloat16, float8_*, int4, ...), else None."""
    if _ml_dtypes is None or dtype.kind != "V" or dtype.fields is not None:
        return None
    for info in (_ml_dtypes.finfo, _ml_dtypes.iinfo):
        try:
            return int(info(dtype).bits)
        except (TypeError, ValueError):
            continue
    return None


def itemsize_bits(dtype):
    """``jax.dtypes.itemsize_bits``: the number of bits one element of ``dtype`` takes:
    8 for ``bool`` (its storage), the width of an integer or floating type, twice its
    parts' for a complex type, and the true width of ml_dtypes' sub-byte types (4 for
    ``int4``, where ``dtype.itemsize`` says 1 byte)."""
    if dtype is None:
        raise ValueError("itemsize_bits: dtype cannot be None")
    d = np.dtype(dtype)
    if d == np.dtype(bool):
        return 8
    if d.kind in "iufc":
        return 8 * d.itemsize
    bits = _ml_dtype_bits(d)
    if bits is None:
        raise ValueError(f"itemsize_bits: expected a boolean, integer, floating or complex dtype, got {d}")
    return bits


def scalar_type_of(x):
    """``jax.dtypes.scalar_type_of``: the Python scalar type of ``x``'s dtype (``bool``,
    ``int``, ``float`` or ``complex``); ``x`` is an array, a tracer, a scalar or a dtype."""
    if isinstance(x, np.dtype):
        d = x
    else:
        d = getattr(x, "dtype", None)
        d = np.result_type(x) if d is None else np.dtype(d)
    if d == np.dtype(bool):
        return bool
    if d.kind in "iu":
        return int
    if d.kind == "f":
        return float
    if d.kind == "c":
        return complex
    if _ml_dtypes is not None and _ml_dtype_bits(d) is not None:
        return int if "int" in d.name else float
    raise TypeError(f"scalar_type_of: {x!r} has no scalar type (dtype {d})")


def canonicalize_dtype(dtype, allow_extended_dtype=False):
    """``jax.dtypes.canonicalize_dtype``: the dtype cuvmap computes in for ``dtype``:
    ``numpy.dtype(dtype)`` (JAX's answer with 64-bit types enabled; cuvmap never narrows
    int64/float64/complex128)."""
    return np.dtype(dtype)


def is_weakly_typed(x):
    """``jax.dtypes.is_weakly_typed``: whether ``x`` is weakly typed — a Python ``int``,
    ``float`` or ``complex``, a value cuvmap computed from such numbers eagerly (a
    ``WeakArray``), or a traced value whose aval is weak (NOTE [eager weak arrays] in
    cuvmap/core/weak.py)."""
    if type(x) in (int, float, complex):
        return True
    aval = getattr(x, "aval", None)  # a tracer's (cuvmap.dtypes sits below cuvmap.core: no import of it)
    if aval is not None and not isinstance(x, np.ndarray):
        return bool(getattr(aval, "weak_type", False))
    return bool(getattr(x, "weak_type", False))  # WeakArray.weak_type is True; NumPy arrays have none
