"""Transcendental functions: ``pow``, ``exp``, ``log``, ``log1p``, ``expm1``, ``sqrt``,
``rsqrt``, ``tanh``, ``logistic``, ``sin``, ``cos``, ``log2``, ``log10``, ``atan``,
``atan2``, ``sinh``, ``cosh``, ``asinh``, ``erf`` (NOTE [erf without SciPy]) and ``erf_inv``
(NOTE [erf_inv from Giles' polynomials]).

Integer operands give NumPy's float dtypes (the smallest float that holds them exactly).
Derivatives: one rule per operand, ``g * ∂out/∂x_i`` (see the package's docstring).
"""
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.lax.elementwise.arithmetic import add, div, mul, neg, sub
from cuvmap.lax.elementwise.common import (
    _c_float, _div_shape_rule, _float64_pow, _float_dtype, _float_unary_shape_rule, _nary,
)
from cuvmap.lax.elementwise.comparisons import convert_element_type, eq, ne, select
from cuvmap.transforms import batching, vjp
from cuvmap.transforms.fusion import CExpression
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

pow_p = _nary("pow", np.power, fused=CExpression("pow({0}, {1})", float_only=True, unfused=_float64_pow))
exp_p = _nary("exp", np.exp, _float_unary_shape_rule, fused=_c_float("exp({0})"))
log_p = _nary("log", np.log, _float_unary_shape_rule, fused=_c_float("log({0})"))
log1p_p = _nary("log1p", np.log1p, _float_unary_shape_rule, fused=_c_float("log1p({0})"))
expm1_p = _nary("expm1", np.expm1, _float_unary_shape_rule, fused=_c_float("expm1({0})"))
sqrt_p = _nary("sqrt", np.sqrt, _float_unary_shape_rule, fused=_c_float("sqrt({0})"))
rsqrt_p = _nary("rsqrt", lambda x: np.reciprocal(np.sqrt(x)), _float_unary_shape_rule,
                fused=_c_float("(({T})1 / sqrt({0}))"))


tanh_p = _nary("tanh", np.tanh, _float_unary_shape_rule, fused=_c_float("tanh({0})"))


# logistic(x) = 1 / (1 + exp(-x)) = exp(-softplus(-x)): no overflow for large |x|.
# A complex z (no logaddexp in NumPy) takes 1 / (1 + exp(-z)), holomorphic as in JAX.
def _logistic_impl(x):
    if getattr(x, "dtype", None) is not None and kind_of(x.dtype) == "c":
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return 1 / (1 + np.exp(-x))
    return np.exp(-np.logaddexp(0, -x))


logistic_p = _nary("logistic", _logistic_impl, _float_unary_shape_rule)
sin_p = _nary("sin", np.sin, _float_unary_shape_rule, fused=_c_float("sin({0})"))
cos_p = _nary("cos", np.cos, _float_unary_shape_rule, fused=_c_float("cos({0})"))
log2_p = _nary("log2", np.log2, _float_unary_shape_rule, fused=_c_float("log2({0})"))
log10_p = _nary("log10", np.log10, _float_unary_shape_rule, fused=_c_float("log10({0})"))
atan_p = _nary("atan", np.arctan, _float_unary_shape_rule, fused=_c_float("atan({0})"))
sinh_p = _nary("sinh", np.sinh, _float_unary_shape_rule, fused=_c_float("sinh({0})"))
cosh_p = _nary("cosh", np.cosh, _float_unary_shape_rule, fused=_c_float("cosh({0})"))
asinh_p = _nary("asinh", np.arcsinh, _float_unary_shape_rule, fused=_c_float("asinh({0})"))


# atan2(y, x) has true division's dtypes: integer and boolean operands give float64
def _atan2_shape_rule(x, y, **params):
    for a in (x, y):
        if kind_of(np.dtype(a.dtype)) == "c":
            raise TypeError(f"lax.atan2: complex operands are not supported, got {np.dtype(a.dtype)} (as in JAX; "
                            "the angle of a complex number is angle(z))")
    return _div_shape_rule(x, y, **params)


atan2_p = _nary("atan2", np.arctan2, _atan2_shape_rule, fused=_c_float("atan2({0}, {1})"))


# NOTE [erf without SciPy]
# NumPy has no erf, and SciPy is no dependency of cuvmap, so on the CPU erf is evaluated
# from Taylor expansions around the centers c = 0, 1/16, ..., 6 (every |x| lies within
# 1/32 of one; erf(6) = 1 − 2·10⁻¹⁷ is 1 in float64, so larger |x| give ±1):
#     erf(c + h) = Σ_m d_m(c) hᵐ,  d_0 = erf(c),
#     d_m(c) = erf⁽ᵐ⁾(c) / m! = (2/√π) e^{−c²} (−1)^{m−1} H_{m−1}(c) / m!   (m ≥ 1),
# with the (physicists') Hermite polynomials from H_{n+1} = 2c·H_n − 2n·H_{n−1}. Nine terms
# leave a remainder below 10⁻¹⁷ for |h| ≤ 1/32 at every center (five below 3·10⁻⁹, for
# float32, which is computed in float32). The coefficients are computed once, at import,
# from these closed forms (and math.erf for d_0); evaluating is one Horner pass whose
# coefficients are gathered by center: about 35 whole-array operations (20 in float32)
# and no Python loop over elements, as fast as SciPy's erf on large arrays. Results are
# within a few units in the last place of math.erf's (tests/numpy/test_numpy.py). On the GPU,
# CuPy's own erf kernel (cupyx.scipy.special.erf) runs instead.
_ERF_STEP = 1.0 / 16
_ERF_LAST = 6.0


def _erf_coefficients(terms, dtype):
    """``(terms + 1, n_centers)``: row ``m`` holds ``d_m`` at every center."""
    centers = np.arange(0.0, _ERF_LAST + _ERF_STEP / 2, _ERF_STEP)
    hermite = [np.ones_like(centers), 2 * centers]
    for n in range(1, terms):
        hermite.append(2 * centers * hermite[n] - 2 * n * hermite[n - 1])
    scale = 2 / math.sqrt(math.pi) * np.exp(-centers * centers)
    rows = [np.array([math.erf(c) for c in centers])]
    for m in range(1, terms + 1):
        rows.append(scale * (-1) ** (m - 1) * hermite[m - 1] / math.factorial(m))
    return np.stack(rows).astype(dtype)


_ERF_TABLES = {np.dtype(np.float64): _erf_coefficients(9, np.float64),
               np.dtype(np.float32): _erf_coefficients(5, np.float32)}


def _erf_taylor(x, xp):
    """erf on float32 or float64 arrays of module ``xp`` (NOTE [erf without SciPy])."""
    table = _ERF_TABLES[x.dtype]
    if xp is not np:
        table = xp.asarray(table)
    a = xp.abs(x)
    # the center index from fmin (which maps NaN to the last center: a valid index);
    # h from minimum, which keeps NaN, so NaN stays NaN
    k = (xp.fmin(a, _ERF_LAST) * (1 / _ERF_STEP) + 0.5).astype(np.intp)
    h = xp.minimum(a, _ERF_LAST) - k.astype(x.dtype) * x.dtype.type(_ERF_STEP)
    acc = table[-1].take(k)
    for row in table[-2::-1]:
        acc *= h
        acc += row.take(k)
    return xp.copysign(acc, x)


def _real_only(name, dtype):
    """erf and erf_inv take real operands (as JAX's): a complex one raises, where NumPy's
    cast would drop its imaginary part and give a wrong number."""
    if kind_of(np.dtype(dtype)) == "c":
        raise TypeError(f"{name}: operand must be real, got {np.dtype(dtype)} (erf of complex numbers is not supported)")


def _real_float_unary_shape_rule(name):
    def rule(x):
        _real_only(name, x.dtype)
        return _float_unary_shape_rule(x)

    return rule


def _erf_impl(x):
    x = core.as_array(x)
    _real_only("erf", x.dtype)
    xp = backend.xp_of(x)
    if kind_of(x.dtype) == "c":  # (its real evaluation would drop the imaginary part)
        raise TypeError(f"lax.erf: complex operands are not supported, got {x.dtype}")
    if kind_of(x.dtype) != "f":
        x = x.astype(_float_dtype(x.dtype))
    if xp is not np:
        try:
            from cupyx.scipy.special import erf as cupy_erf
        except ImportError:  # pragma: no cover - CuPy ships cupyx
            cupy_erf = None
        if cupy_erf is not None:
            return cupy_erf(x)
    if x.dtype in _ERF_TABLES:
        return _erf_taylor(x, xp)
    work = np.float32 if x.dtype.itemsize < 4 else np.float64  # float16; long double
    return _erf_taylor(x.astype(work), xp).astype(x.dtype)


erf_p = _nary("erf", _erf_impl, _real_float_unary_shape_rule("erf"), fused=_c_float("erf({0})"))


# NOTE [erf_inv from Giles' polynomials]
# erf_inv(y), the x with erf(x) = y on (−1, 1), is evaluated on the CPU as in M. Giles,
# "Approximating the erfinv function" (GPU Computing Gems, 2011), the algorithm XLA uses:
# with w = −log((1 − y)(1 + y)) (the product, not 1 − y², keeps the tails accurate),
# erf_inv(y) = y · p(w) for a polynomial p in w − 3.125 (w < 6.25: |y| below about 0.999),
# in √w − 3.25 (w < 16) or in √w − 5 (further out), with the paper's double-precision
# coefficients. It is computed in float64 for every float dtype (and rounded to it), so
# float32 results are correctly rounded or within one ulp; the central polynomial runs
# on the whole array and the tail ones on the few elements beyond |y| ≈ 0.999 only.
# erf_inv(±1) = ±inf, NaN outside [−1, 1]. On the GPU, CuPy's erfinv kernel runs instead.
# Its derivative is 1 / erf'(x) = (√π / 2) exp(x²) at x = erf_inv(y).
_ERF_INV_CENTRAL = (  # in w - 3.125, w < 6.25; highest degree first
    -3.6444120640178196996e-21, -1.685059138182016589e-19, 1.2858480715256400167e-18,
    1.115787767802518096e-17, -1.333171662854620906e-16, 2.0972767875968561637e-17,
    6.6376381343583238325e-15, -4.0545662729752068639e-14, -8.1519341976054721522e-14,
    2.6335093153082322977e-12, -1.2975133253453532498e-11, -5.4154120542946279317e-11,
    1.051212273321532285e-09, -4.1126339803469836976e-09, -2.9070369957882005086e-08,
    4.2347877827932403518e-07, -1.3654692000834678645e-06, -1.3882523362786468719e-05,
    0.0001867342080340571352, -0.00074070253416626697512, -0.0060336708714301490533,
    0.24015818242558961693, 1.6536545626831027356)


_ERF_INV_TAIL = (  # in sqrt(w) - 3.25, 6.25 <= w < 16
    2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
    1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
    2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
    6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
    0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
    -0.0037512085075692412107, 0.005370914553590063617, 1.0052589676941592334,
    3.0838856104922207635)


_ERF_INV_FAR = (  # in sqrt(w) - 5, w >= 16
    -2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
    -3.7894654401267369937e-09, 7.6157012080783393804e-09, -1.4960026627149240478e-08,
    2.9147953450901080826e-08, -6.7711997758452339498e-08, 2.2900482228026654717e-07,
    -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
    7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026,
    1.0103004648645343977, 4.8499064014085844221)


def _horner(coefficients, t):
    acc = np.full_like(t, coefficients[0])
    for c in coefficients[1:]:
        acc *= t
        acc += c
    return acc


def _erf_inv_giles(y):
    """erf_inv on a float64 NumPy array (NOTE [erf_inv from Giles' polynomials])."""
    with np.errstate(invalid="ignore", divide="ignore"):
        w = -np.log((1.0 - y) * (1.0 + y))
        p = _horner(_ERF_INV_CENTRAL, w - 3.125)
        tail = np.nonzero(w >= 6.25)
        if tail[0].size:
            wt = w[tail]
            root = np.sqrt(wt)
            p[tail] = np.where(wt < 16.0, _horner(_ERF_INV_TAIL, root - 3.25), _horner(_ERF_INV_FAR, root - 5.0))
        out = p * y
    ones = np.abs(y) == 1
    if ones.any():
        out[ones] = np.copysign(np.inf, y[ones])
    return out


def _erf_inv_impl(x):
    x = core.as_array(x)
    _real_only("erf_inv", x.dtype)
    xp = backend.xp_of(x)
    if kind_of(x.dtype) == "c":  # (its real evaluation would drop the imaginary part)
        raise TypeError(f"lax.erf_inv: complex operands are not supported, got {x.dtype}")
    if kind_of(x.dtype) != "f":
        x = x.astype(_float_dtype(x.dtype))
    if xp is not np:
        from cupyx.scipy.special import erfinv as cupy_erfinv

        return cupy_erfinv(x)
    return _erf_inv_giles(x.astype(np.float64).reshape(-1)).astype(x.dtype, copy=False).reshape(x.shape)


erf_inv_p = _nary("erf_inv", _erf_inv_impl, _real_float_unary_shape_rule("erf_inv"))


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def pow(x, y):  # noqa: A001 - lax vocabulary
    """``x ** y`` with a traced exponent; see :func:`integer_pow` for a fixed int."""
    return pow_p.bind(x, y)


def exp(x, *, accuracy=None):
    return exp_p.bind(x)


def log(x, *, accuracy=None):
    return log_p.bind(x)


def log1p(x, *, accuracy=None):
    """``log(1 + x)``, accurate for small ``x``."""
    return log1p_p.bind(x)


def expm1(x, *, accuracy=None):
    """``exp(x) - 1``, accurate for small ``x``."""
    return expm1_p.bind(x)


def sqrt(x, *, accuracy=None):
    return sqrt_p.bind(x)


def rsqrt(x, *, accuracy=None):
    """``1 / sqrt(x)``."""
    return rsqrt_p.bind(x)


def tanh(x, *, accuracy=None):
    return tanh_p.bind(x)


def logistic(x, *, accuracy=None):
    """The sigmoid ``1 / (1 + exp(-x))``."""
    return logistic_p.bind(x)


def sin(x, *, accuracy=None):
    return sin_p.bind(x)


def cos(x, *, accuracy=None):
    return cos_p.bind(x)


def log2(x):
    return log2_p.bind(x)


def log10(x):
    return log10_p.bind(x)


def atan(x):
    """``arctan(x)``."""
    return atan_p.bind(x)


def atan2(y, x):
    """The angle of the point ``(x, y)``, in ``[−π, π]`` (``numpy.arctan2(y, x)``)."""
    return atan2_p.bind(y, x)


def sinh(x):
    return sinh_p.bind(x)


def cosh(x):
    return cosh_p.bind(x)


def asinh(x):
    """``arcsinh(x) = log(x + √(x² + 1))``."""
    return asinh_p.bind(x)


def erf(x):
    """The error function ``(2/√π) ∫₀ˣ exp(−t²) dt`` (NOTE [erf without SciPy])."""
    return erf_p.bind(x)


def erf_inv(x):
    """The inverse error function: the ``y`` in ``(−∞, ∞)`` with ``erf(y) = x`` for ``x`` in
    ``[−1, 1]`` (``±inf`` at ``±1``, NaN outside); NOTE [erf_inv from Giles' polynomials]."""
    return erf_inv_p.bind(x)


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defbroadcasting(pow_p, atan2_p)
batching.defunary(
    exp_p, log_p, log1p_p, expm1_p, sqrt_p, rsqrt_p, tanh_p, logistic_p, sin_p, cos_p, log2_p, log10_p, atan_p, sinh_p,
    cosh_p, asinh_p, erf_p, erf_inv_p,
)


# ---------------------------------------------------------------------------------------
# Derivative rules (each serves as JVP and VJP)
# ---------------------------------------------------------------------------------------

def _replace_zero(x):
    return select(eq(x, 0), 1, x)


def _pow_derivative_base(g, out, x, y):
    """``g·y·x^(y−1)``, and 0 at ``x = y = 0``, where ``0·0^(−1)`` would be NaN: x⁰ = 1 is
    constant in x, so 0 is the derivative there (JAX's ``lax.pow`` gives NaN, a TODO of
    its own test; ``x ** n`` with an int ``n`` gives 0 in both). Only that point is
    special: at ``y = 0`` and ``x ≠ 0`` the formula itself is 0, and its derivative in
    ``y`` stays ``1/x`` (JAX's testPowSecondDerivative). The exponent there is 1, so
    that no 0^(−1) is computed only to be dropped."""
    both_zero = _and(eq(x, 0), eq(y, 0))
    y = select(both_zero, 1, y)
    return mul(g, select(both_zero, 0, mul(y, pow(x, sub(y, 1)))))


def _and(p, q):
    """Elementwise ``p and q`` of two boolean arrays, from select (no bitwise primitive here)."""
    return select(p, q, False)


def _pow_derivative_exponent(g, out, x, y):
    """``g·log(x)·x^y`` (``log`` of 1 where ``x = 0``: JAX's 0). A Python-number base keeps
    its log a Python number (weak), so that it meets a GPU ``out`` as the base did (a
    NumPy 0-d array there is a host array CuPy refuses)."""
    if type(x) in (bool, int, float, complex):
        with np.errstate(invalid="ignore", divide="ignore"):  # a negative real base: NaN, as log's
            lx = np.log(np.asarray(x if x != 0 else 1, dtype=np.result_type(x, 1.0))).item()
    else:
        lx = log(_replace_zero(x))
    return mul(g, mul(lx, out))


vjp.defderivative(pow_p, _pow_derivative_base, _pow_derivative_exponent, reads=(0, 1, "out"))


vjp.defderivative(exp_p, lambda g, out, x: mul(g, out), reads=("out",))
vjp.defderivative(log_p, lambda g, out, x: div(g, x), reads=(0,))
vjp.defderivative(log1p_p, lambda g, out, x: div(g, add(x, 1)), reads=(0,))
vjp.defderivative(expm1_p, lambda g, out, x: mul(g, add(out, 1)), reads=("out",))
vjp.defderivative(sqrt_p, lambda g, out, x: div(g, mul(out, 2)), reads=("out",))
vjp.defderivative(rsqrt_p, lambda g, out, x: mul(g, mul(div(out, x), -0.5)), reads=(0, "out"))
vjp.defderivative(tanh_p, lambda g, out, x: mul(g, sub(1, mul(out, out))), reads=("out",))
vjp.defderivative(logistic_p, lambda g, out, x: mul(g, mul(out, sub(1, out))), reads=("out",))
vjp.defderivative(sin_p, lambda g, out, x: mul(g, cos(x)), reads=(0,))
vjp.defderivative(cos_p, lambda g, out, x: neg(mul(g, sin(x))), reads=(0,))
vjp.defderivative(log2_p, lambda g, out, x: div(g, mul(x, math.log(2))), reads=(0,))
vjp.defderivative(log10_p, lambda g, out, x: div(g, mul(x, math.log(10))), reads=(0,))
vjp.defderivative(atan_p, lambda g, out, x: div(g, add(mul(x, x), 1)), reads=(0,))
vjp.defderivative(sinh_p, lambda g, out, x: mul(g, cosh(x)), reads=(0,))
vjp.defderivative(cosh_p, lambda g, out, x: mul(g, sinh(x)), reads=(0,))


# 1/√(x² + 1); for |x| > 1e154 x² overflows and the derivative rounds to its limit 0
vjp.defderivative(asinh_p, lambda g, out, x: mul(g, rsqrt(add(mul(x, x), 1))), reads=(0,))
vjp.defderivative(erf_p, lambda g, out, x: mul(g, mul(2 / math.sqrt(math.pi), exp(neg(mul(x, x))))), reads=(0,))
vjp.defderivative(erf_inv_p, lambda g, out, x: mul(g, mul(math.sqrt(math.pi) / 2, exp(mul(out, out)))),
                  reads=("out",))


def _atan2_derivatives():
    """∂atan2(y, x)/∂y = x / (x² + y²), ∂atan2(y, x)/∂x = −y / (x² + y²)."""

    def norm2(y, x):
        return add(mul(x, x), mul(y, y))

    return (lambda g, out, y, x: mul(g, div(x, norm2(y, x))),
            lambda g, out, y, x: neg(mul(g, div(y, norm2(y, x)))))


vjp.defderivative(atan2_p, *_atan2_derivatives(), reads=(0, 1))
