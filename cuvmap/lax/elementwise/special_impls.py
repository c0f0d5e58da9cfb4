"""Vectorised NumPy evaluations of the special functions of :mod:`cuvmap.lax.elementwise.special`
(SciPy is no dependency of cuvmap): ``erfc`` (NOTE [erfc from erfcx's Taylor tables]),
``lgamma`` and the polygamma functions (NOTE [lgamma and the polygammas]), the regularized
incomplete gamma functions (NOTE [igamma by series and continued fraction]) and the scaled
Bessel functions ``i0e``, ``i1e`` (NOTE [i0e and i1e by series and asymptotics]).

Every function here takes and returns float64 NumPy arrays; the primitives' impls cast
other float dtypes to float64 and back. Loops run over terms or iterations of whole arrays,
never over elements.
"""
import math

import numpy as np

from cuvmap.lax.elementwise.transcendental import _erf_taylor


# NOTE [erfc from erfcx's Taylor tables]
# erfc(x) = 1 − erf(x) loses every digit as erf(x) → 1, so for x ≥ 1/2 it is evaluated as
# erfc(x) = exp(−x²) · erfcx(x), erfcx(x) = exp(x²) erfc(x) being smooth and slowly varying
# (≈ 1 / (x√π)). erfcx is expanded in Taylor series around centers c = 1/2, 1/2 + 1/16, ...,
# 27.25 (erfc underflows float64 past 27.3); its coefficients follow from erfcx' = 2x·erfcx
# − 2/√π: (n + 1) a_{n+1} = 2c a_n + 2 a_{n−1} − (2/√π) [n = 0], with a_0 = erfcx(c) from
# math.erfc. The factor exp(−x²) is exp(−c²) · exp(−(2c + h) h) with h = x − c: c² is exact
# (c is a multiple of 1/16) and (2c + h) h is small, so the product keeps float64's relative
# accuracy where exp(−x²) of a rounded x² would lose x² ulps. For x < 1/2,
# erfc(x) = 1 − erf(x) ∈ (0.47, 2) loses nothing.
_ERFC_STEP = 1.0 / 16
_ERFC_FIRST = 0.5
_ERFC_LAST = 27.25
_ERFC_TERMS = 12


def _erfc_coefficients():
    # the recurrence cancels (2c·a_n against 2a_{n−1}), so it runs in long double (64-bit
    # mantissas on x86) and the table is rounded to float64 at the end
    centers = np.arange(_ERFC_FIRST, _ERFC_LAST + _ERFC_STEP / 2, _ERFC_STEP)
    c = centers.astype(np.longdouble)
    near = centers < 5
    tail = c[~near].copy()
    for n in range(400, 0, -1):  # erfcx(c) = 1 / (√π (c + (1/2)/(c + (2/2)/(c + ...))))
        tail = c[~near] + np.longdouble(n) / 2 / tail
    root_pi = np.sqrt(np.longdouble(np.pi))
    first = np.concatenate([[math.erfc(x) * math.exp(x * x) for x in centers[near]], 1 / (root_pi * tail)])
    rows = [first.astype(np.longdouble)]
    rows.append(2 * c * rows[0] - 2 / root_pi)
    for n in range(1, _ERFC_TERMS):
        rows.append((2 * c * rows[n] + 2 * rows[n - 1]) / (n + 1))
    return centers, np.stack(rows).astype(np.float64), np.exp(-centers * centers)


_ERFC_CENTERS, _ERFC_TABLE, _ERFC_EXP = _erfc_coefficients()


def erfc(x):
    """erfc on a float64 array (NOTE [erfc from erfcx's Taylor tables])."""
    out = 1.0 - _erf_taylor(np.minimum(x, _ERFC_FIRST), np)
    far = np.nonzero(x >= _ERFC_FIRST)
    if far[0].size:
        xf = np.minimum(x[far], _ERFC_LAST + _ERFC_STEP / 2)
        k = np.minimum(((xf - _ERFC_FIRST) * (1 / _ERFC_STEP) + 0.5).astype(np.intp), _ERFC_CENTERS.size - 1)
        c = _ERFC_CENTERS[k]
        h = xf - c
        acc = _ERFC_TABLE[-1][k]
        for row in _ERFC_TABLE[-2::-1]:
            acc = acc * h + row[k]
        value = _ERFC_EXP[k] * np.exp(-(2 * c + h) * h) * acc
        out[far] = np.where(x[far] > _ERFC_LAST + _ERFC_STEP / 2, 0.0, value)
    return out


# NOTE [lgamma and the polygammas]
# lgamma(x) = log|Γ(x)|: for 1/2 ≤ x < 5/2 the Taylor series of lgamma(1 + t) (coefficients
# −γ and (−1)^k ζ(k)/k; around 2 through lgamma(2 + t) = lgamma(1 + t) + log1p(t)), exact at
# the zeros 1 and 2; for 5/2 ≤ x < 10 Lanczos' approximation with g = 7 and nine
# coefficients (relative error about 1e-15), for x ≥ 10 Stirling's series to the 1/x⁹ term,
# and for x < 1/2 the reflection lgamma(x) = log(π / |sin(πx)|) − lgamma(1 − x), with sin(πx)
# taken of x's distance to the nearest integer so that large negative x stay accurate; +inf
# at the poles 0, −1, −2, ....
# The polygammas ψ⁽ᵐ⁾ (m = 0: digamma) shift x up to at least 10 with the recurrence
# ψ⁽ᵐ⁾(x) = ψ⁽ᵐ⁾(x + 1) − (−1)ᵐ m! / x^{m+1} (one whole-array step per unit, at most ten),
# then sum the asymptotic series
#   ψ(x) ~ log x − 1/(2x) − Σ_k B_{2k} / (2k x^{2k}),
#   ψ⁽ᵐ⁾(x) ~ (−1)^{m+1} [(m−1)!/xᵐ + m!/(2x^{m+1}) + Σ_k B_{2k} (2k+m−1)! / ((2k)! x^{2k+m})],
# with the Bernoulli numbers up to B₁₆. Below 1/2, digamma and trigamma reflect:
# ψ(x) = ψ(1 − x) − π/tan(πx), ψ⁽¹⁾(x) = π²/sin²(πx) − ψ⁽¹⁾(1 − x); the higher orders (which
# only derivatives reach) shift up from any x > −1000 (NaN below). NaN at the poles.
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
            1.5056327351493116e-7)
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)  # B_2 ... B_16
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _sin_pi(x):
    """sin(πx), exact at the integers (x reduced to its distance from the nearest one)."""
    r = x - np.round(x)
    sign = np.where(np.remainder(np.round(x), 2) == 0, 1.0, -1.0)
    return sign * np.sin(math.pi * r)


def _zeta(k, n=1000):
    """ζ(k) for an integer k ≥ 2: Σ_{m<n} m^{−k} plus the Euler–Maclaurin tail at n."""
    head = math.fsum(m ** -float(k) for m in range(1, n))
    tail = n ** (1.0 - k) / (k - 1) + 0.5 * n ** -float(k) + k * n ** (-k - 1.0) / 12 \
        - k * (k + 1) * (k + 2) * n ** (-k - 3.0) / 720
    return head + tail


# lgamma(1 + t) = −γ t + Σ_{k≥2} (−1)^k ζ(k) t^k / k, for |t| ≤ 1/2 (60 terms: 0.5^60 ≈ 1e-18)
_LGAMMA_SERIES = tuple([-0.5772156649015329] + [(-1) ** k * _zeta(k) / k for k in range(2, 61)])


def _lgamma_near_one_and_two(z):
    """lgamma on [1/2, 5/2): the series of lgamma(1 + t) at t = z − 1, or at t = z − 2 plus
    log1p(t) (lgamma(2 + t) = lgamma(1 + t) + log(1 + t)): exact zeros at 1 and 2."""
    center = np.where(z < 1.5, 1.0, 2.0)
    t = z - center
    acc = np.zeros_like(t)
    for c in _LGAMMA_SERIES[::-1]:
        acc = (acc + c) * t
    return np.where(center == 2.0, acc + np.log1p(t), acc)


def _lgamma_positive(z):
    """lgamma for z ≥ 1/2."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        small = np.minimum(z, 10.0) - 1.0
        series = np.full_like(small, _LANCZOS[0])
        for i, p in enumerate(_LANCZOS[1:], start=1):
            series += p / (small + i)
        t = small + _LANCZOS_G + 0.5
        lanczos = _HALF_LOG_2PI + (small + 0.5) * np.log(t) - t + np.log(series)
        big = np.maximum(z, 10.0)
        inv = 1.0 / big
        inv2 = inv * inv
        correction = inv * (1 / 12 + inv2 * (-1 / 360 + inv2 * (1 / 1260 + inv2 * (-1 / 1680 + inv2 / 1188))))
        stirling = (big - 0.5) * np.log(big) - big + _HALF_LOG_2PI + correction
    near = np.nonzero(z < 2.5)
    out = np.where(z < 10.0, lanczos, stirling)
    if near[0].size:
        out[near] = _lgamma_near_one_and_two(z[near])
    return out


def lgamma(x):
    """log|Γ(x)| on a float64 array (NOTE [lgamma and the polygammas])."""
    reflect = x < 0.5
    z = np.where(reflect, 1.0 - x, x)
    main = _lgamma_positive(z)
    with np.errstate(divide="ignore", invalid="ignore"):
        reflected = math.log(math.pi) - np.log(np.abs(_sin_pi(x))) - main
    return np.where(reflect, reflected, main)


def _shift_up(x, order, minimum=10.0):
    """``(z, correction)`` with z = x + n ≥ ``minimum`` (n whole-array steps, as many as the
    smallest element needs) and ψ⁽ᵐ⁾(x) = ψ⁽ᵐ⁾(z) + correction, from the recurrence
    ψ⁽ᵐ⁾(x) = ψ⁽ᵐ⁾(x + 1) − (−1)ᵐ m! / x^{m+1}."""
    factor = (-1.0) ** order * math.factorial(order)
    z = x.copy()
    correction = np.zeros_like(x)
    finite = z[np.isfinite(z)]
    steps = int(math.ceil(minimum - finite.min())) if finite.size else 0
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(max(steps, 0)):
            low = z < minimum
            correction -= np.where(low, factor / z ** (order + 1), 0.0)
            z = np.where(low, z + 1.0, z)
    return z, correction


def _polygamma_asymptotic(z, order):
    inv = 1.0 / z
    if order == 0:
        inv2 = inv * inv
        series = np.zeros_like(z)
        for k in range(len(_BERNOULLI), 0, -1):
            series = series * inv2 + _BERNOULLI[k - 1] / (2 * k)
        return np.log(z) - 0.5 * inv - series * inv2
    m = order
    total = math.factorial(m - 1) * inv ** m + math.factorial(m) * 0.5 * inv ** (m + 1)
    for k, b in enumerate(_BERNOULLI, start=1):
        total = total + b * math.factorial(2 * k + m - 1) / math.factorial(2 * k) * inv ** (2 * k + m)
    return (-1.0) ** (m + 1) * total


def polygamma(order, x):
    """ψ⁽ᵒʳᵈᵉʳ⁾(x) on a float64 array, order a non-negative int (NOTE [lgamma and the polygammas])."""
    poles = (x <= 0) & (x == np.floor(x))
    if order == 0:
        reflect = x < 0.5
        z0 = np.where(reflect, 1.0 - x, x)
    elif order == 1:
        reflect = x < 0.5
        z0 = np.where(reflect, 1.0 - x, x)
    else:  # shifted up from wherever x is; beyond −1000 (too many steps) NaN
        reflect = np.zeros(x.shape, bool)
        z0 = np.where(x > -1000.0, x, np.nan)
    z, acc = _shift_up(z0, order)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = _polygamma_asymptotic(z, order) + acc
        if order == 0:
            r = x - np.round(x)
            value = np.where(reflect, value - math.pi / np.tan(math.pi * r), value)
        elif order == 1:
            value = np.where(reflect, math.pi ** 2 / _sin_pi(x) ** 2 - value, value)
    return np.where(poles, np.nan, value)


# NOTE [igamma by series and continued fraction]
# The regularized incomplete gamma functions P(a, x) = γ(a, x)/Γ(a) (igamma) and
# Q(a, x) = 1 − P(a, x) (igammac), for a > 0 and x ≥ 0, as in Numerical Recipes' gser/gcf:
# where x < a + 1, P = x^a e^{−x} / Γ(a + 1) · Σ_n xⁿ / ((a+1)⋯(a+n)) (every term positive);
# elsewhere Q = x^a e^{−x} / Γ(a) · K(a, x) with K Legendre's continued fraction, evaluated
# by the modified Lentz method; the other function is one minus it. The prefactor is
# exp(a log x − x − lgamma(a)), and both loops run over whole arrays until every element has
# converged (to 1e-16 relative; at most 2000 steps). NaN for a ≤ 0 or x < 0 (as JAX),
# P(a, 0) = 0, P(a, inf) = 1.
# ∂P/∂x = x^{a−1} e^{−x} / Γ(a). ∂P/∂a (JAX's igamma_grad_a) differentiates the series
# P = x^a e^{−x} Σ_n xⁿ / Γ(a + n + 1) term by term:
#   ∂P/∂a = log(x) P − x^a e^{−x} Σ_n ψ(a + n + 1) xⁿ / Γ(a + n + 1),
# summed until the terms are negligible (the series converges for every x; at large x it
# needs about x + 10√x terms and its absolute accuracy is about 1e-16 · log x).
_IGAMMA_EPS = 1e-16
_IGAMMA_MAX_STEPS = 2000


def _igamma_prefactor(a, x):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.exp(a * np.log(x) - x - lgamma(a))


def _igamma_series(a, x):
    """P(a, x) by its series (accurate where x < a + 1)."""
    term = 1.0 / a
    total = term.copy()
    ap = a.copy()
    for _ in range(_IGAMMA_MAX_STEPS):
        ap = ap + 1.0
        term = term * x / ap
        total = total + term
        if not np.any(np.abs(term) > np.abs(total) * _IGAMMA_EPS):
            break
    return total * _igamma_prefactor(a, x)


def _igammac_fraction(a, x):
    """Q(a, x) by Legendre's continued fraction, modified Lentz (accurate where x ≥ a + 1)."""
    tiny = 1e-300
    b = x + 1.0 - a
    c = np.full_like(x, 1.0 / tiny)
    d = 1.0 / b
    h = d.copy()
    for i in range(1, _IGAMMA_MAX_STEPS):
        an = -i * (i - a)
        b = b + 2.0
        d = an * d + b
        d = np.where(np.abs(d) < tiny, tiny, d)
        c = b + an / c
        c = np.where(np.abs(c) < tiny, tiny, c)
        d = 1.0 / d
        delta = d * c
        h = h * delta
        if not np.any(np.abs(delta - 1.0) > _IGAMMA_EPS):
            break
    return h * _igamma_prefactor(a, x)


def _igamma_pair(a, x):
    """(P, Q) with the one computed directly where it is accurate."""
    a, x = np.broadcast_arrays(a, x)
    p = np.full(a.shape, np.nan)
    q = np.full(a.shape, np.nan)
    valid = (a > 0) & (x >= 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        series = np.nonzero(valid & (x < a + 1.0))
        if series[0].size:
            p[series] = _igamma_series(a[series], x[series])
            q[series] = 1.0 - p[series]
        fraction = np.nonzero(valid & (x >= a + 1.0) & np.isfinite(x))
        if fraction[0].size:
            q[fraction] = _igammac_fraction(a[fraction], x[fraction])
            p[fraction] = 1.0 - q[fraction]
    infinite = valid & np.isposinf(x)
    p[infinite], q[infinite] = 1.0, 0.0
    return p, q


def igamma(a, x):
    """P(a, x) on float64 arrays (NOTE [igamma by series and continued fraction])."""
    return _igamma_pair(a, x)[0]


def igammac(a, x):
    """Q(a, x) on float64 arrays (NOTE [igamma by series and continued fraction])."""
    return _igamma_pair(a, x)[1]


def igamma_grad_a(a, x):
    """∂P(a, x)/∂a on float64 arrays (NOTE [igamma by series and continued fraction])."""
    a, x = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(x, np.float64))
    out = np.full(a.shape, np.nan)
    valid = np.nonzero((a > 0) & (x >= 0) & np.isfinite(x))
    if not valid[0].size:
        return out
    av, xv = a[valid], x[valid]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        log_x = np.log(xv)
        # term_n = exp(n log x − lgamma(a + n + 1)), built by ratios from term_0 = 1/Γ(a + 1)
        log_term = -lgamma(av + 1.0)
        plain = np.zeros_like(av)
        weighted = np.zeros_like(av)
        n = 0
        while True:
            term = np.exp(log_term)
            plain += term
            weighted += term * polygamma(0, av + n + 1.0)
            past_peak = n > xv - av
            if n >= 50 * _IGAMMA_MAX_STEPS or not np.any(~past_peak | (term > 1e-17 * plain)):
                break
            n += 1
            log_term = log_term + log_x - np.log(av + n)
        scale = np.exp(av * log_x - xv)
        value = log_x * scale * plain - scale * weighted
        out[valid] = np.where(xv == 0, 0.0, value)
    return out


# NOTE [i0e and i1e by series and asymptotics]
# The exponentially scaled modified Bessel functions i0e(x) = e^{−|x|} I₀(x) and
# i1e(x) = e^{−|x|} I₁(x). For |x| < 20, the power series I₀(x) = Σ_k (x²/4)^k / (k!)² and
# I₁(x) = (x/2) Σ_k (x²/4)^k / (k! (k+1)!) (positive terms, so no cancellation; 60 terms
# reach float64's precision at |x| = 20), then the factor e^{−|x|}. For |x| ≥ 20, Hankel's
# asymptotic expansion e^{−x} I_ν(x) ~ (2πx)^{−1/2} Σ_k (−1)^k Π_{j≤k} (μ − (2j−1)²) / (k! (8x)^k),
# μ = 4ν², whose smallest term there is below 1e-17. i0e is even and i1e odd.
_BESSEL_SWITCH = 20.0
_BESSEL_SERIES_TERMS = 60
_BESSEL_ASYMPTOTIC_TERMS = 30


def _bessel_series(a, order):
    q = a * a / 4
    term = np.ones_like(a) if order == 0 else a / 2
    total = term.copy()
    for k in range(1, _BESSEL_SERIES_TERMS):
        term = term * q / (k * (k + order))
        total += term
    return total * np.exp(-a)


def _bessel_asymptotic(a, order):
    mu = 4.0 * order * order
    term = np.ones_like(a)
    total = term.copy()
    for k in range(1, _BESSEL_ASYMPTOTIC_TERMS):
        term = -term * (mu - (2 * k - 1) ** 2) / (k * 8 * a)
        total += term
    return total / np.sqrt(2 * math.pi * a)


def _bessel_scaled(x, order):
    a = np.abs(x)
    out = _bessel_series(np.minimum(a, _BESSEL_SWITCH), order)
    far = np.nonzero(a >= _BESSEL_SWITCH)
    if far[0].size:
        out[far] = _bessel_asymptotic(a[far], order)
    if order == 1:
        out = np.copysign(out, x)
    return np.where(np.isnan(x), np.nan, out)


def bessel_i0e(x):
    """e^{−|x|} I₀(x) on a float64 array (NOTE [i0e and i1e by series and asymptotics])."""
    return _bessel_scaled(x, 0)


def bessel_i1e(x):
    """e^{−|x|} I₁(x) on a float64 array (NOTE [i0e and i1e by series and asymptotics])."""
    return _bessel_scaled(x, 1)
