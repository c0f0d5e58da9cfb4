"""JAX's ``lax`` names that compose cuvmap's primitives: ``full_like``, ``empty``,
``broadcast_shapes``, ``axis_size``, ``div`` and ``rem`` with JAX's integer semantics (the
quotient rounded toward zero, the remainder with the dividend's sign), ``stack`` and
``unstack``, and ``iota`` with JAX's argument order.
"""
import numpy as np

from cuvmap import core
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing
from cuvmap.lax.bitwise import bitwise_and
from cuvmap.lax.shape import broadcast_in_dim, concatenate, expand_dims
from cuvmap.lax.slicing import index_in_dim


def full_like(x, fill_value, dtype=None, shape=None, sharding=None):
    """An array of ``x``'s shape and dtype (or ``shape``, ``dtype``) filled with
    ``fill_value``, on ``x``'s device (JAX's ``jax.lax.full_like``; ``sharding`` is
    accepted for JAX's signature: cuvmap arrays are on one device). A constant to every
    transform unless ``fill_value`` is traced: then the scalar ``fill_value`` broadcast, so
    derivatives flow to it."""
    aval = core.get_aval(x)
    dtype = aval.dtype if dtype is None else np.dtype(dtype)
    shape = aval.shape if shape is None else tuple(int(d) for d in shape)
    if isinstance(fill_value, Tracer):
        if np.ndim(fill_value) != 0:
            raise core.ShapeError(f"full_like: fill_value must be a scalar, got shape {np.shape(fill_value)}")
        return broadcast_in_dim(ew.convert_element_type(fill_value, dtype), shape, ())
    return core.full_like_concrete(x, fill_value, shape=shape, dtype=dtype)


def empty(shape, dtype, *, out_sharding=None):
    """An array of ``shape`` and ``dtype`` (JAX's ``jax.lax.empty``). JAX leaves its values
    unspecified; cuvmap's are zeros. A constant to every transform."""
    return np.zeros(_canonical_shape(shape, "empty"), np.dtype(dtype))


def _canonical_shape(shape, where):
    try:
        dims = tuple(shape)
    except TypeError:
        dims = (shape,)
    if isinstance(shape, str) or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"{where}: Shapes must be 1D sequences of concrete values of integer type, got {shape!r}")
    if any(d < 0 for d in dims):
        raise TypeError(f"{where}: Only non-negative indices are allowed when broadcasting static shapes, "
                        f"but got shape {shape!r}")
    return tuple(int(d) for d in dims)


def broadcast_shapes(*shapes):
    """The shape NumPy's broadcasting gives operands of ``shapes`` (JAX's
    ``jax.lax.broadcast_shapes``): shapes are aligned at their last dims, and each dim of
    the result is the one dim that is not 1 (or 1). Python ints; JAX's TypeError for a
    negative or non-integer dim, a :class:`~cuvmap.core.ShapeError` (a ValueError) naming
    the shapes when they do not broadcast. The broadcasting itself is the elementwise shape
    rule's (``cuvmap.lax.elementwise.common.broadcast_shapes``)."""
    shapes = [_canonical_shape(s, "broadcast_shapes") for s in shapes]
    try:
        return ew.broadcast_shapes(*shapes)
    except core.ShapeError as e:
        raise core.ShapeError(f"broadcast_shapes: Incompatible shapes for broadcasting: {e}") from None




def axis_size(axis_name):
    """The size of the named axis ``axis_name`` (a name or a tuple of names: the product of
    their sizes), bound by ``vmap(..., axis_name=)`` or a process group (JAX's
    ``jax.lax.axis_size``). A Python int: the sizes are static."""
    names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
    size = 1
    for name in names:
        size *= core.tracers.axis_frame(name, "axis_size").size
    return size


def _is_integer(x):
    dtype = core.dtype_of(x)
    return np.issubdtype(dtype, np.integer)


def _rounds_differently(x, r):
    """Where the floor and the truncation of ``x / y`` differ: the remainder ``r`` (with
    ``y``'s sign) is not 0 and its sign is not ``x``'s."""
    return bitwise_and(ew.ne(r, 0), ew.ne(ew.lt(r, 0), ew.lt(x, 0)))


def div(x, y):
    """``x / y`` (JAX's ``jax.lax.div``): true division of floating or complex operands;
    of integers, the quotient rounded toward zero, ``trunc(x / y)`` (``div(-7, 2) == -3``,
    where ``-7 // 2 == -4``), as C and XLA divide."""
    if _is_integer(x) and _is_integer(y):
        q = ew.floor_divide(x, y)
        return ew.select(_rounds_differently(x, ew.remainder(x, y)), ew.add(q, 1), q)
    return ew.div(x, y)


def rem(x, y):
    """``x − y·trunc(x / y)`` (JAX's ``jax.lax.rem``, C's ``fmod``): the remainder with the
    sign of the dividend ``x`` (``rem(-7, 2) == -1``, where NumPy's ``-7 % 2 == 1``). Its
    derivatives are 1 for ``x`` and ``−trunc(x / y)`` for ``y``, away from the jumps."""
    r = ew.remainder(x, y)
    return ew.select(_rounds_differently(x, r), ew.sub(r, y), r)


def iota(dtype, size=None, *, sharding=None, like=None):
    """``[0, 1, ..., size - 1]`` of ``dtype`` (JAX's ``jax.lax.iota(dtype, size)``), a
    constant to every transform, on the device of ``like`` (cuvmap's keyword; default the
    CPU). cuvmap's earlier order ``iota(size, dtype=int64)`` is accepted too: an int
    first is the size (no dtype is an int)."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        dtype, size = (np.int64 if size is None else size), dtype
    if size is None:
        raise TypeError("iota: give the dtype and the size, iota(dtype, size)")
    return indexing.iota(size, dtype, like=like)


def stack(operands, axis=0):
    """The operands (of one shape) along a new axis ``axis`` (JAX's ``jax.lax.stack``):
    ``stack(xs, axis)[..., k, ...] = xs[k]``."""
    operands = list(operands)
    if not operands:
        raise ValueError("stack: needs at least one array")
    rank = np.ndim(operands[0]) + 1
    if not -rank <= axis < rank:
        raise core.ShapeError(f"stack: axis {axis} is out of range for operands of rank {rank - 1}")
    axis = axis % rank
    return concatenate([expand_dims(x, (axis,)) for x in operands], axis)


def unstack(x, axis=0):
    """The slices of ``x`` along ``axis``, as a list (JAX's ``jax.lax.unstack``):
    ``unstack(x, axis)[k] = x[..., k, ...]``, the inverse of :func:`stack`."""
    rank = np.ndim(x)
    if not -rank <= axis < rank:
        raise core.ShapeError(f"unstack: axis {axis} is out of range for an operand of rank {rank}")
    axis = axis % rank
    return [index_in_dim(x, k, axis, keepdims=False) for k in range(core.shape_of(x)[axis])]
