"""Functions of how numbers are represented, with JAX's lax names: ``is_finite``,
``nextafter``, ``population_count`` and ``reduce_precision`` (NOTE [reduce_precision as
XLA rounds]).

``is_finite``, ``nextafter`` and ``population_count`` are piecewise constant or
integer-valued: they carry no derivative (as in JAX). ``reduce_precision`` is treated as
the identity by differentiation, as JAX's rule: its JVP reduces the tangent's precision,
its VJP the cotangent's.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapedArray, ShapeError
from cuvmap.lax.elementwise.common import _nary, _naryop_shape_rule
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.transforms.fusion import CExpression
from cuvmap.core import bfloat16
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

def _is_finite_shape_rule(x):
    if kind_of(x.dtype) not in "fc":
        raise ShapeError(f"is_finite: operand must be floating point, got {x.dtype}")
    return ShapedArray(x.shape, np.bool_)


is_finite_p = _nary("is_finite", np.isfinite, _is_finite_shape_rule, differentiable=False,
                    fused=CExpression("isfinite({0})", float_only=True))


def _nextafter_shape_rule(x1, x2):
    out = _naryop_shape_rule(x1, x2)
    if kind_of(out.dtype) != "f":
        raise ShapeError(f"nextafter: operands must be floating point, got {x1.dtype} and {x2.dtype}")
    return out


nextafter_p = _nary("nextafter", np.nextafter, _nextafter_shape_rule, differentiable=False)


def _population_count_shape_rule(x):
    if kind_of(x.dtype) not in "iu":
        raise ShapeError(f"population_count: operand must be an integer, got {x.dtype}")
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


def _population_count_impl(x):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    # the unsigned view: NumPy's bitwise_count counts the bits of |x| for signed integers
    bits = x.view(np.dtype(f"u{x.dtype.itemsize}"))
    if hasattr(xp, "bitwise_count"):
        return xp.bitwise_count(bits).astype(x.dtype)
    # CuPy without bitwise_count: one bit position per step
    count = xp.zeros(x.shape, dtype=x.dtype)
    for shift in range(8 * x.dtype.itemsize):
        count += ((bits >> shift) & 1).astype(x.dtype)
    return count


population_count_p = _nary("population_count", _population_count_impl, _population_count_shape_rule,
                           differentiable=False)


# NOTE [reduce_precision as XLA rounds]
# reduce_precision(x, exponent_bits, mantissa_bits) rounds a float to the values of a
# narrower format and returns them in x's dtype, bit for bit as XLA's ReducePrecision: on
# the bits of x (as an unsigned integer), the mantissa is rounded to mantissa_bits bits,
# to nearest with ties to even (add 2^{s−1} − 1 plus the last kept bit, then clear the s
# dropped bits), and then an exponent beyond the narrow format's range becomes a signed
# infinity (overflow) or a signed zero (at or below its smallest normal exponent: the narrow
# format's subnormals are flushed). NaN stays NaN (when mantissa_bits > 0). So
# reduce_precision(x, 8, 23) of a float64 is float32 rounding for values in float32's
# normal range, and (5, 10) is float16's.
_FLOAT_BITS = {np.dtype(np.float16): (5, 10), np.dtype(np.float32): (8, 23), np.dtype(np.float64): (11, 52)}


def _reduce_precision_shape_rule(x, *, exponent_bits, mantissa_bits):
    if x.dtype not in _FLOAT_BITS:
        raise ShapeError(f"reduce_precision: operand must be float16, float32 or float64, got {x.dtype}")
    if exponent_bits < 1 or mantissa_bits < 0:
        raise ShapeError(f"reduce_precision: needs exponent_bits >= 1 and mantissa_bits >= 0, got "
                         f"{exponent_bits} and {mantissa_bits}")
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


def _reduce_precision_impl(x, *, exponent_bits, mantissa_bits):
    x = core.as_array(x)
    xp = backend.xp_of(x)
    src_exponent, src_mantissa = _FLOAT_BITS[x.dtype]
    nbits = 8 * x.dtype.itemsize
    utype = np.dtype(f"u{x.dtype.itemsize}").type
    bits = x.view(utype)
    if mantissa_bits < src_mantissa:
        dropped = src_mantissa - mantissa_bits
        last_kept = utype(1 << dropped)
        bias = bits & last_kept
        bias >>= utype(dropped)
        bias += utype((1 << (dropped - 1)) - 1)
        bits = (bits + bias) & utype(~((1 << dropped) - 1) & ((1 << nbits) - 1))
    if exponent_bits < src_exponent:
        exponent_mask = utype(((1 << src_exponent) - 1) << src_mantissa)
        sign_mask = utype(1 << (nbits - 1))
        bias = (1 << (src_exponent - 1)) - 1
        reduced_bias = (1 << (exponent_bits - 1)) - 1
        exponent = bits & exponent_mask
        overflows = exponent > utype((bias + reduced_bias) << src_mantissa)
        underflows = exponent <= utype((bias - reduced_bias) << src_mantissa)
        signed_zero = bits & sign_mask
        bits = xp.where(overflows, signed_zero | exponent_mask, xp.where(underflows, signed_zero, bits))
    out = xp.asarray(bits, dtype=utype).view(x.dtype)
    if mantissa_bits > 0:
        out = xp.where(xp.isnan(x), x, out)
    return out


reduce_precision_p = _nary("reduce_precision", _reduce_precision_impl, _reduce_precision_shape_rule)


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def is_finite(x):
    """True where ``x`` is neither infinite nor NaN (``numpy.isfinite``); floating operands
    only. JAX: ``jax.lax.is_finite``."""
    if kind_of(core.dtype_of(x)) not in "fc":
        raise ShapeError(f"is_finite: operand must be floating point, got {core.dtype_of(x)}")
    return is_finite_p.bind(x)


def nextafter(x1, x2):
    """The next representable float after ``x1`` in the direction of ``x2``
    (``numpy.nextafter``). No derivative. JAX: ``jax.lax.nextafter``."""
    return nextafter_p.bind(x1, x2)


def population_count(x):
    """The number of set bits of each element of an integer array (of its two's complement
    bits for negative ones), in ``x``'s dtype. JAX: ``jax.lax.population_count``."""
    return population_count_p.bind(x)


def reduce_precision(operand, exponent_bits, mantissa_bits):
    """Rounds ``operand`` to the floats with ``exponent_bits`` exponent bits and
    ``mantissa_bits`` mantissa bits, kept in its dtype (NOTE [reduce_precision as XLA
    rounds]): ``reduce_precision(x, 8, 23)`` rounds float64 values as float32 does.
    JAX: ``jax.lax.reduce_precision``."""
    return reduce_precision_p.bind(operand, exponent_bits=int(exponent_bits), mantissa_bits=int(mantissa_bits))


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defunary(is_finite_p, population_count_p, reduce_precision_p)
batching.defbroadcasting(nextafter_p)


# ---------------------------------------------------------------------------------------
# Derivative rules: reduce_precision is linear to differentiation (JAX's deflinear)
# ---------------------------------------------------------------------------------------

jvp.defjvp(reduce_precision_p, lambda t, out, x, **params: reduce_precision_p.bind(t, **params))
vjp.defvjp(reduce_precision_p, lambda ct, out, x, **params: reduce_precision_p.bind(ct, **params), reads=())

# the float after x in bfloat16 is not the one in float32 (ml_dtypes' nextafter is exact)
bfloat16.computes_natively(nextafter_p)
