"""More elementwise functions as ``jax.numpy`` names them: ``hypot``, ``fmax``, ``fmin``,
``fmod``, ``divmod``, ``float_power``, ``heaviside``, ``positive``, the integer functions
``gcd``, ``lcm``, ``bitwise_count``, and ``is_weakly_typed``. Composites of
:mod:`cuvmap.lax` primitives, so every transform applies; the integer functions have
integer results and no derivative."""
import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.lax.control_flow import while_loop
from cuvmap.numpy._dtypes import result_type
from cuvmap.numpy._elementwise import astype, logical_and, logical_or, where
from cuvmap.numpy._float_bits import _operand, _promote_inexact, _require_real, signbit
from cuvmap.numpy._reductions import any as _any
from cuvmap.numpy._shapes import broadcast_arrays
from cuvmap.core.bfloat16 import kind_of


def _promote_numeric(name, *args):
    """The operands in their common dtype (NumPy's promotion, Python scalars weakly)."""
    args = [_operand(a) for a in args]
    dtype = np.dtype(result_type(*args))
    return [astype(a, dtype) for a in args]


def positive(x, /):
    """``jnp.positive``: ``+x``, the operand itself (a boolean too, as JAX's; NumPy's ufunc
    refuses booleans)."""
    return _operand(x)


# NOTE [hypot scaled by a constant]
# JAX computes hypot as M·√(1 + (m/M)²) with M = max(|x1|, |x2|), m = min(...): right value
# and first derivative, but max and min have kinks where |x1| = |x2|, so the composite's
# second derivative is wrong there (hypot itself is smooth away from the origin). Here the
# scale s = max(|x1|, |x2|) is held constant (stop_gradient) and hypot = s·√((x1/s)² +
# (x2/s)²): no square overflows (both ratios are at most 1), and every derivative is
# hypot's own, ties included. At the origin (s = 0) the result is the constant 0, whose
# derivative is 0 as JAX's; ratios are computed on a divisor kept away from 0 so no NaN
# reaches where.


def hypot(x1, x2, /):
    """``jnp.hypot``: ``√(x1² + x2²)``, computed as ``s·√((x1/s)² + (x2/s)²)`` with ``s =
    max(|x1|, |x2|)`` held constant, so no square overflows and the derivatives of every
    order are hypot's (NOTE [hypot scaled by a constant]); ``inf`` where either is infinite
    (even beside NaN). Derivative ``x1/hypot`` in ``x1`` (0 at the origin, as JAX). Real
    operands only (a complex one raises ValueError, as in JAX)."""
    x1, x2 = _promote_inexact("hypot", x1, x2)
    if kind_of(core.dtype_of(x1)) == "c":
        raise ValueError("jnp.hypot is not well defined for complex-valued inputs: take abs(x) first")
    infinite = logical_or(ew.eq(ew.abs(x1), np.inf), ew.eq(ew.abs(x2), np.inf))
    scale = ew.stop_gradient(ew.max(ew.abs(x1), ew.abs(x2)))
    zero = ew.eq(scale, 0)
    safe_scale = where(logical_or(zero, ew.eq(scale, np.inf)), 1.0, scale)
    r1 = where(zero, 1.0, ew.div(x1, safe_scale))
    r2 = ew.div(x2, safe_scale)
    out = where(zero, 0.0, ew.mul(safe_scale, ew.sqrt(ew.add(ew.mul(r1, r1), ew.mul(r2, r2)))))
    return where(infinite, np.inf, out)


def fmax(x1, x2):
    """``jnp.fmax``: the larger of ``x1`` and ``x2``, ignoring a NaN (NaN only where both are
    NaN). The derivative flows to the operand chosen (``x2`` at ties), as in JAX."""
    x1, x2 = _promote_numeric("fmax", x1, x2)
    return where(logical_or(ew.gt(x1, x2), ew.ne(x2, x2)), x1, x2)


def fmin(x1, x2):
    """``jnp.fmin``: the smaller of ``x1`` and ``x2``, ignoring a NaN (NaN only where both are
    NaN). The derivative flows to the operand chosen (``x2`` at ties), as in JAX."""
    x1, x2 = _promote_numeric("fmin", x1, x2)
    return where(logical_or(ew.lt(x1, x2), ew.ne(x2, x2)), x1, x2)


def fmod(x1, x2, /):
    """``jnp.fmod``: C's remainder ``x1 − x2·trunc(x1/x2)``, with the sign of ``x1``
    (``remainder`` takes the sign of ``x2``); integers: 0 where ``x2 = 0``, as NumPy.
    Computed as ``±remainder(|x1|, |x2|)``, which is exact. Derivative 1 in ``x1`` and
    ``−trunc(x1/x2)`` in ``x2``."""
    x1, x2 = _promote_numeric("fmod", x1, x2)
    dtype = core.dtype_of(x1)
    _require_real("fmod", x1)
    if dtype == np.bool_:
        raise TypeError("fmod: boolean operands are not supported")
    if kind_of(dtype) in "iu":
        x2 = where(ew.eq(x2, 0), 1, x2)
        r = ew.remainder(x1, x2)  # exact for integers, with the sign of x2: give it x1's
        if kind_of(dtype) == "u":
            return r
        wrong_sign = logical_and(ew.ne(r, 0), ew.ne(ew.lt(r, 0), ew.lt(x1, 0)))
        return where(wrong_sign, ew.sub(r, x2), r)
    # both operands of remainder ≥ 0 (or NaN): its result is fmod's magnitude, exactly; the
    # signs are read from the sign bits, so fmod(−0.0, y) = −0.0 and the derivative in x1 is
    # s1·s1 = 1 everywhere
    s1, s2 = _sign_of_bit(x1), _sign_of_bit(x2)
    return ew.mul(ew.remainder(ew.mul(x1, s1), ew.mul(x2, s2)), s1)


def _sign_of_bit(x):
    """``−1.0`` where the sign bit of ``x`` is set, else ``1.0`` (no derivative)."""
    return astype(where(signbit(x), -1.0, 1.0), core.dtype_of(x))


def divmod(x1, x2, /):  # noqa: A001 - NumPy's name
    """``jnp.divmod``: ``(floor_divide(x1, x2), remainder(x1, x2))``, Python's ``divmod``
    elementwise. The quotient is piecewise constant (derivative zero); the remainder's
    derivative is 1 in ``x1`` and ``−floor(x1/x2)`` in ``x2``."""
    x1, x2 = _promote_numeric("divmod", x1, x2)
    return ew.floor_divide(x1, x2), ew.remainder(x1, x2)


def float_power(x, y, /):
    """``jnp.float_power``: ``x ** y`` in a float dtype (integers become float64; a float32
    operand stays float32, as JAX's, where NumPy would give float64). Derivatives those
    of ``pow``."""
    x, y = _promote_inexact("float_power", x, y)
    return ew.pow(x, y)


def heaviside(x1, x2, /):
    """``jnp.heaviside``: 0 where ``x1 < 0``, 1 where ``x1 > 0``, ``x2`` where ``x1 = 0``
    (NaN where ``x1`` is NaN). Derivative: 0 in ``x1``; 1 in ``x2`` where ``x1 = 0``."""
    x1, x2 = _promote_inexact("heaviside", x1, x2)
    _require_real("heaviside", x1)
    x1, x2 = broadcast_arrays(x1, x2)
    at_zero = where(ew.ne(x1, x1), x1, x2)
    return where(ew.lt(x1, 0), 0.0, where(ew.gt(x1, 0), 1.0, at_zero))


def bitwise_count(x, /):
    """``jnp.bitwise_count``: the number of 1 bits of ``|x|`` (uint8), as NumPy's (a boolean
    counts as 0 or 1)."""
    x = _operand(x)
    dtype = core.dtype_of(x)
    if dtype == np.bool_:
        return astype(x, np.uint8)
    if kind_of(dtype) not in "iu":
        raise TypeError(f"bitwise_count: operand must be an integer, got dtype {dtype}")
    return astype(ew.population_count(ew.abs(x)), np.uint8)


def _integer_pair(name, x1, x2):
    x1, x2 = _promote_numeric(name, x1, x2)
    dtype = core.dtype_of(x1)
    if kind_of(dtype) not in "iu":
        raise ValueError(f"{name}: arguments must be integers, got dtype {dtype}")
    return broadcast_arrays(ew.abs(x1), ew.abs(x2))


def _euclid_step(pair):
    a, b = pair
    nonzero = ew.ne(b, 0)
    safe_b = where(nonzero, b, 1)  # Python ints: weakly typed, b's dtype
    return where(nonzero, b, a), where(nonzero, ew.remainder(a, safe_b), 0)


def gcd(x1, x2):
    """``jnp.gcd``: the greatest common divisor of ``|x1|`` and ``|x2|`` (0 for two zeros),
    by Euclid's algorithm in a ``while_loop`` until every pair is done. Integers only; an
    integer result, no derivative."""
    a, b = _integer_pair("gcd", x1, x2)
    out, _ = while_loop(lambda pair: _any(ew.ne(pair[1], 0)), _euclid_step, (a, b))
    return out


def lcm(x1, x2):
    """``jnp.lcm``: the least common multiple of ``|x1|`` and ``|x2|``, ``|x1|·(|x2| //
    gcd)`` (0 where either is 0). Integers only; an integer result, no derivative."""
    a, b = _integer_pair("lcm", x1, x2)
    d = gcd(a, b)
    zero = ew.eq(d, 0)
    return where(zero, 0, ew.mul(a, ew.floor_divide(b, where(zero, 1, d))))


def is_weakly_typed(x):
    """``jax.dtypes.is_weakly_typed``: whether ``x`` is weakly typed (a Python scalar, or a
    value computed from Python scalars that a typed operand's dtype overrides)."""
    return bool(core.get_aval(x).weak_type)


def i0(x):
    """``jnp.i0``: the modified Bessel function of the first kind of order 0,
    ``I₀(x) = e^{|x|} · bessel_i0e(x)`` (real ``x``; integers become float64). Its
    derivative is ``I₁(x)``."""
    (x,) = _promote_inexact("i0", x)
    _require_real("i0", x)
    return ew.mul(ew.exp(ew.abs(x)), ew.bessel_i0e(x))
