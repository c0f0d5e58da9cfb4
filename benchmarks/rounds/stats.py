"""Statistics of benchmark timings: the spread of one case, a ratio of two cases' times
with a distribution-free confidence interval, and the verdict FAST, SLOW or SAME.

Times are compared on the log scale, where a ratio of times is a shift: ``log a − log b``.
Nothing here assumes normal times (timings are skewed, with outliers and often two
modes), only that the noise is the same on both sides of a comparison.

**Spread** of one case (:func:`relative_spread`): the interquartile range over the median,
``(q75 − q25) / q50`` (quartiles by linear interpolation), the criterion of
torch.utils.benchmark's ``adaptive_autorange`` and of its IQR warning. It measures the
noise of single calls, so more repeats estimate it better but do not shrink it.

**Paired samples** (:func:`compare_paired`): interleaved rounds time ``a_i`` and ``b_i``
in the same round ``i``, so that a change of the machine's load hits both. With
``d_i = log a_i − log b_i`` (n rounds), the ratio ``a / b`` is ``exp`` of the
Hodges–Lehmann estimate, the median of the ``M = n(n+1)/2`` Walsh averages
``(d_i + d_j) / 2, i ≤ j``; its confidence interval is ``[W_(c), W_(M+1−c)]`` of the sorted
Walsh averages, where ``c`` is the largest count with ``P(T ≤ c − 1) ≤ α/2`` for ``T`` the
Wilcoxon signed-rank statistic when there is no difference (its distribution is exact
for n ≤ 100, the coefficients of ``∏_{i≤n} (1 + q^i) / 2``; normal beyond). The interval
assumes the ``d_i`` symmetric about the shift; a 95 % one needs n ≥ 6 rounds (with fewer
it is unbounded and the verdict SAME).

**Unpaired samples** (:func:`compare_unpaired`): two runs (two JSON files) share no
rounds. The ratio ``head / base`` is ``exp`` of the two-sample Hodges–Lehmann shift, the
median of the ``m·n`` differences ``log head_j − log base_i``; its interval is
``[D_(c), D_(mn+1−c)]`` with ``c`` from the Mann–Whitney statistic ``U`` (exact for
``m·n ≤ 2500`` by the recursion ``P_{m,n}(u) = m/(m+n) P_{m−1,n}(u − n) + n/(m+n) P_{m,n−1}(u)``,
normal beyond). A 95 % interval needs 4 calls on each side.

**Verdict** (:func:`verdict`) of a ratio ``r`` with interval ``[lo, hi]`` and threshold
``factor`` ``f ≥ 1`` (asv's ``-f``; 1.05 by default):

- SLOW when ``lo > 1`` and ``r ≥ f``: slower beyond the noise, and by at least ``f``;
- FAST when ``hi < 1`` and ``r ≤ 1/f``;
- SAME otherwise. A SAME whose interval still reaches past ``f`` or ``1/f`` is
  *unresolved* (the note says so): the noise hides a change of that size, and more
  rounds (or a quieter machine) would tell.

The interval and the verdict are about the typical call (the location shift of the log
times), not the mean: a rare very slow call moves neither.
"""
import math
import statistics
from functools import lru_cache

import numpy as np

SLOW, FAST, SAME = "SLOW", "FAST", "SAME"
DEFAULT_FACTOR = 1.05
DEFAULT_CONFIDENCE = 0.95
EXACT_SIGNED_RANK_MAX_N = 100      # signed-rank distribution exact up to this many pairs
EXACT_RANK_SUM_MAX_MN = 2500       # Mann–Whitney distribution exact up to m·n this large


# ---------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------


def quartiles(times):
    """``(q25, q50, q75)`` of ``times`` by linear interpolation (NumPy's default)."""
    q = np.percentile(np.asarray(times, dtype=np.float64), [25, 50, 75])
    return float(q[0]), float(q[1]), float(q[2])


def relative_spread(times):
    """``IQR / median`` of ``times``; NaN for fewer than 2 values (unknown)."""
    if len(times) < 2:
        return math.nan
    q25, q50, q75 = quartiles(times)
    return (q75 - q25) / q50 if q50 > 0 else math.inf


# ---------------------------------------------------------------------------------------
# Null distributions and critical counts
# ---------------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def signed_rank_null(n):
    """``P(T = t)``, ``t = 0 .. n(n+1)/2``, of the Wilcoxon signed-rank statistic of ``n``
    pairs with no difference: the coefficients of ``∏_{i=1..n} (1 + q^i) / 2``."""
    p = np.ones(1)
    for i in range(1, n + 1):
        q = np.zeros(len(p) + i)
        q[:len(p)] += p
        q[i:] += p
        p = q / 2.0
    p.setflags(write=False)
    return p


@lru_cache(maxsize=256)
def rank_sum_null(m, n):
    """``P(U = u)``, ``u = 0 .. m·n``, of the Mann–Whitney statistic of samples of sizes
    ``m`` and ``n`` with no difference (the recursion in the module's docstring)."""
    # row[j] holds P_{i, j} for the current i
    row = [np.ones(1) for _ in range(n + 1)]  # i = 0: U = 0 surely
    for i in range(1, m + 1):
        new = [np.ones(1)]  # j = 0
        for j in range(1, n + 1):
            p = np.zeros(i * j + 1)
            a, b = row[j], new[j - 1]  # P_{i-1, j} shifted by j; P_{i, j-1}
            p[j:j + len(a)] += a * (i / (i + j))
            p[:len(b)] += b * (j / (i + j))
            new.append(p)
        row = new
    p = row[n]
    p.setflags(write=False)
    return p


def _z(confidence):
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)


def _critical_from_pmf(pmf, alpha):
    """The largest ``c`` with ``P(T ≤ c − 1) ≤ alpha / 2`` (0 when even ``P(T ≤ 0)`` is larger)."""
    cdf = np.cumsum(pmf)
    return int(np.searchsorted(cdf, alpha / 2.0 * (1 + 1e-9), side="right"))


def _critical_normal(mean, var, alpha, confidence):
    c = math.floor(mean - _z(confidence) * math.sqrt(var) + 0.5)
    return max(0, c)


def signed_rank_critical(n, confidence=DEFAULT_CONFIDENCE, exact=None):
    """``c`` for a paired interval of ``n`` pairs: ``[W_(c), W_(M+1−c)]`` of the sorted Walsh
    averages covers the shift with probability ≥ ``confidence`` (0: no finite interval).
    ``exact``: force the exact distribution (True) or the normal approximation (False)."""
    alpha = 1.0 - confidence
    if exact is None:
        exact = n <= EXACT_SIGNED_RANK_MAX_N
    if exact:
        return _critical_from_pmf(signed_rank_null(n), alpha)
    return _critical_normal(n * (n + 1) / 4.0, n * (n + 1) * (2 * n + 1) / 24.0, alpha, confidence)


def rank_sum_critical(m, n, confidence=DEFAULT_CONFIDENCE, exact=None):
    """``c`` for an unpaired interval from samples of sizes ``m`` and ``n``:
    ``[D_(c), D_(mn+1−c)]`` of the sorted differences (0: no finite interval)."""
    alpha = 1.0 - confidence
    if exact is None:
        exact = m * n <= EXACT_RANK_SUM_MAX_MN
    if exact:
        return _critical_from_pmf(rank_sum_null(min(m, n), max(m, n)), alpha)
    return _critical_normal(m * n / 2.0, m * n * (m + n + 1) / 12.0, alpha, confidence)


# ---------------------------------------------------------------------------------------
# Ratios with intervals, and verdicts
# ---------------------------------------------------------------------------------------


class Comparison:
    """The ratio of two cases' times (``numerator / denominator``), its confidence interval
    ``[low, high]`` (``±inf`` when the samples are too small for one), the verdict and a
    note (why SAME is unresolved, or why there is no interval)."""

    def __init__(self, ratio, low, high, *, paired, n, confidence, factor, note=None):
        self.ratio, self.low, self.high = ratio, low, high
        self.paired, self.n, self.confidence, self.factor = paired, n, confidence, factor
        self.verdict, why = verdict(ratio, low, high, factor)
        self.note = note or why

    @property
    def resolved(self):
        """Whether the interval lies on one side of ``factor`` and of ``1 / factor``: the
        data tell a change of that size from none."""
        return self.verdict != SAME or (self.low > 1.0 / self.factor and self.high < self.factor)

    def interval(self, digits=3):
        """The interval as text, e.g. ``[1.02, 1.09]`` (``–`` when unbounded)."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "–"
        return f"[{self.low:.{digits}g}, {self.high:.{digits}g}]"

    def as_dict(self):
        finite = math.isfinite(self.low) and math.isfinite(self.high)
        return dict(ratio=self.ratio, ci_low=self.low if finite else None, ci_high=self.high if finite else None,
                    confidence=self.confidence, verdict=self.verdict, resolved=self.resolved, paired=self.paired,
                    n=self.n, factor=self.factor, note=self.note)

    def __repr__(self):
        return (f"Comparison({self.verdict}, ratio {self.ratio:.4g}, {self.confidence:.0%} CI {self.interval(4)}, "
                f"{'paired' if self.paired else 'unpaired'}, n={self.n})")


def verdict(ratio, low, high, factor=DEFAULT_FACTOR):
    """``(verdict, note)`` of a ratio (numerator / denominator) with interval ``[low, high]``:
    SLOW, FAST or SAME (the module's docstring); the note says why a SAME is unresolved."""
    if not math.isfinite(ratio):
        return SAME, "no estimate"
    if low > 1.0 and ratio >= factor:
        return SLOW, None
    if high < 1.0 and ratio <= 1.0 / factor:
        return FAST, None
    if not (math.isfinite(low) and math.isfinite(high)):
        return SAME, "unresolved: too few calls for an interval"
    if low > 1.0 or high < 1.0:
        return SAME, f"a difference beyond the noise, under ×{factor:g} by its estimate"
    if high >= factor or low <= 1.0 / factor:
        return SAME, f"unresolved: the interval reaches past ×{factor:g} or ×{1 / factor:.3g}"
    return SAME, None


def _logs(times):
    t = np.asarray(times, dtype=np.float64)
    return np.log(np.maximum(t, 1e-300))


def compare_paired(num, den, *, confidence=DEFAULT_CONFIDENCE, factor=DEFAULT_FACTOR):
    """The ratio ``num / den`` of two cases timed in the same rounds (``num[i]`` and
    ``den[i]`` from round ``i``; the rounds both took part in, the common prefix), with
    the Hodges–Lehmann estimate and the signed-rank interval (the module's docstring)."""
    n = min(len(num), len(den))
    if n == 0:
        return Comparison(math.nan, -math.inf, math.inf, paired=True, n=0, confidence=confidence, factor=factor,
                          note="no common rounds")
    d = _logs(num[:n]) - _logs(den[:n])
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2.0)
    ratio = math.exp(float(np.median(walsh)))
    c = signed_rank_critical(n, confidence)
    if c == 0:
        return Comparison(ratio, -math.inf, math.inf, paired=True, n=n, confidence=confidence, factor=factor)
    m = len(walsh)
    return Comparison(ratio, math.exp(walsh[c - 1]), math.exp(walsh[m - c]), paired=True, n=n,
                      confidence=confidence, factor=factor)


def compare_unpaired(num, den, *, confidence=DEFAULT_CONFIDENCE, factor=DEFAULT_FACTOR):
    """The ratio ``num / den`` of two independent samples (e.g. HEAD's times over BASE's),
    with the two-sample Hodges–Lehmann estimate and the Mann–Whitney interval."""
    m, n = len(num), len(den)
    if m == 0 or n == 0:
        return Comparison(math.nan, -math.inf, math.inf, paired=False, n=min(m, n), confidence=confidence,
                          factor=factor, note="an empty sample")
    diffs = np.sort((_logs(num)[:, None] - _logs(den)[None, :]).ravel())
    ratio = math.exp(float(np.median(diffs)))
    c = rank_sum_critical(m, n, confidence)
    if c == 0:
        return Comparison(ratio, -math.inf, math.inf, paired=False, n=min(m, n), confidence=confidence,
                          factor=factor)
    return Comparison(ratio, math.exp(diffs[c - 1]), math.exp(diffs[m * n - c]), paired=False, n=min(m, n),
                      confidence=confidence, factor=factor)


def compare_samples(num, den, *, paired, confidence=DEFAULT_CONFIDENCE, factor=DEFAULT_FACTOR):
    """:func:`compare_paired` or :func:`compare_unpaired`."""
    f = compare_paired if paired else compare_unpaired
    return f(num, den, confidence=confidence, factor=factor)


def target_met(comparison, cmp, target):
    """Whether a ratio meets a target ``ratio cmp target`` (``cmp`` is ``≤`` or ``≥``)
    beyond the noise: ``yes`` when the whole interval does, ``no`` when none of it does,
    ``unresolved (estimate: yes|no)`` when the interval straddles the target."""
    lo, hi, r = comparison.low, comparison.high, comparison.ratio
    if not math.isfinite(r):
        return "not measured"
    ok = (lambda v: v <= target) if cmp == "≤" else (lambda v: v >= target)
    if ok(lo) and ok(hi):
        return "yes"
    if not ok(lo) and not ok(hi):
        return "no"
    return f"unresolved (estimate: {'yes' if ok(r) else 'no'})"
