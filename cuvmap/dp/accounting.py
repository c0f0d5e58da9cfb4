r"""The Rényi-DP accountant of the Poisson-subsampled Gaussian mechanism, and the
calibration of the noise multiplier by it or by the PLD accountant (imports nothing from
cuvmap but :mod:`cuvmap.dp.pld`).

One DP-SGD step on a batch drawn by Poisson sampling with rate ``q`` (every example in
independently with probability ``q``) is the *sampled Gaussian mechanism* (SGM):

* its Rényi DP at order ``α > 1`` (Mironov, Talwar, Zhang 2019) is
  ``ε_α = log(A_α) / (α − 1)`` with ``A_α = E_{z∼μ₀}[(μ(z)/μ₀(z))^α]``, ``μ₀ = N(0, σ²)``,
  ``μ = (1−q)·μ₀ + q·N(1, σ²)``; see :func:`rdp_sampled_gaussian` for the integer and
  fractional formulas;
* RDP composes additively (Mironov 2017, Prop. 1): ``T`` steps give ``T·ε_α``;
* RDP converts to ``(ε, δ)``-DP by minimising over the orders, see :func:`rdp_to_epsilon`.

References:

* I. Mironov. *Rényi Differential Privacy.* CSF 2017, arXiv:1702.07476.
* I. Mironov, K. Talwar, L. Zhang. *Rényi Differential Privacy of the Sampled Gaussian
  Mechanism.* arXiv:1908.10530, 2019 (Sec. 3.3: the series for fractional orders).
* B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato. *Hypothesis Testing Interpretations
  and Rényi Differential Privacy.* AISTATS 2020, arXiv:1905.09982 (Theorem 21).
* C. Canonne, G. Kamath, T. Steinke. *The Discrete Gaussian for Differential Privacy.*
  NeurIPS 2020, arXiv:2004.00010 (Proposition 12).
"""
import functools
import math
import numbers
import warnings

import numpy as np

from cuvmap.dp.pld import (DEFAULT_DISCRETIZATION, PLDRangeError, PLDAccountant, check_num_steps, record_steps,
                           whole_steps)

#: Opacus' default RDP orders: 1.1, 1.2, ..., 10.9, then 12, 13, ..., 63.
DEFAULT_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


# ---------------------------------------------------------------------------------------
# RDP of the sampled Gaussian mechanism
# ---------------------------------------------------------------------------------------

# NOTE [SGM series in log space]
# For an integer order α the binomial expansion of (1 − q + q·e^{(2z−1)/(2σ²)})^α is finite
# and integrates term by term against μ₀ = N(0, σ²):
#     A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)}.
# Because Σ_k C(α,k) (1−q)^{α−k} q^k = 1 and the exponent vanishes for k = 0 and 1,
#     A_α − 1 = Σ_{k=2}^{α} C(α,k) (1−q)^{α−k} q^k expm1((k²−k)/(2σ²)),
# a sum of positive terms: log A_α = log1p(A_α − 1) keeps full relative accuracy even when
# q is so small that A_α − 1 is far below the float spacing at 1.
#
# For a fractional order the series is infinite and converges only where the ratio is
# below 1, so the integral is split at z₀ = σ² log(1/q − 1) + 1/2, where
# q·e^{(2z₀−1)/(2σ²)} = 1 − q (Mironov, Talwar, Zhang 2019, Sec. 3.3):
#     z ≤ z₀:  Σ_k C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)} · ½erfc((k−z₀)/(√2σ))
#     z > z₀:  Σ_k C(α,k) q^{α−k} (1−q)^k e^{(j²−j)/(2σ²)} · ½erfc((z₀−j)/(√2σ)),   j = α−k
# (below z₀ the binomial series runs in powers of q·e^{(2z−1)/(2σ²)} / (1−q) ≤ 1, above it
# in the reciprocal).
# Writing ½erfc(x) = ½erfcx(x)·e^{−x²}, the k-th term of either part is
#     C(α,k) (1−q)^α e^{−z₀²/(2σ²)} · ½erfcx(w),  w = (k−z₀)/(√2σ)  resp.  (z₀−α+k)/(√2σ),
# (the exponentials cancel exactly): both parts carry the sign of C(α,k), which alternates
# for k > α, and for k ≥ α their magnitudes decrease (|C(α,k)| and erfcx both do). The tail is
# an alternating series with decreasing terms: truncating it errs by less than the first
# omitted term. We sum chunks of terms with a signed log-sum-exp until that term is below
# 2^-60 of the largest term (A ≥ 1, so that is below the float precision of the sum).
# Terms with w ≤ 4 use the direct form (no cancellation of large exponents); terms with
# w > 4 use the erfcx form, with erfcx from its continued fraction.
# When α is an integer the coefficients vanish for k > α and the series reduces to the
# closed form above, which the tests use to check it.

_ERFCX_SWITCH = 4.0
_CF_TERMS = 32
_REL_TOL_LOG = -60 * math.log(2.0)
_MAX_TERMS = 1 << 22


def _log_erfc_small(x):
    """log(erfc(x)) for an array of x ≤ _ERFCX_SWITCH (erfc is then ≥ 1.5e-8: no underflow)."""
    return np.log(np.array([math.erfc(v) for v in x.tolist()], dtype=np.float64))


def _log_erfcx_large(x):
    """log(erfcx(x)) = log(e^{x²} erfc(x)) for an array of x > _ERFCX_SWITCH, from the continued
    fraction erfcx(x) = 1/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))), evaluated backwards
    (32 levels give full double precision for x ≥ 4)."""
    acc = x.copy()
    for k in range(_CF_TERMS, 0, -1):
        acc = x + (0.5 * k) / acc
    return -np.log(acc) - 0.5 * math.log(math.pi)


def _log_part(m, w, alpha, log1mq, log_ratio, z0, sigma2):
    """log of the m-th term of one part of the fractional series, without C(α,k) and ½:
    (1−q)^α · (q/(1−q))^m · e^{(m²−m)/(2σ²)} · erfc(w)."""
    out = np.empty_like(w)
    small = w <= _ERFCX_SWITCH
    if small.any():
        ms, ws = m[small], w[small]
        out[small] = alpha * log1mq + ms * log_ratio + (ms * ms - ms) / (2 * sigma2) + _log_erfc_small(ws)
    big = ~small
    if big.any():
        out[big] = alpha * log1mq - z0 * z0 / (2 * sigma2) + _log_erfcx_large(w[big])
    return out


def _log_a_frac(q, sigma, alpha, upper_bound=False):
    """log A_α by the series of NOTE [SGM series in log space] (any real α > 1, 0 < q < 1).
    With ``upper_bound`` the terms' magnitudes are summed, ignoring their signs."""
    sigma2 = sigma * sigma
    log1mq = math.log1p(-q)
    log_ratio = math.log(q) - log1mq  # log(q / (1 − q)) = −(2 z₀ − 1) / (2σ²)
    z0 = -sigma2 * log_ratio + 0.5
    root2s = math.sqrt(2.0) * sigma
    logs, signs = [], []
    start, log_c, sign_c, chunk = 0, 0.0, 1.0, 64
    while True:
        k = np.arange(start, start + chunk, dtype=np.float64)
        # log|C(α,k)| and its sign by the recurrence C(α,k+1) = C(α,k)·(α−k)/(k+1).
        with np.errstate(divide="ignore"):
            step_log = np.log(np.abs(alpha - k)) - np.log1p(k)
        step_sign = np.sign(alpha - k)
        lc = log_c + np.concatenate(([0.0], np.cumsum(step_log[:-1])))
        sc = sign_c * np.concatenate(([1.0], np.cumprod(step_sign[:-1])))
        log_c, sign_c = lc[-1] + step_log[-1], sc[-1] * step_sign[-1]
        live = sc != 0
        if live.any():
            kk, lcl = k[live], lc[live]
            j = alpha - kk
            t0 = _log_part(kk, (kk - z0) / root2s, alpha, log1mq, log_ratio, z0, sigma2)
            t1 = _log_part(j, (z0 - j) / root2s, alpha, log1mq, log_ratio, z0, sigma2)
            terms = lcl + np.logaddexp(t0, t1) - math.log(2.0)
            logs.append(terms)
            signs.append(sc[live])
        start += chunk
        if sign_c == 0 or start >= _MAX_TERMS:
            break
        if start > alpha + 1 and logs:
            head = max(float(np.max(x)) for x in logs)
            if logs[-1][-1] < head + _REL_TOL_LOG:
                break
        chunk = min(2 * chunk, 1 << 16)
    logs = np.concatenate(logs)
    signs = np.concatenate(signs)
    top = float(np.max(logs))
    mags = np.exp(logs - top)
    magnitude = math.fsum(mags.tolist())
    if upper_bound:
        return top + math.log(magnitude)
    total = math.fsum((signs * mags).tolist())
    if not total > 1e-8 * magnitude:
        # Cancellation ate the precision: fall back on the (valid, looser) bound Σ|terms|.
        warnings.warn(
            f"rdp_sampled_gaussian: the series for order {alpha} (q={q}, sigma={sigma}) cancels "
            "beyond float precision; using the upper bound that sums the terms' magnitudes",
            RuntimeWarning, stacklevel=4,
        )
        return top + math.log(magnitude)
    return top + math.log(total)


def _log_expm1(x):
    """log(e^x − 1) for x > 0, stable for small and large x."""
    return x + math.log(-math.expm1(-x)) if x > 1.0 else math.log(math.expm1(x))


def _log_a_int(q, sigma, alpha):
    """log A_α for an integer α ≥ 2 from the finite sum for A_α − 1 (NOTE [SGM series in log space])."""
    if alpha < 2:
        return 0.0
    log_q, log1mq = math.log(q), math.log1p(-q)
    lg_a = math.lgamma(alpha + 1)
    terms = [
        lg_a - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
        + k * log_q + (alpha - k) * log1mq + _log_expm1((k * k - k) / (2 * sigma * sigma))
        for k in range(2, alpha + 1)
    ]
    top = max(terms)
    log_a_minus_1 = top + math.log(math.fsum(math.exp(t - top) for t in terms))
    return float(np.logaddexp(0.0, log_a_minus_1))  # log(1 + (A − 1))


def _rdp_one(q, sigma, alpha, upper_bound):
    if q == 0 or sigma == math.inf:  # (infinite noise: the output says nothing, as Opacus' ε = 0)
        return 0.0
    if sigma == 0 or math.isinf(alpha):
        return math.inf
    if q == 1:
        return alpha / (2 * sigma * sigma)
    if float(alpha).is_integer():
        log_a = _log_a_int(q, sigma, int(alpha))
    else:
        log_a = _log_a_frac(q, sigma, float(alpha), upper_bound)
    return log_a / (alpha - 1)


def rdp_sampled_gaussian(q, noise_multiplier, orders, *, steps=1, fractional="exact"):
    r"""Rényi DP of the Poisson-sampled Gaussian mechanism, composed over ``steps``.

    One step releases ``f(S) + N(0, σ²)`` with ``f`` of L2 sensitivity 1 (DP-SGD's clipped
    sum with noise multiplier ``σ``) on a Poisson sample ``S`` of rate ``q``. Its RDP at
    order ``α > 1`` is (Mironov, Talwar, Zhang 2019)::

        ε(α) = log(A_α) / (α − 1),   A_α = E_{z∼N(0,σ²)}[((1−q) + q·e^{(2z−1)/(2σ²)})^α]

    * integer ``α``: ``A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)}``, summed as
      ``1 + Σ_{k≥2} … expm1(…)`` in log space (accurate for tiny ``q``);
    * fractional ``α``: the two-sided series of the paper's Sec. 3.3 (split at
      ``z₀ = σ² log(1/q − 1) + 1/2``, with ``erfc`` factors), in log space, truncated once
      the alternating tail is below 2^-60 of the largest term; see NOTE [SGM series in log space];
      the signed sum keeps ``log A_α`` accurate to about 1e-16 absolute, so ``ε(α)`` loses
      relative accuracy as ``q → 0`` (about 1e-8 at ``q = 1e-4``, ``σ = 1``, ``α = 1.5``);
    * ``q = 1`` is the plain Gaussian mechanism, ``ε(α) = α / (2σ²)``; ``q = 0`` or
      ``σ = ∞`` gives 0; ``σ = 0`` or ``α = ∞`` gives ``inf``.

    Composition over ``steps`` identical steps multiplies by ``steps`` (Mironov 2017,
    Prop. 1); for different steps add the results.

    ``fractional="upper_bound"`` sums the magnitudes of the fractional series' terms
    instead of their signed values: a valid but looser bound, which is what
    ``dp_accounting`` (hence TF Privacy) computes since version 0.4.4; use it only to
    reproduce their numbers. (``"exact"`` also falls back on it, with a warning, if the
    signed sum ever cancels beyond float precision.)

    Args:
      q: sampling rate, ``0 ≤ q ≤ 1``.
      noise_multiplier: ``σ ≥ 0``.
      orders: one order ``> 1`` or a sequence of them.
      steps: number of compositions (keyword-only).
      fractional: ``"exact"`` (default) or ``"upper_bound"``, see above.

    Returns:
      A float for a scalar order, else a float64 array of the same length.

    Example::

        rdp = rdp_sampled_gaussian(256 / 60000, 1.1, DEFAULT_ORDERS, steps=14063)
    """
    q, sigma = float(q), float(noise_multiplier)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"rdp_sampled_gaussian: q must be in [0, 1], got {q!r}")
    if not sigma >= 0:
        raise ValueError(f"rdp_sampled_gaussian: noise_multiplier must be >= 0, got {noise_multiplier!r}")
    if isinstance(steps, bool) or not (isinstance(steps, numbers.Real) and math.isfinite(steps) and steps >= 0):
        raise ValueError(f"rdp_sampled_gaussian: steps must be a finite number >= 0, got {steps!r}")
    if fractional not in ("exact", "upper_bound"):
        raise ValueError(f"rdp_sampled_gaussian: fractional must be 'exact' or 'upper_bound', got {fractional!r}")
    scalar = np.ndim(orders) == 0
    alphas = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if alphas.ndim != 1 or not np.all(alphas > 1):
        raise ValueError(f"rdp_sampled_gaussian: orders must be > 1, got {orders!r}")
    upper = fractional == "upper_bound"
    out = np.array([_rdp_one(q, sigma, float(a), upper) for a in alphas], dtype=np.float64)
    if steps != 1:
        out = out * steps if steps else np.zeros_like(out)
    return float(out[0]) if scalar else out


# ---------------------------------------------------------------------------------------
# RDP -> (epsilon, delta)
# ---------------------------------------------------------------------------------------


def rdp_to_epsilon(orders, rdp, delta, *, conversion="improved"):
    r"""Converts RDP guarantees ``rdp[i]`` at ``orders[i]`` into ``(ε, δ)``-DP: the smallest
    ε over the orders.

    ``conversion="improved"`` (default) — Balle et al. 2020, Theorem 21; the same bound is
    Canonne, Kamath, Steinke 2020, Proposition 12 (and Asoodeh et al. 2020, Eq. 20). It is
    what TF Privacy / ``dp_accounting`` and Opacus use now::

        ε = min_α  rdp(α) + log((α − 1)/α) − (log δ + log α) / (α − 1)

    Like ``dp_accounting``, an order whose RDP already gives ``δ ≥ sqrt(1 − e^{−rdp(α)})``
    yields ``ε = 0`` (total variation bounded through KL ≤ rdp(α), Bretagnolle–Huber), and
    the result is clipped at 0.

    ``conversion="classic"`` — Mironov 2017, Proposition 3, which TF Privacy used until
    2020 and older Opacus releases::

        ε = min_α  rdp(α) + log(1/δ) / (α − 1)

    It is never tighter than the improved bound; it is kept to reproduce published numbers.

    Args:
      orders: the RDP orders (each > 1), a sequence or a scalar.
      rdp: the RDP at each order (same length), e.g. from :func:`rdp_sampled_gaussian`.
      delta: target ``δ`` in ``(0, 1)``.
      conversion: ``"improved"`` or ``"classic"`` (keyword-only).

    Returns:
      ``(epsilon, optimal_order)`` as floats; ``(inf, nan)`` when every order gives ``inf``.
    """
    alphas = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    rdps = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    if alphas.shape != rdps.shape or alphas.ndim != 1:
        raise ValueError(f"rdp_to_epsilon: orders and rdp must have the same length, got "
                         f"{alphas.shape} and {rdps.shape}")
    if not 0 < delta < 1:
        raise ValueError(f"rdp_to_epsilon: delta must be in (0, 1), got {delta!r}")
    if not np.all(alphas > 1):
        raise ValueError("rdp_to_epsilon: orders must be > 1")
    if np.any(rdps < 0) or np.any(np.isnan(rdps)):
        raise ValueError("rdp_to_epsilon: rdp must be >= 0")
    with np.errstate(over="ignore", invalid="ignore"):
        if conversion == "improved":
            eps = rdps + np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1)
            eps = np.where(delta * delta + np.expm1(-rdps) >= 0, 0.0, eps)
        elif conversion == "classic":
            eps = rdps - math.log(delta) / (alphas - 1)
        else:
            raise ValueError(f"rdp_to_epsilon: conversion must be 'improved' or 'classic', got {conversion!r}")
    eps = np.where(np.isnan(eps), np.inf, eps)
    if np.all(np.isinf(eps)):
        return math.inf, math.nan
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(alphas[i])


# ---------------------------------------------------------------------------------------
# Accountant
# ---------------------------------------------------------------------------------------


class RDPAccountant:
    """Tracks the RDP of a sequence of sampled Gaussian steps and reports ``(ε, δ)``.

    Each :meth:`step` records ``num_steps`` applications of the Poisson-sampled Gaussian
    mechanism with ``(noise_multiplier, sample_rate)``; consecutive steps with the same
    parameters are merged, and the per-step RDP of each distinct pair is computed once.
    The total RDP is the sum over the history (composition); :meth:`get_epsilon` converts
    it with :func:`rdp_to_epsilon`.

    Args:
      orders: the RDP orders to optimise over (default :data:`DEFAULT_ORDERS`, Opacus').

    Example::

        acct = RDPAccountant()
        for _ in range(steps):
            ...  # one DP-SGD step with sampling rate q and noise multiplier sigma
            acct.step(noise_multiplier=sigma, sample_rate=q)
        eps = acct.get_epsilon(delta=1e-5)
    """

    def __init__(self, orders=DEFAULT_ORDERS):
        self.orders = tuple(float(a) for a in np.atleast_1d(orders))
        if not self.orders or min(self.orders) <= 1:
            raise ValueError("RDPAccountant: orders must be a non-empty sequence of values > 1")
        self.history = []  # [noise_multiplier, sample_rate, num_steps]
        self._cache = {}

    def step(self, noise_multiplier, sample_rate, num_steps=1):
        """Records ``num_steps`` steps with noise multiplier ``σ`` and Poisson rate ``q``;
        a fractional count (``epochs / q``) is composed exactly, never truncated (NOTE
        [fractional steps are never under-counted] in :mod:`cuvmap.dp.pld`)."""
        record_steps(self.history, "RDPAccountant", noise_multiplier, sample_rate, num_steps, whole=False)

    def __len__(self):
        """The number of steps recorded, rounded up (:attr:`num_steps` is the exact count)."""
        return math.ceil(self.num_steps)

    @property
    def num_steps(self):
        """The steps recorded, a float when a count was fractional."""
        return sum(h[2] for h in self.history)

    def get_rdp(self):
        """The composed RDP at each of ``self.orders`` (a float64 array)."""
        total = np.zeros(len(self.orders))
        for sigma, q, n in self.history:
            key = (sigma, q)
            if key not in self._cache:
                self._cache[key] = rdp_sampled_gaussian(q, sigma, self.orders)
            if n:
                total = total + self._cache[key] * n
        return total

    def get_privacy_spent(self, delta, *, conversion="improved"):
        """``(epsilon, optimal_order)`` for the recorded steps at ``delta``."""
        return rdp_to_epsilon(self.orders, self.get_rdp(), delta, conversion=conversion)

    def get_epsilon(self, delta, *, conversion="improved"):
        """ε for the recorded steps at ``delta`` (see :func:`rdp_to_epsilon`)."""
        return self.get_privacy_spent(delta, conversion=conversion)[0]


def epsilon(dataset_size, batch_size, epochs, noise_multiplier, delta, *, orders=DEFAULT_ORDERS,
            conversion="improved", return_order=False):
    """ε of a whole DP-SGD run with Poisson sampling, like TF Privacy's
    ``compute_dp_sgd_privacy``.

    The sampling rate is ``q = batch_size / dataset_size`` and the number of steps
    ``ceil(epochs · dataset_size / batch_size)`` (TF Privacy's convention; ``epochs`` may be
    fractional).

    Args:
      dataset_size: ``N``, the number of training examples.
      batch_size: the (expected) batch size.
      epochs: number of epochs.
      noise_multiplier: ``σ``.
      delta: target ``δ``.
      orders: RDP orders (default Opacus'); keyword-only like the rest.
      conversion: ``"improved"`` or ``"classic"``, see :func:`rdp_to_epsilon`.
      return_order: also return the optimal order.

    Returns:
      ε, or ``(ε, optimal_order)``.

    Example::

        eps = epsilon(60000, 256, 60, 1.1, 1e-5)
    """
    if not 0 < batch_size <= dataset_size:
        raise ValueError(f"epsilon: need 0 < batch_size <= dataset_size, got {batch_size} and {dataset_size}")
    q = batch_size / dataset_size
    steps = int(math.ceil(epochs * dataset_size / batch_size))
    rdp = rdp_sampled_gaussian(q, noise_multiplier, orders, steps=steps)
    eps, order = rdp_to_epsilon(orders, rdp, delta, conversion=conversion)
    return (eps, order) if return_order else eps


# ---------------------------------------------------------------------------------------
# Calibration: the smallest noise multiplier for a target ε
# ---------------------------------------------------------------------------------------

# NOTE [calibrating the noise multiplier]
# ε(σ) falls as σ grows (more noise, less loss), for both accountants. With g(u) =
# log ε(e^u) − log ε_target, nearly linear in u = log σ, we bracket the root by steps of
# ×2 from σ = 1, then shrink the bracket [lo, hi] (g(lo) > 0 ≥ g(hi)) by secant estimates
# u*: each round evaluates u* ± ½·log(1 + rtol), so that a good estimate closes the
# bracket to a ratio of 1 + rtol in one round (bisection when a round gains less than
# half). The result is hi: it meets the target, and hi / (1 + rtol) does not.
# Both accountants first run this on a cheaper ε that is never below theirs: the PLD
# accountant on a grid ten times coarser (every evaluation about ten times cheaper: its
# points are a subset of the fine grid's, so the coarse pair dominates the fine pair and
# ε_coarse ≥ ε_fine), the RDP accountant on the integer orders alone (closed forms; a
# minimum over fewer orders). The coarse answer is then an upper end of the fine bracket,
# and the slope there predicts where the fine root lies, so the costly ε is evaluated three
# or four times.

_SIGMA_RANGE = (1e-3, 1e6)


def _shrink(g, lo, glo, hi, ghi, rtol):
    """Shrinks a bracket of the decreasing ``g`` (``glo > 0 ≥ ghi``, in log σ) to
    ``hi − lo ≤ log(1 + rtol)`` (NOTE [calibrating the noise multiplier])."""
    width = math.log1p(rtol)
    while hi - lo > width:
        before = hi - lo
        u = hi - ghi * (hi - lo) / (ghi - glo) if glo != ghi else 0.5 * (lo + hi)
        for c in (u + 0.45 * width, u - 0.45 * width):
            if hi - lo <= width:
                break
            c = min(max(c, lo + 0.05 * (hi - lo)), hi - 0.05 * (hi - lo))
            gc = g(c)
            if gc > 0:
                lo, glo = c, gc
            else:
                hi, ghi = c, gc
        if hi - lo > 0.5 * before and hi - lo > width:
            c = 0.5 * (lo + hi)
            gc = g(c)
            if gc > 0:
                lo, glo = c, gc
            else:
                hi, ghi = c, gc
    return lo, glo, hi, ghi


def _bracket(g, u0, ghint=None):
    """A bracket ``(lo, g(lo), hi, g(hi))`` of the decreasing ``g`` around its root, by
    steps of ×2 in σ from ``e^{u0}``."""
    step = math.log(2.0)
    lo_lim, hi_lim = (math.log(s) for s in _SIGMA_RANGE)
    u, gu = u0, (g(u0) if ghint is None else ghint)
    if gu > 0:
        while gu > 0:
            lo, glo = u, gu
            u += step
            if u > hi_lim:
                raise ValueError("calibrate_noise: no noise multiplier up to 1e6 meets the target")
            gu = g(u)
        return lo, glo, u, gu
    while gu <= 0:
        hi, ghi = u, gu
        u -= step
        if u < lo_lim:
            raise ValueError("calibrate_noise: the target is met with a noise multiplier below 1e-3; "
                             "no smaller one is searched")
        gu = g(u)
    return u, gu, hi, ghi


#: The integer orders among :data:`DEFAULT_ORDERS` (closed forms: the cheap first stage of
#: the RDP calibration).
_INTEGER_ORDERS = tuple(a for a in DEFAULT_ORDERS if float(a).is_integer())


def _rdp_eps(sigma, q, steps, delta, orders=DEFAULT_ORDERS):
    acct = RDPAccountant(orders)
    acct.step(sigma, q, steps)
    return acct.get_epsilon(delta)


def _pld_eps(sigma, q, steps, delta, h):
    acct = PLDAccountant(discretization=h)
    acct.step(sigma, q, steps)
    return acct.get_epsilon(delta)


_GAP_BOUND = 60.0


def _log_gap(eps, target):
    """``log ε − log target``, clamped to ``±_GAP_BOUND``: an ``ε`` of exactly 0 (the RDP
    conversion reaches it where the total variation is below δ) or ``inf`` keeps its sign
    without making the secant steps infinite (they would give a σ of NaN); the bracket
    only needs the sign."""
    if not eps > 0:
        return -_GAP_BOUND
    return max(-_GAP_BOUND, min(_GAP_BOUND, math.log(eps) - math.log(target)))


def _two_stages(eps_coarse, eps_fine, target, rtol):
    """The smallest σ with ``eps_fine(σ) ≤ target`` (to ``rtol``), given a cheaper
    ``eps_coarse ≥ eps_fine`` (NOTE [calibrating the noise multiplier])."""
    def g_coarse(u):
        return _log_gap(eps_coarse(math.exp(u)), target)

    def g_fine(u):
        return _log_gap(eps_fine(math.exp(u)), target)

    lo, glo, hi, ghi = _shrink(g_coarse, *_bracket(g_coarse, 0.0), rtol)
    # the fine root lies at or below the coarse one: start there, jump by the slope
    slope = (ghi - glo) / (hi - lo) if hi > lo and ghi < glo else -1.0
    u, gu = hi, g_fine(hi)
    if gu > 0:  # not expected (ε_coarse ≥ ε_fine); search upwards
        return math.exp(_shrink(g_fine, *_bracket(g_fine, u, gu), rtol)[2])
    margin = 0.45 * math.log1p(rtol)
    while True:  # predicted root, less a margin that doubles while the guesses still pass
        v = u - gu / slope - margin
        if v < math.log(_SIGMA_RANGE[0]):
            raise ValueError("calibrate_noise: the target is met with a noise multiplier below 1e-3; "
                             "no smaller one is searched")
        gv = g_fine(v)
        if gv > 0:
            lo, glo, hi, ghi = v, gv, u, gu
            break
        if gv > gu:  # a secant slope from the fine function itself
            slope = (gv - gu) / (v - u)
        u, gu = v, gv
        margin *= 2
    return math.exp(_shrink(g_fine, lo, glo, hi, ghi, rtol)[2])


@functools.lru_cache(maxsize=256)
def _calibrate(target, delta, q, steps, accountant, rtol, h):
    if accountant == "rdp":  # first the integer orders only: a minimum over fewer orders
        return _two_stages(lambda s: _rdp_eps(s, q, steps, delta, _INTEGER_ORDERS),
                           lambda s: _rdp_eps(s, q, steps, delta), target, rtol)
    coarse = min(10 * h, 0.05)  # a grid whose points are the fine grid's every tenth

    def eps(sigma, grid):
        try:
            return _pld_eps(sigma, q, steps, delta, grid)
        except PLDRangeError:
            raise ValueError(
                f"calibrate_noise: the target ε={target:g} needs a noise multiplier near {sigma:.3g} or below, where "
                f"the PLD accountant's grid at discretization {grid:g} cannot hold the privacy loss (so little noise "
                "spreads it too wide, or beyond e^700): pass accountant='rdp', or a coarser discretization=") from None

    return _two_stages(lambda s: eps(s, coarse), lambda s: eps(s, h), target, rtol)


def calibrate_noise(target_epsilon, delta, sample_rate, num_steps, accountant="pld", *, rtol=1e-3,
                    discretization=None):
    r"""The smallest noise multiplier ``σ`` with which ``num_steps`` Poisson-subsampled
    Gaussian steps of rate ``sample_rate`` are ``(target_epsilon, delta)``-DP.

    ``ε(σ)`` falls as ``σ`` grows; the result ``σ`` has ``ε(σ) ≤ target_epsilon`` and
    ``ε(σ / (1 + rtol)) > target_epsilon``, ``ε`` by the chosen accountant (NOTE
    [calibrating the noise multiplier]). Results are memoised: a repeated call is free.

    Args:
      target_epsilon: the ε to meet, > 0.
      delta: the δ, in (0, 1).
      sample_rate: the Poisson rate ``q``, in [0, 1] (``q = 0``: no loss, ``σ = 0``).
      num_steps: the number of steps ``T ≥ 0``; a fractional ``T`` (``epochs / q``) is
        calibrated for exactly by the RDP accountant and for ``ceil(T)`` by the PLD one.
      accountant: ``"pld"`` (default, :class:`~cuvmap.dp.PLDAccountant`, tight) or
        ``"rdp"`` (:class:`RDPAccountant`, an upper bound: a larger σ).
      rtol: the relative resolution of ``σ`` (keyword-only).
      discretization: the PLD grid width (default the accountant's, 1e-4).

    Returns:
      ``σ`` as a float.

    Example::

        sigma = calibrate_noise(2.382, 1e-5, 256 / 60000, 14063)   # ≈ 1.1
    """
    target, delta, q = float(target_epsilon), float(delta), float(sample_rate)
    # the RDP accountant composes a fractional count exactly, the PLD one whole steps (rounded
    # up): NOTE [fractional steps are never under-counted] in cuvmap/dp/pld.py
    steps = (whole_steps(num_steps, "calibrate_noise") if accountant == "pld"
             else check_num_steps(num_steps, "calibrate_noise"))
    if not target > 0:
        raise ValueError(f"calibrate_noise: target_epsilon must be > 0, got {target_epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"calibrate_noise: delta must be in (0, 1), got {delta!r}")
    if not 0 <= q <= 1:
        raise ValueError(f"calibrate_noise: sample_rate must be in [0, 1], got {sample_rate!r}")
    if accountant not in ("pld", "rdp"):
        raise ValueError(f"calibrate_noise: accountant must be 'pld' or 'rdp', got {accountant!r}")
    if not 0 < rtol < 1:
        raise ValueError(f"calibrate_noise: rtol must be in (0, 1), got {rtol!r}")
    if q == 0 or steps == 0:
        return 0.0
    if discretization is None:
        discretization = DEFAULT_DISCRETIZATION
    return _calibrate(target, delta, q, steps, accountant, float(rtol), float(discretization))
