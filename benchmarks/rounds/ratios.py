"""Ratios between two cases of a run, judged: the ratio of their medians, its confidence
interval and verdict from the rounds they shared (:mod:`benchmarks.rounds.stats`), and
whether it meets a target beyond the noise.

A suite declares its targets as data (``(name, numerator key, denominator key, "≤" or
"≥", value)``) and :func:`judge` turns two rows into the entry of its ratios table and of
its JSON.
"""
from benchmarks.rounds import stats as bstats


def compare_rows(num, den, args=None, paired=True):
    """``num / den`` of two rows' per-call times (``times_ms``), as a
    :class:`benchmarks.rounds.stats.Comparison`: paired by round (the rows were timed in
    the same interleaved rounds) or not; ``args`` gives ``--factor`` and ``--confidence``."""
    return bstats.compare_samples(num["times_ms"], den["times_ms"], paired=paired,
                                  confidence=getattr(args, "confidence", bstats.DEFAULT_CONFIDENCE),
                                  factor=getattr(args, "factor", bstats.DEFAULT_FACTOR))


def verdict_text(comparison):
    """The verdict of a :class:`~benchmarks.rounds.stats.Comparison` for a table (FAST and
    SLOW in bold), with ``?`` when unresolved."""
    return verdict_cell(comparison.as_dict())


def verdict_cell(c):
    """:func:`verdict_text` of a comparison as the JSON keeps it (a dict; "" for none)."""
    if not c:
        return ""
    return (f"**{c['verdict']}**" if c["verdict"] != bstats.SAME else c["verdict"]) + ("" if c["resolved"] else " ?")


def interval_text(c):
    """The interval of a comparison as the JSON keeps it (a dict), ``–`` when it has none."""
    if not c or c.get("ci_low") is None:
        return "–"
    return f"[{c['ci_low']:.3g}, {c['ci_high']:.3g}]"


def judge(name, num, den, args=None, cmp=None, target=None):
    """The ratio ``num / den`` of two rows (dicts with ``median_ms`` and ``times_ms``) timed in
    the same rounds: ``(cells, entry)``, the cells of a ratios table (value, interval,
    verdict, target, met) and the dict of the JSON. Without a target the ratio is for
    information."""
    c = compare_rows(num, den, args)
    value = num["median_ms"] / den["median_ms"]
    met = None if target is None else (value <= target if cmp == "≤" else value >= target)
    met_ci = None if target is None else bstats.target_met(c, cmp, target)
    cells = (value, c.interval(), verdict_text(c), "(for information)" if target is None else f"{cmp} {target:g}",
             met_ci or "")
    entry = dict(ratio=name, value=value, target=None if target is None else f"{cmp} {target:g}", met=met,
                 met_beyond_noise=met_ci, comparison=c.as_dict())
    return cells, entry


def not_measured(name, cmp, target, why="not measured"):
    """The cells and entry of a target whose rows did not run."""
    return (None, "–", "", f"{cmp} {target:g}", why), dict(ratio=name, value=None, target=f"{cmp} {target:g}", met=None)


def verdict_legend(args=None, memory=False):
    """The line under a ratios table that says what its verdicts and ``met`` mean."""
    factor = getattr(args, "factor", bstats.DEFAULT_FACTOR)
    return (f"- verdict: SLOW / FAST when the numerator is slower / faster than the denominator beyond the noise (the "
            f"interval above / below 1) by more than ×{factor:g}; SAME otherwise (? when the interval is too wide to "
            "tell); met: yes / no when the whole interval is on one side of the target"
            + (" (memory: one call, no interval)" if memory else ""))
