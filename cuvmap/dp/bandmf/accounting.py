r"""The accountant of amplified BandMF: the Poisson-subsampled Gaussian over ``⌈T/b⌉``
participations, by cuvmap's RDP or PLD accountant unchanged underneath; the calibration of
``σ`` for it; and the price of truncating the batches.

**Amplification** (Choquette-Choo et al. 2023, Theorem 4). Let ``C'`` be ``b``-banded,
lower-triangular, with columns of norm at most 1, and the units sampled by cyclic Poisson
sampling over ``b`` groups with rate ``q`` (:mod:`~cuvmap.dp.bandmf.sampling`). A unit of
group ``g`` can only be in the steps ``g + kb``, whose columns of ``C'`` have disjoint
supports (rows ``g + kb … g + kb + b − 1``): after the post-processing ``y = C'X + σZ``
(what :mod:`~cuvmap.dp.bandmf.noise`'s ``x_t + σ w_t`` is a function of), each of its
participations is one Poisson-subsampled Gaussian mechanism with sensitivity 1 and noise
``σ``, on rows no other of its participations touches. The run is then ``(ε, δ)``-DP with
the ``(ε, δ)`` of ``k = ⌈T/b⌉`` compositions of the subsampled Gaussian ``(q, σ)`` — DP-SGD's
accountant with ``⌈T/b⌉`` steps (jax_privacy's ``amplified_bandmf_event``). ``b = 1`` is
DP-SGD's accounting exactly.

**Truncation** (``max_batch_size = B``). Run the truncated and the untruncated mechanisms
on the same randomness: they differ only if some step's batch has more than ``B`` units,
whose probability is at most ``T·p`` with ``p = P(Bin(N + 1, q/b) > B)`` (a unit of the
dataset is in step ``t``'s batch with probability ``q/b`` over the groups and the draw,
independently of the others; ``N + 1`` covers the larger of two neighbours, ``N`` the
plan's number of units, treated as public). So for every event ``E`` and neighbours
``D, D'``: ``P[M'(D) ∈ E] ≤ P[M(D) ∈ E] + Tp ≤ e^ε (P[M'(D') ∈ E] + Tp) + δ + Tp``: the
truncated run is ``(ε, δ + (1 + e^ε)·T·p)``-DP whenever the untruncated one is
``(ε, δ)``-DP (a coupling bound, looser than the analyses of Chua et al. 2024 and Ganesh
et al. 2025, exact in what it claims).

References:

* C. A. Choquette-Choo, A. Ganesh, R. McKenna, H. B. McMahan, K. Rush, A. G. Thakurta,
  Z. Xu. *(Amplified) Banded Matrix Factorization.* NeurIPS 2023, arXiv:2306.08153.
* L. Chua, B. Ghazi, P. Kamath, R. Kumar, P. Manurangsi, A. Sinha, C. Zhang. *Scalable
  DP-SGD: Shuffling vs. Poisson Subsampling.* NeurIPS 2024, arXiv:2411.04205.
"""
import math

import numpy as np

from cuvmap.dp import accounting as rdp_accounting
from cuvmap.dp import pld

#: the accountants underneath, by name (the Poisson-subsampled Gaussian: ``step(σ, q, T)``
#: and ``get_epsilon(δ)``)
BASE_ACCOUNTANTS = {"rdp": rdp_accounting.RDPAccountant, "pld": pld.PLDAccountant}


def participations(steps, bands):
    """``⌈T / b⌉``: the most steps one unit can be in under cyclic sampling over ``b``
    groups."""
    return -(-int(steps) // int(bands))


def truncation_probability(num_units, sample_rate, bands, max_batch_size):
    """``p = P(Bin(N + 1, q/b) > B)``: an upper bound on the probability that one step's
    batch is truncated, for the plan's ``N`` units or a neighbour with one more (module
    docstring). Summed in log space over a window of ±40 standard deviations around the
    mean (the mass outside it is below ``e^{−700}``); a ``B`` above the window gives the
    Chernoff bound ``exp(−n·KL(B/n ‖ p))``."""
    n, p, cap = int(num_units) + 1, float(sample_rate) / int(bands), int(max_batch_size)
    if cap >= n:
        return 0.0
    if p >= 1:
        return 1.0
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    lo, hi = max(cap + 1, int(mean - 40 * sd) - 10), min(n, int(math.ceil(mean + 40 * sd)) + 10)
    if lo > hi:  # B far above the mean
        a = (cap + 1) / n
        kl = a * math.log(a / p) + (1 - a) * math.log((1 - a) / (1 - p)) if a < 1 else -math.log(p)
        return math.exp(-n * kl)
    k = np.arange(lo, hi + 1)
    lg = np.array([math.lgamma(x + 1) for x in k.tolist()])
    log_pmf = math.lgamma(n + 1) - lg - np.array([math.lgamma(n - x + 1) for x in k.tolist()]) \
        + k * math.log(p) + (n - k) * math.log1p(-p)
    top = float(np.max(log_pmf))
    return min(1.0, math.exp(top) * float(np.sum(np.exp(log_pmf - top))))


class BandMFAccountant:
    """The accountant of amplified BandMF (the module's docstring): :meth:`step` records
    the run's steps, and ε is the base accountant's for ``⌈T/b⌉`` Poisson-subsampled
    Gaussian steps with the same ``(σ, q)`` (plus the truncation's ``(1 + e^ε)·T·p`` in δ);
    jax_privacy's ``accounting.amplified_bandmf_event`` composed by ``dp_accounting``.

    Args:
      bands: ``b``.
      base: ``"pld"`` (default), ``"rdp"``, or an accountant class with the interface of
        :class:`cuvmap.dp.RDPAccountant` (``step``, ``get_epsilon``).
      truncation: ``None`` or ``(num_units, max_batch_size)``: the plan's ``N`` and ``B``.

    Example::

        acct = BandMFAccountant(4)
        acct.step(noise_multiplier=2.1, sample_rate=0.44, num_steps=500)
        acct.get_epsilon(1e-5)     # = PLDAccountant over 125 steps of (2.1, 0.44)
    """

    def __init__(self, bands, base="pld", *, truncation=None):
        if isinstance(bands, (bool, np.bool_)) or not isinstance(bands, (int, np.integer)) or bands < 1:
            raise ValueError(f"BandMFAccountant: bands must be a positive int, got {bands!r}")
        if isinstance(base, str):
            if base not in BASE_ACCOUNTANTS:
                raise ValueError(f"BandMFAccountant: base must be one of {sorted(BASE_ACCOUNTANTS)} or an accountant "
                                 f"class, got {base!r}")
            base = BASE_ACCOUNTANTS[base]
        self.bands, self.base_class, self.truncation = int(bands), base, truncation
        self.noise_multiplier = self.sample_rate = None
        self.steps = 0

    def step(self, noise_multiplier, sample_rate, num_steps=1):
        """Records ``num_steps`` steps of the run (``⌈T/b⌉`` is taken over all of them), all
        with one ``(σ, q)``."""
        if isinstance(num_steps, (bool, np.bool_)) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0:
            raise ValueError(f"BandMFAccountant.step: num_steps must be an int >= 0, got {num_steps!r}")
        if not noise_multiplier >= 0 or not 0 <= sample_rate <= 1:
            raise ValueError(f"BandMFAccountant.step: need noise_multiplier >= 0 and 0 <= sample_rate <= 1, got "
                             f"{noise_multiplier!r} and {sample_rate!r}")
        pair = (float(noise_multiplier), float(sample_rate))
        if self.steps and pair != (self.noise_multiplier, self.sample_rate):
            raise ValueError(f"BandMFAccountant.step: (σ, q) = {pair}, but the run so far had "
                             f"{(self.noise_multiplier, self.sample_rate)}: the amplified-BandMF accounting here is "
                             "stated for one (σ, q) over the run")
        self.noise_multiplier, self.sample_rate = pair
        self.steps += int(num_steps)

    def __len__(self):
        """The number of steps recorded (``T``)."""
        return self.steps

    @property
    def participations(self):
        """``⌈T / b⌉``."""
        return participations(self.steps, self.bands)

    def base(self):
        """A fresh base accountant that has composed ``⌈T/b⌉`` steps of ``(σ, q)``."""
        acct = self.base_class()
        if self.steps:
            acct.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate,
                      num_steps=self.participations)
        return acct

    def truncation_slack(self, epsilon):
        """``(1 + e^ε)·T·p``: what truncation adds to δ at ``ε`` (0 without truncation)."""
        if self.truncation is None or not self.steps:
            return 0.0
        p = truncation_probability(self.truncation[0], self.sample_rate, self.bands, self.truncation[1])
        return (1 + math.exp(min(epsilon, 700.0))) * self.steps * p

    def get_epsilon(self, delta):
        """ε of ``(ε, δ)``-DP for the recorded run: the base accountant's for ``⌈T/b⌉``
        steps; with truncation the least ε with ``ε ≥ ε_base(δ − (1 + e^ε)·T·p)`` (to a
        relative 1e-9, from above), found by iterating the right-hand side from
        ``ε_base(δ)`` (``inf`` when the climb leaves no room in δ)."""
        base = self.base()
        eps0 = base.get_epsilon(delta)
        if self.truncation is None or not self.steps:
            return eps0

        def required(eps):  # the ε the base accountant needs once truncation has taken its share of δ at eps
            room = delta - self.truncation_slack(eps)
            return base.get_epsilon(room) if room > 0 else math.inf

        # required() is increasing, so iterating it from below climbs to its least fixed point
        eps = eps0
        for _ in range(1000):
            nxt = required(eps)
            if nxt <= eps:
                return eps
            if nxt == math.inf:
                return math.inf
            bumped = nxt * (1 + 1e-9) + 1e-12
            if required(bumped) <= bumped:
                return bumped
            eps = nxt
        return math.inf

    def get_delta(self, epsilon):
        """δ at ``epsilon``: the base accountant's (it needs ``get_delta``, as
        :class:`cuvmap.dp.PLDAccountant` has) plus the truncation's slack."""
        base = self.base()
        if not hasattr(base, "get_delta"):
            raise ValueError(f"BandMFAccountant.get_delta: the base accountant {type(base).__name__} has no get_delta")
        return min(1.0, base.get_delta(epsilon) + self.truncation_slack(epsilon))


def epsilon(noise_multiplier, sample_rate, steps, bands, delta, accountant="pld", *, truncation=None):
    """ε of ``T = steps`` steps of amplified BandMF with ``b = bands`` (a
    :class:`BandMFAccountant` in one call)."""
    acct = BandMFAccountant(bands, accountant, truncation=truncation)
    acct.step(noise_multiplier, sample_rate, steps)
    return acct.get_epsilon(delta)


def calibrate_noise(target_epsilon, delta, sample_rate, steps, bands, accountant="pld", *, truncation=None,
                    rtol=1e-3):
    """The smallest ``σ`` with which ``steps`` steps of amplified BandMF over ``bands``
    groups with rate ``sample_rate`` are ``(target_epsilon, delta)``-DP:
    :func:`cuvmap.dp.calibrate_noise` over ``⌈T/b⌉`` steps, at ``δ − (1 + e^ε)·T·p`` with
    truncation (the slack at the target ε is fixed, so the target is met exactly when the
    base accountant meets it there).

    Example::

        sigma = calibrate_noise(1.0, 1e-5, 0.444, 500, 4)
    """
    if isinstance(accountant, str) and accountant not in BASE_ACCOUNTANTS:
        raise ValueError(f"calibrate_noise: accountant must be 'pld' or 'rdp', got {accountant!r}")
    acct = BandMFAccountant(bands, accountant, truncation=truncation)
    acct.step(0.0, sample_rate, steps)
    room = delta - acct.truncation_slack(float(target_epsilon))
    if not room > 0:
        raise ValueError(f"calibrate_noise: truncating at {truncation[1]} leaves no room in δ = {delta:g} at "
                         f"ε = {target_epsilon:g} (the truncation alone costs {acct.truncation_slack(target_epsilon):.3g}"
                         "): raise max_batch_size")
    return rdp_accounting.calibrate_noise(target_epsilon, room, sample_rate, acct.participations, accountant, rtol=rtol)
