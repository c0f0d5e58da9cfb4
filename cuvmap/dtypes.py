"""Dtypes beyond NumPy's that JAX code names (``jax.dtypes``): ``float0``, the dtype of
the tangents and gradients of integer and boolean values, and ``bfloat16`` when
``ml_dtypes`` (JAX's own dtype package, cuvmap's optional ``bfloat16`` extra) is installed
(NOTE [bfloat16 needs ml_dtypes]).

``float0`` is JAX's: a NumPy structured dtype with no bytes per element, so an array of
it holds no data; ``grad(f, allow_int=True)`` returns zeros of it for integer inputs,
whose derivative is zero (nothing flows through an integer).
"""
import numpy as np

float0 = np.dtype([("float0", np.void, 0)])


# NOTE [bfloat16 needs ml_dtypes]
# bfloat16 is not a NumPy dtype: JAX takes it from ml_dtypes, which registers it (and its
# casts and ufunc loops) with NumPy. cuvmap does likewise when ml_dtypes is installed
# (``pip install cuvmap[bfloat16]``): ``cuvmap.dtypes.bfloat16`` and
# ``cuvmap.numpy.bfloat16`` are ml_dtypes' type. Without ml_dtypes they are absent, and a
# dtype spelled "bfloat16" is refused by name (:func:`check_supported_dtype`).
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
