"""The ``jax.numpy`` functions of a float's sign, exponent and integer part: ``signbit``,
``copysign``, ``frexp``, ``ldexp``, ``modf``, ``trunc``, ``rint``, ``fabs``, ``nextafter``
and ``nan_to_num``. Composites of :mod:`cuvmap.lax` primitives: the sign and exponent
are read from the float's bits (``bitcast_convert_type``), so ``-0.0``, subnormals and
the extremes of the range give NumPy's results exactly (NOTE [frexp and ldexp by exact
powers of two]). Integer and boolean operands of the float functions become float64, as
in NumPy."""
import numpy as np

from cuvmap import core
from cuvmap.lax import bitwise as lax_bitwise
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._dtypes import result_type
from cuvmap.numpy._elementwise import astype, logical_and, logical_not, logical_or, where
from cuvmap.core.bfloat16 import kind_of

_SIGNED_OF_WIDTH = {2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}


def _operand(x):
    """Lists and tuples as arrays; arrays, tracers and Python scalars as they are."""
    return asarray(x) if isinstance(x, (list, tuple)) else x


def _promote_inexact(name, *args):
    """The operands in their common dtype (NumPy's promotion, Python scalars weakly), a
    float or complex one: integers and booleans become float64."""
    args = [_operand(a) for a in args]
    dtype = np.dtype(result_type(*args))
    if kind_of(dtype) not in "fc":
        dtype = np.dtype(np.float64)
    return [astype(a, dtype) for a in args]


def _require_real(name, x):
    if kind_of(core.dtype_of(x)) == "c":
        raise TypeError(f"{name}: complex operands are not supported (got dtype {core.dtype_of(x)}); "
                        "split them with real/imag first")


def _require_float_bits(name, dtype):
    if dtype.itemsize not in _SIGNED_OF_WIDTH:
        raise TypeError(f"{name}: supports float16, float32 and float64 operands, got {dtype}")


def signbit(x, /):
    """``jnp.signbit``: true where the sign bit of ``x`` is set (``−0.0`` and negative NaNs
    included; ``x < 0`` for integers, false for booleans). A boolean, no derivative."""
    x = _operand(x)
    dtype = core.dtype_of(x)
    if dtype == np.bool_:
        return ew.ne(x, x)
    if kind_of(dtype) in "iu":
        return ew.lt(x, 0)
    if kind_of(dtype) != "f":
        raise TypeError(f"signbit: operand must be real, got dtype {dtype}")
    _require_float_bits("signbit", dtype)
    bits = lax_bitwise.bitcast_convert_type(ew.stop_gradient(x), _SIGNED_OF_WIDTH[dtype.itemsize])
    return ew.lt(bits, 0)


def copysign(x1, x2, /):
    """``jnp.copysign``: ``|x1|`` with the sign bit of ``x2``. Derivative: ``sign(x1)·s`` in
    ``x1`` (``s = ±1``, the sign taken), none in ``x2``. Real operands only."""
    x1, x2 = _promote_inexact("copysign", x1, x2)
    _require_real("copysign", x1)
    magnitude = ew.abs(x1)
    return where(signbit(x2), ew.neg(magnitude), magnitude)


def fabs(x, /):
    """``jnp.fabs``: ``|x|`` as a float (integers become float64). Real operands only; its
    derivative is ``sign(x)``."""
    (x,) = _promote_inexact("fabs", x)
    _require_real("fabs", x)
    return ew.abs(x)


def trunc(x):
    """``jnp.trunc``: rounds toward zero (``ceil`` below 0, ``floor`` above); integers and
    booleans stay as they are. Piecewise constant: its derivative is zero."""
    x = _operand(x)
    if kind_of(core.dtype_of(x)) in "biu":
        return x
    return where(ew.lt(x, 0), ew.ceil(x), ew.floor(x))


def rint(x, /):
    """``jnp.rint``: rounds to the nearest integer, halves to even, in a float dtype
    (integers and booleans become float64); complex numbers part by part. Derivative
    zero."""
    x = _operand(x)
    dtype = core.dtype_of(x)
    if kind_of(dtype) in "biu":
        return astype(x, np.float64)
    if kind_of(dtype) == "c":
        return ew.complex(rint(ew.real(x)), rint(ew.imag(x)))
    return ew.round(x, ew.RoundingMethod.TO_NEAREST_EVEN)


def modf(x, /, out=None):
    """``jnp.modf``: ``(x − trunc(x), trunc(x))``, the fractional and integral parts, both
    carrying ``x``'s sign (NumPy's ``modf(-2.0) = (-0.0, -2.0)``, ``modf(inf) = (0.0,
    inf)``). Derivative: 1 for the fraction, 0 for the integral part."""
    if out is not None:
        raise NotImplementedError("modf: out= is not supported (arrays are immutable)")
    (x,) = _promote_inexact("modf", x)
    _require_real("modf", x)
    whole = trunc(x)
    negative = signbit(x)
    # −(whole − x) rather than x − whole below zero: an exact integer gives −0.0 as NumPy
    frac = where(negative, ew.neg(ew.sub(whole, x)), ew.sub(x, whole))
    frac = where(ew.eq(ew.abs(x), np.inf), astype(where(negative, -0.0, 0.0), core.dtype_of(x)), frac)
    return frac, whole


# NOTE [frexp and ldexp by exact powers of two]
# frexp reads the exponent e from the bits (subnormals are first scaled by 2^nmant into the
# normal range), and the mantissa is x · 2^(−e), a product by a power of two built from its
# bits: exact, and differentiable in x with derivative 2^(−e), JAX's frexp JVP. ldexp(x, n)
# is m · 2^(e + n) with (m, e) = frexp(x), so a tiny x times a large 2^n does not overflow
# on the way. 2^k alone is not a float for every k that matters (2^−1074 · 2^1100 is
# finite), so each scaling multiplies by 2^a then 2^b with a = ⌊k/2⌋, b = k − a, each a
# normal float: the first product stays normal and exact, the second rounds once, so the
# result is NumPy's correctly rounded one, subnormal and overflowing results included
# (k is clipped to the range where the answer is not already 0 or ∞). Where 2^n itself is
# a normal float, ldexp is the one product x · 2^n (rounded once too), whose derivative
# 2^n is computed without the mantissa's factor 2^(−e), which overflows for a subnormal
# x (so does a subnormal x with n below the normal range, whose result is 0); n, an
# integer, has no derivative.


def _pow2(k, dtype):
    """``2^k`` in the float ``dtype`` for an integer array ``k`` inside the normal exponent
    range, built from its bits (exact)."""
    info = np.finfo(dtype)
    int_dtype = _SIGNED_OF_WIDTH[dtype.itemsize]
    biased = astype(ew.add(k, int(info.maxexp) - 1), int_dtype)
    return lax_bitwise.bitcast_convert_type(lax_bitwise.shift_left(biased, int(info.nmant)), dtype)


def _scale_by_pow2(x, k):
    """``x · 2^k`` for an int32 ``k`` (NOTE [frexp and ldexp by exact powers of two])."""
    dtype = core.dtype_of(x)
    a = lax_bitwise.shift_right_arithmetic(k, 1)  # ⌊k/2⌋
    return ew.mul(ew.mul(x, _pow2(a, dtype)), _pow2(ew.sub(k, a), dtype))


def _exponent(x):
    """The int32 ``e`` of ``x = m · 2^e`` with ``0.5 ≤ |m| < 1`` (0 for 0, ±∞ and NaN), read
    from the bits of ``x`` (no derivative)."""
    dtype = core.dtype_of(x)
    info = np.finfo(dtype)
    x = ew.stop_gradient(x)
    subnormal = ew.lt(ew.abs(x), float(info.smallest_normal))
    normal = where(subnormal, ew.mul(x, float(2.0 ** info.nmant)), x)
    int_dtype = _SIGNED_OF_WIDTH[dtype.itemsize]
    bits = lax_bitwise.bitcast_convert_type(normal, int_dtype)
    field = lax_bitwise.shift_right_arithmetic(bits, int(info.nmant))
    biased = astype(lax_bitwise.bitwise_and(field, (1 << info.nexp) - 1), np.int32)
    e = ew.sub(ew.sub(biased, int(info.maxexp) - 2), astype(where(subnormal, int(info.nmant), 0), np.int32))
    special = logical_or(logical_not(ew.is_finite(x)), ew.eq(x, 0))
    return where(special, 0, e)


def frexp(x, /):
    """``jnp.frexp``: ``(m, e)`` with ``x = m · 2^e``, ``0.5 ≤ |m| < 1`` (``m = x``, ``e = 0``
    at 0, ±∞ and NaN); ``e`` is int32. Exact for subnormals (NOTE [frexp and ldexp by exact
    powers of two]). ``dm/dx = 2^(−e)``; ``e`` has no derivative."""
    (x,) = _promote_inexact("frexp", x)
    _require_real("frexp", x)
    _require_float_bits("frexp", core.dtype_of(x))
    e = _exponent(x)
    return _scale_by_pow2(x, ew.neg(e)), e


def ldexp(x1, x2, /):
    """``jnp.ldexp``: ``x1 · 2^x2`` for an integer ``x2``, correctly rounded over the whole
    range (subnormal and overflowing results as NumPy; NOTE [frexp and ldexp by exact
    powers of two]). The result has ``x1``'s float dtype (integers become float64).
    Derivative ``2^x2`` in ``x1``; none in ``x2``."""
    x1, x2 = _operand(x1), _operand(x2)
    x2_dtype = np.dtype(type(x2)) if isinstance(x2, (bool, int)) else core.dtype_of(x2)
    if kind_of(x2_dtype) not in "biu" or (not isinstance(x1, (bool, int, float)) and kind_of(core.dtype_of(x1)) == "c"):
        x1_dtype = np.dtype(type(x1)) if isinstance(x1, (bool, int, float, complex)) else core.dtype_of(x1)
        raise ValueError(f"ldexp: x1 must be real and x2 an integer, got dtypes {x1_dtype} and {x2_dtype}")
    if isinstance(x1, (bool, int, float)):
        x1 = asarray(x1, np.float64)
    (x1,) = _promote_inexact("ldexp", x1)
    dtype = core.dtype_of(x1)
    _require_float_bits("ldexp", dtype)
    info = np.finfo(dtype)
    low, high = int(info.minexp) - int(info.nmant) - 2, int(info.maxexp) + 1  # beyond: 0 or ∞
    span = high - low + 2  # |x2| beyond it: e + x2 is beyond [low, high] for every exponent e
    if isinstance(x2, (bool, int)):
        x2 = min(max(int(x2), -span), span)
    else:
        x2 = asarray(x2)
        if kind_of(x2_dtype) != "b":
            bounds = np.iinfo(x2_dtype)
            x2 = ew.min(ew.max(x2, max(-span, int(bounds.min))), min(span, int(bounds.max)))
    n = astype(x2, np.int32)
    # 2^n a normal float: one product, rounded once, with derivative 2^n
    direct = logical_and(ew.ge(n, int(info.minexp)), ew.le(n, int(info.maxexp) - 1))
    single = ew.mul(x1, _pow2(ew.min(ew.max(n, int(info.minexp)), int(info.maxexp) - 1), dtype))
    # otherwise through the mantissa (NOTE [frexp and ldexp by exact powers of two])
    e = _exponent(x1)
    k = ew.min(ew.max(ew.add(e, n), low), high)
    through_mantissa = _scale_by_pow2(_scale_by_pow2(x1, ew.neg(e)), k)
    # a subnormal x1 scaled below 2^minexp is 0 (the same signed zero); computed directly, so
    # that its tangent does not pass through the mantissa's 2^(−e), which overflows there
    minexp = int(info.minexp)
    underflow = logical_and(ew.lt(ew.abs(x1), float(info.smallest_normal)), ew.lt(n, minexp))
    zero = ew.mul(ew.mul(x1, _pow2(minexp, dtype)), _pow2(ew.min(ew.max(ew.sub(n, minexp), minexp), -1), dtype))
    return where(direct, single, where(underflow, zero, through_mantissa))


def nextafter(x, y, /):
    """``jnp.nextafter``: the float after ``x`` in the direction of ``y`` (integers
    become float64). Piecewise constant: no derivative, as in JAX."""
    x, y = _promote_inexact("nextafter", x, y)
    return ew.nextafter(x, y)


def spacing(x, /):
    """``jnp.spacing``: the distance from ``x`` to the next float away from zero (negative
    for negative ``x``, positive at ``±0``, as NumPy's; NaN at ``±inf``). Piecewise
    constant: no derivative."""
    (x,) = _promote_inexact("spacing", x)
    toward = where(ew.lt(x, 0), astype(-np.inf, core.dtype_of(x)), astype(np.inf, core.dtype_of(x)))
    return ew.sub(ew.nextafter(x, toward), x)


def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """``jnp.nan_to_num``: ``x`` with NaN replaced by ``nan``, ``+∞`` by ``posinf`` and ``−∞``
    by ``neginf`` (the dtype's largest and most negative finite values by default);
    complex numbers part by part, integers and booleans unchanged. The derivative flows
    to ``x`` where it is finite."""
    del copy
    x = asarray(x) if isinstance(x, (list, tuple, bool, int, float, complex)) else x
    dtype = core.dtype_of(x)
    if kind_of(dtype) not in "fc":
        return x
    if kind_of(dtype) == "c":
        return ew.complex(nan_to_num(ew.real(x), nan=nan, posinf=posinf, neginf=neginf),
                          nan_to_num(ew.imag(x), nan=nan, posinf=posinf, neginf=neginf))
    info = np.finfo(dtype)
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    out = where(ew.ne(x, x), astype(nan, dtype), x)
    out = where(ew.eq(out, np.inf), astype(posinf, dtype), out)
    return where(ew.eq(out, -np.inf), astype(neginf, dtype), out)
