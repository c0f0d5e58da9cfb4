"""More special functions as primitives: the regularized incomplete beta function (JAX's
``lax.betainc``, primitive ``regularized_incomplete_beta``) and the Bessel functions of
integer order ``J_n``, ``Y_n`` and of real order ``e^{−|x|} I_v`` (``bessel_jn``,
``bessel_yn``, ``bessel_ive``: SciPy's ``jn``, ``yn``, ``ive``, which JAX's lax has not).

Their impls are the vectorised NumPy evaluations of :mod:`cuvmap.lax.elementwise.bessel_impls`
(each NOTE there states the method and its accuracy), computed in float64 and rounded to the
operands' float dtype; on the GPU the operands are copied to the host for them.

Derivatives (one rule per operand, ``g * ∂out/∂x_i``):
∂I_x(a, b)/∂x = x^{a−1}(1−x)^{b−1}/B(a, b) (the derivatives in ``a`` and ``b`` raise, as in
JAX); J_n' = (J_{n−1} − J_{n+1})/2, Y_n' = (Y_{n−1} − Y_{n+1})/2; for ive,
d/dx e^{−|x|} I_v(x) = ive(v+1, x) + (v/x − sign(x)) ive(v, x) (from I_v' = I_{v+1} + (v/x) I_v),
with its limits at x = 0. The orders ``n`` and ``v`` have no derivative (a ``MissingRuleError``
names them), as in SciPy/autograd.
"""
import numpy as np

from cuvmap.core import ShapedArray
from cuvmap.errors import MissingRuleError
from cuvmap.lax.elementwise import bessel_impls
from cuvmap.lax.elementwise.arithmetic import abs as abs_, add, div, mul, sign, sub
from cuvmap.lax.elementwise.common import _float_dtype, _nary, _naryop_shape_rule
from cuvmap.lax.elementwise.comparisons import eq, gt, select
from cuvmap.lax.elementwise.special import _check_real, _special_impl, lgamma
from cuvmap.lax.elementwise.transcendental import exp, log, log1p
from cuvmap.transforms import batching, vjp


def _real_nary_shape_rule(name):
    def rule(*avals, **params):
        _check_real(name, [a.dtype for a in avals])
        out = _naryop_shape_rule(*avals)
        return ShapedArray(out.shape, _float_dtype(out.dtype), weak_type=out.weak_type)

    return rule


regularized_incomplete_beta_p = _nary(
    "regularized_incomplete_beta", _special_impl("regularized_incomplete_beta", bessel_impls.betainc, None),
    _real_nary_shape_rule("betainc"))
bessel_jn_p = _nary("bessel_jn", _special_impl("bessel_jn", bessel_impls.bessel_jn, None),
                    _real_nary_shape_rule("bessel_jn"))
bessel_yn_p = _nary("bessel_yn", _special_impl("bessel_yn", bessel_impls.bessel_yn, None),
                    _real_nary_shape_rule("bessel_yn"))
bessel_ive_p = _nary("bessel_ive", _special_impl("bessel_ive", bessel_impls.bessel_ive, None),
                     _real_nary_shape_rule("bessel_ive"))


def betainc(a, b, x):
    """The regularized incomplete beta function
    ``I_x(a, b) = (1/B(a, b)) ∫₀ˣ t^{a−1} (1−t)^{b−1} dt`` for ``a, b > 0``, ``0 ≤ x ≤ 1``
    (NaN elsewhere); NOTE [betainc by its continued fraction]. Differentiable in ``x`` only,
    as JAX's. JAX: ``jax.lax.betainc``."""
    return regularized_incomplete_beta_p.bind(a, b, x)


def bessel_jn(n, x):
    """The Bessel function of the first kind ``J_n(x)`` of integer order ``n`` (an array of
    integer values; NaN for others); NOTE [J_n and Y_n by Miller's recurrence, Neumann's series
    and Hankel's expansion]. SciPy: ``scipy.special.jn``."""
    return bessel_jn_p.bind(n, x)


def bessel_yn(n, x):
    """The Bessel function of the second kind ``Y_n(x)`` of integer order ``n``, for
    ``x > 0`` (``−inf`` at 0, NaN below). SciPy: ``scipy.special.yn``."""
    return bessel_yn_p.bind(n, x)


def bessel_ive(v, x):
    """The exponentially scaled modified Bessel function of the first kind of real order,
    ``e^{−|x|} I_v(x)``, for ``v ≥ 0`` or integer ``v``; ``x < 0`` only for integer ``v``
    (NaN otherwise); NOTE [ive by its series summed from the largest term].
    SciPy: ``scipy.special.ive``."""
    return bessel_ive_p.bind(v, x)


batching.defbroadcasting(regularized_incomplete_beta_p, bessel_jn_p, bessel_yn_p, bessel_ive_p)


def _no_order_derivative(name, argument):
    def rule(g, out, *primals):
        raise MissingRuleError(f"{name}: no derivative with respect to {argument} (as in JAX/SciPy); "
                               f"differentiate with respect to x only")

    return rule


def _betainc_dx(g, out, a, b, x):
    """x^{a−1} (1−x)^{b−1} / B(a, b), as exp of its log."""
    log_beta = sub(add(lgamma(a), lgamma(b)), lgamma(add(a, b)))
    return mul(g, exp(sub(add(mul(sub(a, 1), log(x)), mul(sub(b, 1), log1p(mul(x, -1)))), log_beta)))


vjp.defderivative(regularized_incomplete_beta_p, _no_order_derivative("betainc", "a"),
                  _no_order_derivative("betainc", "b"), _betainc_dx, reads=(0, 1, 2))
vjp.defderivative(bessel_jn_p, _no_order_derivative("jn", "the order n"),
                  lambda g, out, n, x: mul(g, mul(0.5, sub(bessel_jn(sub(n, 1), x), bessel_jn(add(n, 1), x)))),
                  reads=(0, 1))
vjp.defderivative(bessel_yn_p, _no_order_derivative("yn", "the order n"),
                  lambda g, out, n, x: mul(g, mul(0.5, sub(bessel_yn(sub(n, 1), x), bessel_yn(add(n, 1), x)))),
                  reads=(0, 1))


def _ive_dx(g, out, v, x):
    """ive(v+1, x) + (v/x − sign(x)) ive(v, x); at x = 0 its limit: 1/2 for |v| = 1, 0 for
    v = 0 and |v| > 1, inf for 0 < v < 1."""
    zero = eq(x, 0)
    safe_x = select(zero, 1, x)
    slope = add(bessel_ive(add(v, 1), safe_x), mul(sub(div(v, safe_x), sign(safe_x)), bessel_ive(v, safe_x)))
    order = abs_(v)
    at_zero = select(eq(order, 1), 0.5, select(gt(order, 1), 0.0, select(eq(order, 0), 0.0, np.inf)))
    return mul(g, select(zero, at_zero, slope))


vjp.defderivative(bessel_ive_p, _no_order_derivative("ive", "the order v"), _ive_dx, reads=(0, 1))

__all__ = ["betainc", "bessel_ive", "bessel_jn", "bessel_yn", "bessel_ive_p", "bessel_jn_p", "bessel_yn_p",
           "regularized_incomplete_beta_p"]
