"""Arithmetic: ``neg``, ``add``, ``sub``, ``mul``, ``div``, ``floor_divide``,
``remainder``, ``integer_pow``, ``max``, ``min``, ``abs``, ``sign`` and rounding (``floor``,
``ceil``, ``round`` with JAX's ``RoundingMethod``, and NumPy's ``round_decimals``).

Derivatives: one rule per operand, ``g * ∂out/∂x_i`` (see the package's docstring);
rounding, ``sign`` and ``floor_divide`` are piecewise constant and carry none.
"""
import enum

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapedArray, ShapeError
from cuvmap.lax.elementwise.common import (
    _c_float, _div_shape_rule, _float64_pow, _nary, _naryop_shape_rule, _same_shape_rule,
)
from cuvmap.lax.elementwise.comparisons import _where_nonzero, eq, gt, lt, select
from cuvmap.transforms import batching, vjp
from cuvmap.transforms.fusion import CExpression
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

neg_p = _nary("neg", np.negative, _same_shape_rule, fused=CExpression("(-{0})"))
add_p = _nary("add", np.add, fused=CExpression("({0} + {1})"))
sub_p = _nary("sub", np.subtract, fused=CExpression("({0} - {1})"))
mul_p = _nary("mul", np.multiply, fused=CExpression("({0} * {1})"))
div_p = _nary("div", np.true_divide, _div_shape_rule, fused=_c_float("({0} / {1})"))
max_p = _nary("max", np.maximum, fused=CExpression("(({0} != {0} || {1} != {1}) ? ({0} + {1}) : max({0}, {1}))"))
min_p = _nary("min", np.minimum, fused=CExpression("(({0} != {0} || {1} != {1}) ? ({0} + {1}) : min({0}, {1}))"))


# Python's // and %: the quotient rounds toward −∞ and the remainder takes the divisor's
# sign, so x == y · floor_divide(x, y) + remainder(x, y) (numpy.floor_divide, numpy.remainder)
def _real_only(name):
    """The shape rule of a binary op that JAX defines for real operands only: a complex
    operand raises naming the op and the dtype (NumPy's ufunc error names neither)."""
    def rule(*avals, **params):
        for a in avals:
            if kind_of(np.dtype(a.dtype)) == "c":
                raise TypeError(f"lax.{name}: complex operands are not supported, got {np.dtype(a.dtype)} (as in JAX)")
        return _naryop_shape_rule(*avals, **params)
    return rule


floor_divide_p = _nary("floor_divide", np.floor_divide, _real_only("floor_divide"), differentiable=False)
remainder_p = _nary("remainder", np.remainder, _real_only("remainder"))


def _abs_shape_rule(x):
    """``|x|`` keeps a real dtype; a complex one gives its real dtype (complex128 -> float64)."""
    dtype = np.finfo(x.dtype).dtype if kind_of(x.dtype) == "c" else x.dtype
    return ShapedArray(x.shape, dtype, weak_type=x.weak_type)


abs_p = _nary("abs", np.abs, _abs_shape_rule, fused=_c_float("fabs({0})"))
sign_p = _nary("sign", np.sign, _same_shape_rule, differentiable=False)


# Rounding: piecewise constant, so no derivative (zero tangents and cotangents, as JAX's
# defjvp_zero). The wrappers return integer and boolean operands unchanged, as jnp does;
# the primitives take floating operands only.
def _rounding_shape_rule(x, **params):
    if kind_of(x.dtype) != "f":
        raise ShapeError(f"operand must be floating point, got {x.dtype}")
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


class RoundingMethod(enum.IntEnum):
    """How :func:`round` breaks ties (JAX's ``jax.lax.RoundingMethod``): ``AWAY_FROM_ZERO``
    (0, C's ``round``: 2.5 -> 3) or ``TO_NEAREST_EVEN`` (1, NumPy's: 2.5 -> 2)."""
    AWAY_FROM_ZERO = 0
    TO_NEAREST_EVEN = 1


def _round_impl(x, *, decimals, rounding_method=RoundingMethod.TO_NEAREST_EVEN):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    if rounding_method == RoundingMethod.TO_NEAREST_EVEN:
        if decimals == 0 or kind_of(x.dtype) not in "fc":
            return xp.round(x, decimals)
        if kind_of(x.dtype) == "c":
            return (_round_decimals_real(xp, x.real, decimals)
                    + 1j * _round_decimals_real(xp, x.imag, decimals)).astype(x.dtype, copy=False)
        return _round_decimals_real(xp, x, decimals)
    # away from zero, decimals = 0 (the only case the wrapper binds): the truncation, one
    # step further from zero where the dropped fraction is at least a half (exact: no x + 0.5)
    truncated = xp.trunc(x)
    return xp.where(xp.abs(x - truncated) >= 0.5, truncated + xp.sign(x), truncated).astype(x.dtype, copy=False)


def _round_decimals_real(xp, x, decimals):
    """NumPy's ``round(x, decimals)`` (scale by ``10^decimals``, round half to even, scale
    back) without its NaNs for large ``|decimals|`` (JAX's issue 31689): where the scaled
    value is at least ``2^(nmant+1)`` (or overflows), ``x`` has no digit that far right and
    is its own rounding; where ``10^decimals`` underflows, every finite ``x`` rounds to a
    zero of its sign."""
    finfo = np.finfo(x.dtype)
    if decimals < -np.log10(finfo.max):
        return x * 0
    with np.errstate(over="ignore", invalid="ignore"):
        out = xp.round(x, decimals) if decimals < np.log10(finfo.max) else x
        exact = xp.abs(x) * np.float64(10.0) ** min(decimals, 400) >= 2.0 ** (finfo.nmant + 1)
    return xp.where(exact, x, out).astype(x.dtype, copy=False)


floor_p = _nary("floor", np.floor, _rounding_shape_rule, differentiable=False, fused=_c_float("floor({0})"))
ceil_p = _nary("ceil", np.ceil, _rounding_shape_rule, differentiable=False, fused=_c_float("ceil({0})"))
round_p = _nary("round", _round_impl, _rounding_shape_rule, differentiable=False)


def _integer_pow_impl(x, *, y):
    if y == 2:  # the same products, 1.4x faster than np.power (squared norms in DP clipping)
        return np.square(x)
    return np.power(x, y)


def _integer_pow_shape_rule(x, *, y):
    if not isinstance(y, (int, np.integer)):
        raise ShapeError(f"exponent must be a Python int, got {y!r}")
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


integer_pow_p = _nary(
    "integer_pow", _integer_pow_impl, _integer_pow_shape_rule,
    fused=CExpression(lambda y: "({0} * {0})" if y == 2 else "pow({0}, (({T}){y}))",
                      float_only=True, accepts=lambda y: isinstance(y, int),
                      unfused=lambda dtype, y: y != 2 and _float64_pow(dtype)),
)


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def neg(x):
    """``-x``."""
    return neg_p.bind(x)


def add(x, y):
    """``x + y`` with NumPy broadcasting."""
    return add_p.bind(x, y)


def sub(x, y):
    """``x - y``."""
    return sub_p.bind(x, y)


def mul(x, y):
    """``x * y``."""
    return mul_p.bind(x, y)


def div(x, y):
    """``x / y`` (true division)."""
    return div_p.bind(x, y)


def floor_divide(x, y):
    """``x // y``: ``⌊x / y⌋``, in the operands' common dtype (integers stay integers).
    Piecewise constant, so its derivative is zero."""
    return floor_divide_p.bind(x, y)


def remainder(x, y):
    """``x % y = x − y·⌊x / y⌋``, with the sign of ``y``. Its derivatives are 1 for ``x``
    and ``−⌊x / y⌋`` for ``y`` (away from the jumps where ``x / y`` is an integer)."""
    return remainder_p.bind(x, y)


def integer_pow(x, y):
    """``x ** y`` for a static Python int ``y``."""
    return integer_pow_p.bind(x, y=int(y))


def max(x, y):  # noqa: A001
    """Elementwise maximum; at ties the derivative is split evenly."""
    return max_p.bind(x, y)


def min(x, y):  # noqa: A001
    """Elementwise minimum; at ties the derivative is split evenly."""
    return min_p.bind(x, y)


def _is_integer_or_bool(x):
    return kind_of(core.dtype_of(x)) in "biu"


def floor(x):
    """``⌊x⌋``; integers and booleans are returned as they are. No derivative (zero)."""
    return x if _is_integer_or_bool(x) else floor_p.bind(x)


def ceil(x):
    """``⌈x⌉``; integers and booleans are returned as they are. No derivative (zero)."""
    return x if _is_integer_or_bool(x) else ceil_p.bind(x)


def round(x, rounding_method=RoundingMethod.AWAY_FROM_ZERO):  # noqa: A001 - lax vocabulary
    """Rounds to the nearest integer, ties away from zero (``RoundingMethod.AWAY_FROM_ZERO``,
    the default: 2.5 -> 3, -0.5 -> -1) or to even (``TO_NEAREST_EVEN``: 2.5 -> 2); integers
    and booleans are returned as they are. No derivative (zero). JAX: ``jax.lax.round``."""
    if _is_integer_or_bool(x):
        return x
    return round_p.bind(x, decimals=0, rounding_method=RoundingMethod(int(rounding_method)))


def round_decimals(x, decimals=0):
    """Rounds to ``decimals`` decimal places, halves to even (``numpy.round``); integers
    and booleans are returned as they are. No derivative (zero)."""
    if _is_integer_or_bool(x):
        return x
    return round_p.bind(x, decimals=int(decimals), rounding_method=RoundingMethod.TO_NEAREST_EVEN)


def abs(x):  # noqa: A001
    """``|x|``; its derivative at 0 is 0 (``sign(0)``)."""
    return abs_p.bind(x)


def sign(x):
    """-1, 0 or 1; carries no derivative. For a complex ``z``, ``z / |z|`` (0 at 0), a
    composite of div and abs whose derivative is the real-linear
    ``(ż − s·re(conj(s)·ż)) / |z|`` with ``s = sign(z)`` (NOTE [complex convention] in
    cuvmap/transforms/complex_rules.py; JAX's is zero); 0 at ``z = 0``, where no branch's
    cotangent is NaN (the divisor there is 1)."""
    if kind_of(core.dtype_of(x)) == "c":
        r = abs(x)
        zero = eq(r, 0)
        return select(zero, 0, div(x, select(zero, 1, r)))
    return sign_p.bind(x)


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defbroadcasting(add_p, sub_p, mul_p, div_p, max_p, min_p, floor_divide_p, remainder_p)
batching.defunary(neg_p, abs_p, sign_p, integer_pow_p, floor_p, ceil_p, round_p)


# ---------------------------------------------------------------------------------------
# Derivative rules (each serves as JVP and VJP)
# ---------------------------------------------------------------------------------------

vjp.defderivative(neg_p, lambda g, out, x: neg(g), reads=())
vjp.defderivative(add_p, lambda g, out, x, y: g, lambda g, out, x, y: g, reads=())
vjp.defderivative(sub_p, lambda g, out, x, y: g, lambda g, out, x, y: neg(g), reads=())
vjp.defderivative(mul_p, lambda g, out, x, y: mul(g, y), lambda g, out, x, y: mul(g, x), reads=(0, 1))
vjp.defderivative(
    div_p,
    lambda g, out, x, y: div(g, y),
    lambda g, out, x, y: neg(mul(g, div(out, y))),
    reads=(1, "out"),
)


def _integer_pow_derivative(g, out, x, *, y):
    if y == 0:
        return mul(g, 0)
    if y == 1:
        return g
    return mul(g, mul(y, x if y == 2 else integer_pow(x, y - 1)))


vjp.defderivative(integer_pow_p, _integer_pow_derivative, reads=(0,))


def _minmax_derivative(pick):
    """∂max(x, y)/∂x is 1 where x wins, 1/2 at ties (as JAX does), 0 elsewhere."""

    def wins(g, out, x, y):
        return select(pick(x, y), g, _where_nonzero(eq(x, y), mul(g, 0.5)))

    def loses(g, out, x, y):
        return select(pick(y, x), g, _where_nonzero(eq(x, y), mul(g, 0.5)))

    return wins, loses


vjp.defderivative(
    remainder_p,
    lambda g, out, x, y: g,
    lambda g, out, x, y: neg(mul(g, floor_divide(x, y))),
    reads=(0, 1),
)


vjp.defderivative(max_p, *_minmax_derivative(gt), reads=(0, 1))
vjp.defderivative(min_p, *_minmax_derivative(lt), reads=(0, 1))
# abs's rules (sign(x)·ẋ for real x, the real-linear re(conj(z)·ż)/|z| for complex z) are
# in complex_numbers.py, beside the real and conj they call
