"""The array-API names of ``jax.numpy``: the aliases ``asin``, ``acos``, ``atan``,
``atan2``, ``asinh``, ``acosh``, ``atanh``, ``pow``, ``concat``, and ``permute_dims``,
``matrix_transpose``, ``copy``, the products ``vecdot``, ``matvec``, ``vecmat``, and
``float0`` (``jax.dtypes.float0``, the dtype of integer inputs' cotangents) and
``broadcast_shapes``. Composites
of :mod:`cuvmap.lax` primitives."""

import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.dtypes import float0  # noqa: F401 - re-exported (jax.dtypes.float0)
from cuvmap.lax import elementwise as ew
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.jax_extras import broadcast_shapes as _lax_broadcast_shapes
from cuvmap.numpy import linalg
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._creation import array, asarray
from cuvmap.numpy._dtypes import result_type
from cuvmap.numpy._elementwise import power
from cuvmap.numpy._indexing import getitem
from cuvmap.numpy._products import _preferred_operands, _preferred_result, matmul
from cuvmap.numpy._shapes import concatenate, expand_dims, swapaxes
from cuvmap.core.bfloat16 import kind_of

asin = ew.asin
acos = ew.acos
atan = ew.atan
atan2 = ew.atan2
asinh = ew.asinh
acosh = ew.acosh
atanh = ew.atanh
pow = power  # noqa: A001 - the array API's name


def concat(arrays, /, *, axis=0):
    """``jnp.concat`` (the array API's ``concatenate``): the arrays joined along ``axis``
    (flattened first for ``axis=None``)."""
    return concatenate(arrays, axis=axis)


def permute_dims(a, /, axes):
    """``jnp.permute_dims`` (the array API's ``transpose``): dim ``i`` of the result is dim
    ``axes[i]`` of ``a``; ``axes`` is a permutation of the dims (negatives count from the
    end)."""
    a = asarray(a)
    n = ndim(a)
    axes = tuple(int(i) for i in axes)
    if sorted(i % n if -n <= i < n else i for i in axes) != list(range(n)):
        raise ValueError(f"permute_dims: axes {axes} is not a permutation of the {n} dims of an array of shape "
                         f"{shape(a)}")
    return lax_shape.transpose(a, tuple(i % n for i in axes))


def matrix_transpose(x, /):
    """``jnp.matrix_transpose``: the last two dims swapped (``x.mT``); ``x`` must have at
    least two."""
    x = asarray(x)
    if ndim(x) < 2:
        raise ValueError(f"matrix_transpose: x must have at least two dims, got shape {shape(x)}")
    return swapaxes(x, -1, -2)


def copy(a, order=None):
    """``jnp.copy``: a copy of ``a`` (a traced value is returned as it is: values are
    immutable)."""
    if order not in (None, "K", "C", "A"):
        raise NotImplementedError(f"copy: order={order!r} is not supported")
    return array(a, copy=True)


def vecdot(x1, x2, /, *, axis=-1, precision=None, preferred_element_type=None):
    """``jnp.vecdot``: ``Σ conj(x1)·x2`` along ``axis`` (counted in each operand's own
    dims), the other dims broadcast. ``precision`` and ``preferred_element_type`` as JAX's
    (NOTE [precision and preferred_element_type of the products] in
    ``cuvmap/numpy/_products.py``)."""
    x1, x2 = asarray(x1), asarray(x2)
    for x in (x1, x2):
        if not -ndim(x) <= axis < ndim(x):
            raise ShapeError(f"vecdot: axis {axis} is out of range for operands of shapes {shape(x1)} and "
                             f"{shape(x2)}")
    if shape(x1)[axis] != shape(x2)[axis]:
        raise ShapeError(f"vecdot: the contracted dims differ: shapes {shape(x1)} and {shape(x2)} with axis={axis}")
    x1, x2 = _preferred_operands(x1, x2, precision, preferred_element_type, "vecdot")
    # the operands' dtype, as JAX and NumPy (an integer sum would give int64)
    dtype = result_type(x1, x2) if preferred_element_type is None else preferred_element_type
    return _preferred_result(linalg.vecdot(x1, x2, axis=axis), dtype)


def matvec(x1, x2, /):
    """``jnp.matvec``: the matrix-vector product ``out[..., i] = Σ_j x1[..., i, j] · x2[...,
    j]``, the leading dims broadcast (``x1 (..., n, m)``, ``x2 (..., m)``)."""
    x1, x2 = asarray(x1), asarray(x2)
    if ndim(x1) < 2 or ndim(x2) < 1:
        raise ShapeError(f"matvec: x1 must have at least 2 dims and x2 at least 1, got shapes {shape(x1)} and "
                         f"{shape(x2)}")
    return getitem(matmul(x1, expand_dims(x2, -1)), (Ellipsis, 0))


def vecmat(x1, x2, /):
    """``jnp.vecmat``: the vector-matrix product ``out[..., j] = Σ_i conj(x1[..., i]) ·
    x2[..., i, j]``, the leading dims broadcast (``x1 (..., n)``, ``x2 (..., n, m)``)."""
    x1, x2 = asarray(x1), asarray(x2)
    if ndim(x1) < 1 or ndim(x2) < 2:
        raise ShapeError(f"vecmat: x1 must have at least 1 dim and x2 at least 2, got shapes {shape(x1)} and "
                         f"{shape(x2)}")
    if kind_of(core.dtype_of(x1)) == "c":
        x1 = ew.conj(x1)
    return getitem(matmul(expand_dims(x1, -2), x2), (Ellipsis, 0, slice(None)))


def broadcast_shapes(*shapes):
    """``jnp.broadcast_shapes``: the shape that ``shapes`` broadcast to (an int is a 1-d
    shape), as Python ints; a :class:`~cuvmap.core.ShapeError` (a ValueError) when they do
    not broadcast. :func:`cuvmap.lax.broadcast_shapes` with an int read as a 1-d shape."""
    return _lax_broadcast_shapes(*(s if np.iterable(s) else (s,) for s in shapes))
