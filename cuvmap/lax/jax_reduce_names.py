"""JAX's ``lax.reduce_prod``, ``reduce_and``, ``reduce_or``, ``reduce_xor``, ``full``,
``broadcasted_iota`` and ``collapse``: composites of :func:`cuvmap.lax.reduce` (whose
monoid rules apply: products differentiate, the logical reductions have no derivative),
``broadcast_in_dim``, ``iota`` and ``reshape``, so every transform applies."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import bitwise, indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import elementwise as ew
from cuvmap.lax.reducers import reduce
from cuvmap.core.bfloat16 import kind_of


def _axes(name, operand, axes):
    rank = len(core.shape_of(operand))
    axes = tuple(int(a) for a in axes)
    if any(not -rank <= a < rank for a in axes) or len(set(a % max(rank, 1) for a in axes)) != len(axes):
        raise ShapeError(f"{name}: axes {axes} must be distinct dims of an operand of shape {core.shape_of(operand)}")
    return tuple(a % rank for a in axes)


def _identity(operand, value):
    return np.asarray(value, dtype=core.dtype_of(operand))


def reduce_prod(operand, axes):
    """``jax.lax.reduce_prod``: the product over ``axes`` (its derivative is exact where the
    operand has zeros, :func:`reduce`'s product rule)."""
    return reduce(operand, _identity(operand, 1), ew.mul, _axes("reduce_prod", operand, axes))


def _check_logical(name, operand):
    if kind_of(core.dtype_of(operand)) not in "biu":
        raise TypeError(f"{name}: needs a boolean or integer operand, got {core.dtype_of(operand)}")


def reduce_and(operand, axes):
    """``jax.lax.reduce_and``: bitwise (booleans: logical) AND over ``axes``."""
    _check_logical("reduce_and", operand)
    all_bits = np.invert(np.zeros((), core.dtype_of(operand)))
    return reduce(operand, all_bits, bitwise.bitwise_and, _axes("reduce_and", operand, axes))


def reduce_or(operand, axes):
    """``jax.lax.reduce_or``: bitwise (booleans: logical) OR over ``axes``."""
    _check_logical("reduce_or", operand)
    return reduce(operand, _identity(operand, 0), bitwise.bitwise_or, _axes("reduce_or", operand, axes))


def reduce_xor(operand, axes):
    """``jax.lax.reduce_xor``: bitwise (booleans: logical) XOR over ``axes``."""
    _check_logical("reduce_xor", operand)
    return reduce(operand, _identity(operand, 0), bitwise.bitwise_xor, _axes("reduce_xor", operand, axes))


def full(shape, fill_value, dtype=None, *, sharding=None):
    """``jax.lax.full``: an array of ``shape`` filled with ``fill_value`` (a scalar, traced
    or not), in ``dtype`` (default: the fill value's)."""
    dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if isinstance(fill_value, Tracer) or hasattr(fill_value, "shape"):
        if core.shape_of(fill_value) != ():
            raise ShapeError(f"full: fill_value must be a scalar, got shape {core.shape_of(fill_value)}")
        value = fill_value if dtype is None else ew.convert_element_type(fill_value, np.dtype(dtype))
    else:
        value = np.asarray(fill_value, dtype=dtype)
    return lax_shape.broadcast_in_dim(value, dims, ())


def broadcasted_iota(dtype, shape, dimension, *, sharding=None):
    """``jax.lax.broadcasted_iota``: ``out[i_0, ..., i_n] = i_dimension`` in ``dtype``, of
    ``shape`` (a constant)."""
    dims = tuple(int(d) for d in shape)
    if not 0 <= int(dimension) < len(dims):
        raise ShapeError(f"broadcasted_iota: dimension {dimension} is out of range for shape {dims}")
    line = indexing.iota(dims[int(dimension)], np.dtype(dtype))
    return lax_shape.broadcast_in_dim(line, dims, (int(dimension),))


def collapse(operand, start_dimension, stop_dimension=None):
    """``jax.lax.collapse``: dims ``start_dimension`` to ``stop_dimension`` (exclusive;
    default: the last) merged into one, row-major."""
    s = core.shape_of(operand)
    rank = len(s)
    start = int(start_dimension) + (rank if int(start_dimension) < 0 else 0)
    stop = rank if stop_dimension is None else int(stop_dimension) + (rank if int(stop_dimension) < 0 else 0)
    if not 0 <= start <= stop <= rank:
        raise ShapeError(f"collapse: dims {start_dimension}:{stop_dimension} do not fit shape {s}")
    merged = int(np.prod(s[start:stop], dtype=np.int64))
    return lax_shape.reshape(operand, tuple(s[:start]) + (merged,) + tuple(s[stop:]))
