"""Reductions: reduce_sum, reduce_max, reduce_min, argmax, argmin.

``reduce_sum`` is linear: its VJP broadcasts the cotangent back over the reduced axes.
``reduce_max``/``reduce_min`` send the cotangent to the positions that attain the extremum,
split evenly between ties (as JAX does), so the gradient is a valid subgradient and
``jvp`` agrees with ``vjp``. ``argmax``/``argmin`` return integer indices and carry no
derivative.
"""
import numpy as np

from cuvmap import core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.shape import broadcast_in_dim
from cuvmap.transforms import batching, complex_rules, jvp, vjp


def _check_axes(x, axes):
    if any(not 0 <= a < x.ndim for a in axes) or len(set(axes)) != len(axes):
        raise ShapeError(f"axes {axes} out of range or repeated for shape {x.shape}")


def _reduce_shape_rule(x, *, axes):
    _check_axes(x, axes)
    return ShapedArray(tuple(s for i, s in enumerate(x.shape) if i not in axes), x.dtype, x.weak_type)


def _reduce_sum_shape_rule(x, *, axes):
    out = _reduce_shape_rule(x, axes=axes)
    if x.dtype == np.bool_:
        out.dtype = np.dtype(np.int64)
    return out


def _kept_dims(ndim, axes):
    return tuple(i for i in range(ndim) if i not in axes)


# ---------------------------------------------------------------------------------------
# reduce_sum
# ---------------------------------------------------------------------------------------

def _reduce_sum_impl(x, *, axes):
    x = core.as_array(x)
    # NumPy would promote small ints (int32, uint8) to int64; keep the dtype the shape rule
    # states: the operand's, int64 for booleans
    return x.sum(axis=axes, dtype=np.int64 if x.dtype == np.bool_ else x.dtype)


reduce_sum_p = Primitive("reduce_sum", owns_output=True)
reduce_sum_p.impl = _reduce_sum_impl
reduce_sum_p.shape_rule = _reduce_sum_shape_rule


def _normalize_axes(x, axes):
    ndim = len(core.shape_of(x))
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, (int, np.integer)):
        axes = (axes,)
    return tuple(sorted(int(a) % ndim if ndim else int(a) for a in axes))


def reduce_sum(operand, axes=None):
    """Sum over ``axes`` (a tuple of non-negative ints; ``None`` sums everything)."""
    axes = _normalize_axes(operand, axes)
    if not axes:
        return operand
    return reduce_sum_p.bind(operand, axes=axes)


def _reduce_sum_transpose(ct, x, *, axes):
    shape = core.shape_of(x)
    return broadcast_in_dim(ct, shape, _kept_dims(len(shape), axes))


batching.defreduction(reduce_sum_p)
vjp.deflinear(reduce_sum_p, _reduce_sum_transpose)


# ---------------------------------------------------------------------------------------
# reduce_max, reduce_min
# ---------------------------------------------------------------------------------------

reduce_max_p = Primitive("reduce_max")
reduce_max_p.impl = lambda x, *, axes: core.as_array(x).max(axis=axes)
reduce_max_p.shape_rule = _reduce_shape_rule

reduce_min_p = Primitive("reduce_min")
reduce_min_p.impl = lambda x, *, axes: core.as_array(x).min(axis=axes)
reduce_min_p.shape_rule = _reduce_shape_rule


def reduce_max(operand, axes=None):
    """Maximum over ``axes``; the derivative is shared evenly between tied maxima."""
    axes = _normalize_axes(operand, axes)
    if not axes:
        return operand
    return reduce_max_p.bind(operand, axes=axes)


def reduce_min(operand, axes=None):
    """Minimum over ``axes``; the derivative is shared evenly between tied minima."""
    axes = _normalize_axes(operand, axes)
    if not axes:
        return operand
    return reduce_min_p.bind(operand, axes=axes)


def _extremum_weights(out, x, axes):
    """``1/count`` at the positions of ``x`` equal to the extremum, 0 elsewhere."""
    shape = core.shape_of(x)
    kept = _kept_dims(len(shape), axes)
    hit = ew.convert_element_type(ew.eq(x, broadcast_in_dim(out, shape, kept)), core.dtype_of(x))
    count = reduce_sum(hit, axes)
    return ew.div(hit, broadcast_in_dim(count, shape, kept)), kept


def _extremum_vjp(ct, out, x, *, axes):
    weights, kept = _extremum_weights(out, x, axes)
    return ew.mul(weights, broadcast_in_dim(ct, core.shape_of(x), kept))


def _extremum_jvp(t, out, x, *, axes):
    weights, _ = _extremum_weights(out, x, axes)
    return reduce_sum(ew.mul(weights, t), axes)


for _p in (reduce_max_p, reduce_min_p):
    batching.defreduction(_p)
    jvp.defjvp(_p, _extremum_jvp)
    vjp.defvjp(_p, _extremum_vjp, reads=(0, "out"))
del _p


# ---------------------------------------------------------------------------------------
# argmax, argmin
# ---------------------------------------------------------------------------------------


def _arg_shape_rule(x, *, axis):
    _check_axes(x, (axis,))
    return ShapedArray(tuple(s for i, s in enumerate(x.shape) if i != axis), np.int64)


argmax_p = Primitive("argmax", differentiable=False)
argmax_p.impl = lambda x, *, axis: core.as_array(x).argmax(axis=axis)
argmax_p.shape_rule = _arg_shape_rule

argmin_p = Primitive("argmin", differentiable=False)
argmin_p.impl = lambda x, *, axis: core.as_array(x).argmin(axis=axis)
argmin_p.shape_rule = _arg_shape_rule


def _arg_index(primitive, x, axis, index_dtype):
    ndim = len(core.shape_of(x))
    if not -ndim <= int(axis) < ndim:
        raise ShapeError(f"{primitive.name}: axis {axis} is out of range for an array of shape {core.shape_of(x)}")
    index_dtype = np.dtype(index_dtype)
    if not np.issubdtype(index_dtype, np.integer):
        raise ShapeError(f"{primitive.name}: index_dtype must be an integer dtype, got {index_dtype}")
    out = primitive.bind(x, axis=int(axis) % ndim)
    if index_dtype != np.int64:
        out = ew.convert_element_type(out, index_dtype)
    return out


def argmax(operand, axis, index_dtype=np.int64):
    """JAX's ``lax.argmax``: the index of the first maximum along ``axis`` (NaN counts as
    the largest), as ``index_dtype`` (JAX requires it; cuvmap's default is int64); no
    derivative."""
    return _arg_index(argmax_p, operand, axis, index_dtype)


def argmin(operand, axis, index_dtype=np.int64):
    """JAX's ``lax.argmin``: the index of the first minimum along ``axis`` (NaN counts as
    the smallest), as ``index_dtype``; no derivative."""
    return _arg_index(argmin_p, operand, axis, index_dtype)


def _arg_batcher(primitive):
    def rule(axis_size, vals, dims, *, axis):
        (x,), (d,) = vals, dims
        a = batching.physical_axis(axis, d)
        return primitive.bind(x, axis=a), d if d < a else d - 1

    return rule


batching.primitive_batchers[argmax_p] = _arg_batcher(argmax_p)
batching.primitive_batchers[argmin_p] = _arg_batcher(argmin_p)


# linear: their transposes need no conjugate (NOTE [complex convention])
complex_rules.defcomplex(reduce_sum_p, reduce_max_p, reduce_min_p)  # max, min: selections (lexicographic order)
