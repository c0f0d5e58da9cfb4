"""Elementwise primitives: arithmetic, transcendental functions (erf and erf_inv included:
NOTE [erf without SciPy], NOTE [erf_inv from Giles' polynomials]), rounding, comparisons,
select, dtype conversion and stop_gradient.

Binary and ternary primitives follow NumPy broadcasting, and Python scalars are weakly
typed (NEP 50: ``float32_array * 2.0`` stays float32). The impls are NumPy ufuncs, which
dispatch to CuPy's through ``__array_ufunc__``, so one impl serves both backends (erf and
round pick the array module themselves).

Derivatives: the Jacobian of an elementwise primitive is diagonal, so one rule per
operand, ``g * ∂out/∂x_i``, serves as both its JVP rule and its VJP rule
(:func:`cuvmap.transforms.vjp.defderivative`). The transforms sum or broadcast the
result back to each operand's shape.
"""
import builtins
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.transforms.fusion import CExpression


# ---------------------------------------------------------------------------------------
# Shared shape rules
# ---------------------------------------------------------------------------------------


def _dtype_operand(aval):
    """What ``np.result_type`` needs to apply NEP 50: a Python scalar for weak avals."""
    if aval.weak_type:
        return {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}[aval.dtype.kind]
    return aval.dtype


def broadcast_shapes(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(
            "shapes " + ", ".join(str(tuple(s)) for s in shapes) + " do not broadcast"
        ) from None


def _naryop_shape_rule(*avals, **params):
    """NumPy's broadcasting and promotion, a weakly typed operand taking the others' dtype
    (NEP 50); operands all weakly typed promote their dtypes and stay weak (JAX's
    ``weak f32 + 1`` is a weak float32)."""
    shape = broadcast_shapes(*(a.shape for a in avals))
    if all(a.weak_type for a in avals):
        # JAX's lattice: a weak float over a weak int, then the widest of that kind
        top = builtins.max("biufc".index(a.dtype.kind) for a in avals)
        dtype = np.result_type(*(a.dtype for a in avals if "biufc".index(a.dtype.kind) == top))
        return ShapedArray(shape, dtype, weak_type=True)
    return ShapedArray(shape, np.result_type(*(_dtype_operand(a) for a in avals)))


def _div_shape_rule(x, y):
    """True division: integer and boolean operands give float64 (NumPy's ``true_divide``)."""
    out = _naryop_shape_rule(x, y)
    if out.dtype.kind not in "fc":
        out.dtype = np.dtype(np.float64)
    return out


def _float_dtype(dtype):
    """The float dtype of a transcendental function of ``dtype``: NumPy's ufunc rule, the
    smallest float that holds the integers exactly (bool, (u)int8 -> float16, (u)int16 ->
    float32, wider -> float64; a weak Python int -> float64)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind in "fc" else np.promote_types(dtype, np.float16)


def _float_unary_shape_rule(x, **params):
    return ShapedArray(x.shape, _float_dtype(x.dtype), weak_type=x.weak_type)


def _same_shape_rule(x, **params):
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


def _comparison_shape_rule(*avals, **params):
    return ShapedArray(broadcast_shapes(*(a.shape for a in avals)), np.bool_)


def _nary(name, impl, shape_rule=_naryop_shape_rule, differentiable=True, **facts):
    """An elementwise primitive. A ufunc impl is its own writer into a buffer (``out=``),
    so the jit executor may write its results into buffers it owns (``impl_into``:
    :class:`~cuvmap.core.Primitive`); ``facts`` are the other attributes (``fused``)."""
    if isinstance(impl, np.ufunc):
        facts.setdefault("impl_into", impl)
    if facts.get("impl_into") is not None:
        facts.setdefault("owns_output", True)
    return Primitive(name, differentiable=differentiable, impl=impl, shape_rule=shape_rule, **facts)


# NOTE [fused expressions]
# The C expression of each fusible primitive (fused=, a CExpression) is the formula its
# impl computes through CuPy's ufuncs, so a fused program gives the unfused bits (NOTE
# [fused kernels round as the unfused ones] in cuvmap/cuda/kernels.py): rsqrt is a
# reciprocal of sqrt as the impl, integer_pow's square is a product as the impl, and
# max/min are CuPy's maximum/minimum: CUDA's max/min (fmax/fmin for floats, so
# max(-0.0, +0.0) is +0.0 in either order, as CuPy's and unlike a comparison) except that
# a NaN operand gives a NaN (the sum of the operands: a NaN, its payload aside).
# Float64 powers other than squares run unfused (CExpression.unfused: _float64_pow).
# logistic is left out (its impl goes through logaddexp), and so are erf_inv, round,
# sign, floor_divide and remainder: without a C expression they run unfused.
def _float64_pow(dtype, **params):
    """CUDA's double ``pow`` compiled with --fmad=false (as the fused kernels are) can differ
    in the last bit from CuPy's own power kernel, compiled with contraction: a float64 power
    stays unfused (NOTE [fused kernels round as the unfused ones] in cuvmap/cuda/kernels.py)."""
    return dtype == np.float64


def _c_float(template):
    """An expression computed in floating point only: an integer operand is not fused."""
    return CExpression(template, float_only=True)


def _comparison_operands_dtype(*avals):
    """The dtype a comparison computes in: its operands' common dtype (weak literals take
    the array's)."""
    return _naryop_shape_rule(*avals).dtype


def _c_comparison(operator):
    return CExpression("({0} %s {1})" % operator, comparison_dtype=_comparison_operands_dtype)


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

neg_p = _nary("neg", np.negative, _same_shape_rule, fused=CExpression("(-{0})"))
add_p = _nary("add", np.add, fused=CExpression("({0} + {1})"))
sub_p = _nary("sub", np.subtract, fused=CExpression("({0} - {1})"))
mul_p = _nary("mul", np.multiply, fused=CExpression("({0} * {1})"))
div_p = _nary("div", np.true_divide, _div_shape_rule, fused=_c_float("({0} / {1})"))
pow_p = _nary("pow", np.power, fused=CExpression("pow({0}, {1})", float_only=True, unfused=_float64_pow))
max_p = _nary("max", np.maximum, fused=CExpression("(({0} != {0} || {1} != {1}) ? ({0} + {1}) : max({0}, {1}))"))
min_p = _nary("min", np.minimum, fused=CExpression("(({0} != {0} || {1} != {1}) ? ({0} + {1}) : min({0}, {1}))"))
# Python's // and %: the quotient rounds toward −∞ and the remainder takes the divisor's
# sign, so x == y · floor_divide(x, y) + remainder(x, y) (numpy.floor_divide, numpy.remainder)
floor_divide_p = _nary("floor_divide", np.floor_divide, differentiable=False)
remainder_p = _nary("remainder", np.remainder)

exp_p = _nary("exp", np.exp, _float_unary_shape_rule, fused=_c_float("exp({0})"))
log_p = _nary("log", np.log, _float_unary_shape_rule, fused=_c_float("log({0})"))
log1p_p = _nary("log1p", np.log1p, _float_unary_shape_rule, fused=_c_float("log1p({0})"))
expm1_p = _nary("expm1", np.expm1, _float_unary_shape_rule, fused=_c_float("expm1({0})"))
sqrt_p = _nary("sqrt", np.sqrt, _float_unary_shape_rule, fused=_c_float("sqrt({0})"))
rsqrt_p = _nary("rsqrt", lambda x: np.reciprocal(np.sqrt(x)), _float_unary_shape_rule,
                fused=_c_float("(({T})1 / sqrt({0}))"))
tanh_p = _nary("tanh", np.tanh, _float_unary_shape_rule, fused=_c_float("tanh({0})"))
# logistic(x) = 1 / (1 + exp(-x)) = exp(-softplus(-x)): no overflow for large |x|.
logistic_p = _nary("logistic", lambda x: np.exp(-np.logaddexp(0, -x)), _float_unary_shape_rule)
sin_p = _nary("sin", np.sin, _float_unary_shape_rule, fused=_c_float("sin({0})"))
cos_p = _nary("cos", np.cos, _float_unary_shape_rule, fused=_c_float("cos({0})"))
log2_p = _nary("log2", np.log2, _float_unary_shape_rule, fused=_c_float("log2({0})"))
log10_p = _nary("log10", np.log10, _float_unary_shape_rule, fused=_c_float("log10({0})"))
atan_p = _nary("atan", np.arctan, _float_unary_shape_rule, fused=_c_float("atan({0})"))
sinh_p = _nary("sinh", np.sinh, _float_unary_shape_rule, fused=_c_float("sinh({0})"))
cosh_p = _nary("cosh", np.cosh, _float_unary_shape_rule, fused=_c_float("cosh({0})"))
asinh_p = _nary("asinh", np.arcsinh, _float_unary_shape_rule, fused=_c_float("asinh({0})"))
abs_p = _nary("abs", np.abs, _same_shape_rule, fused=_c_float("fabs({0})"))
sign_p = _nary("sign", np.sign, _same_shape_rule, differentiable=False)
# atan2(y, x) has true division's dtypes: integer and boolean operands give float64
atan2_p = _nary("atan2", np.arctan2, _div_shape_rule, fused=_c_float("atan2({0}, {1})"))


# Rounding: piecewise constant, so no derivative (zero tangents and cotangents, as JAX's
# defjvp_zero). The wrappers return integer and boolean operands unchanged, as jnp does;
# the primitives take floating operands only.
def _rounding_shape_rule(x, **params):
    if x.dtype.kind != "f":
        raise ShapeError(f"operand must be floating point, got {x.dtype}")
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


def _round_impl(x, *, decimals):
    x = core.as_array(x)
    return backend.xp_of(x).round(x, decimals)


floor_p = _nary("floor", np.floor, _rounding_shape_rule, differentiable=False, fused=_c_float("floor({0})"))
ceil_p = _nary("ceil", np.ceil, _rounding_shape_rule, differentiable=False, fused=_c_float("ceil({0})"))
round_p = _nary("round", _round_impl, _rounding_shape_rule, differentiable=False)

eq_p = _nary("eq", np.equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison("=="))
ne_p = _nary("ne", np.not_equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison("!="))
lt_p = _nary("lt", np.less, _comparison_shape_rule, differentiable=False, fused=_c_comparison("<"))
le_p = _nary("le", np.less_equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison("<="))
gt_p = _nary("gt", np.greater, _comparison_shape_rule, differentiable=False, fused=_c_comparison(">"))
ge_p = _nary("ge", np.greater_equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison(">="))


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


def _erf_impl(x):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    if x.dtype.kind != "f":
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


erf_p = _nary("erf", _erf_impl, _float_unary_shape_rule, fused=_c_float("erf({0})"))


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
    xp = backend.xp_of(x)
    if x.dtype.kind != "f":
        x = x.astype(_float_dtype(x.dtype))
    if xp is not np:
        from cupyx.scipy.special import erfinv as cupy_erfinv

        return cupy_erfinv(x)
    return _erf_inv_giles(x.astype(np.float64).reshape(-1)).astype(x.dtype, copy=False).reshape(x.shape)


erf_inv_p = _nary("erf_inv", _erf_inv_impl, _float_unary_shape_rule)


# NOTE [branch-free select]
# np.where branches per element, and on a random mask (relu's, max pool's) it mispredicts
# about half the time: it measured an order of magnitude slower than np.maximum on the
# same values. For NumPy float operands the impl blends the bit patterns instead: with
# m = -pred as an integer mask (all ones where pred holds),
# select = (bits(on_true) & m) | (bits(on_false) & ~m), exact for every value (inf, NaN
# and -0.0 included) and several times faster than np.where, most with a zero operand
# (relu's). tests/lax/test_ops.py checks it bit for bit against np.where.
_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def _float_bits(value, dtype, int_type):
    return np.asarray(value, dtype=dtype).view(int_type)


def _is_positive_zero(value):
    """A Python 0 or 0.0 (not -0.0, whose sign bit the blend must keep)."""
    return type(value) in (int, float) and value == 0 and math.copysign(1.0, value) > 0


def select_impl(pred, on_true, on_false):
    """``numpy.where`` on concrete arrays, branch-free for NumPy floats (used by pooling too)."""
    if type(pred) is not np.ndarray or pred.dtype != np.bool_ or pred.ndim == 0:
        return np.where(pred, on_true, on_false)
    dtype = np.result_type(on_true, on_false)
    if (dtype.kind != "f" or dtype.itemsize not in _SAME_SIZE_INT
            or type(on_true) not in _NUMPY_OPERANDS or type(on_false) not in _NUMPY_OPERANDS):
        return np.where(pred, on_true, on_false)
    int_type = _SAME_SIZE_INT[dtype.itemsize]
    if _is_positive_zero(on_false):
        # relu's select (and its VJP's): a one-byte mask, widened inside the ufunc's loop, so
        # that the only array of the result's width is the result (NOTE [branch-free select])
        return np.bitwise_and(_float_bits(on_true, dtype, int_type), np.negative(pred.view(np.int8))).view(dtype)
    shape = np.broadcast_shapes(pred.shape, np.shape(on_true), np.shape(on_false))
    mask = np.negative(pred.view(np.int8), dtype=int_type)  # 0 or -1 (all bits set)
    # the mask's buffer is reused for the last result when it has the full shape: one
    # fresh array fewer to touch (fresh pages are slow here, NOTE [cache blocking])
    reuse = mask if mask.shape == shape else None
    out = np.bitwise_and(_float_bits(on_true, dtype, int_type), mask)
    np.invert(mask, out=mask)
    other = np.bitwise_and(_float_bits(on_false, dtype, int_type), mask, out=reuse)
    if other.shape == out.shape:
        out |= other
    else:
        out = np.bitwise_or(out, other)
    return out.view(dtype)


_NUMPY_OPERANDS = (np.ndarray, int, float, np.float16, np.float32, np.float64)


def _select_shape_rule(pred, on_true, on_false):
    if pred.dtype != np.bool_:
        raise ShapeError(f"predicate must be boolean, got {pred.dtype}")
    out = _naryop_shape_rule(on_true, on_false)
    return ShapedArray(broadcast_shapes(pred.shape, out.shape), out.dtype, out.weak_type)


def select_into(pred, on_true, on_false, *, out):
    """``select`` written into ``out``, a buffer of the result's shape and dtype that the
    jit executor owns (NOTE [buffer planning] in cuvmap/transforms/executor.py): the
    branch-free blend of NOTE [branch-free select] with a one-byte mask, so that relu's
    select (``on_false`` a positive zero) allocates nothing of the result's size (another
    ``on_false`` needs one temporary). ``out`` may be ``on_true``'s or ``on_false``'s
    buffer (each element is read before it is written). Raises TypeError where the blend
    does not apply (not NumPy floats), and the executor then calls :func:`select_impl`."""
    dtype = out.dtype
    if (type(out) is not np.ndarray or type(pred) is not np.ndarray or pred.dtype != np.bool_
            or dtype.kind != "f" or dtype.itemsize not in _SAME_SIZE_INT
            or type(on_true) not in _NUMPY_OPERANDS or type(on_false) not in _NUMPY_OPERANDS):
        raise TypeError("select_into: the blend needs NumPy float operands")
    int_type = _SAME_SIZE_INT[dtype.itemsize]
    bits = out.view(int_type)
    mask = np.negative(pred.view(np.int8))  # 0 or -1; widened to the int type elementwise
    if _is_positive_zero(on_false):
        np.bitwise_and(_float_bits(on_true, dtype, int_type), mask, out=bits)
        return out
    other = np.bitwise_and(_float_bits(on_false, dtype, int_type), np.invert(mask))  # on_false read first
    np.bitwise_and(_float_bits(on_true, dtype, int_type), mask, out=bits)
    np.bitwise_or(bits, other, out=bits)
    return out


def _select_workspace(in_avals, out_avals, params, strided):
    """The blend's one-byte mask, and the second operand's bits unless it is a positive zero
    (the plan's memory estimate cannot tell, so it counts them: NOTE [planned peak memory])."""
    out = out_avals[0]
    return out.size + out.size * out.dtype.itemsize


select_p = _nary("select", select_impl, _select_shape_rule, impl_into=select_into, workspace=_select_workspace,
                 impl_into_when=lambda aval, gpu: not gpu and aval.dtype.kind == "f",  # the blend's operands
                 fused=CExpression("({0} ? {1} : {2})", bool_operands=(0,)))


def _convert_element_type_impl(x, *, new_dtype):
    if isinstance(x, (bool, int, float, complex)):
        return np.asarray(x, dtype=new_dtype)
    return x.astype(new_dtype)


def _convert_element_type_shape_rule(x, *, new_dtype):
    return ShapedArray(x.shape, new_dtype)


# fused as a cast of its operand to the output's type (new_dtype)
convert_element_type_p = _nary(
    "convert_element_type", _convert_element_type_impl, _convert_element_type_shape_rule,
    fused=CExpression("{0}", accepts=lambda new_dtype: True),
)

stop_gradient_p = _nary("stop_gradient", lambda x: x, _same_shape_rule, differentiable=False, fused=CExpression("{0}"),
                        layout=lambda strided, *_: (False, strided[0]))  # its operand itself


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


def pow(x, y):  # noqa: A001 - lax vocabulary
    """``x ** y`` with a traced exponent; see :func:`integer_pow` for a fixed int."""
    return pow_p.bind(x, y)


def integer_pow(x, y):
    """``x ** y`` for a static Python int ``y``."""
    return integer_pow_p.bind(x, y=int(y))


def max(x, y):  # noqa: A001
    """Elementwise maximum; at ties the derivative is split evenly."""
    return max_p.bind(x, y)


def min(x, y):  # noqa: A001
    """Elementwise minimum; at ties the derivative is split evenly."""
    return min_p.bind(x, y)


def exp(x):
    return exp_p.bind(x)


def log(x):
    return log_p.bind(x)


def log1p(x):
    """``log(1 + x)``, accurate for small ``x``."""
    return log1p_p.bind(x)


def expm1(x):
    """``exp(x) - 1``, accurate for small ``x``."""
    return expm1_p.bind(x)


def sqrt(x):
    return sqrt_p.bind(x)


def rsqrt(x):
    """``1 / sqrt(x)``."""
    return rsqrt_p.bind(x)


def tanh(x):
    return tanh_p.bind(x)


def logistic(x):
    """The sigmoid ``1 / (1 + exp(-x))``."""
    return logistic_p.bind(x)


def sin(x):
    return sin_p.bind(x)


def cos(x):
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


def _is_integer_or_bool(x):
    return core.dtype_of(x).kind in "biu"


def floor(x):
    """``⌊x⌋``; integers and booleans are returned as they are. No derivative (zero)."""
    return x if _is_integer_or_bool(x) else floor_p.bind(x)


def ceil(x):
    """``⌈x⌉``; integers and booleans are returned as they are. No derivative (zero)."""
    return x if _is_integer_or_bool(x) else ceil_p.bind(x)


def round(x, decimals=0):  # noqa: A001 - lax vocabulary
    """Rounds to ``decimals`` decimal places, halves to even (``numpy.round``); integers
    and booleans are returned as they are. No derivative (zero)."""
    if _is_integer_or_bool(x):
        return x
    return round_p.bind(x, decimals=int(decimals))


def abs(x):  # noqa: A001
    """``|x|``; its derivative at 0 is 0 (``sign(0)``)."""
    return abs_p.bind(x)


def sign(x):
    """-1, 0 or 1; carries no derivative."""
    return sign_p.bind(x)


def eq(x, y):
    return eq_p.bind(x, y)


def ne(x, y):
    return ne_p.bind(x, y)


def lt(x, y):
    return lt_p.bind(x, y)


def le(x, y):
    return le_p.bind(x, y)


def gt(x, y):
    return gt_p.bind(x, y)


def ge(x, y):
    return ge_p.bind(x, y)


def select(pred, on_true, on_false):
    """``on_true`` where ``pred`` holds, else ``on_false`` (``numpy.where``), broadcasting."""
    return select_p.bind(pred, on_true, on_false)


def convert_element_type(x, new_dtype):
    """``x.astype(new_dtype)``; differentiable between floating dtypes."""
    return convert_element_type_p.bind(x, new_dtype=np.dtype(new_dtype))


def stop_gradient(x):
    """The identity, whose derivative is zero: transforms of derivatives see a constant."""
    return stop_gradient_p.bind(x)


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defbroadcasting(
    add_p, sub_p, mul_p, div_p, pow_p, max_p, min_p, floor_divide_p, remainder_p, atan2_p,
    eq_p, ne_p, lt_p, le_p, gt_p, ge_p, select_p,
)
batching.defunary(
    neg_p, exp_p, log_p, log1p_p, expm1_p, sqrt_p, rsqrt_p, tanh_p, logistic_p,
    sin_p, cos_p, abs_p, sign_p, integer_pow_p, convert_element_type_p, stop_gradient_p,
    log2_p, log10_p, atan_p, sinh_p, cosh_p, asinh_p, erf_p, erf_inv_p, floor_p, ceil_p, round_p,
)


# ---------------------------------------------------------------------------------------
# Derivative rules (each serves as JVP and VJP: see the module docstring)
# ---------------------------------------------------------------------------------------


def _where_nonzero(pred, g):
    """``g`` where ``pred`` holds, zero elsewhere, in ``g``'s dtype."""
    return select(pred, g, 0)


def _replace_zero(x):
    return select(eq(x, 0), 1, x)


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
vjp.defderivative(
    pow_p,
    lambda g, out, x, y: mul(g, mul(y, pow(x, sub(y, 1)))),
    lambda g, out, x, y: mul(g, mul(log(_replace_zero(x)), out)),
    reads=(0, 1, "out"),
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
vjp.defderivative(abs_p, lambda g, out, x: mul(g, sign(x)), reads=(0,))
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
vjp.defderivative(
    select_p,
    None,
    lambda g, out, pred, t, f: _where_nonzero(pred, g),
    lambda g, out, pred, t, f: select(pred, 0, g),
    reads=(0,),
)


def _convert_element_type_jvp(t, out, x, *, new_dtype):
    return convert_element_type(t, new_dtype)


def _convert_element_type_vjp(ct, out, x, *, new_dtype):
    if not core.is_float(x):
        return None
    return convert_element_type(ct, core.dtype_of(x))


jvp.defjvp(convert_element_type_p, _convert_element_type_jvp)
vjp.defvjp(convert_element_type_p, _convert_element_type_vjp, reads=())
