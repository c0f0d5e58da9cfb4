"""Shape primitives: reshape, transpose, broadcast_in_dim, squeeze, expand_dims,
concatenate and pad.

All of them are linear, so each JVP rule applies the primitive to the tangent and each
VJP rule is the transpose: reshape back, inverse permutation, sum over broadcast dims,
slice the pieces of a concatenation, slice away padding.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.transforms.batching import move_bdim, physical_axis


# ---------------------------------------------------------------------------------------
# reshape
# ---------------------------------------------------------------------------------------


def _reshape_shape_rule(x, *, new_sizes):
    if int(np.prod(x.shape, dtype=np.int64)) != int(np.prod(new_sizes, dtype=np.int64)):
        raise ShapeError(f"cannot reshape {x.shape} ({int(np.prod(x.shape))} elements) to {new_sizes}")
    return ShapedArray(new_sizes, x.dtype, x.weak_type)


# The layouts of the views, for the plan's memory estimate (the ``layout`` fact of
# cuvmap.core.Primitive; NOTE [planned peak memory] in cuvmap/transforms/executor/peak_memory.py):
# ``(allocates, strided)``.

def _view_keeps_layout(strided, in_avals, out_avals, params):
    """A view in its operand's layout (squeeze, size-1 dims added)."""
    return False, strided[0]


def _view_strided(strided, in_avals, out_avals, params):
    """A view that may not be in C order (a transpose, a broadcast, a slice)."""
    return False, True


def _reshape_layout(strided, in_avals, out_avals, params):
    """A view of an operand in C order; of any other, a copy (in C order)."""
    return strided[0], False


reshape_p = Primitive("reshape", impl=lambda x, *, new_sizes: core.as_array(x).reshape(new_sizes),
                      shape_rule=_reshape_shape_rule, layout=_reshape_layout)


def reshape(x, new_sizes):
    """``x.reshape(new_sizes)``; ``new_sizes`` is a tuple of non-negative ints (no -1)."""
    new_sizes = tuple(map(int, new_sizes))
    if getattr(x, "shape", ()) == new_sizes:  # core.shape_of, inlined: the rules reshape often
        return x
    return reshape_p.bind(x, new_sizes=new_sizes)


def _reshape_batch(axis_size, vals, dims, *, new_sizes):
    (x,), (d,) = vals, dims
    x = move_bdim(x, d, 0)
    return reshape(x, (x.shape[0],) + new_sizes), 0


batching.primitive_batchers[reshape_p] = _reshape_batch
vjp.deflinear(reshape_p, lambda ct, x, *, new_sizes: reshape(ct, x.shape))


# ---------------------------------------------------------------------------------------
# transpose
# ---------------------------------------------------------------------------------------


def argsort_ints(values):
    """``numpy.argsort`` of a few distinct ints (a permutation's inverse, the order of a
    rule's axes), as a tuple of Python ints worked out in Python: no NumPy call per bind."""
    return tuple(sorted(range(len(values)), key=values.__getitem__))


def _transpose_shape_rule(x, *, permutation):
    if sorted(permutation) != list(range(x.ndim)):
        raise ShapeError(f"permutation {permutation} is not a permutation of the {x.ndim} axes of {x.shape}")
    return ShapedArray(tuple(x.shape[p] for p in permutation), x.dtype, x.weak_type)


transpose_p = Primitive("transpose", impl=lambda x, *, permutation: core.as_array(x).transpose(permutation),
                        shape_rule=_transpose_shape_rule, layout=_view_strided)


def transpose(operand, permutation):
    """Permutes the axes: output axis ``i`` is input axis ``permutation[i]``."""
    permutation = tuple(map(int, permutation))
    if permutation == tuple(range(len(permutation))):
        return operand
    return transpose_p.bind(operand, permutation=permutation)


def _transpose_batch(axis_size, vals, dims, *, permutation):
    (x,), (d,) = vals, dims
    perm = (d,) + tuple(physical_axis(p, d) for p in permutation)
    return transpose(x, perm), 0


batching.primitive_batchers[transpose_p] = _transpose_batch
vjp.deflinear(transpose_p, lambda ct, x, *, permutation: transpose(ct, argsort_ints(permutation)))


# ---------------------------------------------------------------------------------------
# broadcast_in_dim
# ---------------------------------------------------------------------------------------


def _broadcast_in_dim_shape_rule(x, *, shape, broadcast_dimensions):
    if len(broadcast_dimensions) != x.ndim:
        raise ShapeError(f"broadcast_dimensions {broadcast_dimensions} must name one output dim per dim of {x.shape}")
    for i, d in enumerate(broadcast_dimensions):
        if not 0 <= d < len(shape) or x.shape[i] not in (1, shape[d]):
            raise ShapeError(f"cannot broadcast {x.shape} to {shape} along dims {broadcast_dimensions}")
    if list(broadcast_dimensions) != sorted(broadcast_dimensions):
        raise ShapeError(f"broadcast_dimensions {broadcast_dimensions} must be increasing")
    return ShapedArray(shape, x.dtype, x.weak_type)


def _broadcast_in_dim_impl(x, *, shape, broadcast_dimensions):
    x = core.as_array(x)
    expanded = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        expanded[d] = x.shape[i]
    return backend.xp_of(x).broadcast_to(x.reshape(expanded), shape)


broadcast_in_dim_p = Primitive("broadcast_in_dim", impl=_broadcast_in_dim_impl, shape_rule=_broadcast_in_dim_shape_rule,
                               layout=_view_strided)


def broadcast_in_dim(operand, shape, broadcast_dimensions):
    """Broadcasts ``operand`` to ``shape``; dim ``i`` of ``operand`` becomes dim
    ``broadcast_dimensions[i]`` of the output (size 1 or equal)."""
    shape = tuple(map(int, shape))
    broadcast_dimensions = tuple(map(int, broadcast_dimensions))
    if core.shape_of(operand) == shape:
        return operand
    return broadcast_in_dim_p.bind(operand, shape=shape, broadcast_dimensions=broadcast_dimensions)


def broadcast_to(x, shape):
    """NumPy's ``broadcast_to``: trailing dims aligned."""
    shape = tuple(shape)
    s = core.shape_of(x)
    if s == shape:
        return x
    if len(s) > len(shape):
        raise ShapeError(f"broadcast_to: Cannot broadcast to shape with fewer dimensions: arr_shape={s} shape={shape}")
    if any(a not in (1, b) for a, b in zip(s, shape[len(shape) - len(s):])):
        raise ShapeError(f"broadcast_to: Incompatible shapes for broadcasting: {s} and requested shape {shape}")
    return broadcast_in_dim(x, shape, tuple(range(len(shape) - len(s), len(shape))))


def _broadcast_in_dim_batch(axis_size, vals, dims, *, shape, broadcast_dimensions):
    (x,), (d,) = vals, dims
    x = move_bdim(x, d, 0)
    return (
        broadcast_in_dim(x, (x.shape[0],) + shape, (0,) + tuple(b + 1 for b in broadcast_dimensions)),
        0,
    )


def _broadcast_in_dim_transpose(ct, x, *, shape, broadcast_dimensions):
    x_shape = core.shape_of(x)
    summed = tuple(
        d for d in range(len(shape))
        if d not in broadcast_dimensions
        or (x_shape[broadcast_dimensions.index(d)] == 1 and shape[d] != 1)
    )
    from cuvmap.lax.reduction import reduce_sum  # a cycle: reduce_sum's transpose is a broadcast

    return reshape(reduce_sum(ct, summed), x_shape)


batching.primitive_batchers[broadcast_in_dim_p] = _broadcast_in_dim_batch
vjp.deflinear(broadcast_in_dim_p, _broadcast_in_dim_transpose)


def unbroadcast(ct, shape):
    """Sums ``ct`` down to ``shape``, undoing NumPy broadcasting (the transpose of
    :func:`broadcast_to`)."""
    from cuvmap.lax.reduction import reduce_sum  # a cycle: reduce_sum's transpose is a broadcast

    ct_shape = core.shape_of(ct)
    lead = len(ct_shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and ct_shape[lead + i] != 1
    )
    if axes:
        ct = reduce_sum(ct, axes)
    return reshape(ct, shape)


# ---------------------------------------------------------------------------------------
# squeeze and expand_dims
# ---------------------------------------------------------------------------------------


def _squeeze_shape_rule(x, *, dimensions):
    for d in dimensions:
        if not 0 <= d < x.ndim or x.shape[d] != 1:
            raise ShapeError(f"cannot squeeze dim {d} of {x.shape}: it must exist and have size 1")
    return ShapedArray(tuple(s for i, s in enumerate(x.shape) if i not in dimensions), x.dtype, x.weak_type)


squeeze_p = Primitive("squeeze", impl=lambda x, *, dimensions: core.as_array(x).squeeze(dimensions),
                      shape_rule=_squeeze_shape_rule, layout=_view_keeps_layout)


def squeeze(array, dimensions):
    """Removes the size-1 dims ``dimensions`` (negative ones count from the end).
    JAX: ``jax.lax.squeeze``."""
    ndim = len(core.shape_of(array))
    dimensions = tuple(sorted(int(d) % ndim if ndim else int(d) for d in dimensions))
    if not dimensions:
        return array
    return squeeze_p.bind(array, dimensions=dimensions)


def _squeeze_batch(axis_size, vals, dims, *, dimensions):
    (x,), (d,) = vals, dims
    phys = tuple(physical_axis(a, d) for a in dimensions)
    return squeeze(x, phys), d - sum(1 for a in phys if a < d)


batching.primitive_batchers[squeeze_p] = _squeeze_batch
vjp.deflinear(squeeze_p, lambda ct, x, *, dimensions: reshape(ct, x.shape))


def _expand_dims_shape(shape, dimensions):
    out = list(shape)
    for d in dimensions:
        out.insert(d, 1)
    return tuple(out)


def _expand_dims_shape_rule(x, *, dimensions):
    n = x.ndim + len(dimensions)
    if any(not 0 <= d < n for d in dimensions):
        raise ShapeError(f"expand_dims dims {dimensions} out of range for an output of rank {n}")
    return ShapedArray(_expand_dims_shape(x.shape, dimensions), x.dtype, x.weak_type)


expand_dims_p = Primitive(
    "expand_dims",
    impl=lambda x, *, dimensions: core.as_array(x).reshape(_expand_dims_shape(np.shape(x), dimensions)),
    shape_rule=_expand_dims_shape_rule,
    layout=_view_keeps_layout,  # (size-1 dims added: always a view)
)


def expand_dims(array, dimensions):
    """Inserts size-1 dims at the output positions ``dimensions`` (negative ones count from
    the end of the output). JAX: ``jax.lax.expand_dims``."""
    out_ndim = len(core.shape_of(array)) + len(dimensions)
    dimensions = tuple(sorted(int(d) % out_ndim for d in dimensions))
    if not dimensions:
        return array
    return expand_dims_p.bind(array, dimensions=dimensions)


def _expand_dims_batch(axis_size, vals, dims, *, dimensions):
    (x,), (d,) = vals, dims
    x = move_bdim(x, d, 0)
    return expand_dims(x, tuple(a + 1 for a in dimensions)), 0


batching.primitive_batchers[expand_dims_p] = _expand_dims_batch
vjp.deflinear(expand_dims_p, lambda ct, x, *, dimensions: reshape(ct, x.shape))


# ---------------------------------------------------------------------------------------
# concatenate
# ---------------------------------------------------------------------------------------


def _concatenate_shape_rule(*xs, dimension):
    if not xs:
        raise ShapeError("needs at least one operand")
    ref = xs[0]
    if not 0 <= dimension < ref.ndim:
        raise ShapeError(f"dimension {dimension} out of range for rank {ref.ndim}")
    for x in xs:
        if x.ndim != ref.ndim or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, ref.shape)) if i != dimension
        ):
            raise ShapeError(
                "operand shapes " + ", ".join(str(x.shape) for x in xs)
                + f" differ outside dimension {dimension}"
            )
    shape = list(ref.shape)
    shape[dimension] = sum(x.shape[dimension] for x in xs)
    dtype = np.result_type(*(x.dtype for x in xs))
    return ShapedArray(shape, dtype)


def _concatenate_impl(*xs, dimension):
    return backend.xp_of(*xs).concatenate(xs, axis=dimension)


concatenate_p = Primitive("concatenate", impl=_concatenate_impl, shape_rule=_concatenate_shape_rule)


def concatenate(operands, dimension):
    """Joins arrays of equal shape except along ``dimension``."""
    operands = tuple(operands)
    if len(operands) == 1:
        return operands[0]
    return concatenate_p.bind(*operands, dimension=int(dimension))


def _concatenate_batch(axis_size, vals, dims, *, dimension):
    xs = [batching.bdim_at_front(v, d, axis_size) for v, d in zip(vals, dims)]
    return concatenate(xs, dimension + 1), 0


def _concatenate_jvp(i, t, out, *xs, dimension):
    pieces = [t if j == i else core.full_like_concrete(x, 0, dtype=core.dtype_of(t)) for j, x in enumerate(xs)]
    return concatenate(pieces, dimension)


def _concatenate_vjp(i, ct, out, *xs, dimension):
    from cuvmap.lax.indexing import slice_in_dim  # a cycle: indexing's rules reshape and broadcast

    start = sum(core.shape_of(x)[dimension] for x in xs[:i])
    return slice_in_dim(ct, start, start + core.shape_of(xs[i])[dimension], dimension)


batching.primitive_batchers[concatenate_p] = _concatenate_batch
jvp.primitive_jvps[concatenate_p] = _concatenate_jvp
vjp.primitive_vjps[concatenate_p] = _concatenate_vjp   # one rule for any number of operands
vjp.declare_reads(concatenate_p, ())                     # it reads their shapes only


# ---------------------------------------------------------------------------------------
# pad
# ---------------------------------------------------------------------------------------


def _pad_shape_rule(x, *, pads, value):
    if len(pads) != x.ndim:
        raise ShapeError(f"needs one (low, high) pair per dim of {x.shape}, got {pads}")
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise ShapeError(f"negative padding {pads}")
    return ShapedArray(tuple(s + lo + hi for s, (lo, hi) in zip(x.shape, pads)), x.dtype, x.weak_type)


def _pad_impl(x, *, pads, value):
    x = core.as_array(x)
    return backend.xp_of(x).pad(x, pads, mode="constant", constant_values=value)


pad_p = Primitive("pad", impl=_pad_impl, shape_rule=_pad_shape_rule)


def pad(x, pads, value=0):
    """Pads each dim with ``(low, high)`` copies of the constant ``value``."""
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    return pad_p.bind(x, pads=pads, value=value)


def _pad_batch(axis_size, vals, dims, *, pads, value):
    (x,), (d,) = vals, dims
    return pad(x, pads[:d] + ((0, 0),) + pads[d:], value), d


def _pad_vjp(ct, out, x, *, pads, value):
    from cuvmap.lax.indexing import slice_p  # a cycle: indexing's rules reshape and broadcast

    shape = core.shape_of(ct)
    slices = tuple((lo, n - hi, 1) for (lo, hi), n in zip(pads, shape))
    return slice_p.bind(ct, slices=slices)


batching.primitive_batchers[pad_p] = _pad_batch
jvp.defjvp(pad_p, lambda t, out, x, *, pads, value: pad(t, pads, 0))
vjp.defvjp(pad_p, _pad_vjp, reads=())


# linear: their transposes need no conjugate (NOTE [complex convention])
complex_rules.defcomplex(reshape_p, transpose_p, broadcast_in_dim_p, squeeze_p, expand_dims_p, concatenate_p, pad_p)
