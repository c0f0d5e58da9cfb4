"""Running sums and products that skip NaNs, as ``jax.numpy`` names them: ``nancumsum``
and ``nancumprod``. NaNs are replaced by the identity (0, 1) with a select, so NaN
entries get a zero derivative, then :func:`cuvmap.numpy.cumsum` / ``cumprod`` run."""
import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._elementwise_composites import isnan
from cuvmap.numpy._reductions import _no_out, cumprod, cumsum


def _without_nans(a, identity, dtype):
    a = asarray(a)
    if np.dtype(core.dtype_of(a)).kind in "fc":
        a = ew.select(isnan(a), identity, a)
    if dtype is not None and np.dtype(dtype) == np.bool_ and core.dtype_of(a) != np.bool_:
        a = ew.ne(a, 0)  # a boolean result counts truth values, not the values' sums
    return a


def nancumsum(a, axis=None, dtype=None, out=None):
    """``jnp.nancumsum``: running sums along ``axis`` (``None``: of the flattened array)
    with NaNs counted as zero, in ``dtype`` or :func:`cuvmap.numpy.cumsum`'s."""
    _no_out("nancumsum", out)
    a = _without_nans(a, 0, dtype)
    if dtype is not None and np.dtype(dtype) == np.bool_:
        return astype(cumsum(a, axis, np.int64), np.bool_)
    return cumsum(a, axis, dtype)


def nancumprod(a, axis=None, dtype=None, out=None):
    """``jnp.nancumprod``: running products along ``axis`` (``None``: of the flattened
    array) with NaNs counted as one, in ``dtype`` or :func:`cuvmap.numpy.cumprod`'s."""
    _no_out("nancumprod", out)
    a = _without_nans(a, 1, dtype)
    if dtype is not None and np.dtype(dtype) == np.bool_:
        return astype(cumprod(a, axis, np.int64), np.bool_)
    return cumprod(a, axis, dtype)
