"""Special functions as primitives, with JAX's names: ``erfc``, ``lgamma``, ``digamma``,
``polygamma`` (for derivatives), ``igamma``, ``igammac``, ``igamma_grad_a``, ``bessel_i0e``,
``bessel_i1e``.

On the CPU they are vectorised NumPy evaluations (:mod:`cuvmap.lax.elementwise.special_impls`,
where each NOTE states the method and its accuracy), computed in float64 and rounded to the
operand's float dtype; on the GPU, CuPy's kernels of ``cupyx.scipy.special`` run instead.
Integer operands give NumPy's float dtypes.

Derivatives (one rule per operand, ``g * ∂out/∂x_i``, as every elementwise primitive):
erfc' = −(2/√π) e^{−x²}; lgamma' = digamma; ψ⁽ᵐ⁾' = ψ⁽ᵐ⁺¹⁾; ∂P(a, x)/∂x = x^{a−1} e^{−x} / Γ(a)
and ∂P/∂a = ``igamma_grad_a`` (Q = 1 − P: the negatives); i0e' = i1e − sign(x) i0e;
i1e' = i0e − i1e (sign(x) + 1/x), 1/2 at 0.
"""
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapedArray
from cuvmap.errors import MissingRuleError
from cuvmap.lax.elementwise import special_impls
from cuvmap.lax.elementwise.arithmetic import add, div, mul, neg, sign, sub
from cuvmap.lax.elementwise.common import _float_dtype, _float_unary_shape_rule, _nary, _naryop_shape_rule
from cuvmap.lax.elementwise.comparisons import eq, select
from cuvmap.lax.elementwise.transcendental import exp, log
from cuvmap.transforms import batching, vjp
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

def _check_real(name, dtypes):
    """The special functions are real: a complex operand raises (rather than losing its
    imaginary part in the float64 evaluation)."""
    for dtype in dtypes:
        if kind_of(np.dtype(dtype)) == "c":
            raise TypeError(f"lax.{name}: complex operands are not supported, got {np.dtype(dtype)}")


def _real_unary_shape_rule(name):
    def rule(x, **params):
        _check_real(name, [x.dtype])
        return _float_unary_shape_rule(x)

    return rule


def _real_binary_shape_rule(name):
    def rule(a, x, **params):
        _check_real(name, [a.dtype, x.dtype])
        out = _naryop_shape_rule(a, x)
        return ShapedArray(out.shape, _float_dtype(out.dtype), weak_type=out.weak_type)

    return rule


def _special_impl(name, numpy_fn, cupy_name):
    """The impl of a special function: CuPy's kernel ``cupyx.scipy.special.<cupy_name>`` on
    the GPU (where CuPy has none, ``numpy_fn`` on the host and the result copied back),
    ``numpy_fn`` on float64 arrays on the CPU."""

    def impl(*operands, **params):
        _check_real(name, [np.result_type(getattr(x, "dtype", x)) for x in operands])
        # Python scalars stay weak in result_type (NEP 50), as in the shape rule
        dtype = _float_dtype(np.result_type(*(getattr(x, "dtype", x) for x in operands)))
        arrays = [core.as_array(x) for x in operands]
        xp = backend.xp_of(*arrays)
        if xp is not np:
            import cupyx.scipy.special  # optional: the GPU backend only

            kernel = getattr(cupyx.scipy.special, cupy_name, None) if cupy_name is not None else None
            if kernel is not None:
                return kernel(*params.values(), *(x.astype(dtype) for x in arrays))
            shape = np.broadcast_shapes(*(x.shape for x in arrays))
            host = [np.atleast_1d(xp.asnumpy(x).astype(np.float64)) for x in arrays]
            return xp.asarray(numpy_fn(*params.values(), *host).astype(dtype).reshape(shape))
        shape = np.broadcast_shapes(*(np.shape(x) for x in arrays))
        host = [np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in arrays]  # (0-d: the evaluations index)
        out = numpy_fn(*params.values(), *host)
        return np.asarray(out).astype(dtype, copy=False).reshape(shape)

    return impl


erfc_p = _nary("erfc", _special_impl("erfc", special_impls.erfc, "erfc"), _real_unary_shape_rule("erfc"))
lgamma_p = _nary("lgamma", _special_impl("lgamma", special_impls.lgamma, "gammaln"), _real_unary_shape_rule("lgamma"))
digamma_p = _nary("digamma", _special_impl("digamma", lambda x: special_impls.polygamma(0, x), "digamma"),
                  _real_unary_shape_rule("digamma"))


def _polygamma_shape_rule(x, *, order):
    if not isinstance(order, int) or order < 0:
        raise core.ShapeError(f"polygamma: order must be a non-negative Python int, got {order!r}")
    _check_real("polygamma", [x.dtype])
    return _float_unary_shape_rule(x)


polygamma_p = _nary("polygamma", _special_impl("polygamma", special_impls.polygamma, "polygamma"),
                    _polygamma_shape_rule)
igamma_p = _nary("igamma", _special_impl("igamma", special_impls.igamma, "gammainc"), _real_binary_shape_rule("igamma"))
igammac_p = _nary("igammac", _special_impl("igammac", special_impls.igammac, "gammaincc"),
                  _real_binary_shape_rule("igammac"))
# CuPy has no kernel for ∂P/∂a: it is computed on the host
igamma_grad_a_p = _nary("igamma_grad_a", _special_impl("igamma_grad_a", special_impls.igamma_grad_a, None),
                        _real_binary_shape_rule("igamma_grad_a"))
bessel_i0e_p = _nary("bessel_i0e", _special_impl("bessel_i0e", special_impls.bessel_i0e, "i0e"),
                     _real_unary_shape_rule("bessel_i0e"))
bessel_i1e_p = _nary("bessel_i1e", _special_impl("bessel_i1e", special_impls.bessel_i1e, "i1e"),
                     _real_unary_shape_rule("bessel_i1e"))


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def erfc(x):
    """The complementary error function ``erfc(x) = 1 − erf(x) = (2/√π) ∫ₓ^∞ e^{−t²} dt``,
    accurate in relative terms where it is tiny (NOTE [erfc from erfcx's Taylor tables]).
    JAX: ``jax.lax.erfc``."""
    return erfc_p.bind(x)


def lgamma(x):
    """``log |Γ(x)|``; ``+inf`` at the poles 0, −1, −2, ... (NOTE [lgamma and the
    polygammas]). Its derivative is :func:`digamma`. JAX: ``jax.lax.lgamma``."""
    return lgamma_p.bind(x)


def digamma(x):
    """The digamma function ``ψ(x) = Γ'(x)/Γ(x) = d lgamma(x)/dx``; NaN at the poles
    (NOTE [lgamma and the polygammas]). JAX: ``jax.lax.digamma``."""
    return digamma_p.bind(x)


def polygamma(m, x):
    """The polygamma function ``ψ⁽ᵐ⁾(x) = dᵐ ψ(x) / dxᵐ`` for a static Python int ``m ≥ 0``
    (``m = 0`` is :func:`digamma`); it carries the derivatives of ``digamma``. JAX's
    ``jax.lax.polygamma`` takes ``m`` as an array; here it must be a concrete int."""
    m = int(m)
    return digamma_p.bind(x) if m == 0 else polygamma_p.bind(x, order=m)


def igamma(a, x):
    """The regularized lower incomplete gamma function
    ``P(a, x) = (1/Γ(a)) ∫₀ˣ t^{a−1} e^{−t} dt`` for ``a > 0``, ``x ≥ 0`` (NaN elsewhere);
    NOTE [igamma by series and continued fraction]. JAX: ``jax.lax.igamma``."""
    return igamma_p.bind(a, x)


def igammac(a, x):
    """The regularized upper incomplete gamma function ``Q(a, x) = 1 − P(a, x)``, computed
    directly where it is small. JAX: ``jax.lax.igammac``."""
    return igammac_p.bind(a, x)


def igamma_grad_a(a, x):
    """``∂P(a, x)/∂a``, the derivative of :func:`igamma` in its first argument (its own
    derivative in ``a`` is not implemented, as in JAX). JAX: ``jax.lax.igamma_grad_a``."""
    return igamma_grad_a_p.bind(a, x)


def bessel_i0e(x):
    """The exponentially scaled modified Bessel function of order 0,
    ``i0e(x) = e^{−|x|} I₀(x)`` (NOTE [i0e and i1e by series and asymptotics]).
    JAX: ``jax.lax.bessel_i0e``."""
    return bessel_i0e_p.bind(x)


def bessel_i1e(x):
    """The exponentially scaled modified Bessel function of order 1,
    ``i1e(x) = e^{−|x|} I₁(x)``. JAX: ``jax.lax.bessel_i1e``."""
    return bessel_i1e_p.bind(x)


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defunary(erfc_p, lgamma_p, digamma_p, polygamma_p, bessel_i0e_p, bessel_i1e_p)
batching.defbroadcasting(igamma_p, igammac_p, igamma_grad_a_p)


# ---------------------------------------------------------------------------------------
# Derivative rules (each serves as JVP and VJP)
# ---------------------------------------------------------------------------------------

vjp.defderivative(erfc_p, lambda g, out, x: mul(g, mul(-2 / math.sqrt(math.pi), exp(neg(mul(x, x))))), reads=(0,))
vjp.defderivative(lgamma_p, lambda g, out, x: mul(g, digamma(x)), reads=(0,))
vjp.defderivative(digamma_p, lambda g, out, x: mul(g, polygamma(1, x)), reads=(0,))
vjp.defderivative(polygamma_p, lambda g, out, x, *, order: mul(g, polygamma(order + 1, x)), reads=(0,))


def _igamma_dx(a, x):
    """∂P(a, x)/∂x = exp((a − 1) log x − x − lgamma(a))."""
    return exp(sub(sub(mul(sub(a, 1), log(x)), x), lgamma(a)))


vjp.defderivative(
    igamma_p,
    lambda g, out, a, x: mul(g, igamma_grad_a(a, x)),
    lambda g, out, a, x: mul(g, _igamma_dx(a, x)),
    reads=(0, 1),
)
vjp.defderivative(
    igammac_p,
    lambda g, out, a, x: neg(mul(g, igamma_grad_a(a, x))),
    lambda g, out, a, x: neg(mul(g, _igamma_dx(a, x))),
    reads=(0, 1),
)


def _igamma_grad_a_da(g, out, a, x):
    raise MissingRuleError("igamma_grad_a: the derivative with respect to a (a second derivative of igamma in "
                           "a) is not implemented (as in JAX)")


# ∂/∂x ∂P/∂a = ∂/∂a ∂P/∂x = ∂P/∂x · (log x − ψ(a))
vjp.defderivative(
    igamma_grad_a_p,
    _igamma_grad_a_da,
    lambda g, out, a, x: mul(g, mul(_igamma_dx(a, x), sub(log(x), digamma(a)))),
    reads=(0, 1),
)
vjp.defderivative(bessel_i0e_p, lambda g, out, x: mul(g, sub(bessel_i1e(x), mul(sign(x), out))), reads=(0, "out"))


def _bessel_i1e_derivative(g, out, x):
    """i0e(x) − i1e(x)(sign(x) + 1/x), whose limit at 0 is 1/2 (x = 0 divides by 1 instead)."""
    zero = eq(x, 0)
    safe_x = select(zero, 1, x)
    slope = sub(bessel_i0e(safe_x), mul(out, add(sign(safe_x), div(1, safe_x))))
    return mul(g, select(zero, 0.5, slope))


vjp.defderivative(bessel_i1e_p, _bessel_i1e_derivative, reads=(0, "out"))
