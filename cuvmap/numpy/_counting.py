"""Counting occurrences, as ``jax.numpy`` names it: ``bincount``. One scatter-add of the
weights into the bins, so it differentiates in the weights, batches and (with a static
``length``) stages under ``jit``."""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import slicing
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._creation import asarray, ones, zeros
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._shapes import reshape
from cuvmap.core.bfloat16 import kind_of

_INTO_BINS = slicing.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                             scatter_dims_to_operand_dims=(0,))


def bincount(x, weights=None, minlength=0, *, length=None):
    """``jnp.bincount``: ``out[j] = Σ_{i: x_i = j} w_i`` (``w = 1`` without ``weights``,
    int64 counts) for the non-negative ints ``x`` (negative ones count in bin 0, as JAX
    clips them; booleans count as 0/1). The number of bins is ``length`` when given (a
    static int: values beyond it are dropped; needed under ``jit``), else
    ``max(minlength, max(x) + 1)`` from ``x``'s values."""
    x = asarray(x)
    if core.dtype_of(x) == np.bool_:
        x = astype(x, np.int64)
    if kind_of(core.dtype_of(x)) not in "iu":
        raise TypeError(f"bincount: x must be integers, got {core.dtype_of(x)}")
    if ndim(x) != 1:
        raise ShapeError(f"bincount: x must be 1-D, got shape {shape(x)}")
    if isinstance(minlength, Tracer):
        raise core.ConcretizationError("bincount: minlength must be a static int, not a traced value")
    minlength = int(minlength)
    if minlength < 0:
        raise ValueError(f"bincount: minlength must be non-negative, got {minlength}")
    if length is None:
        if isinstance(x, Tracer):
            raise core.ConcretizationError(
                "bincount: without length= the number of bins depends on x's values; pass a static length "
                "under jit or vmap")
        host = x.get() if backend.is_cupy_array(x) else np.asarray(x)
        length = max(minlength, int(max(0, host.max())) + 1 if host.size else 0)
    else:
        if isinstance(length, Tracer):
            raise core.ConcretizationError("bincount: length must be a static int, not a traced value")
        length = int(length)
    if weights is None:
        weights = ones(shape(x), dtype=np.int64, like=x)
    else:
        weights = asarray(weights)
        if tuple(shape(weights)) != tuple(shape(x)):
            raise ShapeError(f"bincount: weights of shape {shape(weights)} must have x's shape {shape(x)}")
        if core.dtype_of(weights) == np.bool_:
            weights = astype(weights, np.int64)
    bins = zeros((length,), dtype=core.dtype_of(weights), like=weights)
    index = reshape(ew.max(astype(x, np.int64), 0), (shape(x)[0], 1))
    return slicing.scatter_add(bins, index, weights, _INTO_BINS, mode="drop")
