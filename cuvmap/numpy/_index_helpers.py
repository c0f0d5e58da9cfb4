"""Index arrays and counts, as ``jax.numpy`` names them: ``tri``, ``tril_indices``,
``triu_indices`` (and their ``_from`` forms), ``diag_indices`` (and ``_from``),
``indices``, ``unravel_index``, ``ravel_multi_index``, ``count_nonzero`` and
``isscalar``. The index arrays depend only on shapes, so they are constants; the
conversions between flat and multi-dimensional indices work on traced indices too."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._common import shape
from cuvmap.numpy._creation import asarray, diagonal_band
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._reductions import sum
from cuvmap.core.bfloat16 import kind_of


def tri(N, M=None, k=0, dtype=None):  # noqa: N803 - jax.numpy's names
    """``jnp.tri``: the ``N × M`` array with ones at and below diagonal ``k`` (``j ≤ i + k``;
    ``k`` may be traced)."""
    if isinstance(k, Tracer):
        return diagonal_band(N, M, k, dtype, ew_eq=False)
    return np.tri(int(N), None if M is None else int(M), int(k), dtype=dtype or np.float64)


def tril_indices(n, k=0, m=None):
    """``jnp.tril_indices``: the (row, column) indices of the entries at and below
    diagonal ``k`` of an ``n × m`` array, in row-major order."""
    return np.tril_indices(int(n), int(k), None if m is None else int(m))


def triu_indices(n, k=0, m=None):
    """``jnp.triu_indices``: the (row, column) indices of the entries at and above
    diagonal ``k`` of an ``n × m`` array, in row-major order."""
    return np.triu_indices(int(n), int(k), None if m is None else int(m))


def _matrix_shape(arr, name):
    s = shape(arr)
    if len(s) != 2:
        raise ShapeError(f"{name}: the array must be 2-D, got shape {s}")
    return s


def tril_indices_from(arr, k=0):
    """``jnp.tril_indices_from``: :func:`tril_indices` for ``arr``'s (2-D) shape."""
    n, m = _matrix_shape(arr, "tril_indices_from")
    return tril_indices(n, k, m)


def triu_indices_from(arr, k=0):
    """``jnp.triu_indices_from``: :func:`triu_indices` for ``arr``'s (2-D) shape."""
    n, m = _matrix_shape(arr, "triu_indices_from")
    return triu_indices(n, k, m)


def diag_indices(n, ndim=2):
    """``jnp.diag_indices``: ``ndim`` copies of ``arange(n)``, the indices of the main
    diagonal of an ``n × … × n`` array."""
    if n < 0:
        raise ValueError(f"diag_indices: n must be non-negative, got {n}")
    return np.diag_indices(int(n), int(ndim))


def diag_indices_from(arr):
    """``jnp.diag_indices_from``: :func:`diag_indices` of ``arr``, whose dims must all be equal."""
    s = shape(arr)
    if len(s) < 2 or len(set(s)) != 1:
        raise ValueError(f"diag_indices_from: all dims of the array must be equal and at least 2, got shape {s}")
    return diag_indices(s[0], len(s))


def indices(dimensions, dtype=None, sparse=False):
    """``jnp.indices``: the grid of indices of an array of shape ``dimensions``:
    ``out[k][i0, …, in] = ik`` (broadcastable pieces with ``sparse``)."""
    return np.indices(tuple(int(d) for d in dimensions), dtype=dtype or np.int64, sparse=sparse)


def unravel_index(indices, shape):  # noqa: A002 - jax.numpy's name
    """``jnp.unravel_index``: the multi-dimensional indices into an array of ``shape`` of
    the flat (row-major) ``indices``: ``i_k = (flat // stride_k) mod shape[k]``. Negative
    flat indices count from the end (JAX's convention; NumPy raises); out-of-range ones
    are clipped, as JAX does."""
    shape = tuple(int(s) for s in ((shape,) if isinstance(shape, (int, np.integer)) else shape))
    total = int(np.prod(shape, dtype=np.int64))
    flat = asarray(indices)
    if kind_of(core.dtype_of(flat)) not in "iu":
        raise TypeError(f"unravel_index: indices must be integers, got {core.dtype_of(flat)}")
    flat = ew.select(ew.lt(flat, 0), ew.add(flat, total), flat)
    flat = ew.min(ew.max(flat, 0), max(total - 1, 0))
    out = []
    for k, dim in enumerate(shape):
        stride = int(np.prod(shape[k + 1:], dtype=np.int64))
        out.append(ew.remainder(ew.floor_divide(flat, stride), dim) if dim > 0 else ew.mul(flat, 0))
    return tuple(out)


def ravel_multi_index(multi_index, dims, mode="raise", order="C", *, dtype=None):
    """``jnp.ravel_multi_index``: the flat index ``Σ_k i_k · stride_k`` of the indices
    ``multi_index`` (one array per dim) into an array of shape ``dims``; ``mode`` is
    ``'raise'`` (concrete indices only), ``'wrap'``, ``'clip'`` or ``'ignore'`` (the
    caller promises in-bounds indices: no check, as JAX); ``order='F'`` for
    column-major strides. The result is int64, or the integer ``dtype`` (which must
    hold ``prod(dims) − 1``)."""
    dims = tuple(int(d) for d in dims)
    if len(multi_index) != len(dims):
        raise ValueError(f"ravel_multi_index: {len(multi_index)} index arrays for {len(dims)} dims")
    if order not in ("C", "F"):
        raise ValueError(f"ravel_multi_index: order must be 'C' or 'F', got {order!r}")
    index = multi_index_arrays = [asarray(i) for i in multi_index]
    for i in index:
        if kind_of(core.dtype_of(i)) not in "iu":
            raise TypeError(f"ravel_multi_index: indices must be integers, got {core.dtype_of(i)}")
    if mode == "raise":
        for i, d in zip(index, dims):
            if isinstance(i, Tracer):
                raise core.ConcretizationError("ravel_multi_index: mode='raise' needs concrete indices; use mode='clip' or 'wrap'")
            host = i.get() if hasattr(i, "get") else np.asarray(i)
            if host.size and (host.min() < 0 or host.max() >= d):
                raise ValueError(f"invalid entry in coordinates array (ravel_multi_index: an index outside "
                                 f"[0, {d}) for a dim of size {d})")
    elif mode == "wrap":  # in int64: a narrow index dtype may not hold the dims
        index = [ew.remainder(astype(i, np.int64), d) for i, d in zip(index, dims)]
    elif mode == "clip":
        index = [ew.min(ew.max(astype(i, np.int64), 0), d - 1) for i, d in zip(index, dims)]
    elif mode != "ignore":
        raise ValueError(f"ravel_multi_index: mode must be 'raise', 'wrap', 'clip' or 'ignore', got {mode!r}")
    largest = int(np.prod(dims, dtype=np.int64)) - 1
    if dtype is None:  # the indices' dtype (as JAX), or int64 where that cannot hold the flat indices
        out_dtype = np.result_type(*[core.dtype_of(i) for i in multi_index_arrays]) if index else np.dtype(np.int64)
        if largest > np.iinfo(out_dtype).max:
            out_dtype = np.dtype(np.int64)
    else:
        out_dtype = np.dtype(dtype)
    if kind_of(out_dtype) not in "iu":
        raise ValueError(f"ravel_multi_index: dtype must be an integer dtype, got {out_dtype}")
    if largest > np.iinfo(out_dtype).max:
        raise ValueError(f"ravel_multi_index: dtype {out_dtype} cannot hold the flat indices of an array "
                         f"of shape {dims}")
    order_dims = range(len(dims)) if order == "C" else reversed(range(len(dims)))
    strides = {}
    stride = 1
    for k in reversed(list(order_dims)):
        strides[k] = stride
        stride *= dims[k]
    out = 0
    for k, i in enumerate(index):
        term = ew.mul(astype(i, out_dtype), strides[k])
        out = term if isinstance(out, int) else ew.add(out, term)
    return asarray(np.zeros((), out_dtype)) if isinstance(out, int) else out


def count_nonzero(a, axis=None, keepdims=False):
    """``jnp.count_nonzero``: how many entries over ``axis`` are nonzero (int64)."""
    return sum(astype(ew.ne(asarray(a), 0), np.int64), axis, keepdims=keepdims)


def isscalar(element):
    """``jnp.isscalar``: true for Python and NumPy scalars and for 0-d arrays and tracers
    (JAX treats those as scalars)."""
    if isinstance(element, (int, float, complex, bool, np.generic)):
        return True
    if isinstance(element, Tracer) or hasattr(element, "shape"):
        return len(shape(element)) == 0
    return False
