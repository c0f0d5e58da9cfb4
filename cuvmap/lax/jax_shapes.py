"""JAX's signatures over cuvmap's shape and product primitives: ``pad(operand, padding_value,
padding_config)`` with ``(low, high, interior)`` triples (negative ``low``/``high`` crop),
``slice(operand, start_indices, limit_indices, strides)``, ``slice_in_dim``, ``broadcast``,
``reshape(..., dimensions=)``, ``rev``, ``dot``, ``dot_general(..., precision=,
preferred_element_type=)``, ``Precision`` and ``platform_dependent``. These are the
``cuvmap.lax`` names; the modules below keep their own signatures for cuvmap's internal use
(``shape.pad(x, pads, value)``, ``indexing.slice(x, slices)``, ``indexing.slice_in_dim(x,
start, stop, axis, step)``).

Each is a composition of primitives that have every rule (slice_p, pad_p, reshape_p,
concatenate_p, broadcast_in_dim_p, transpose_p, dot_general_p), so batching and derivatives
come from theirs: ``pad``'s transpose is a strided slice, ``rev``'s is ``rev``.
"""
import enum

import numpy as np

from cuvmap import backend, core, tree
from cuvmap.core import ShapeError
from cuvmap.lax import indexing, linalg, shape
from cuvmap.lax.elementwise import convert_element_type
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------------------

class Precision(enum.Enum):
    """JAX's ``jax.lax.Precision`` for ``dot``, ``dot_general`` and the convolutions:
    ``DEFAULT``, ``HIGH``, ``HIGHEST`` (also spelled ``"default"``, ``"high"``,
    ``"highest"``, ``"bfloat16"``, ``"tensorfloat32"``, ``"float32"``). Accepted and checked;
    it changes nothing: NumPy and CuPy compute float32 products in float32 at least (there is
    no bfloat16 pass as on TPUs)."""
    DEFAULT = 0
    HIGH = 1
    HIGHEST = 2

    def __repr__(self):
        return f"Precision.{self.name}"  # (JAX's text form of a product's params)

    @classmethod
    def _missing_(cls, value):
        names = {"default": cls.DEFAULT, "bfloat16": cls.DEFAULT, "high": cls.HIGH, "tensorfloat32": cls.HIGH,
                 "highest": cls.HIGHEST, "float32": cls.HIGHEST, "fastest": cls.DEFAULT}
        if isinstance(value, str) and value.lower() in names:
            return names[value.lower()]
        return None


def _check_precision(precision, fn):
    if precision is None:
        return
    pair = precision if isinstance(precision, (tuple, list)) else (precision,)
    for p in pair:
        if p is not None and not isinstance(p, Precision):
            try:
                Precision(p)
            except ValueError:
                raise ValueError(f"lax.{fn}: precision must be a lax.Precision, one of its names, or a pair of "
                                 f"them, got {precision!r}") from None


def canonical_precision(precision, fn):
    """JAX's canonical form of a product's ``precision``: None, or a pair of
    :class:`Precision` (one given applies to both operands), the form the equation records."""
    _check_precision(precision, fn)
    if precision is None:
        return None
    pair = tuple(precision) if isinstance(precision, (tuple, list)) else (precision, precision)
    if len(pair) != 2:
        raise ValueError(f"lax.{fn}: precision must be a lax.Precision or a pair of them, got {precision!r}")
    if all(p is None for p in pair):
        return None
    return tuple(Precision.DEFAULT if p is None else p if isinstance(p, Precision) else Precision(p) for p in pair)


# ---------------------------------------------------------------------------------------
# Products
# ---------------------------------------------------------------------------------------

def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """General tensor contraction: ``dimension_numbers = ((lhs_contract, rhs_contract),
    (lhs_batch, rhs_batch))``; the result's dims are batch, lhs free, rhs free.
    ``precision`` (:class:`Precision`) is accepted and changes nothing; with
    ``preferred_element_type`` the operands are converted to it first when they cast to it
    safely or it is a float type (so int8 operands accumulate in int32, as in JAX), else the
    result is converted. JAX: ``jax.lax.dot_general``."""
    precision = canonical_precision(precision, "dot_general")
    if preferred_element_type is not None:
        preferred = np.dtype(preferred_element_type)
        operands = np.result_type(core.dtype_of(lhs), core.dtype_of(rhs))
        if kind_of(preferred) in "fc" or np.can_cast(operands, preferred, "safe"):
            lhs, rhs = convert_element_type(lhs, preferred), convert_element_type(rhs, preferred)
            return linalg.dot_general(lhs, rhs, dimension_numbers, precision, preferred)
        return convert_element_type(linalg.dot_general(lhs, rhs, dimension_numbers, precision), preferred)
    return linalg.dot_general(lhs, rhs, dimension_numbers, precision)


def dot(lhs, rhs, precision=None, preferred_element_type=None, *, dimension_numbers=None):
    """The vector/matrix product of ranks 1 or 2: vector · vector (a scalar), matrix ·
    vector, matrix · matrix, contracting ``lhs``'s last dim with ``rhs``'s first; with
    ``dimension_numbers`` (``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``) it
    is :func:`dot_general`. JAX: ``jax.lax.dot``."""
    if dimension_numbers is not None:
        return dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type)
    nl, nr = len(core.shape_of(lhs)), len(core.shape_of(rhs))
    if nl not in (1, 2) or nr not in (1, 2):
        raise ShapeError(f"lax.dot: operands must have rank 1 or 2, got shapes {core.shape_of(lhs)} and "
                         f"{core.shape_of(rhs)}; pass dimension_numbers= or use lax.dot_general for others")
    return dot_general(lhs, rhs, (((nl - 1,), (0,)), ((), ())), precision, preferred_element_type)


# ---------------------------------------------------------------------------------------
# Slicing
# ---------------------------------------------------------------------------------------

def slice(operand, start_indices, limit_indices, strides=None):  # noqa: A001 - JAX's name
    """``operand[start_0:limit_0:stride_0, ...]`` with static non-negative bounds (one per
    dim; strides default to 1). JAX: ``jax.lax.slice``."""
    dims = core.shape_of(operand)
    strides = (1,) * len(dims) if strides is None else tuple(strides)
    if not len(start_indices) == len(limit_indices) == len(strides) == len(dims):
        raise ShapeError(f"lax.slice: needs one start, limit and stride per dim of {dims}, got {start_indices}, "
                         f"{limit_indices}, {strides}")
    for s, l, st, n in zip(start_indices, limit_indices, strides, dims):
        if not 0 <= int(s) <= int(l) <= n or int(st) < 1:
            raise ShapeError(f"lax.slice: bounds {tuple(start_indices)}:{tuple(limit_indices)}:{strides} do not fit "
                             f"{dims} (0 <= start <= limit <= size, stride >= 1)")
    return indexing.slice(operand, tuple((int(s), int(l), int(st))
                                         for s, l, st in zip(start_indices, limit_indices, strides)))


def slice_in_dim(operand, start_index, limit_index, stride=1, axis=0):
    """:func:`slice` along one ``axis``: ``start_index``/``limit_index`` may be None (the
    ends) or negative (from the end). JAX: ``jax.lax.slice_in_dim``."""
    dims = core.shape_of(operand)
    axis = int(axis) % len(dims)
    n = dims[axis]
    start = 0 if start_index is None else int(start_index)
    limit = n if limit_index is None else int(limit_index)
    start, limit = (start + n if start < 0 else start), (limit + n if limit < 0 else limit)
    starts, limits, strides = [0] * len(dims), list(dims), [1] * len(dims)
    starts[axis], limits[axis], strides[axis] = start, limit, int(stride)
    return slice(operand, starts, limits, strides)


def rev(operand, dimensions):
    """Reverses ``operand`` along each of ``dimensions``. JAX: ``jax.lax.rev``."""
    dims = core.shape_of(operand)
    flipped = {int(d) % len(dims) for d in dimensions} if dims else set()
    if not flipped:
        return operand
    return indexing.slice(operand, tuple((n - 1, None, -1) if i in flipped else (0, n, 1)
                                         for i, n in enumerate(dims)))


# ---------------------------------------------------------------------------------------
# Padding
# ---------------------------------------------------------------------------------------

def _interior(x, value, axis, interior):
    """``interior`` copies of ``value`` between neighbours along ``axis``: each element
    followed by a block of fillers (a concatenation on a new axis, then a reshape), the
    trailing block sliced away."""
    dims = core.shape_of(x)
    n = dims[axis]
    if n == 0:
        return x
    column = shape.expand_dims(x, (axis + 1,))
    fill_shape = dims[:axis + 1] + (interior,) + dims[axis + 1:]
    filler = shape.broadcast_in_dim(convert_element_type(value, core.dtype_of(x)), fill_shape, ())
    joined = shape.reshape(shape.concatenate([column, filler], axis + 1),
                           dims[:axis] + (n * (interior + 1),) + dims[axis + 1:])
    return indexing.slice_in_dim(joined, 0, n + (n - 1) * interior, axis)


def pad(operand, padding_value, padding_config):
    """Pads with the scalar ``padding_value``: ``padding_config`` holds one ``(low, high,
    interior)`` per dim: ``low``/``high`` copies at each end (negative values crop), and
    ``interior`` copies between neighbours. Its transpose slices the operand back out (a
    strided slice where ``interior > 0``); the derivative in ``padding_value`` sums the
    cotangent over the padding. JAX: ``jax.lax.pad``."""
    dims = core.shape_of(operand)
    config = tuple(tuple(int(v) for v in c) for c in padding_config)
    if len(config) != len(dims) or any(len(c) != 3 for c in config):
        raise ShapeError(f"lax.pad: padding_config needs one (low, high, interior) per dim of {dims}, got "
                         f"{padding_config}")
    if any(c[2] < 0 for c in config):
        raise ShapeError(f"lax.pad: interior padding must be non-negative, got {padding_config}")
    if core.shape_of(padding_value) != ():
        raise ShapeError(f"lax.pad: padding_value must be a scalar, got shape {core.shape_of(padding_value)}")
    for n, (lo, hi, interior) in zip(dims, config):
        if n + max(n - 1, 0) * interior + lo + hi < 0:
            raise ShapeError(f"lax.pad: padding {padding_config} of {dims} gives a negative size")
    x = operand
    for axis, (_, _, interior) in enumerate(config):
        if interior > 0:
            x = _interior(x, padding_value, axis, interior)
    # crop the negative ends, then pad the positive ones
    cropped = core.shape_of(x)
    starts = [max(-lo, 0) for lo, _, _ in config]
    limits = [n - max(-hi, 0) for n, (_, hi, _) in zip(cropped, config)]
    if any(starts) or limits != list(cropped):
        x = indexing.slice(x, tuple((s, l, 1) for s, l in zip(starts, limits)))
    pads = tuple((max(lo, 0), max(hi, 0)) for lo, hi, _ in config)
    if not any(lo or hi for lo, hi in pads):
        return x
    if not isinstance(padding_value, core.Tracer):
        return shape.pad(x, pads, np.asarray(padding_value).item())
    # a traced padding value: concatenate blocks of it (its derivative sums over them)
    value = convert_element_type(padding_value, core.dtype_of(x))
    for axis, (lo, hi) in enumerate(pads):
        dims_now = core.shape_of(x)
        parts = [x]
        if lo:
            parts.insert(0, shape.broadcast_in_dim(value, dims_now[:axis] + (lo,) + dims_now[axis + 1:], ()))
        if hi:
            parts.append(shape.broadcast_in_dim(value, dims_now[:axis] + (hi,) + dims_now[axis + 1:], ()))
        x = shape.concatenate(parts, axis)
    return x


# ---------------------------------------------------------------------------------------
# Broadcasting and reshaping
# ---------------------------------------------------------------------------------------

def broadcast(operand, sizes):
    """Adds leading dims of ``sizes``: the result's shape is ``sizes + operand.shape``.
    JAX: ``jax.lax.broadcast``."""
    dims = core.shape_of(operand)
    sizes = tuple(int(s) for s in sizes)
    if not sizes:
        return operand
    return shape.broadcast_in_dim(operand, sizes + dims, tuple(range(len(sizes), len(sizes) + len(dims))))


def reshape(operand, new_sizes, dimensions=None):
    """``operand`` in the shape ``new_sizes`` (C order); with ``dimensions``, the operand's
    dims are first permuted to that order (``reshape(transpose(operand, dimensions),
    new_sizes)``). JAX: ``jax.lax.reshape``."""
    if dimensions is not None:
        operand = shape.transpose(operand, tuple(dimensions))
    return shape.reshape(operand, tuple(new_sizes))


# ---------------------------------------------------------------------------------------
# platform_dependent
# ---------------------------------------------------------------------------------------

def platform_dependent(*args, default=None, **per_platform):
    """Calls the branch for the platform the operands live on: ``cuda(*args)`` when any
    operand is a CuPy array (or a value traced from one) and ``cuda`` is given, else
    ``cpu(*args)`` on the CPU, else ``default(*args)``. Branches for other platforms
    (``rocm``, ``tpu``, any name, as JAX's ``**per_platform``) are accepted and never
    chosen (cuvmap runs on neither). JAX: ``jax.lax.platform_dependent``."""
    for name, f in per_platform.items():
        if not callable(f):
            raise TypeError(f"lax.platform_dependent: the branch {name}= must be callable, got {f!r}")
    on_gpu = any(backend.backend_name(leaf) == "gpu" for leaf in tree.leaves(args))
    platform = "cuda" if on_gpu else "cpu"
    branch = per_platform.get(platform) or default
    if branch is None:
        # NotImplementedError with JAX's text (lowering finds no rule for the platform)
        raise NotImplementedError(f"lax.platform_dependent: no branch for the platform {platform} and no default "
                                  f"(translation rule for platform_dependent not found for platform {platform})")
    return branch(*args)
