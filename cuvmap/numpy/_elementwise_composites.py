"""Elementwise functions built from several primitives, as ``jax.numpy`` names them:
``logaddexp``, ``logaddexp2``, ``sinc``, the float tests ``isnan``, ``isinf``,
``isfinite``, and ``isclose`` / ``allclose``. Integer operands of the float functions
are promoted to float64, as NumPy does."""
import math

import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.lax import reduction as lax_reduction
from cuvmap.numpy._common import ndim
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype, logical_and, logical_or, where
from cuvmap.core.bfloat16 import kind_of


def _inexact(x):
    """``x`` as an array or tracer (lists and tuples become arrays) in a floating dtype:
    integers and booleans become float64; Python floats stay weakly typed."""
    if isinstance(x, (list, tuple)):
        x = asarray(x)
    if isinstance(x, float):
        return x
    if isinstance(x, (int, bool)) or not core.is_float(x):
        return astype(x, np.float64)
    return x


def isnan(x):
    """``jnp.isnan``: true where ``x`` is NaN (``x != x``); false for integers. A boolean."""
    x = asarray(x) if isinstance(x, (list, tuple)) else x
    return ew.ne(x, x)  # false everywhere for integers, with x's shape


def isinf(x):
    """``jnp.isinf``: true where ``|x| = ∞``. A boolean."""
    x = asarray(x) if isinstance(x, (list, tuple)) else x
    if not core.is_float(x):
        return ew.ne(x, x)
    return ew.eq(ew.abs(x), np.inf)


def isfinite(x):
    """``jnp.isfinite``: true where ``x`` is neither NaN nor ±∞ (``x − x = 0`` exactly
    there). A boolean."""
    x = asarray(x) if isinstance(x, (list, tuple)) else x
    if not core.is_float(x):
        return ew.eq(x, x)
    return ew.eq(ew.sub(x, x), 0)


# NOTE [logaddexp as a shifted log-sum]
# ``max(x1, x2) + log1p(exp(−|x1 − x2|))`` has the right value and first derivative, but
# its second derivative is wrong where x1 = x2 (max and |·| have kinks there, so the
# composite's second derivative misses the smooth curvature p(1 − p) = 1/4). Written as
# ``m + log(exp(x1 − m) + exp(x2 − m))`` with the shift ``m = stop_gradient(max(x1, x2))``
# every term is smooth: the derivative in x1 is exp(x1 − out) at any order, and the sum
# lies in [1, 2], so the log is stable. An infinite shift is replaced by 0 (then
# exp(±∞) gives the right ±∞ and NaN stays NaN), as in ``logsumexp``.


def _shift(x1, x2):
    m = ew.stop_gradient(ew.max(x1, x2))
    return where(isfinite(m), m, 0.0)


def _principal(z):
    """A complex logarithm ``z`` on the principal branch: its imaginary part brought into
    (−π, π] as ``atan2(sin(y), cos(y))`` (derivative 1: the function stays holomorphic).
    The shift ``m`` of a complex logaddexp carries its own imaginary part, which the log of
    the sum does not reduce; NumPy's ``log(exp(x1) + exp(x2))`` is principal. Real values
    pass through."""
    if kind_of(core.dtype_of(z)) != "c":
        return z
    y = ew.imag(z)
    return ew.complex(ew.real(z), ew.atan2(ew.sin(y), ew.cos(y)))


def logaddexp(x1, x2):
    """``jnp.logaddexp``: ``log(exp(x1) + exp(x2))``, computed stably as
    ``m + log(exp(x1 − m) + exp(x2 − m))`` with ``m = max(x1, x2)`` held constant (NOTE
    [logaddexp as a shifted log-sum]). Its derivative in ``x1`` is ``exp(x1 − out)``."""
    x1, x2 = _inexact(x1), _inexact(x2)
    m = _shift(x1, x2)
    return _principal(ew.add(m, ew.log(ew.add(ew.exp(ew.sub(x1, m)), ew.exp(ew.sub(x2, m))))))


def logaddexp2(x1, x2):
    """``jnp.logaddexp2``: ``log2(2**x1 + 2**x2)``, computed as ``m + log2(2**(x1 − m) +
    2**(x2 − m))`` with ``m = max(x1, x2)`` held constant (NOTE [logaddexp as a shifted
    log-sum])."""
    x1, x2 = _inexact(x1), _inexact(x2)
    m = _shift(x1, x2)
    ln2 = math.log(2.0)
    total = ew.add(ew.exp(ew.mul(ew.sub(x1, m), ln2)), ew.exp(ew.mul(ew.sub(x2, m), ln2)))
    return ew.div(_principal(ew.add(ew.mul(m, ln2), ew.log(total))), ln2)


# NOTE [sinc near zero]
# sin(πx)/(πx) is 0/0 at x = 0. A ``where`` that returns the constant 1 there would give
# the right value and first derivative (0) but a wrong second derivative (0 instead of
# −π²/3). Below |πx| < 1e-2 sinc is evaluated by its Taylor polynomial
# 1 − y²/6 + y⁴/120 − y⁶/5040 + y⁸/362880 (y = πx), whose error there is below 1e-22 and whose
# derivatives at 0 are sinc's up to the eighth; the quotient is evaluated on a
# denominator kept away from zero, so neither branch produces NaN for ``where`` to mask.
_SINC_SERIES_BELOW = 1e-2


def sinc(x):
    """``jnp.sinc``: the normalized sinc ``sin(πx) / (πx)``, 1 at 0, with every
    derivative right at 0 too (NOTE [sinc near zero])."""
    x = _inexact(x)
    y = ew.mul(x, np.pi)
    small = ew.lt(ew.abs(y), _SINC_SERIES_BELOW)
    safe_y = where(small, 1.0, y)
    quotient = ew.div(ew.sin(safe_y), safe_y)
    y2 = ew.mul(y, y)
    series = 1 / 362880
    for coefficient in (-1 / 5040, 1 / 120, -1 / 6, 1.0):  # Horner in y², highest first
        series = ew.add(ew.mul(series, y2), coefficient)
    return where(small, series, quotient)


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``jnp.isclose``: ``|a − b| ≤ atol + rtol·|b|`` elementwise (NumPy's asymmetric
    test), true where ``a == b`` (equal infinities included) and, with ``equal_nan``,
    where both are NaN. Integers take the tolerances too, compared as float64 (NumPy's and
    JAX's: ``isclose(6, 10, rtol=0.5)`` is true). A boolean."""
    a = asarray(a) if isinstance(a, (list, tuple)) else a
    b = asarray(b) if isinstance(b, (list, tuple)) else b
    a, b = _inexact(a), _inexact(b)
    close = ew.le(ew.abs(ew.sub(a, b)), ew.add(atol, ew.mul(rtol, ew.abs(b))))
    out = logical_or(logical_and(close, isfinite(b)), ew.eq(a, b))
    if equal_nan:
        out = logical_or(out, logical_and(isnan(a), isnan(b)))
    return out


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``jnp.allclose``: whether :func:`isclose` holds everywhere (a boolean scalar)."""
    close = isclose(a, b, rtol, atol, equal_nan)
    return ew.eq(lax_reduction.reduce_sum(ew.eq(close, False), tuple(range(ndim(close)))), 0)
