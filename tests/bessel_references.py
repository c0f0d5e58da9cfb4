"""Independent references for the Bessel functions and the regularized incomplete beta
function, one value at a time in Python floats: integral representations by quadrature and
positive series (tests/special_more_rows.py and tests/scipy/test_bessel_betainc.py)."""
import math

import numpy as np

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(40)


def _quad(f, lo, hi, pieces=16):
    """∫_lo^hi f by 40-point Gauss–Legendre on each of ``pieces`` equal parts (f vectorised)."""
    edges = np.linspace(lo, hi, pieces + 1)
    total = []
    for a, b in zip(edges[:-1], edges[1:]):
        t = 0.5 * (b - a) * _NODES + 0.5 * (b + a)
        total.append(0.5 * (b - a) * float(np.dot(_WEIGHTS, f(t))))
    return math.fsum(total)


def jn_one(n, x):
    """J_n(x) = (1/2π) ∫₀^{2π} cos(nτ − x sin τ) dτ by the trapezoidal rule, exact to rounding
    for a periodic integrand with enough points (1024 ≫ |x| + |n|)."""
    t = np.arange(1024) * (2 * math.pi / 1024)
    return math.fsum(np.cos(n * t - x * np.sin(t))) / 1024


def yn_one(n, x):
    """Y_n(x) = (1/π) ∫₀^π sin(x sin τ − nτ) dτ − (1/π) ∫₀^∞ (e^{nt} + (−1)ⁿ e^{−nt}) e^{−x sinh t} dt."""
    first = _quad(lambda t: np.sin(x * np.sin(t) - n * t), 0.0, math.pi)
    top = math.asinh(800.0 / x) + 1  # e^{−x sinh t} below e^{−800} past it
    second = _quad(lambda t: (np.exp(n * t) + (-1) ** n * np.exp(-n * t)) * np.exp(-x * np.sinh(t)), 0.0, top)
    return (first - second) / math.pi


def iv_one(v, x):
    """I_v(x) = (1/π) ∫₀^π e^{x cos τ} cos(vτ) dτ − (sin vπ / π) ∫₀^∞ e^{−x cosh t − vt} dt (x > 0)."""
    first = _quad(lambda t: np.exp(x * np.cos(t)) * np.cos(v * t), 0.0, math.pi)
    top = math.acosh(800.0 / x + 1) + 1
    second = _quad(lambda t: np.exp(-x * np.cosh(t) - v * t), 0.0, top)
    return (first - math.sin(v * math.pi) * second) / math.pi


def iv_series_one(v, x):
    """I_v(x) = Σ_k (x/2)^{v+2k} / (k! Γ(v+k+1)) in Python floats (positive terms), for the
    high orders whose integral representation cancels."""
    term = math.exp(v * math.log(x / 2) - math.lgamma(v + 1))
    terms = [term]
    for k in range(1, 200):
        term *= (x / 2) ** 2 / (k * (v + k))
        terms.append(term)
    return math.fsum(terms)


def betainc_series_one(a, b, x):
    """I_x(a, b) = x^a/B(a, b) · Σ_n (1−b)_n xⁿ / (n! (a+n)) (the hypergeometric series,
    A&S 26.5.23 with 6.6.8), for x ≤ 1/2; above, 1 − I_{1−x}(b, a)."""
    if x > 0.5:
        return 1 - betainc_series_one(b, a, 1 - x)
    coefficient, terms = 1.0, []
    for n in range(200):
        terms.append(coefficient / (a + n))
        coefficient *= (n + 1 - b) * x / (n + 1)
    return math.exp(a * math.log(x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)) * math.fsum(terms)


def ive_one(v, x):
    """e^{−x} I_v(x) by its positive series (x > 0)."""
    term = math.exp(v * math.log(x / 2) - math.lgamma(v + 1) - x)
    terms = [term]
    for k in range(1, 120):
        term *= (x / 2) ** 2 / (k * (v + k))
        terms.append(term)
    return math.fsum(terms)
