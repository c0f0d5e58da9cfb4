"""Elementwise choices with JAX's lax names: ``clamp(min, x, max)`` and
``select_n(which, *cases)``.

Both broadcast their operands as NumPy does (JAX asks for scalars or equal shapes: those
are cases of it). Derivatives pass the tangent or cotangent to the operand each element
took, as JAX's rules: ``clamp``'s to ``x`` where ``min < x < max``, to ``min`` where
``x < min < max``, to ``max`` where ``max < x`` or ``max < min``; ``select_n``'s to ``cases[which]``.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapedArray, ShapeError
from cuvmap.lax.bitwise import bitwise_and, bitwise_or
from cuvmap.lax.elementwise.common import _nary, _naryop_shape_rule, broadcast_shapes
from cuvmap.lax.elementwise.comparisons import _where_nonzero, eq, gt, lt
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

def _clamp_shape_rule(lo, x, hi):
    return _naryop_shape_rule(lo, x, hi)


def _clamp_impl(lo, x, hi):
    xp = backend.xp_of(lo, x, hi)
    dtype = np.result_type(*(getattr(v, "dtype", v) for v in (lo, x, hi)))
    return xp.minimum(xp.maximum(x, lo), hi).astype(dtype, copy=False)


# XLA's clamp: min(max(x, lo), hi) (hi wins where lo > hi)
clamp_p = _nary("clamp", _clamp_impl, _clamp_shape_rule)


def _select_n_shape_rule(which, *cases):
    if not cases:
        raise ShapeError("select_n: needs at least one case")
    if which.dtype != np.bool_ and kind_of(which.dtype) not in "iu":
        raise ShapeError(f"select_n: which must be boolean or an integer, got {which.dtype}")
    if which.dtype == np.bool_ and len(cases) > 2:
        raise ShapeError(f"select_n: a boolean which selects between two cases, got {len(cases)}")
    out = _naryop_shape_rule(*cases)
    return ShapedArray(broadcast_shapes(which.shape, out.shape), out.dtype, out.weak_type)


def _select_n_impl(which, *cases):
    xp = backend.xp_of(which, *cases)
    dtype = np.result_type(*(getattr(c, "dtype", c) for c in cases))
    if len(cases) == 1:
        shape = np.broadcast_shapes(np.shape(which), np.shape(cases[0]))
        return xp.broadcast_to(xp.asarray(cases[0], dtype=dtype), shape).copy()
    which = core.as_array(which)
    if which.dtype == np.bool_:
        return xp.where(which, cases[1], cases[0]).astype(dtype, copy=False)
    if xp is np:  # NumPy's choose raises on an index out of range
        return np.choose(which, [np.asarray(c, dtype=dtype) for c in cases])
    # CuPy: one where per case (an out-of-range index is not checked on the GPU, where the
    # check would synchronize; JAX leaves it undefined)
    out = xp.asarray(cases[0], dtype=dtype)
    for i, case in enumerate(cases[1:], start=1):
        out = xp.where(which == i, xp.asarray(case, dtype=dtype), out)
    shape = np.broadcast_shapes(which.shape, *(np.shape(c) for c in cases))
    return xp.broadcast_to(out, shape).copy()


select_n_p = _nary("select_n", _select_n_impl, _select_n_shape_rule)


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def clamp(min, x, max):  # noqa: A002 - JAX's names
    """``min(max(x, min), max)``, elementwise (``numpy.clip`` with both bounds).
    JAX: ``jax.lax.clamp(min, x, max)``."""
    return clamp_p.bind(min, x, max)


def select_n(which, *cases):
    """``cases[which]``, elementwise: ``which`` is boolean (two cases: ``cases[0]`` where
    False, ``cases[1]`` where True) or an integer array in ``[0, len(cases))`` (out-of-range
    values raise on the CPU and are unchecked on the GPU). JAX: ``jax.lax.select_n``."""
    _select_n_shape_rule(core.get_aval(which), *(core.get_aval(c) for c in cases))  # eager calls check too
    return select_n_p.bind(which, *cases)


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defbroadcasting(clamp_p, select_n_p)


# ---------------------------------------------------------------------------------------
# Derivative rules (each serves as JVP and VJP)
# ---------------------------------------------------------------------------------------

vjp.defderivative(
    clamp_p,
    lambda g, out, lo, x, hi: _where_nonzero(bitwise_and(gt(lo, x), lt(lo, hi)), g),
    lambda g, out, lo, x, hi: _where_nonzero(bitwise_and(gt(x, lo), lt(x, hi)), g),
    # max is taken where it is below x or below min (JAX's rule misses the second case)
    lambda g, out, lo, x, hi: _where_nonzero(bitwise_or(lt(hi, x), lt(hi, lo)), g),
    reads=(0, 1, 2),
)


def _select_n_case_rule(i):
    return lambda g, out, which, *cases: _where_nonzero(eq(which, i), g)


def _select_n_vjp(i, ct, out, which, *cases):
    return None if i == 0 else _select_n_case_rule(i - 1)(ct, out, which, *cases)


def _select_n_jvp(i, t, out, which, *cases):
    return None if i == 0 else _select_n_case_rule(i - 1)(t, out, which, *cases)


# one rule for any number of cases (select_n is variadic)
vjp.primitive_vjps[select_n_p] = _select_n_vjp
vjp.declare_reads(select_n_p, (0,))
jvp.primitive_jvps[select_n_p] = _select_n_jvp
complex_rules.defcomplex(select_n_p)  # a selection with real weights: no conjugate (NOTE [complex convention])
