"""Vectorised NumPy evaluations of the Bessel functions of integer order ``J_n``, ``Y_n``
(NOTE [J_n and Y_n by Miller's recurrence, Neumann's series and Hankel's expansion]), the
exponentially scaled modified Bessel function of real order ``e^{−|x|} I_v(x)`` (NOTE [ive by
its series summed from the largest term]) and the regularized incomplete beta function
(NOTE [betainc by its continued fraction]), for :mod:`cuvmap.lax.elementwise.special_more`.

As in :mod:`cuvmap.lax.elementwise.special_impls`, every function takes and returns float64
NumPy arrays (1-D or more; the impls broadcast first) and loops over terms or recurrence steps
of whole arrays, never over elements.
"""
import math

import numpy as np

from cuvmap.lax.elementwise.special_impls import lgamma

_EULER_GAMMA = 0.5772156649015329

# NOTE [J_n and Y_n by Miller's recurrence, Neumann's series and Hankel's expansion]
# For 10⁻³ ≤ x < 25, J_k(x) for every k ≤ N comes from Miller's backward recurrence
# J_{k−1} = (2k/x) J_k − J_{k+1}, started at J_{N+1} = 0, J_N = 10⁻³⁰ with
# N ≥ max(n, x) + 30 + √(40 max(n, x)) (rescaled whenever it passes 10²⁵⁰) and normalized by
# J_0 + 2 Σ_k J_{2k} = 1: backward, the recurrence is stable and the error of the start decays
# below float64's precision before it reaches the orders kept. The same pass sums Neumann's
# series (Abramowitz & Stegun 9.1.88–89)
#   Y_0 = (2/π)(log(x/2) + γ) J_0 − (4/π) Σ_{k≥1} (−1)^k J_{2k} / k,
#   Y_1 = −2 J_0/(πx) + (2/π)(log(x/2) + γ − 1) J_1 − (2/π) Σ_{k≥1} (−1)^k (2k+1) J_{2k+1} / (k(k+1)),
# and Y_n follows by the forward recurrence Y_{k+1} = (2k/x) Y_k − Y_{k−1} (stable forward).
# Below 10⁻³ the J_k are their power series (four terms: (x/2)⁸ ≈ 4·10⁻²⁵ relative) and the
# same formulas give Y_0, Y_1. For x ≥ 25, Hankel's expansion (A&S 9.2.5–10)
#   J_ν = √(2/(πx)) (P cos χ − Q sin χ), Y_ν = √(2/(πx)) (P sin χ + Q cos χ), χ = x − (ν/2 + ¼)π,
# P, Q the even and odd parts of Σ_k i^k a_k(ν)/x^k, a_k = Π_{j≤k} (4ν² − (2j−1)²) / (k! 8^k),
# summed to 50 terms (its terms decrease to about e^{−2x} < 10⁻²¹ there), gives J_0, J_1 and
# the J_n with n² ≤ x; the other J_n of x ≥ 25 take Miller's recurrence. Negative orders and
# arguments follow J_{−n} = (−1)ⁿ J_n, J_n(−x) = (−1)ⁿ J_n(x), Y_{−n} = (−1)ⁿ Y_n; Y_n(0) = −inf,
# Y_n(x < 0) and non-integer orders are NaN. Accuracy: about 1e-15 absolute (relative away
# from the zeros) against mpmath-grade references for 0 < x ≤ 10³, |n| ≤ 100.
_SMALL_X = 1e-3
_HANKEL_SWITCH = 25.0
_HANKEL_TERMS = 50
_RESCALE = 1e250
_FACTORIALS = np.array([float(math.factorial(k)) for k in range(171)])


def _series_j(m, x, terms=4):
    """J_m(x) for small x by its power series (m a non-negative integer array)."""
    half = x / 2
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        # (x/2)^m / m! with the factorials exact (past 170, (x/2)^m with x < 10⁻³ is 0 anyway)
        lead = np.power(half, m) / _FACTORIALS[np.minimum(m, 170).astype(np.int64)]
    term = np.ones_like(x)
    total = np.ones_like(x)
    for k in range(1, terms):
        term = -term * half * half / (k * (m + k))
        total = total + term
    return lead * total


def _hankel(nu, x):
    """(J_ν(x), Y_ν(x)) by Hankel's expansion, for large x."""
    mu = 4.0 * nu * nu
    p = np.ones_like(x)
    q = np.zeros_like(x)
    term = np.ones_like(x)
    for k in range(1, _HANKEL_TERMS):
        term = term * (mu - (2 * k - 1) ** 2) / (k * 8 * x)
        # i^k: k ≡ 1 → +i (Q), 2 → −1 (P), 3 → −i (Q), 0 → +1 (P)
        if k % 4 == 1:
            q = q + term
        elif k % 4 == 2:
            p = p - term
        elif k % 4 == 3:
            q = q - term
        else:
            p = p + term
    chi = x - (nu / 2 + 0.25) * math.pi
    scale = np.sqrt(2 / (math.pi * x))
    c, s = np.cos(chi), np.sin(chi)
    return scale * (p * c - q * s), scale * (p * s + q * c)


def _miller(n, x):
    """(J_n, J_0, J_1, Σ(−1)^k J_{2k}/k, Σ(−1)^k (2k+1) J_{2k+1}/(k(k+1))) for x ≥ 10⁻³, n ≥ 0."""
    top = float(max(np.max(n, initial=0), np.max(x, initial=0)))
    start = 2 * int((top + 30 + math.sqrt(40 * top)) / 2 + 1)
    below = np.zeros_like(x)          # J_{m+1}
    here = np.full_like(x, 1e-30)     # J_m
    norm = np.zeros_like(x)
    jn = np.zeros_like(x)
    j1 = np.zeros_like(x)
    even = np.zeros_like(x)
    odd = np.zeros_like(x)
    for m in range(start, 0, -1):
        jn = np.where(n == m, here, jn)
        if m == 1:
            j1 = here
        if m % 2 == 0:
            k = m // 2
            norm = norm + 2 * here
            even = even + (-1) ** k * here / k
        elif m >= 3:
            k = (m - 1) // 2
            odd = odd + (-1) ** k * m * here / (k * (k + 1))
        below, here = here, (2 * m / x) * here - below
        big = np.abs(here) > _RESCALE
        if big.any():
            f = np.where(big, 1 / _RESCALE, 1.0)
            below, here, norm, jn, j1, even, odd = (v * f for v in (below, here, norm, jn, j1, even, odd))
    j0 = here
    jn = np.where(n == 0, j0, jn)
    norm = norm + j0
    return jn / norm, j0 / norm, j1 / norm, even / norm, odd / norm


def _j_y_01_parts(n, x):
    """For 0 < x < 25: (J_n, J_0, J_1, even sum, odd sum), by series below 10⁻³, Miller above."""
    out = [np.empty_like(x) for _ in range(5)]
    small = x < _SMALL_X
    for mask, method in ((small, "series"), (~small, "miller")):
        idx = np.nonzero(mask)
        if not idx[0].size:
            continue
        nn, xx = n[idx], x[idx]
        if method == "miller":
            parts = _miller(nn, xx)
        else:
            j = [_series_j(np.full_like(xx, k), xx) for k in range(8)]
            even = -j[2] + j[4] / 2 - j[6] / 3
            odd = -3 * j[3] / 2 + 5 * j[5] / 6 - 7 * j[7] / 12
            parts = (_series_j(nn, xx), j[0], j[1], even, odd)
        for o, p in zip(out, parts):
            o[idx] = p
    return out


def _neumann(x, j0, j1, even, odd):
    with np.errstate(divide="ignore"):
        log_term = np.log(x / 2) + _EULER_GAMMA
        y0 = (2 / math.pi) * log_term * j0 - (4 / math.pi) * even
        y1 = -2 * j0 / (math.pi * x) + (2 / math.pi) * (log_term - 1) * j1 - (2 / math.pi) * odd
    return y0, y1


def _orders(n, x):
    """Broadcast (n, x); the integer order |n|, the sign (−1)^n of a negative order, NaN mask."""
    n, x = np.broadcast_arrays(np.asarray(n, np.float64), np.asarray(x, np.float64))
    shape = n.shape
    n, x = n.ravel(), x.ravel()
    bad = (n != np.round(n)) | np.isnan(n) | np.isnan(x)
    order = np.where(bad, 0.0, np.abs(n))
    flip = np.where((n < 0) & (np.remainder(order, 2) == 1), -1.0, 1.0)
    return shape, order, x, flip, bad


def bessel_jn(n, x):
    """J_n(x) for integer-valued n on float64 arrays (NOTE [J_n and Y_n by Miller's recurrence,
    Neumann's series and Hankel's expansion])."""
    shape, order, x, flip, bad = _orders(n, x)
    a = np.abs(x)
    odd_order = np.remainder(order, 2) == 1
    flip = flip * np.where((x < 0) & odd_order, -1.0, 1.0)
    out = np.where(order == 0, 1.0, 0.0)  # x = 0
    hankel = (a >= _HANKEL_SWITCH) & (order * order <= a)
    idx = np.nonzero(hankel)
    if idx[0].size:
        out[idx] = _hankel(order[idx], a[idx])[0]
    idx = np.nonzero(~hankel & (a > 0) & np.isfinite(a))
    if idx[0].size:
        nn, aa = order[idx], a[idx]
        res = np.empty_like(aa)
        small = aa < _SMALL_X
        s = np.nonzero(small)
        res[s] = _series_j(nn[s], aa[s])
        m = np.nonzero(~small)
        if m[0].size:
            res[m] = _miller(nn[m], aa[m])[0]
        out[idx] = res
    out = np.where(np.isinf(a), 0.0, out)
    return np.where(bad, np.nan, flip * out).reshape(shape)


def bessel_yn(n, x):
    """Y_n(x) for integer-valued n on float64 arrays (NOTE [J_n and Y_n by Miller's recurrence,
    Neumann's series and Hankel's expansion])."""
    shape, order, x, flip, bad = _orders(n, x)
    y0 = np.full_like(x, -np.inf)
    y1 = np.full_like(x, -np.inf)
    near = np.nonzero((x > 0) & (x < _HANKEL_SWITCH))
    if near[0].size:
        xx = x[near]
        _, j0, j1, even, odd = _j_y_01_parts(np.zeros_like(xx), xx)
        y0[near], y1[near] = _neumann(xx, j0, j1, even, odd)
    far = np.nonzero(x >= _HANKEL_SWITCH)
    if far[0].size:
        y0[far] = _hankel(np.zeros_like(x[far]), x[far])[1]
        y1[far] = _hankel(np.ones_like(x[far]), x[far])[1]
    out = np.where(order == 0, y0, y1)
    top = int(np.max(order, initial=0))
    prev, cur = y0, y1
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for k in range(1, top):
            prev, cur = cur, (2 * k / x) * cur - prev
            out = np.where(order == k + 1, cur, out)
    out = np.where(np.isinf(x) & (x > 0), 0.0, out)
    out = np.where((x == 0) | (np.isnan(out) & (x > 0)), -np.inf, out)  # the pole; overflow past −inf
    return np.where(bad | (x < 0), np.nan, flip * out).reshape(shape)


# NOTE [ive by its series summed from the largest term]
# e^{−|x|} I_v(x) for real v ≥ 0 (and integer v < 0, I_{−n} = I_n): the series
# I_v(z) = Σ_k t_k, t_k = (z/2)^{v+2k} / (k! Γ(v+k+1)), has positive terms (no cancellation);
# their ratio t_{k+1}/t_k = (z²/4)/((k+1)(v+k+1)) passes 1 at k* ≈ (√(v²+z²) − v)/2 − 1. The
# sum is taken relative to t_{k*} (downwards to k = 0 and upwards until a term is below 1e-17
# of the sum, by the ratios) and scaled by exp(log t_{k*} − z), log t_{k*} from lgamma: no
# overflow for any z, relative error about 1e-15 · max(1, log t_{k*}) (lgamma's error
# scaled by the exponent: about 1e-13 at z = 100, 5e-12 at z = 3000). For z ≥ 30 with
# 4v² ≤ z, Hankel's expansion e^{−z} I_v(z) ~ (2πz)^{−1/2} Σ_k (−1)^k a_k(v)/z^k (60 terms;
# its smallest term, near k = 2z, is below 1e-20), relative error about 1e-15. I_v(−x) = (−1)^v I_v(x) for
# integer v, NaN for other v (complex), as NaN for non-integer v < 0 (which needs K_v).
_IVE_ASYMPTOTIC_SWITCH = 30.0


def _ive_series(v, z):
    root = (np.sqrt(v * v + z * z) - v) / 2 - 1
    kstar = np.maximum(0.0, np.floor(root + 1))
    q = z * z / 4
    with np.errstate(divide="ignore"):
        log_peak = (v + 2 * kstar) * np.log(z / 2) - lgamma(kstar + 1) - lgamma(v + kstar + 1)
    total = np.ones_like(z)
    term = np.ones_like(z)
    for j in range(int(np.max(kstar, initial=0))):  # downwards: t_{k−1} = t_k · k(v+k)/q
        k = kstar - j
        live = k >= 1
        term = np.where(live, term * k * (v + k) / np.where(live, q, 1.0), 0.0)
        total = total + term
    term = np.ones_like(z)
    k = kstar
    for _ in range(100000):
        term = term * q / ((k + 1) * (v + k + 1))
        total = total + term
        k = k + 1
        if not np.any(term > 1e-17 * total):
            break
    return total * np.exp(log_peak - z)


def _ive_hankel(v, z):
    mu = 4.0 * v * v
    term = np.ones_like(z)
    total = np.ones_like(z)
    for k in range(1, 60):
        term = -term * (mu - (2 * k - 1) ** 2) / (k * 8 * z)
        total = total + term
    return total / np.sqrt(2 * math.pi * z)


def bessel_ive(v, x):
    """e^{−|x|} I_v(x) on float64 arrays (NOTE [ive by its series summed from the largest term])."""
    v, x = np.broadcast_arrays(np.asarray(v, np.float64), np.asarray(x, np.float64))
    shape = v.shape
    v, x = v.ravel(), x.ravel()
    integer = v == np.round(v)
    bad = np.isnan(v) | np.isnan(x) | ((v < 0) & ~integer) | ((x < 0) & ~integer)
    order = np.where(bad, 0.0, np.abs(v))
    z = np.abs(x)
    out = np.where(order == 0, 1.0, 0.0)  # z = 0
    far = (z >= _IVE_ASYMPTOTIC_SWITCH) & (4 * order * order <= z)
    idx = np.nonzero(far & np.isfinite(z))
    if idx[0].size:
        out[idx] = _ive_hankel(order[idx], z[idx])
    idx = np.nonzero(~far & (z > 0) & np.isfinite(z))
    if idx[0].size:
        out[idx] = _ive_series(order[idx], z[idx])
    out = np.where(np.isinf(z), 0.0, out)
    sign = np.where((x < 0) & (np.remainder(order, 2) == 1), -1.0, 1.0)
    return np.where(bad, np.nan, sign * out).reshape(shape)


# NOTE [betainc by its continued fraction]
# I_x(a, b) = x^a (1−x)^b / (a B(a, b)) · 1/(1 + d₁/(1 + d₂/(1 + ⋯))), with
# d_{2m+1} = −(a+m)(a+b+m) x / ((a+2m)(a+2m+1)), d_{2m} = m(b−m) x / ((a+2m−1)(a+2m)),
# evaluated by the modified Lentz algorithm (Numerical Recipes §6.4), which converges fast for
# x < (a+1)/(a+b+2); above, I_x(a, b) = 1 − I_{1−x}(b, a). The prefactor is
# exp(a log x + b log1p(−x) − lgamma(a) − lgamma(b) + lgamma(a+b)). Relative error about
# 1e-14 for a, b ≤ 10³ (the fraction needs O(√max(a, b)) steps; at most 2000 are run).
# I_0 = 0, I_1 = 1; NaN for a ≤ 0, b ≤ 0 or x outside [0, 1].
_BETAINC_STEPS = 2000
_TINY = 1e-300


def _betainc_fraction(a, b, x):
    qab, qap, qam = a + b, a + 1, a - 1
    c = np.ones_like(x)
    d = 1 - qab * x / qap
    d = np.where(np.abs(d) < _TINY, _TINY, d)
    d = 1 / d
    h = d.copy()
    done = np.zeros(x.shape, bool)
    for m in range(1, _BETAINC_STEPS):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 + aa * d
        d = np.where(np.abs(d) < _TINY, _TINY, d)
        c = 1 + aa / c
        c = np.where(np.abs(c) < _TINY, _TINY, c)
        d = 1 / d
        h = h * d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 + aa * d
        d = np.where(np.abs(d) < _TINY, _TINY, d)
        c = 1 + aa / c
        c = np.where(np.abs(c) < _TINY, _TINY, c)
        d = 1 / d
        delta = d * c
        h = np.where(done, h, h * delta)  # a converged element stops (no rounding accumulates)
        done = done | (np.abs(delta - 1) < 4e-16)
        if done.all():
            break
    return h


def betainc(a, b, x):
    """I_x(a, b) on float64 arrays (NOTE [betainc by its continued fraction])."""
    a, b, x = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (a, b, x)))
    shape = x.shape
    a, b, x = a.ravel(), b.ravel(), x.ravel()
    bad = ~((a > 0) & (b > 0) & (x >= 0) & (x <= 1))
    inner = ~bad & (x > 0) & (x < 1)
    out = np.where(x >= 1, 1.0, 0.0)
    idx = np.nonzero(inner)
    if idx[0].size:
        aa, bb, xx = a[idx], b[idx], x[idx]
        swap = xx >= (aa + 1) / (aa + bb + 2)
        p, q = np.where(swap, bb, aa), np.where(swap, aa, bb)
        y = np.where(swap, 1 - xx, xx)
        log1m = np.where(swap, np.log(xx), np.log1p(-xx))
        prefactor = np.exp(p * np.log(y) + q * log1m - lgamma(p) - lgamma(q) + lgamma(p + q))
        value = prefactor * _betainc_fraction(p, q, y) / p
        out[idx] = np.where(swap, 1 - value, value)
    return np.where(bad, np.nan, out).reshape(shape)
