"""``jax.scipy.special``'s functions: ``logsumexp`` (with ``b=`` and ``return_sign=``),
``xlogy``, ``xlog1py``, ``gammaln``, ``digamma``, ``erf``, ``erfc``, ``erfinv``, ``ndtr``,
``ndtri``, ``log_ndtr``, ``expit``, ``logit``, ``softmax``, ``log_softmax``,
``gammainc``/``gammaincc`` (JAX's names of ``lax.igamma``/``lax.igammac``), ``gamma``,
``gammasgn``, ``rgamma``, ``beta``, ``betaln``, ``multigammaln``, ``polygamma``, the
entropies ``entr``, ``rel_entr``, ``kl_div``, the Bessel functions ``i0``, ``i0e``,
``i1``, ``i1e``, ``erfcinv``, and (from :mod:`cuvmap.scipy.special_bessel`) ``j0``, ``j1``,
``y0``, ``y1``, ``jn``, ``yn``, ``iv``, ``ive``, ``bessel_jn`` and ``betainc``.

They are compositions of :mod:`cuvmap.lax` primitives (the special functions themselves are
primitives there), so every transform applies; where the composition's own derivative would
lose accuracy or give NaN, a ``custom_jvp`` states it as JAX does (``xlogy``, ``xlog1py``,
``log_ndtr``, ``ndtri``). SciPy is not needed.
"""
import math

import numpy as np

from cuvmap import lax
from cuvmap import numpy as cnp
from cuvmap.scipy._util import promote_inexact
from cuvmap.transforms.custom_derivatives import custom_jvp
from cuvmap.core.bfloat16 import kind_of

_LOG_2PI = math.log(2 * math.pi)
_SQRT_HALF = math.sqrt(0.5)


# ---------------------------------------------------------------------------------------
# logsumexp, softmax
# ---------------------------------------------------------------------------------------

def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False, where=None):
    """``log(Σ b · exp(a))`` over ``axis``, computed stably (shifted by the maximum).

    With ``b`` (broadcast against ``a``; negative weights allowed) the sum may be negative:
    ``return_sign=True`` returns ``(log|Σ b·exp(a)|, sign)``; without it a negative sum gives
    NaN, as JAX. ``where`` (a boolean mask broadcast against ``a``) sums only the entries
    where it is true (an empty sum gives ``-inf``). JAX: ``jax.scipy.special.logsumexp``."""
    a = promote_inexact(a)
    if where is not None:
        mask = cnp.asarray(where)
        b = cnp.where(mask, 1.0 if b is None else b, 0.0)
        a = cnp.where(mask, a, -np.inf)
    if b is None and not return_sign:
        return cnp.logsumexp(a, axis=axis, keepdims=keepdims)
    if b is None:
        out = cnp.logsumexp(a, axis=axis, keepdims=keepdims)
        return out, cnp.where(out == -np.inf, 0.0, 1.0)
    b = promote_inexact(b)
    a, b = cnp.broadcast_arrays(a, b)
    # the shift: the largest a whose weight is not zero (a constant to differentiation)
    masked = cnp.where(b != 0, a, -np.inf)
    m = cnp.stop_gradient(cnp.max(masked, axis=axis, keepdims=True))
    m = cnp.where(cnp.isfinite(m), m, 0.0)
    total = cnp.sum(b * cnp.exp(a - m), axis=axis, keepdims=True)
    sign = cnp.sign(total)
    out = cnp.log(cnp.abs(total)) + m
    if not keepdims:
        out = cnp.squeeze(out, axis=_reduced_axes(cnp.ndim(a), axis))
        sign = cnp.squeeze(sign, axis=_reduced_axes(cnp.ndim(a), axis))
    if return_sign:
        return out, sign
    return cnp.where(sign < 0, np.nan, out)


def _reduced_axes(ndim, axis):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim for a in axes)


def log_softmax(x, axis=None):
    """``x − logsumexp(x, axis, keepdims=True)``; ``axis=None`` (JAX's default here)
    normalizes over all entries. JAX: ``jax.scipy.special.log_softmax`` (``jax.nn.log_softmax``
    defaults to ``axis=-1``)."""
    x = promote_inexact(x)
    return x - cnp.logsumexp(x, axis=axis, keepdims=True)


def softmax(x, axis=None):
    """``exp(x) / Σ exp(x)`` along ``axis`` (``None``, JAX's default here: over all
    entries). JAX: ``jax.scipy.special.softmax``."""
    return cnp.exp(log_softmax(x, axis))


# ---------------------------------------------------------------------------------------
# x log y
# ---------------------------------------------------------------------------------------

@custom_jvp
def xlogy(x, y):
    """``x · log(y)``, 0 where ``x = 0`` (even for ``y = 0``). Its derivatives are
    ``log(y)`` and ``x / y`` (JAX's rule). JAX: ``jax.scipy.special.xlogy``."""
    x, y = promote_inexact(x, y)
    safe_y = cnp.where(x == 0, 1.0, y)
    return cnp.where(x == 0, 0.0, x * cnp.log(safe_y))


@xlogy.defjvp
def _xlogy_jvp(primals, tangents):
    x, y = promote_inexact(*primals)
    x_dot, y_dot = tangents
    return xlogy(x, y), x_dot * cnp.log(y) + y_dot * x / y


@custom_jvp
def xlog1py(x, y):
    """``x · log(1 + y)``, 0 where ``x = 0``. Its derivatives are ``log1p(y)`` and
    ``x / (1 + y)``. JAX: ``jax.scipy.special.xlog1py``."""
    x, y = promote_inexact(x, y)
    safe_y = cnp.where(x == 0, 0.0, y)
    return cnp.where(x == 0, 0.0, x * cnp.log1p(safe_y))


@xlog1py.defjvp
def _xlog1py_jvp(primals, tangents):
    x, y = promote_inexact(*primals)
    x_dot, y_dot = tangents
    return xlog1py(x, y), x_dot * cnp.log1p(y) + y_dot * x / (1 + y)


# ---------------------------------------------------------------------------------------
# Gamma and error functions (the lax primitives under SciPy's names)
# ---------------------------------------------------------------------------------------

def gammaln(x):
    """``log |Γ(x)|`` (:func:`cuvmap.lax.lgamma`). JAX: ``jax.scipy.special.gammaln``."""
    return lax.lgamma(promote_inexact(x))


def digamma(x):
    """``ψ(x) = Γ'(x)/Γ(x)`` (:func:`cuvmap.lax.digamma`). JAX: ``jax.scipy.special.digamma``."""
    return lax.digamma(promote_inexact(x))


psi = digamma


def gammasgn(x):
    """The sign of ``Γ(x)``: 1 for ``x > 0``, ``(−1)^{⌈−x⌉}`` between the poles of the
    negative axis, NaN at the poles. JAX: ``jax.scipy.special.gammasgn``."""
    x = promote_inexact(x)
    negative_odd = (x < 0) & (cnp.remainder(cnp.floor(x), 2.0) == 1.0)
    pole = (x <= 0) & (x == cnp.floor(x))
    return cnp.where(pole, np.nan, cnp.where(negative_odd, -1.0, 1.0))


def gamma(x):
    """``Γ(x) = gammasgn(x) · exp(lgamma(x))``. JAX: ``jax.scipy.special.gamma``."""
    x = promote_inexact(x)
    return gammasgn(x) * cnp.exp(lax.lgamma(x))


def rgamma(x):
    """``1 / Γ(x)``, 0 at the poles. JAX: ``jax.scipy.special.rgamma``."""
    x = promote_inexact(x)
    pole = (x <= 0) & (x == cnp.floor(x))
    return cnp.where(pole, 0.0, gammasgn(cnp.where(pole, 1.0, x)) * cnp.exp(-lax.lgamma(x)))


def betaln(a, b):
    """``log |B(a, b)| = lgamma(a) + lgamma(b) − lgamma(a + b)``. JAX: ``jax.scipy.special.betaln``."""
    a, b = promote_inexact(a, b)
    return lax.lgamma(a) + lax.lgamma(b) - lax.lgamma(a + b)


def beta(a, b):
    """``B(a, b) = Γ(a) Γ(b) / Γ(a + b)`` (with its sign). JAX: ``jax.scipy.special.beta``."""
    a, b = promote_inexact(a, b)
    return gammasgn(a) * gammasgn(b) * gammasgn(a + b) * cnp.exp(betaln(a, b))


def multigammaln(a, d):
    """The log of the multivariate gamma function of dimension ``d`` (a Python int):
    ``d(d−1)/4 · log π + Σ_{j<d} lgamma(a − j/2)``. JAX: ``jax.scipy.special.multigammaln``."""
    a = promote_inexact(a)
    d = int(d)
    total = d * (d - 1) / 4 * math.log(math.pi)
    for j in range(d):
        total = total + lax.lgamma(a - j / 2)
    return total


def polygamma(n, x):
    """``ψ⁽ⁿ⁾(x)``, the n-th derivative of :func:`digamma`, for a concrete non-negative
    integer ``n`` (JAX also takes an array of orders). JAX: ``jax.scipy.special.polygamma``."""
    order = np.asarray(n)
    if order.ndim != 0 or kind_of(order.dtype) not in "iuf" or order != int(order) or order < 0:
        raise ValueError(f"scipy.special.polygamma: n must be one concrete non-negative integer, got {n!r}")
    return lax.polygamma(int(order), promote_inexact(x))


def gammainc(a, x):
    """The regularized lower incomplete gamma function ``P(a, x)`` (:func:`cuvmap.lax.igamma`).
    JAX: ``jax.scipy.special.gammainc``."""
    return lax.igamma(*promote_inexact(a, x))


def gammaincc(a, x):
    """The regularized upper incomplete gamma function ``Q(a, x) = 1 − P(a, x)``
    (:func:`cuvmap.lax.igammac`). JAX: ``jax.scipy.special.gammaincc``."""
    return lax.igammac(*promote_inexact(a, x))


def erf(x):
    """``(2/√π) ∫₀ˣ e^{−t²} dt`` (:func:`cuvmap.lax.erf`). JAX: ``jax.scipy.special.erf``."""
    return lax.erf(promote_inexact(x))


def erfc(x):
    """``1 − erf(x)``, accurate where small (:func:`cuvmap.lax.erfc`). JAX:
    ``jax.scipy.special.erfc``."""
    return lax.erfc(promote_inexact(x))


def erfinv(x):
    """The inverse of :func:`erf` on ``[−1, 1]`` (:func:`cuvmap.lax.erf_inv`). JAX:
    ``jax.scipy.special.erfinv``."""
    return lax.erf_inv(promote_inexact(x))


def erfcinv(y):
    """The inverse of :func:`erfc` on ``[0, 2]``: ``erfcinv(y) = −ndtri(y/2)/√2`` (accurate
    for tiny ``y``, where ``erfinv(1 − y)`` would lose every digit);
    ``erfcinv'(y) = −(√π/2) e^{erfcinv(y)²}``. SciPy: ``scipy.special.erfcinv``."""
    y = promote_inexact(y)
    return -ndtri(y / 2) * _SQRT_HALF


# ---------------------------------------------------------------------------------------
# The normal distribution function
# ---------------------------------------------------------------------------------------

def ndtr(x):
    """The standard normal CDF ``Φ(x) = ½ erfc(−x/√2)`` (accurate in the lower tail).
    JAX: ``jax.scipy.special.ndtr``."""
    x = promote_inexact(x)
    return 0.5 * lax.erfc(-x * _SQRT_HALF)


# NOTE [log_ndtr in three pieces]
# log Φ(x): for x > −1 (Φ > 0.16), log1p(−Φ(−x)), exact as Φ → 1; for −20 ≤ x ≤ −1, the log
# of ½ erfc(−x/√2), whose erfc keeps its relative accuracy far into the tail; below −20,
# the asymptotic series log Φ(x) = −x²/2 − log(−x) − ½ log 2π + log(1 − 1/x² + 3/x⁴ − ⋯)
# (ten terms, below 1e-17 there). Each piece sees only inputs of its own range (the others
# get a safe constant) so that its derivative is never NaN; the derivative is the custom
# φ(x)/Φ(x) = exp(log φ(x) − log Φ(x)), finite everywhere.
_LOG_NDTR_ASYMPTOTIC_TERMS = 10


def log_ndtr(x, series_order=3):
    """``log Φ(x)``, accurate for every ``x`` (NOTE [log_ndtr in three pieces]).
    ``series_order`` (an int in ``[0, 30]``) is JAX's number of terms of the asymptotic
    series below −20; it is checked, and cuvmap always sums ten (accurate below 1e-17).
    JAX: ``jax.scipy.special.log_ndtr``."""
    if not isinstance(series_order, (int, np.integer)) or isinstance(series_order, bool):
        raise TypeError(f"log_ndtr: series_order must be a Python int, got {series_order!r}")
    if not 0 <= series_order <= 30:
        raise ValueError(f"log_ndtr: series_order must be in [0, 30], got {series_order}")
    return _log_ndtr(x)


@custom_jvp
def _log_ndtr(x):
    x = promote_inexact(x)
    upper = cnp.where(x > -1, x, 0.0)
    middle = cnp.where((x <= -1) & (x >= -20), x, -1.0)
    lower = cnp.where(x < -20, x, -20.0)
    upper_value = cnp.log1p(-ndtr(-upper))
    middle_value = cnp.log(ndtr(middle))
    inv2 = 1.0 / (lower * lower)
    series = cnp.ones_like(lower)
    term = cnp.ones_like(lower)
    for k in range(1, _LOG_NDTR_ASYMPTOTIC_TERMS + 1):
        term = -term * (2 * k - 1) * inv2
        series = series + term
    lower_value = -0.5 * lower * lower - cnp.log(-lower) - 0.5 * _LOG_2PI + cnp.log(series)
    return cnp.where(x > -1, upper_value, cnp.where(x >= -20, middle_value, lower_value))


@_log_ndtr.defjvp
def _log_ndtr_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    x = promote_inexact(x)
    out = _log_ndtr(x)
    return out, x_dot * cnp.exp(-0.5 * x * x - 0.5 * _LOG_2PI - out)


# NOTE [ndtri refined by Newton]
# ndtri(p) = Φ⁻¹(p) = √2 erf_inv(2p − 1). For p ≥ 1/4, 2p − 1 is exact and erf_inv
# (Giles' polynomials) is accurate. Below, 2p − 1 loses p's low digits (and rounds to −1
# below 1e-16), so the start is √2 erf_inv(2p − 1) where p ≥ 1e-12 and the tail
# approximation x₀ = −√(−2 log p − log(−2 log p) − log 2π) below, then four Newton steps on
# log Φ(x) = log p (convergence is quadratic from either start):
# x ← x − (log Φ(x) − log p) · Φ(x)/φ(x). Its derivative is 1/φ(ndtri(p)) = √(2π) e^{x²/2};
# ndtri(0) = −inf, ndtri(1) = inf, NaN outside [0, 1].
_NDTRI_NEWTON_STEPS = 4


@custom_jvp
def ndtri(p):
    """The inverse of the standard normal CDF: the ``x`` with ``Φ(x) = p`` (NOTE [ndtri
    refined by Newton]). JAX: ``jax.scipy.special.ndtri``."""
    p = promote_inexact(p)
    central = math.sqrt(2) * lax.erf_inv(2 * p - 1)
    tail = (p < 0.25) & (p > 0)
    safe_p = cnp.where(tail, p, 0.1)
    log_p = cnp.log(safe_p)
    t = -2 * log_p
    far_start = -cnp.sqrt(t - cnp.log(t) - _LOG_2PI)
    x = cnp.where(safe_p >= 1e-12, math.sqrt(2) * lax.erf_inv(2 * safe_p - 1), far_start)
    for _ in range(_NDTRI_NEWTON_STEPS):
        log_cdf = log_ndtr(x)
        x = x - (log_cdf - log_p) * cnp.exp(log_cdf + 0.5 * x * x + 0.5 * _LOG_2PI)
    return cnp.where(tail, x, central)


@ndtri.defjvp
def _ndtri_jvp(primals, tangents):
    (p,), (p_dot,) = primals, tangents
    x = ndtri(p)
    return x, p_dot * cnp.exp(0.5 * x * x + 0.5 * _LOG_2PI)


# ---------------------------------------------------------------------------------------
# The logistic function and its inverse
# ---------------------------------------------------------------------------------------

def expit(x):
    """The logistic sigmoid ``1 / (1 + e^{−x})`` (:func:`cuvmap.lax.logistic`). JAX:
    ``jax.scipy.special.expit``."""
    return lax.logistic(promote_inexact(x))


def logit(x):
    """The inverse of :func:`expit`: ``log(x / (1 − x)) = log x − log1p(−x)``. JAX:
    ``jax.scipy.special.logit``."""
    x = promote_inexact(x)
    return cnp.log(x) - cnp.log1p(-x)


# ---------------------------------------------------------------------------------------
# Entropies and the modified Bessel functions of orders 0 and 1
# ---------------------------------------------------------------------------------------

def entr(x):
    """The elementwise entropy ``−x log x`` for ``x > 0``, ``0`` at ``0``, ``−inf`` below.
    JAX: ``jax.scipy.special.entr``."""
    x = promote_inexact(x)
    positive = x > 0
    safe = cnp.where(positive, x, 1.0)
    return cnp.where(positive, -safe * cnp.log(safe), cnp.where(x == 0, 0.0, -np.inf))


def rel_entr(p, q):
    """The relative entropy ``p log(p/q)`` for ``p, q > 0``; ``0`` where ``p = 0`` and
    ``q ≥ 0``; ``inf`` otherwise. JAX: ``jax.scipy.special.rel_entr``."""
    p, q = promote_inexact(p, q)
    both = (p > 0) & (q > 0)
    sp, sq = cnp.where(both, p, 1.0), cnp.where(both, q, 1.0)
    return cnp.where(both, sp * cnp.log(sp / sq), cnp.where((p == 0) & (q >= 0), 0.0, np.inf))


def kl_div(p, q):
    """The Kullback-Leibler term ``p log(p/q) − p + q`` for ``p, q > 0``; ``q`` where
    ``p = 0`` and ``q ≥ 0``; ``inf`` otherwise. JAX: ``jax.scipy.special.kl_div``."""
    p, q = promote_inexact(p, q)
    both = (p > 0) & (q > 0)
    sp, sq = cnp.where(both, p, 1.0), cnp.where(both, q, 1.0)
    return cnp.where(both, sp * cnp.log(sp / sq) - sp + sq, cnp.where((p == 0) & (q >= 0), q, np.inf))


def i0e(x):
    """The exponentially scaled modified Bessel function ``e^{−|x|} I₀(x)``
    (:func:`cuvmap.lax.bessel_i0e`). JAX: ``jax.scipy.special.i0e``."""
    return lax.bessel_i0e(promote_inexact(x))


def i1e(x):
    """The exponentially scaled modified Bessel function ``e^{−|x|} I₁(x)``
    (:func:`cuvmap.lax.bessel_i1e`). JAX: ``jax.scipy.special.i1e``."""
    return lax.bessel_i1e(promote_inexact(x))


def i0(x):
    """The modified Bessel function ``I₀(x) = e^{|x|} · i0e(x)``. JAX:
    ``jax.scipy.special.i0``."""
    x = promote_inexact(x)
    return cnp.exp(cnp.abs(x)) * lax.bessel_i0e(x)


def i1(x):
    """The modified Bessel function ``I₁(x) = e^{|x|} · i1e(x)``. JAX:
    ``jax.scipy.special.i1``."""
    x = promote_inexact(x)
    return cnp.exp(cnp.abs(x)) * lax.bessel_i1e(x)


from cuvmap.scipy.special_bessel import (  # noqa: E402,F401  (a file of their own: this one's size)
    bessel_jn, betainc, iv, ive, j0, j1, jn, y0, y1, yn,
)
