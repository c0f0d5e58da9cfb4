r"""A tight (ε, δ) accountant for the Poisson-subsampled Gaussian mechanism: privacy loss
distributions (PLD), composed by FFT convolution, in NumPy alone (imports nothing from
cuvmap).

**The mechanism.** One DP-SGD step releases ``f(S) + N(0, σ²)`` where ``f`` has L2
sensitivity 1 (the clipped sum over ``C``) and ``S`` is a Poisson sample of rate ``q``.
Under add/remove-one adjacency a single step is dominated (it reduces to one dimension,
Mironov, Talwar, Zhang 2019; Zhu, Dong, Wang 2022) by two pairs of distributions on ℝ,
with ``μ₀ = N(0, σ²)``, ``μ₁ = N(1, σ²)`` and the mixture ``μ_q = (1 − q)·μ₀ + q·μ₁``::

    remove one example:  P = μ_q, Q = μ₀,   L(x) =  log(1 − q + q·e^{(2x−1)/(2σ²)})
    add one example:     P = μ₀, Q = μ_q,   L(x) = −log(1 − q + q·e^{(2x−1)/(2σ²)})

``L = log(dP/dQ)`` is the *privacy loss*; its law under ``x ∼ P`` is the pair's PLD. The
mechanism is ``(ε, δ)``-DP for a pair iff ``δ ≥ H_ε(P‖Q)``, the hockey-stick divergence::

    H_ε(P‖Q) = E_{x∼P}[(1 − e^{ε − L(x)})₊] = P(L > ε) − e^ε·Q(L > ε),

in closed form with ``Φ̄`` the standard normal tail (``t(ε)`` the point where ``L = ε``)::

    remove, ε > log(1−q):  t = σ² log((e^ε − 1 + q)/q) + ½,
                           H = q·Φ̄((t−1)/σ) − (e^ε − 1 + q)·Φ̄(t/σ)      (1 − e^ε below)
    add,   ε < −log(1−q):  t = σ² log((e^{−ε} − 1 + q)/q) + ½,
                           H = (1 − (1−q)e^ε)·Φ(t/σ) − q·e^ε·Φ((t−1)/σ)   (0 above)

and ``q = 1`` is the Gaussian mechanism of Balle and Wang (2018),
``H = Φ(1/(2σ) − εσ) − e^ε·Φ(−1/(2σ) − εσ)`` for both pairs.

**Composition.** ``T`` steps (the same neighbouring pair throughout) have the PLD of the
sum of ``T`` independent losses: the ``T``-fold convolution, per pair (Meiser, Mohammadi
2018; Koskela, Jälkö, Honkela 2020). The accountant composes each pair's PLD separately
and reports ``ε(δ) = max`` over the two pairs (the relation is add *or* remove).

**Pessimistic discretisation** (connect the dots, Doroshenko, Ghazi, Kamath, Kumar,
Manurangsi 2022): on the grid ``ε_i = i·h`` every bin ``(ε_j, ε_{j+1}]`` of the loss is
split between its two end points so that the bin's ``P``- *and* ``Q``-masses are both kept
(a point of loss ``L`` gives ``P``-weight ``(e^{−ε_j} − e^{−L}) / (e^{−ε_j} − e^{−ε_{j+1}})``
to ``ε_{j+1}``, the rest to ``ε_j``). Merging the two points of each split recovers the
true pair, so the true pair is a post-processing of the discrete one: the discrete PLD's
``H_ε`` is an upper bound at every ε, and stays one under composition. Truncation moves
mass only up: the ``P``-mass of ``x`` outside ``[−10σ, 1 + 10σ]`` (at most ``Φ̄(10) ≈
7.6e-24`` on either side per step) goes to the lowest grid point or to ``L = +∞``; the
FFT's tails beyond the Chernoff bounds (at most ``TAIL_MASS`` in all) are counted at
``+∞``. What is *not* a bound is float rounding: the FFT's round-off, about 1e-16 per bin
relative to the largest, is clipped at zero. With the default ``h = 1e-4`` the ε of the
tests' recipes equal those of ``dp_accounting``'s PLD accountant (the same construction) to
1e-8, and the exact ε of the Gaussian mechanism (``q = 1``) to 1e-6; a coarser grid is a
looser bound (MNIST's anchor: 2.3818 at 1e-4, 2.3906 at 1e-3).

References:

* I. Mironov, K. Talwar, L. Zhang. *Rényi Differential Privacy of the Sampled Gaussian
  Mechanism.* arXiv:1908.10530, 2019.
* B. Balle, Y.-X. Wang. *Improving the Gaussian Mechanism for Differential Privacy:
  Analytical Calibration and Optimal Denoising.* ICML 2018, arXiv:1805.06530 (Theorem 8).
* S. Meiser, E. Mohammadi. *Tight on Budget? Tight Bounds for r-Fold Approximate
  Differential Privacy.* CCS 2018.
* A. Koskela, J. Jälkö, A. Honkela. *Computing Tight Differential Privacy Guarantees Using
  FFT.* AISTATS 2020, arXiv:1906.03049.
* V. Doroshenko, B. Ghazi, P. Kamath, R. Kumar, P. Manurangsi. *Connect the Dots: Tighter
  Discrete Approximations of Privacy Loss Distributions.* PETS 2022, arXiv:2207.04380.
* Y. Zhu, J. Dong, Y.-X. Wang. *Optimal Accounting of Differential Privacy via
  Characteristic Function.* AISTATS 2022, arXiv:2106.08567.
"""
import functools
import math
import numbers
import warnings

import numpy as np

#: The default width of the loss grid (``dp_accounting``'s default too).
DEFAULT_DISCRETIZATION = 1e-4
#: The mass that composition adds at ``+∞`` when it truncates the FFT's tails (half for
#: each side cut).
TAIL_MASS = 1e-15
_Z_TAIL = 10.0  # the noise is followed to ±10σ; beyond, Φ̄(10) ≈ 7.6e-24 per step
_MAX_BINS = 1 << 24  # refuse grids past this (128 MiB of float64)
_MAX_LOSS = 700.0  # and one step's losses past this many nats (e^709 overflows float64)


class PLDRangeError(ValueError):
    """A step whose privacy loss the grid cannot hold: more than ``_MAX_BINS`` points at
    its discretization, or a loss beyond ``_MAX_LOSS`` nats (whose ``e^loss`` overflows)."""


# ---------------------------------------------------------------------------------------
# The normal tail, vectorised
# ---------------------------------------------------------------------------------------

# NOTE [the normal tail in NumPy]
# NumPy has no erfc, and a Python loop over math.erfc pays the interpreter for every point
# of grids of 10^4 to 10^6 points, evaluated once per accountant and noise multiplier
# (calibrate_noise evaluates a dozen; `python -m benchmarks accounting` times it). So
# Φ̄(z) = ½·erfcx(z/√2)·e^{−z²/2} (z ≥ 0), with erfcx(x) = e^{x²}·erfc(x) smooth and bounded,
# is computed as a Chebyshev series: with t = 2/(2 + x) ∈ (0, 1], erfcx(x)/t is analytic in
# t on [0, 1] (it tends to 1/(2√π) as x → ∞), and its interpolant of degree 40 on the
# Chebyshev points is fitted once, at import, from math.erfc (x < 4, where e^{x²} is exact
# enough) and from erfc's continued fraction (x ≥ 4). e^{−z²/2} is taken as
# e^{−z_h²/2}·e^{−(z−z_h)(z+z_h)/2} with z_h = z rounded to 1/1024, whose square is exact,
# so the large exponent carries no rounding. The tests compare it with math.erfc: within
# 2e-13 relatively for 0 ≤ z ≤ 37 (where Φ̄ underflows).

_ERFCX_DEGREE = 40


def _erfcx_point(x):
    """erfcx(x) for one x ≥ 0: math.erfc scaled by an exact e^{x²} below 4, the continued
    fraction 1/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))) from 4 on."""
    if x < 4.0:
        xh = round(x * 1024.0) / 1024.0
        return math.erfc(x) * math.exp(xh * xh) * math.exp((x - xh) * (x + xh))
    acc = x
    for k in range(64, 0, -1):
        acc = x + (0.5 * k) / acc
    return 1.0 / (acc * math.sqrt(math.pi))


def _erfcx_series():
    def f(s):
        t = (np.atleast_1d(s) + 1.0) / 2.0
        return np.array([_erfcx_point(2.0 / ti - 2.0) / ti for ti in t.tolist()])

    return np.polynomial.chebyshev.chebinterpolate(f, _ERFCX_DEGREE)


_ERFCX_COEFFS = _erfcx_series()


def _normal_sf(z):
    """``Φ̄(z) = ½ erfc(z/√2)`` for an array ``z ≥ 0`` (``inf`` allowed; NOTE [the normal
    tail in NumPy])."""
    z = np.asarray(z, dtype=np.float64)
    zc = np.minimum(z, 40.0)                   # Φ̄(40) underflows: the same 0 below
    t = 2.0 / (2.0 + zc * (1.0 / math.sqrt(2.0)))
    zh = np.round(zc * 1024.0) / 1024.0
    with np.errstate(under="ignore"):
        out = (0.5 * t * np.polynomial.chebyshev.chebval(2.0 * t - 1.0, _ERFCX_COEFFS)
               * np.exp(-0.5 * zh * zh) * np.exp(-0.5 * (zc - zh) * (zc + zh)))
    return np.where(z >= 40.0, 0.0, out)


def _normal_masses(z):
    """The standard normal masses of the intervals between consecutive points of the
    non-decreasing array ``z`` (``±inf`` allowed): ``Φ(z[j+1]) − Φ(z[j])``, each from the tail
    that keeps it accurate (one ``erfc`` per point: ``s = Φ̄(|z|)``; a bin right of 0 is
    ``s_j − s_{j+1}``, left of 0 ``s_{j+1} − s_j``, across 0 ``1 − s_j − s_{j+1}``)."""
    s = _normal_sf(np.abs(z))
    lo, hi = z[:-1], z[1:]
    m = np.where(lo >= 0, s[:-1] - s[1:], np.where(hi <= 0, s[1:] - s[:-1], 1.0 - s[:-1] - s[1:]))
    return np.maximum(m, 0.0)


# ---------------------------------------------------------------------------------------
# A PLD on a grid: δ(ε) and ε(δ)
# ---------------------------------------------------------------------------------------

class DiscretePLD:
    """A PLD on the grid ``h·(offset + i)``: ``probs[i]`` is the ``P``-probability of the loss
    ``h·(offset + i)``, ``infinity_mass`` that of ``L = +∞``. Only ``P``-masses are kept: the
    ``Q``-mass a pair needs beyond ``Σ probs·e^{−loss}`` sits at ``L = −∞``, where it never
    counts in ``H_ε``."""

    __slots__ = ("h", "offset", "probs", "infinity_mass")

    def __init__(self, h, offset, probs, infinity_mass):
        self.h, self.offset, self.probs, self.infinity_mass = float(h), int(offset), probs, float(infinity_mass)

    @property
    def losses(self):
        """The grid's loss values, ``h·(offset + i)``."""
        return self.h * (self.offset + np.arange(len(self.probs), dtype=np.float64))

    def get_delta(self, epsilon):
        """``H_ε = infinity_mass + Σ_{loss > ε} probs·(1 − e^{ε − loss})`` for a float or an
        array of ε."""
        eps = np.asarray(epsilon, dtype=np.float64)
        losses, p = self.losses, self.probs
        upper, lower = _tail_sums(losses, p)
        # masses strictly above ε: the first grid index with loss > ε
        k = np.searchsorted(losses, eps, side="right")
        with np.errstate(over="ignore", invalid="ignore"):
            d = self.infinity_mass + upper[k] - np.exp(eps - losses[np.minimum(k, len(p) - 1)]) * lower[k]
        d = np.where(k >= len(p), self.infinity_mass, np.maximum(d, 0.0))
        return float(d) if d.ndim == 0 else d

    def get_epsilon(self, delta):
        """The smallest ``ε ≥ 0`` with ``H_ε ≤ δ`` (``inf`` if ``infinity_mass > δ``)."""
        if self.infinity_mass > delta:
            return math.inf
        losses, p = self.losses, self.probs
        upper, lower = _tail_sums(losses, p)  # over indices ≥ k, lower scaled by e^{−losses[k]}
        n = len(p)
        # H at the grid point losses[k] counts the masses of indices > k
        with np.errstate(over="ignore", invalid="ignore"):
            at_grid = self.infinity_mass + upper[1:] - np.exp(-self.h) * lower[1:]
        k = int(np.argmax(at_grid <= delta)) if np.any(at_grid <= delta) else n - 1
        # on (losses[k−1], losses[k]] H(ε) = inf + upper[k] − e^{ε − losses[k]}·lower[k]
        excess = self.infinity_mass + upper[k] - delta
        if excess <= 0 or lower[k] <= 0:  # (only at k = 0: H ≤ δ below the grid too)
            return max(0.0, float(losses[k]) if k > 0 else 0.0)
        return max(0.0, float(losses[k] + math.log(excess / lower[k])))


def _tail_sums(losses, p):
    """``upper[k] = Σ_{i≥k} p_i`` and ``lower[k] = Σ_{i≥k} p_i·e^{losses[k] − losses[i]}``
    (each with a trailing 0 at ``k = n``): reverse cumulative sums over blocks of at most
    500 nats of loss, so that no exponential overflows or underflows to nothing."""
    n = len(p)
    upper = np.zeros(n + 1)
    upper[:n] = np.cumsum(p[::-1])[::-1]
    lower = np.zeros(n + 1)
    if n == 0:
        return upper, lower
    h = losses[1] - losses[0] if n > 1 else 1.0
    block = max(1, int(500.0 / h))
    carry, carry_loss = 0.0, losses[-1]
    for start in range(((n - 1) // block) * block, -1, -block):
        stop = min(start + block, n)
        rel = losses[start:stop] - losses[start]         # in [0, 500]
        cum = np.cumsum((p[start:stop] * np.exp(-rel))[::-1])[::-1]
        lower[start:stop] = cum * np.exp(rel) + carry * np.exp(losses[start:stop] - carry_loss)
        carry, carry_loss = lower[start], losses[start]
    return upper, lower


# ---------------------------------------------------------------------------------------
# One step: the discretised PLD of each pair
# ---------------------------------------------------------------------------------------

def _loss_remove(x, sigma, q):
    """``log(1 − q + q·e^{(2x−1)/(2σ²)})`` (the remove pair's loss at ``x``)."""
    log_tail = math.log(q) + (2.0 * x - 1.0) / (2.0 * sigma * sigma)
    return float(np.logaddexp(math.log1p(-q), log_tail)) if q < 1 else log_tail


def _crossing(eps, sigma, q):
    """``t`` with ``1 − q + q·e^{(2t−1)/(2σ²)} = e^ε`` for an array of ε (``−inf`` where
    ``e^ε ≤ 1 − q``): ``t = σ²·log((e^ε − 1 + q)/q) + ½``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        arg = np.expm1(eps) + q
        t = sigma * sigma * (np.log(np.where(arg > 0, arg, 1.0)) - math.log(q)) + 0.5
    return np.where(arg > 0, t, -np.inf)


def step_pld(noise_multiplier, sample_rate, pair, h=DEFAULT_DISCRETIZATION):
    """The pessimistic (connect-the-dots) discrete PLD of one Poisson-subsampled Gaussian
    step for ``pair`` ``"remove"`` or ``"add"`` (module docstring).

    On the grid ``ε_i = i·h`` covering the losses of ``x ∈ [−10σ, 1 + 10σ]``, each bin's
    ``P``-mass ``a`` and ``Q``-mass ``b`` go to its end points ``ε_j`` and ``ε_{j+1}`` as
    ``(e^{ε_{j+1}}·b − a)/(e^h − 1)`` and ``(e^h·a − e^{ε_{j+1}}·b)/(e^h − 1)``: both
    non-negative, they keep ``a`` and ``b``. ``P``-mass below the grid is moved up to its
    first point, above it to ``+∞``.
    """
    sigma, q = float(noise_multiplier), float(sample_rate)
    if not (sigma > 0 and 0 < q <= 1):
        raise ValueError(f"step_pld: need noise_multiplier > 0 and 0 < sample_rate <= 1, got {sigma} and {q}")
    if pair not in ("remove", "add"):
        raise ValueError(f"step_pld: pair must be 'remove' or 'add', got {pair!r}")
    sign = 1.0 if pair == "remove" else -1.0
    ends = (sign * _loss_remove(-_Z_TAIL * sigma, sigma, q), sign * _loss_remove(1.0 + _Z_TAIL * sigma, sigma, q))
    lo, hi = math.floor(min(ends) / h), math.ceil(max(ends) / h)
    hi = max(hi, lo + 1)
    if hi - lo + 1 > _MAX_BINS:
        raise PLDRangeError(f"step_pld: noise_multiplier={sigma}, sample_rate={q} needs {hi - lo + 1} grid points "
                            f"at discretization {h}; use a coarser grid")
    if max(abs(e) for e in ends) > _MAX_LOSS:  # (e^loss would overflow: noise this small loses nearly everything)
        raise PLDRangeError(f"step_pld: noise_multiplier={sigma}, sample_rate={q} gives privacy losses up to "
                            f"{max(abs(e) for e in ends):.4g} nats, beyond the {_MAX_LOSS:g} the grid's exponentials "
                            "hold; use the RDP accountant")
    eps = h * np.arange(lo, hi + 1, dtype=np.float64)
    # x where the loss crosses each grid point; the loss grows with x for "remove", falls for "add"
    t = _crossing(sign * eps, sigma, q)
    # the points in x order, with ±inf at the ends: bins 1..n−1 are the grid's, bin 0 is below
    # the grid and bin n above it ("remove"), or the other way round ("add")
    x = np.concatenate(([-np.inf], t if pair == "remove" else t[::-1], [np.inf]))
    m0 = _normal_masses(x / sigma)              # N(0, σ²)
    m1 = _normal_masses((x - 1.0) / sigma)      # N(1, σ²)
    if pair == "add":
        m0, m1 = m0[::-1], m1[::-1]             # back to the order of the loss
    mix = (1 - q) * m0 + q * m1
    a, b = (mix, m0) if pair == "remove" else (m0, mix)
    # bins in loss order: 0 below ε_0, 1..n−1 the grid's (ε_{j−1}, ε_j], n above ε_{n−1}
    a_in, b_in = a[1:-1], b[1:-1]
    eh1 = math.expm1(h)
    gap = np.exp(eps[1:]) * b_in - a_in        # ∫ (e^{ε_{j+1}} − e^L) dQ over the bin, ≥ 0
    down = np.maximum(gap, 0.0) / eh1
    up = np.maximum(eh1 * a_in - gap, 0.0) / eh1
    probs = np.zeros(len(eps))
    probs[:-1] += down
    probs[1:] += up
    probs[0] += a[0]
    return DiscretePLD(h, lo, probs, a[-1])


# ---------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------

# NOTE [PLD composition by FFT]
# The PLD of T steps is the T-fold convolution of the step's grid masses: in Fourier space,
# the T-th power of the DFT. A DFT of length N computes the convolution modulo N, so the
# length must cover the support of the result that matters: the composed finite masses lie
# on indices [T·lo, T·hi], far too wide (T·n), but by Chernoff's bound the mass of index
# ≥ b is at most e^{T·log M(s) − s·b·h} for every s > 0, with M(s) = Σ p_i e^{s·loss_i} the
# step's moment generating function (and likewise below a with s < 0). We take the
# smallest b (largest a) that leaves at most TAIL_MASS/2 on each side over the eleven
# orders s*·2^{−8}, …, s*·4 (geometric), s* = ±sqrt(2·log(2/TAIL_MASS) / (T·var)) being
# the optimum if the composed loss were Gaussian: any order gives a valid bound, and the
# heavy upper tail of a subsampled step needs orders well below s*. Then a DFT length
# N ≥ b − a + 1, and indices a..b are read off the circular result.
# The mass outside [a, b] wraps around: into the window, or into the slack N − (b − a + 1)
# that is dropped. From above (≤ TAIL_MASS/2) it may land at lower losses or vanish; from
# below (≤ TAIL_MASS/2) at higher losses (pessimistic) or vanish. So TAIL_MASS/2 is added
# at +∞ for each side that was cut, which bounds both. The mass at +∞ composes as
# 1 − (1 − m)^T. FFT round-off (about 1e-16 relative to the largest mass per bin, T-fold
# at the low frequencies) can leave tiny negative values, which are clipped at 0.

_ORDER_FACTORS = np.geomspace(1.0 / 256, 4.0, 11)


def _fast_length(n):
    """The smallest 2^a·3^b·5^c ≥ n (a length NumPy's FFT handles fast)."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _chernoff_window(pld, num_steps, tail):
    """Index bounds ``(a, b)`` of the ``num_steps``-fold composition outside which at most
    ``tail / 2`` of mass lies on each side (NOTE [PLD composition by FFT])."""
    n, h = len(pld.probs), pld.h
    lo, hi = num_steps * pld.offset, num_steps * (pld.offset + n - 1)
    nz = pld.probs > 0
    if not nz.any():
        return lo, lo
    p, losses = pld.probs[nz], pld.losses[nz]
    # orders near the optimum for a Gaussian of the composed mean and variance,
    # s* = sqrt(2·log(2/tail) / (T·var)); every order gives a valid bound
    mass = p.sum()
    mean = float(np.dot(p, losses)) / mass
    var = float(np.dot(p, (losses - mean) ** 2)) / mass
    if not var > 0:
        return lo, hi
    s_star = math.sqrt(2.0 * math.log(2.0 / tail) / (num_steps * var))
    orders = np.concatenate((-s_star * _ORDER_FACTORS, s_star * _ORDER_FACTORS))
    x = orders[:, None] * losses[None, :] + np.log(p)[None, :]
    top = x.max(axis=1)
    log_mgf = top + np.log(np.exp(x - top[:, None]).sum(axis=1))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        bound = (num_steps * log_mgf + math.log(2.0 / tail)) / orders / h
    up = bound[(orders > 0) & np.isfinite(bound)]
    down = bound[(orders < 0) & np.isfinite(bound)]
    b = min(hi, math.ceil(up.min())) if up.size else hi
    a = max(lo, math.floor(down.max())) if down.size else lo
    return a, max(a, b)


def self_compose(pld, num_steps, tail=TAIL_MASS):
    """The PLD of ``num_steps`` independent copies of ``pld`` (NOTE [PLD composition by FFT])."""
    num_steps = int(num_steps)
    if num_steps < 0:
        raise ValueError(f"self_compose: num_steps must be >= 0, got {num_steps}")
    if num_steps == 0:
        return DiscretePLD(pld.h, 0, np.ones(1), 0.0)
    if num_steps == 1:
        return pld
    a, b = _chernoff_window(pld, num_steps, tail)
    width = b - a + 1
    if width > _MAX_BINS:
        raise PLDRangeError(f"self_compose: {num_steps} steps need {width} grid points at discretization {pld.h}; "
                         "use a coarser grid")
    size = _fast_length(max(width, len(pld.probs)))
    spectrum = np.fft.rfft(pld.probs, size) ** num_steps
    circ = np.fft.irfft(spectrum, size)
    start = (a - num_steps * pld.offset) % size
    probs = np.roll(circ, -start)[:width]
    np.maximum(probs, 0.0, out=probs)
    inf = -math.expm1(num_steps * math.log1p(-pld.infinity_mass)) if pld.infinity_mass < 1 else 1.0
    cut = (a > num_steps * pld.offset) + (b < num_steps * (pld.offset + len(pld.probs) - 1))
    truncated = cut * tail / 2
    return DiscretePLD(pld.h, a, probs, min(1.0, inf + truncated))


def compose(first, second, tail=TAIL_MASS):
    """The PLD of two independent mechanisms (same grid): their convolution, the lowest
    masses (at most ``tail / 2``) moved up to the first kept point and the highest (at most
    ``tail / 2``) to ``+∞``."""
    if first.h != second.h:
        raise ValueError(f"compose: the grids differ ({first.h} and {second.h})")
    n = len(first.probs) + len(second.probs) - 1
    size = _fast_length(n)
    probs = np.fft.irfft(np.fft.rfft(first.probs, size) * np.fft.rfft(second.probs, size), size)[:n]
    np.maximum(probs, 0.0, out=probs)
    offset = first.offset + second.offset
    cum = np.cumsum(probs)
    i = int(np.searchsorted(cum, tail / 2, side="right"))  # probs[:i] sum to ≤ tail/2
    rcum = np.cumsum(probs[::-1])
    j = int(np.searchsorted(rcum, tail / 2, side="right"))  # probs[n−j:] sum to ≤ tail/2
    i, j = min(i, n - 1), min(j, n - 1 - i)
    kept = probs[i:n - j].copy()
    kept[0] += cum[i - 1] if i else 0.0
    dropped_top = rcum[j - 1] if j else 0.0
    inf = 1.0 - (1.0 - first.infinity_mass) * (1.0 - second.infinity_mass)
    return DiscretePLD(first.h, offset + i, kept, min(1.0, inf + dropped_top))


# ---------------------------------------------------------------------------------------
# Accountant
# ---------------------------------------------------------------------------------------

PAIRS = ("remove", "add")


@functools.lru_cache(maxsize=64)
def _cached_step(sigma, q, pair, h):
    return step_pld(sigma, q, pair, h)


def _composed(groups, pair, h):
    """The PLD of the steps ``groups`` (``(σ, q) → count``) for one pair."""
    result = None
    for (sigma, q), count in groups.items():
        part = self_compose(_cached_step(sigma, q, pair, h), count)
        result = part if result is None else compose(result, part)
    return result


# NOTE [fractional steps are never under-counted]
# A run's step count is often computed as epochs / q, a float (2.5, 100.5). Truncating it
# (int()) reports the ε of fewer steps than ran. The RDP accountant composes any real
# number of steps exactly (T·ε(α) is linear in T), so it keeps num_steps as given; the PLD
# accountant composes whole steps (a T-fold convolution), so it rounds num_steps up, with a
# warning that says so (pass math.ceil(steps) to silence it); calibrate_noise does the same
# per accountant. A count that is not a finite number >= 0 is refused, naming num_steps.
def check_num_steps(num_steps, owner):
    """``num_steps`` as a float: a finite real number ≥ 0 (a ValueError naming ``owner``
    and ``num_steps`` otherwise)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Real):
        raise ValueError(f"{owner}: num_steps must be a number of steps >= 0, got {num_steps!r}")
    value = float(num_steps)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{owner}: num_steps must be a finite number of steps >= 0, got {num_steps!r}")
    return value


def whole_steps(num_steps, owner):
    """``num_steps`` (checked) rounded up to an int, with a warning when it was not whole
    (NOTE [fractional steps are never under-counted])."""
    value = check_num_steps(num_steps, owner)
    whole = math.ceil(value)
    if whole != value:
        warnings.warn(f"{owner}: the PLD accountant composes whole steps: num_steps={num_steps!r} is counted as "
                      f"{whole} (never fewer than ran); pass math.ceil(steps) to say so", RuntimeWarning, stacklevel=3)
    return whole


def record_steps(history, owner, noise_multiplier, sample_rate, num_steps, whole=True):
    """Appends ``num_steps`` steps of ``(σ, q)`` to an accountant's ``history`` (a list of
    ``[σ, q, steps]``, merging a repeat of the last ``(σ, q)``), after checking them; the
    errors name ``owner``. ``whole``: the count rounded up to an int (the PLD accountant),
    else kept as given (the RDP accountant; NOTE [fractional steps are never under-counted])."""
    where = f"{owner}.step"
    num_steps = whole_steps(num_steps, where) if whole else check_num_steps(num_steps, where)
    noise_multiplier, sample_rate = float(noise_multiplier), float(sample_rate)
    if not 0 <= sample_rate <= 1:
        raise ValueError(f"{owner}.step: sample_rate must be in [0, 1], got {sample_rate}")
    if not noise_multiplier >= 0:
        raise ValueError(f"{owner}.step: noise_multiplier must be >= 0, got {noise_multiplier}")
    if history and history[-1][:2] == [noise_multiplier, sample_rate]:
        history[-1][2] += num_steps
    else:
        history.append([noise_multiplier, sample_rate, num_steps])


class PLDAccountant:
    """Tracks a sequence of Poisson-subsampled Gaussian steps by their privacy loss
    distributions and reports ``(ε, δ)`` under add/remove-one adjacency: tight where
    :class:`~cuvmap.dp.RDPAccountant` is an upper bound (module docstring).

    The interface is :class:`~cuvmap.dp.RDPAccountant`'s: :meth:`step` records
    ``num_steps`` steps with ``(noise_multiplier, sample_rate)``; :meth:`get_epsilon`
    composes what was recorded (steps with the same parameters by one FFT power, distinct
    ones by convolution; steps commute, so their order does not matter) and returns the
    smallest ε with ``δ(ε) ≤ delta`` over both pairs. The composed PLDs are kept until the
    next :meth:`step`.

    Args:
      discretization: the width ``h`` of the loss grid (default 1e-4). Every ``h`` gives
        an upper bound (the discretisation is pessimistic); smaller is tighter and slower.

    Example::

        acct = PLDAccountant()
        acct.step(noise_multiplier=1.1, sample_rate=256 / 60000, num_steps=14063)
        eps = acct.get_epsilon(delta=1e-5)     # 2.382 (the RDP accountant: 2.597)
    """

    def __init__(self, discretization=DEFAULT_DISCRETIZATION):
        h = float(discretization)
        if not 0 < h < 1:
            raise ValueError(f"PLDAccountant: discretization must be in (0, 1), got {discretization!r}")
        self.discretization = h
        self.history = []  # [noise_multiplier, sample_rate, num_steps]
        self._plds = None

    def step(self, noise_multiplier, sample_rate, num_steps=1):
        """Records ``num_steps`` steps with noise multiplier ``σ`` and Poisson rate ``q``."""
        record_steps(self.history, "PLDAccountant", noise_multiplier, sample_rate, num_steps)
        self._plds = None

    def __len__(self):
        """The number of steps recorded (each call's count rounded up)."""
        return sum(h[2] for h in self.history)

    def _groups(self):
        """``{(σ, q): count}`` of the steps that lose privacy; ``None`` if one has ``σ = 0``."""
        groups = {}
        for sigma, q, n in self.history:
            if n == 0 or q == 0 or sigma == math.inf:  # (infinite noise loses nothing)
                continue
            if sigma == 0:
                return None
            groups[(sigma, q)] = groups.get((sigma, q), 0) + n
        return groups

    def get_pld(self):
        """``{"remove": DiscretePLD, "add": DiscretePLD}`` of the recorded steps (``None``
        values when nothing was recorded; ``{}`` when a step had ``σ = 0``)."""
        if self._plds is None:
            groups = self._groups()
            if groups is None:
                self._plds = {}
            else:
                self._plds = {pair: _composed(groups, pair, self.discretization) if groups else None
                              for pair in PAIRS}
        return self._plds

    def get_epsilon(self, delta):
        """The smallest ε such that the recorded steps are ``(ε, delta)``-DP (by this
        accountant's pessimistic grid); ``inf`` when none is (a step without noise)."""
        if not 0 < delta < 1:
            raise ValueError(f"PLDAccountant.get_epsilon: delta must be in (0, 1), got {delta!r}")
        plds = self.get_pld()
        if not plds:
            return math.inf
        return max(0.0 if p is None else p.get_epsilon(delta) for p in plds.values())

    def get_delta(self, epsilon):
        """The smallest δ such that the recorded steps are ``(epsilon, δ)``-DP."""
        plds = self.get_pld()
        if not plds:
            return 1.0
        return max(0.0 if p is None else p.get_delta(float(epsilon)) for p in plds.values())
