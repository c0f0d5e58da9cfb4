"""Sorting along one axis: ``sort`` and ``argsort``.

Both are stable (equal elements keep their order) and put NaNs last, as NumPy's
``kind="stable"``. ``argsort`` returns int64 indices and carries no derivative. ``sort``
permutes its operand, so its derivatives follow the permutation ``perm = argsort(x)``:
the JVP gathers the tangent with it (``t[perm]`` along the axis) and the VJP puts the
cotangent back where each element came from, a gather with the inverse permutation
``argsort(perm)`` (a scatter-add would do the same more slowly: ``numpy.add.at``). At ties
the derivative follows the stable order, as JAX's does.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import iota, take
from cuvmap.lax.shape import reshape, transpose
from cuvmap.transforms import batching, jvp, vjp


def _check_axis(x, axis):
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"axis {axis} out of range for shape {x.shape}")


def _sort_shape_rule(x, *, axis):
    _check_axis(x, axis)
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def _argsort_shape_rule(x, *, axis):
    _check_axis(x, axis)
    return ShapedArray(x.shape, np.int64)


def _sort_impl(x, *, axis):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    if xp is np:
        return np.sort(x, axis=axis, kind="stable")
    return xp.sort(x, axis=axis)  # CuPy sorts stably (its only kind)


def _argsort_impl(x, *, axis):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    if xp is np:
        return np.argsort(x, axis=axis, kind="stable").astype(np.int64, copy=False)
    return xp.argsort(x, axis=axis).astype(np.int64, copy=False)


sort_p = Primitive("sort")
sort_p.impl = _sort_impl
sort_p.shape_rule = _sort_shape_rule

argsort_p = Primitive("argsort", differentiable=False)
argsort_p.impl = _argsort_impl
argsort_p.shape_rule = _argsort_shape_rule


def _axis(x, axis, name):
    ndim = len(core.shape_of(x))
    if not -ndim <= int(axis) < ndim:
        raise ShapeError(f"{name}: axis {axis} is out of range for an array of shape {core.shape_of(x)}")
    return int(axis) % ndim


def sort(x, axis=-1):
    """``x`` sorted along ``axis`` (stable, NaNs last)."""
    return sort_p.bind(x, axis=_axis(x, axis, "sort"))


def argsort(x, axis=-1):
    """The int64 indices that sort ``x`` along ``axis`` (stable: ties keep their order)."""
    return argsort_p.bind(x, axis=_axis(x, axis, "argsort"))


def _axis_batcher(primitive):
    def rule(axis_size, vals, dims, *, axis):
        (x,), (d,) = vals, dims
        return primitive.bind(x, axis=batching.physical_axis(axis, d)), d

    return rule


batching.primitive_batchers[sort_p] = _axis_batcher(sort_p)
batching.primitive_batchers[argsort_p] = _axis_batcher(argsort_p)


def permute_along(x, perm, axis):
    """``out[..., i, ...] = x[..., perm[..., i, ...], ...]`` for ``perm`` of ``x``'s shape
    (one gather of the flattened array, each row's indices offset by its start)."""
    shape = core.shape_of(x)
    nd = len(shape)
    n = shape[axis]
    order = tuple(i for i in range(nd) if i != axis) + (axis,)
    xt, pt = transpose(x, order), transpose(perm, order)
    moved = core.shape_of(xt)
    rows = int(np.prod(moved[:-1], dtype=np.int64))
    offsets = reshape(ew.mul(iota(rows, np.int64, like=perm), n), (rows, 1))
    flat = take(reshape(xt, (rows * n,)), ew.add(reshape(pt, (rows, n)), offsets), 0)
    return transpose(reshape(flat, moved), tuple(int(i) for i in np.argsort(order)))


def _sort_jvp(t, out, x, *, axis):
    return permute_along(t, argsort(x, axis), axis)


def _sort_vjp(ct, out, x, *, axis):
    return permute_along(ct, argsort(argsort(x, axis), axis), axis)


jvp.defjvp(sort_p, _sort_jvp)
vjp.defvjp(sort_p, _sort_vjp, reads=(0,))
