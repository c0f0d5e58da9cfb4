"""Sorting along one axis: ``sort`` (of one array, or of several by the first
``num_keys``), ``sort_key_val``, ``argsort`` and ``top_k``.

Both are stable (equal elements keep their order) and put NaNs last, as NumPy's
``kind="stable"``. ``argsort`` returns int64 indices and carries no derivative. ``sort``
permutes its operand, so its derivatives follow the permutation ``perm = argsort(x)``:
the JVP gathers the tangent with it (``t[perm]`` along the axis) and the VJP puts the
cotangent back where each element came from, a gather with the inverse permutation
``argsort(perm)`` (a scatter-add would do the same more slowly: ``numpy.add.at``). At ties
the derivative follows the stable order, as JAX's does. Complex numbers sort
lexicographically, by real part then imaginary part (NumPy's and JAX's order); the
derivatives are the same permutations, which need no conjugate (NOTE [complex
convention]).
"""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import iota, normalize_slice, slice_p, take
from cuvmap.lax.shape import reshape, transpose
from cuvmap.transforms import batching, complex_rules, jvp, vjp


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


def sort(operand, dimension=-1, is_stable=True, num_keys=1):
    """JAX's ``lax.sort``: ``operand`` sorted along ``dimension`` (stable, NaNs last).

    ``operand`` may be one array or a sequence of arrays of one shape: then all are
    permuted by the one permutation that sorts the first ``num_keys`` of them
    lexicographically (the first the most significant key), and a tuple is returned,
    ``out_i[..., j, ...] = operand_i[..., π(j), ...]``. The sort is always stable
    (``is_stable=False`` allows any order of ties, so a stable one is correct).
    Derivatives flow to every operand through the permutation (a gather), none to ``π``.
    """
    del is_stable  # a stable sort is a valid unstable one
    if not isinstance(operand, (tuple, list)):
        return sort_p.bind(operand, axis=_axis(operand, dimension, "sort"))
    operands = tuple(operand)
    if not operands:
        raise ShapeError("sort: needs at least one operand")
    shapes = [tuple(core.shape_of(x)) for x in operands]
    if len(set(shapes)) != 1:
        raise ShapeError(f"sort: the operands must have one shape, got {shapes}")
    if not 1 <= int(num_keys) <= len(operands):
        raise ShapeError(f"sort: num_keys {num_keys} must be between 1 and the number of operands {len(operands)}")
    axis = _axis(operands[0], dimension, "sort")
    perm = lexsort_permutation(operands[:int(num_keys)], axis)
    return tuple(permute_along(x, perm, axis) for x in operands)


def sort_key_val(keys, values, dimension=-1, is_stable=True):
    """JAX's ``lax.sort_key_val``: ``keys`` sorted along ``dimension`` and ``values``
    permuted the same way: ``sort((keys, values), dimension, is_stable, num_keys=1)``."""
    return sort((keys, values), dimension, is_stable, num_keys=1)


def lexsort_permutation(keys, axis):
    """The stable permutation ``π`` (int64, of the keys' shape) that sorts ``keys``
    lexicographically along ``axis``, ``keys[0]`` the most significant: one stable
    argsort per key, least significant first, each of the key permuted by the order so
    far (the LSD radix idea)."""
    perm = argsort(keys[-1], axis)
    for key in reversed(keys[:-1]):
        perm = permute_along(perm, argsort(permute_along(key, perm, axis), axis), axis)
    return perm


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
    but for ``axis``, where it may be shorter (one gather of the flattened array, each
    row's indices offset by its start)."""
    shape = core.shape_of(x)
    nd = len(shape)
    n = shape[axis]
    m = core.shape_of(perm)[axis]
    order = tuple(i for i in range(nd) if i != axis) + (axis,)
    xt, pt = transpose(x, order), transpose(perm, order)
    moved = core.shape_of(pt)
    rows = int(np.prod(moved[:-1], dtype=np.int64))
    offsets = reshape(ew.mul(iota(rows, np.int64, like=perm), n), (rows, 1))
    flat = take(reshape(xt, (rows * n,)), ew.add(reshape(pt, (rows, m)), offsets), 0)
    return transpose(reshape(flat, moved), tuple(int(i) for i in np.argsort(order)))


def _sort_jvp(t, out, x, *, axis):
    return permute_along(t, argsort(x, axis), axis)


def _sort_vjp(ct, out, x, *, axis):
    return permute_along(ct, argsort(argsort(x, axis), axis), axis)


jvp.defjvp(sort_p, _sort_jvp)
vjp.defvjp(sort_p, _sort_vjp, reads=(0,))
complex_rules.defcomplex(sort_p)  # a permutation: its transpose has no conjugate


# ---------------------------------------------------------------------------------------
# top_k: a composite of argsort and the permutation gather
# ---------------------------------------------------------------------------------------


def top_k(operand, k, *, axis=-1, is_stable=True):
    """JAX's ``lax.top_k``: the ``k`` largest entries along ``axis`` in descending order
    and their int32 indices, ties in ascending index order (NaNs count as the largest):

        values[..., j] = operand[..., idx[..., j]],  operand[idx[j]] ≥ operand[idx[j + 1]]

    A stable ascending argsort of the reversed array, read backwards, is the descending
    order with ties by ascending index: ``idx = n − 1 − reverse(argsort(reverse(x)))``.
    Derivatives flow through the gather of the values, none through the indices.
    """
    del is_stable  # always stable
    shape = core.shape_of(operand)
    if not shape:
        raise ShapeError("top_k: operand must have at least one dim, got a scalar")
    axis = _axis(operand, axis, "top_k")
    n = shape[axis]
    k = int(k)
    if not 0 <= k <= n:
        raise ShapeError(f"top_k: k={k} must be between 0 and the size {n} of axis {axis} of {tuple(shape)}")
    if np.issubdtype(core.dtype_of(operand), np.complexfloating):
        raise ShapeError(f"top_k: complex operands have no order, got {core.dtype_of(operand)}")
    backwards = argsort(_reverse(operand, axis), axis)
    idx = ew.sub(n - 1, _reverse(backwards, axis))
    idx = _first(idx, k, axis)
    values = permute_along(operand, idx, axis) if k else _first(operand, 0, axis)
    return values, ew.convert_element_type(idx, np.dtype(np.int32))


def _reverse(x, axis):
    shape = core.shape_of(x)
    slices = [(0, n, 1) for n in shape]
    slices[axis] = normalize_slice(builtins.slice(None, None, -1), shape[axis])
    return slice_p.bind(x, slices=tuple(slices))


def _first(x, k, axis):
    shape = core.shape_of(x)
    slices = [(0, n, 1) for n in shape]
    slices[axis] = (0, k, 1)
    return slice_p.bind(x, slices=tuple(slices))
