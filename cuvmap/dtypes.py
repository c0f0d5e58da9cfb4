"""Dtypes beyond NumPy's that JAX code names (``jax.dtypes``): ``float0``, the dtype of
the tangents and gradients of integer and boolean values, and ``bfloat16`` when
``ml_dtypes`` (JAX's own dtype package, cuvmap's optional ``bfloat16`` extra) is installed
(NOTE [bfloat16 needs ml_dtypes]).

``float0`` is JAX's: a NumPy structured dtype with no bytes per element, so an array of
it holds no data; ``grad(f, allow_int=True)`` returns zeros of it for integer inputs,
whose derivative is zero (nothing flows through an integer).
"""
import numpy as np

from cuvmap.dtypes_helpers import canonicalize_dtype, is_weakly_typed, itemsize_bits, scalar_type_of  # noqa: F401

float0 = np.dtype([("float0", np.void, 0)])


# NOTE [bfloat16 needs ml_dtypes]
# bfloat16 is not a NumPy dtype: JAX takes it from ml_dtypes, which registers it (and its
# casts and ufunc loops) with NumPy. cuvmap names ml_dtypes' type when ml_dtypes is
# installed (``pip install cuvmap[bfloat16]``): ``cuvmap.dtypes.bfloat16`` and
# ``cuvmap.numpy.bfloat16``. cuvmap computes with it on the CPU as JAX does, with JAX's
# promotions, each primitive in float32 rounded to bfloat16 (NOTE [bfloat16 computes in
# float32] in cuvmap/core/bfloat16.py). ml_dtypes' other types (float8_*, int4, ...) have
# no such rules in cuvmap: an input of one of them to a transform or to an eager
# primitive, a constant a staged function closes over, and a cast to one of them
# (``convert_element_type``, ``astype`` of a tracer: a derivative through it would be a
# silent zero) are refused by name (:func:`check_supported`), never computed with NumPy's
# promotions; cast to float32. Making arrays of them (``cnp.zeros(3, cnp.float8_e4m3fn)``,
# NumPy's own ``astype``) is NumPy's and works.
try:  # optional dependency (the bfloat16 extra)
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None

if _ml_dtypes is not None:
    bfloat16 = _ml_dtypes.bfloat16


def has_bfloat16():
    """Whether bfloat16 is available (``ml_dtypes`` is installed)."""
    return _ml_dtypes is not None


def zeros_float0(shape):
    """An array of ``float0`` zeros of ``shape`` (JAX's gradient of an integer value)."""
    return np.zeros(shape, dtype=float0)


def unsupported_dtype(x):
    """The name of ``x``'s dtype when it is one of ml_dtypes' that cuvmap does not compute
    with (float8_*, int4, ...: a NumPy dtype of kind ``"V"`` without fields, bfloat16
    aside), else None."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or type(x) in (bool, int, float, complex):
        return None
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    if dtype.kind == "V" and dtype.fields is None and not (_ml_dtypes is not None and dtype == bfloat16):
        return dtype.name
    return None


def check_supported(x, what, where):
    """Raises ``TypeError`` naming the dtype for a value of one of ml_dtypes' dtypes
    (NOTE [bfloat16 needs ml_dtypes]): ``what`` names the value (a string, or a function
    returning it: the name is built only for the error), ``where`` the transform."""
    name = unsupported_dtype(x)
    if name is not None:
        what = what() if callable(what) else what
        raise TypeError(
            f"{where}: {what} has dtype {name}, which cuvmap's transforms do not support yet (NumPy has no "
            f"{name}; ml_dtypes provides the type, but not JAX's promotion rules for it); cast it to float32 "
            "first (x.astype(numpy.float32))")
