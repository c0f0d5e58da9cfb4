"""Cumulative reductions (scans) along one axis: ``cumsum`` and ``cumprod`` (primitives),
``cummax``, ``cummin`` and ``cumlogsumexp`` (associative scans of ``max``, ``min`` and
``logaddexp``; NOTE [cumulative extrema as associative scans]).

    cumsum(x)[..., i, ...] = Σ_{j ≤ i} x[..., j, ...]      (reverse: Σ_{j ≥ i})
    cumprod(x)[..., i, ...] = Π_{j ≤ i} x[..., j, ...]     (reverse: Π_{j ≥ i})

Both impls are the array module's ``cumsum``/``cumprod`` (one pass; a composite of
primitives would need a logarithmic number of passes). Booleans accumulate in int64,
other dtypes in their own (NumPy would promote int32 to int64), as ``reduce_sum`` does.

``cumsum`` is linear: its JVP is the cumsum of the tangent and its transpose the cumsum in
the other direction. ``cumprod``'s derivatives are scans themselves (NOTE [cumprod's
derivatives without division]).
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.scan_ops import associative_scan
from cuvmap.lax.shape import pad
from cuvmap.transforms import batching, complex_rules, jvp, vjp


def _cumulative_shape_rule(x, *, axis, reverse):
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"axis {axis} out of range for shape {x.shape}")
    dtype = np.dtype(np.int64) if x.dtype == np.bool_ else x.dtype
    return ShapedArray(x.shape, dtype, x.weak_type)


def _cumulative_impl(name):
    def impl(x, *, axis, reverse):
        x = core.as_array(x)
        xp = backend.xp_of(x)
        scan = getattr(xp, name)
        dtype = np.int64 if x.dtype == np.bool_ else x.dtype
        if reverse:
            return xp.flip(scan(xp.flip(x, axis), axis=axis, dtype=dtype), axis)
        return scan(x, axis=axis, dtype=dtype)

    return impl


def _cumulative(name):
    return Primitive(name, impl=_cumulative_impl(name), shape_rule=_cumulative_shape_rule)


cumsum_p = _cumulative("cumsum")
cumprod_p = _cumulative("cumprod")


def _bind(primitive, x, axis, reverse):
    ndim = len(core.shape_of(x))
    if not -ndim <= int(axis) < ndim:
        raise ShapeError(f"{primitive.name}: axis {axis} is out of range for an array of shape {core.shape_of(x)}")
    return primitive.bind(x, axis=int(axis) % ndim, reverse=bool(reverse))


def cumsum(operand, axis=0, reverse=False):
    """JAX's ``lax.cumsum``: running sums along ``axis`` (from the end when ``reverse``)."""
    return _bind(cumsum_p, operand, axis, reverse)


def cumprod(operand, axis=0, reverse=False):
    """JAX's ``lax.cumprod``: running products along ``axis`` (from the end when
    ``reverse``); its derivatives are exact where ``operand`` has zeros."""
    return _bind(cumprod_p, operand, axis, reverse)


# NOTE [cumulative extrema as associative scans]
# cummax, cummin and cumlogsumexp are associative scans (cuvmap/lax/scan_ops.py) of the
# binary max, min and logaddexp, as JAX defines their derivatives: O(log n) elementwise
# passes, differentiable, batchable and stageable through the primitives they bind. At a
# tie between an earlier and a later element, max and min send the derivative to the
# later one (the binary max's rule). logaddexp(a, b) = m + log1p(exp(min(a, b) − m)),
# m = max(a, b), with the difference taken as 0 where a = b, so that two equal infinities
# give that infinity instead of NaN (and equal finite values m + log 2).


def _checked_axis(name, x, axis):
    ndim = len(core.shape_of(x))
    if not -ndim <= int(axis) < ndim:
        raise ShapeError(f"{name}: axis {axis} is out of range for an array of shape {core.shape_of(x)}")
    return int(axis) % ndim


def cummax(operand, axis=0, reverse=False):
    """JAX's ``lax.cummax``: ``out[i] = max_{j ≤ i} operand[j]`` along ``axis`` (``j ≥ i`` when
    ``reverse``); NaNs propagate."""
    return associative_scan(ew.max, operand, reverse=reverse, axis=_checked_axis("cummax", operand, axis))


def cummin(operand, axis=0, reverse=False):
    """JAX's ``lax.cummin``: ``out[i] = min_{j ≤ i} operand[j]`` along ``axis`` (``j ≥ i`` when
    ``reverse``); NaNs propagate."""
    return associative_scan(ew.min, operand, reverse=reverse, axis=_checked_axis("cummin", operand, axis))


def logaddexp(a, b):
    """``log(exp(a) + exp(b))`` without overflow (NOTE [cumulative extrema as associative scans])."""
    m = ew.max(a, b)
    same = ew.eq(a, b)
    d = ew.sub(ew.select(same, 0.0, ew.min(a, b)), ew.select(same, 0.0, m))
    return ew.add(m, ew.log1p(ew.exp(d)))


def cumlogsumexp(operand, axis=0, reverse=False):
    """JAX's ``lax.cumlogsumexp``: ``out[i] = log Σ_{j ≤ i} exp(operand[j])`` along ``axis``
    (``j ≥ i`` when ``reverse``), computed stably; its derivative is the running softmax."""
    if not np.issubdtype(core.dtype_of(operand), np.inexact):
        raise ShapeError(f"cumlogsumexp: needs a floating operand, got {core.dtype_of(operand)}")
    return associative_scan(logaddexp, operand, reverse=reverse, axis=_checked_axis("cumlogsumexp", operand, axis))


def _cumulative_batcher(primitive):
    def rule(axis_size, vals, dims, *, axis, reverse):
        (x,), (d,) = vals, dims
        return primitive.bind(x, axis=batching.physical_axis(axis, d), reverse=reverse), d

    return rule


batching.primitive_batchers[cumsum_p] = _cumulative_batcher(cumsum_p)
batching.primitive_batchers[cumprod_p] = _cumulative_batcher(cumprod_p)
vjp.deflinear(cumsum_p, lambda ct, x, *, axis, reverse: cumsum_p.bind(ct, axis=axis, reverse=not reverse))


# ---------------------------------------------------------------------------------------
# cumprod's derivatives
# ---------------------------------------------------------------------------------------

# NOTE [cumprod's derivatives without division]
# With out_i = Π_{m ≤ i} x_m, ∂out_i/∂x_j = Π_{m ≤ i, m ≠ j} x_m for j ≤ i. The common
# shortcut out_i / x_j divides by zero wherever x has one, so — as JAX, which differentiates
# an associative scan — both rules are scans of products, exact with zeros:
# - JVP: the pairs (x_i, t_i) scanned with (p, t) ⊕ (p', t') = (p·p', t·p' + p·t'), the
#   product rule, whose second component is the tangent of out;
# - VJP: ct_x_j = E_j · s_j, where E_j = Π_{m < j} x_m is out shifted by one place, and
#   s_j = Σ_{i ≥ j} ct_i Π_{j < m ≤ i} x_m obeys s_j = ct_j + x_{j+1} · s_{j+1}: a scan in
#   the other direction of the affine maps s ↦ ct_j + x_{j+1} · s.
# The scans are Hillis–Steele scans built from slices, pads and multiplications:
# ⌈log₂ n⌉ steps, each combining every element with the one 2^k places before it, so the
# rules are primitives and differentiable and batchable in turn (reverse mode reads x and
# out).


def _shift(x, d, axis, reverse, fill):
    """``x`` moved ``d`` places along ``axis`` in scan order: ``out[i] = x[i − d]``
    (``x[i + d]`` when ``reverse``), ``fill`` where that lies outside."""
    shape = core.shape_of(x)
    n = shape[axis]
    pads = [(0, 0)] * len(shape)
    if d >= n:
        part = slice_in_dim(x, 0, 0, axis)
        pads[axis] = (n, 0)
    elif reverse:
        part = slice_in_dim(x, d, n, axis)
        pads[axis] = (0, d)
    else:
        part = slice_in_dim(x, 0, n - d, axis)
        pads[axis] = (d, 0)
    return pad(part, tuple(pads), fill)


def _scan(combine, elems, fills, axis, reverse):
    """The inclusive scan of the tuples ``elems`` along ``axis`` under ``combine(earlier,
    later)``; ``fills`` is its identity element (NOTE [cumprod's derivatives without
    division])."""
    n = core.shape_of(elems[0])[axis]
    d = 1
    while d < n:
        earlier = tuple(_shift(e, d, axis, reverse, f) for e, f in zip(elems, fills))
        elems = combine(earlier, elems)
        d *= 2
    return elems


def _product_rule(earlier, later):
    (p0, t0), (p1, t1) = earlier, later
    return ew.mul(p0, p1), ew.add(ew.mul(t0, p1), ew.mul(p0, t1))


def _cumprod_jvp(t, out, x, *, axis, reverse):
    return _scan(_product_rule, (x, t), (1, 0), axis, reverse)[1]


def _compose_affine(earlier, later):
    """``later`` holds (a, b) of s ↦ b + a·s for a block of positions and ``earlier`` that
    of the block after it (in the backward direction): their composition."""
    (a0, b0), (a1, b1) = earlier, later
    return ew.mul(a1, a0), ew.add(b1, ew.mul(a1, b0))


def _cumprod_vjp(ct, out, x, *, axis, reverse):
    before = _shift(out, 1, axis, reverse, 1)   # E_j = Π_{m < j} x_m
    after = _shift(x, 1, axis, not reverse, 0)  # x_{j+1}
    s = _scan(_compose_affine, (after, ct), (1, 0), axis, not reverse)[1]
    return ew.mul(before, s)


jvp.defjvp(cumprod_p, _cumprod_jvp)
vjp.defvjp(cumprod_p, _cumprod_vjp, reads=(0, "out"))


# cumsum is linear and cumprod's rules are products without a conjugate: both follow the
# complex convention (NOTE [complex convention])
complex_rules.defcomplex(cumsum_p, cumprod_p)
