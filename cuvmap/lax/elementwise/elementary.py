"""The remaining elementary functions under JAX's lax names: ``tan``, ``asin``, ``acos``,
``acosh``, ``atanh``, ``cbrt``, ``square`` and ``exp2``.

The impls are NumPy's ufuncs (``tan``, ``arcsin``, ``arccos``, ``arccosh``, ``arctanh``,
``cbrt``, ``square``, ``exp2``), which dispatch to CuPy's; integer operands give NumPy's float
dtypes (``square`` keeps its operand's dtype). Derivatives (one rule per operand,
``g * ∂out/∂x``): tan' = 1 + tan², asin' = 1/√(1 − x²), acos' = −1/√(1 − x²),
acosh' = 1/√((x − 1)(x + 1)), atanh' = 1/(1 − x²), cbrt' = 1/(3 cbrt(x)²), square' = 2x,
exp2' = log(2) · 2ˣ. All but ``cbrt`` take complex operands (NumPy's principal branches); their
rules are holomorphic (NOTE [complex convention] in cuvmap/transforms/complex_rules.py),
acosh's as ``1/(√(z − 1)·√(z + 1))``, which is ``1/√(z² − 1)`` only where ``re z ≥ 0``.
``cbrt`` of a complex operand raises (NumPy has no complex cube root), as in JAX.
"""
import math

import numpy as np

from cuvmap import core
from cuvmap.core import ShapedArray
from cuvmap.lax.elementwise.arithmetic import add, div, integer_pow, mul, neg, sub
from cuvmap.lax.elementwise.common import _c_float, _float_dtype, _float_unary_shape_rule, _nary, _same_shape_rule
from cuvmap.lax.elementwise.transcendental import rsqrt, sqrt
from cuvmap.transforms import batching, complex_rules, vjp
from cuvmap.transforms.fusion import CExpression
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

tan_p = _nary("tan", np.tan, _float_unary_shape_rule, fused=_c_float("tan({0})"))
asin_p = _nary("asin", np.arcsin, _float_unary_shape_rule, fused=_c_float("asin({0})"))
acos_p = _nary("acos", np.arccos, _float_unary_shape_rule, fused=_c_float("acos({0})"))
acosh_p = _nary("acosh", np.arccosh, _float_unary_shape_rule, fused=_c_float("acosh({0})"))
atanh_p = _nary("atanh", np.arctanh, _float_unary_shape_rule, fused=_c_float("atanh({0})"))


def _cbrt_shape_rule(x, **params):
    if kind_of(np.dtype(x.dtype)) == "c":
        raise TypeError(f"lax.cbrt: complex operands are not supported, got {np.dtype(x.dtype)} (JAX's cbrt is real)")
    return ShapedArray(x.shape, _float_dtype(x.dtype), weak_type=x.weak_type)


cbrt_p = _nary("cbrt", np.cbrt, _cbrt_shape_rule, fused=_c_float("cbrt({0})"))
square_p = _nary("square", np.square, _same_shape_rule, fused=CExpression("({0} * {0})"))
exp2_p = _nary("exp2", np.exp2, _float_unary_shape_rule, fused=_c_float("exp2({0})"))


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def tan(x, *, accuracy=None):
    """``tan(x) = sin(x) / cos(x)``. JAX: ``jax.lax.tan``."""
    return tan_p.bind(x)


def asin(x):
    """``arcsin(x)`` in ``[−π/2, π/2]``, NaN outside ``[−1, 1]``. JAX: ``jax.lax.asin``."""
    return asin_p.bind(x)


def acos(x):
    """``arccos(x)`` in ``[0, π]``, NaN outside ``[−1, 1]``. JAX: ``jax.lax.acos``."""
    return acos_p.bind(x)


def acosh(x):
    """``arccosh(x) = log(x + √(x² − 1))`` for ``x ≥ 1`` (NaN below). JAX: ``jax.lax.acosh``."""
    return acosh_p.bind(x)


def atanh(x):
    """``arctanh(x) = ½ log((1 + x)/(1 − x))`` on ``(−1, 1)``, ``±inf`` at ``±1``.
    JAX: ``jax.lax.atanh``."""
    return atanh_p.bind(x)


def cbrt(x, *, accuracy=None):
    """The real cube root ``∛x`` (negative for negative ``x``). JAX: ``jax.lax.cbrt``."""
    return cbrt_p.bind(x)


def square(x):
    """``x²``, in ``x``'s dtype. JAX: ``jax.lax.square``."""
    return square_p.bind(x)


def exp2(x, *, accuracy=None):
    """``2ˣ``. JAX: ``jax.lax.exp2``."""
    return exp2_p.bind(x)


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defunary(tan_p, asin_p, acos_p, acosh_p, atanh_p, cbrt_p, square_p, exp2_p)


# ---------------------------------------------------------------------------------------
# Derivative rules (each serves as JVP and VJP)
# ---------------------------------------------------------------------------------------

def _one_minus_square(x):
    return sub(1, mul(x, x))


vjp.defderivative(tan_p, lambda g, out, x: mul(g, add(1, mul(out, out))), reads=("out",))
vjp.defderivative(asin_p, lambda g, out, x: mul(g, rsqrt(_one_minus_square(x))), reads=(0,))
vjp.defderivative(acos_p, lambda g, out, x: neg(mul(g, rsqrt(_one_minus_square(x)))), reads=(0,))
# (x − 1)(x + 1) rather than x² − 1: no cancellation near 1
# (complex z: 1/(√(z − 1)·√(z + 1)), the principal branch's derivative also where re z < 0)
def _acosh_derivative(g, out, x):
    if kind_of(core.dtype_of(x)) == "c":
        return div(g, mul(sqrt(sub(x, 1)), sqrt(add(x, 1))))
    return mul(g, rsqrt(mul(sub(x, 1), add(x, 1))))


vjp.defderivative(acosh_p, _acosh_derivative, reads=(0,))
vjp.defderivative(atanh_p, lambda g, out, x: div(g, _one_minus_square(x)), reads=(0,))
vjp.defderivative(cbrt_p, lambda g, out, x: mul(g, mul(1 / 3, integer_pow(out, -2))), reads=("out",))
vjp.defderivative(square_p, lambda g, out, x: mul(g, mul(2, x)), reads=(0,))
vjp.defderivative(exp2_p, lambda g, out, x: mul(g, mul(math.log(2), out)), reads=("out",))

# holomorphic on complex operands: the rules above are f'(z)·g (NOTE [complex convention])
complex_rules.defcomplex(tan_p, asin_p, acos_p, acosh_p, atanh_p, square_p, exp2_p)
