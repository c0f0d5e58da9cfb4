"""The benchmark harness's statistics and verdicts (benchmarks/rounds/: stats.py, runner.py,
timers.py; benchmarks/report/compare.py, benchmarks/suites/selfcheck.py), on synthetic timings with known answers: exact null
distributions against their closed forms, critical values against the published tables,
Hodges–Lehmann estimates worked by hand, verdicts of known shifts under known noise,
the runner on a scripted timer and clock, ``compare`` on JSON files written here, the
self-check on fixed-length waits, and the GPU timers on a fake CuPy. Nothing here
depends on the machine's speed; the whole file runs in a few seconds.
"""
import json
import math
import os
import sys
import zlib
from math import comb

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file
if ROOT not in sys.path:  # `pytest` run from elsewhere: the benchmarks package lives at the root
    sys.path.insert(0, ROOT)

from benchmarks.cli import main as cli_main  # noqa: E402
from benchmarks.report import compare  # noqa: E402
from benchmarks.rounds import peaks, runner, stats, timers  # noqa: E402

# ---------------------------------------------------------------------------------------
# Null distributions and critical counts
# ---------------------------------------------------------------------------------------

# n: counts of T = 0, 1, ... (subsets of {1..n} by their sum), out of 2**n
SIGNED_RANK_COUNTS = [
    (1, [1, 1]),
    (2, [1, 1, 1, 1]),
    (3, [1, 1, 1, 2, 1, 1, 1]),
    (4, [1, 1, 1, 2, 2, 2, 2, 2, 1, 1, 1]),
]

# (m, n): counts of U = 0, 1, ... (the Gaussian binomial [m+n choose m]_q), out of C(m+n, m)
RANK_SUM_COUNTS = [
    ((1, 1), [1, 1]),
    ((2, 2), [1, 1, 2, 1, 1]),
    ((2, 3), [1, 1, 2, 2, 2, 1, 1]),
    ((3, 3), [1, 1, 2, 3, 3, 3, 3, 2, 1, 1]),
]


@pytest.mark.parametrize("n, counts", SIGNED_RANK_COUNTS)
def test_signed_rank_null_is_the_subset_sum_count(n, counts):
    np.testing.assert_allclose(stats.signed_rank_null(n) * 2 ** n, counts)


@pytest.mark.parametrize("mn, counts", RANK_SUM_COUNTS)
def test_rank_sum_null_is_the_gaussian_binomial(mn, counts):
    m, n = mn
    np.testing.assert_allclose(stats.rank_sum_null(m, n) * comb(m + n, m), counts)
    np.testing.assert_allclose(stats.rank_sum_null(n, m) * comb(m + n, m), counts)


def test_null_distributions_are_symmetric_and_sum_to_one():
    for p in (stats.signed_rank_null(37), stats.rank_sum_null(9, 14)):
        assert p.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(p, p[::-1], atol=1e-15)


# published two-sided critical values (reject when T ≤ t, or U ≤ u); our c is t + 1
# (the interval's rank), 0 where no test at that level exists
SIGNED_RANK_CRITICAL = [  # n, confidence, t (None: none)
    (5, 0.95, None), (6, 0.95, 0), (7, 0.95, 2), (8, 0.95, 3), (10, 0.95, 8), (15, 0.95, 25), (20, 0.95, 52),
    (30, 0.95, 137), (10, 0.99, 3), (20, 0.99, 37),
]
RANK_SUM_CRITICAL = [  # m, n, confidence, u (None: none)
    (3, 3, 0.95, None), (4, 4, 0.95, 0), (5, 5, 0.95, 2), (6, 6, 0.95, 5), (8, 8, 0.95, 13), (10, 10, 0.95, 23),
    (5, 10, 0.95, 8), (20, 20, 0.95, 127), (10, 10, 0.99, 16),
]


@pytest.mark.parametrize("n, confidence, t", SIGNED_RANK_CRITICAL)
def test_signed_rank_critical_values_match_the_tables(n, confidence, t):
    assert stats.signed_rank_critical(n, confidence) == (0 if t is None else t + 1)


@pytest.mark.parametrize("m, n, confidence, u", RANK_SUM_CRITICAL)
def test_rank_sum_critical_values_match_the_tables(m, n, confidence, u):
    assert stats.rank_sum_critical(m, n, confidence) == (0 if u is None else u + 1)
    assert stats.rank_sum_critical(n, m, confidence) == (0 if u is None else u + 1)


def test_normal_approximations_agree_with_the_exact_counts():
    for n in (40, 100):
        assert abs(stats.signed_rank_critical(n, exact=True) - stats.signed_rank_critical(n, exact=False)) <= 1
    for m, n in ((30, 30), (50, 50), (20, 60)):
        assert abs(stats.rank_sum_critical(m, n, exact=True) - stats.rank_sum_critical(m, n, exact=False)) <= 1


# ---------------------------------------------------------------------------------------
# Estimates and intervals worked by hand
# ---------------------------------------------------------------------------------------


def test_paired_estimate_is_the_median_of_walsh_averages():
    # d = 1, 2, 3: Walsh averages 1, 1.5, 2, 2, 2.5, 3 → median 2; 3 pairs give no 95 % interval
    c = stats.compare_paired(np.exp([1.0, 2.0, 3.0]), np.ones(3))
    assert c.ratio == pytest.approx(math.e ** 2) and c.paired and c.n == 3
    assert c.low == -math.inf and c.high == math.inf
    assert c.verdict == "SAME" and "too few calls" in c.note and c.interval() == "–"


def test_paired_interval_of_six_pairs_is_their_range():
    # n = 6 at 95 %: c = 1, the interval is [smallest, largest] Walsh average = [min d, max d]
    d = np.array([0.05, 0.08, 0.10, 0.11, 0.12, 0.20])
    c = stats.compare_paired(np.exp(d) * 3.0, np.full(6, 3.0))
    assert c.low == pytest.approx(math.exp(0.05)) and c.high == pytest.approx(math.exp(0.20))
    assert c.verdict == "SLOW"


def test_unpaired_estimate_is_the_median_of_all_differences():
    # logs: base 0, 1; head 2, 4 → differences 2, 1, 4, 3 → median 2.5
    c = stats.compare_unpaired(np.exp([2.0, 4.0]), np.exp([0.0, 1.0]))
    assert c.ratio == pytest.approx(math.exp(2.5)) and not c.paired
    # 4 against 4 at 95 %: c = 1, the interval is [min, max] of the 16 differences
    c = stats.compare_unpaired(np.exp([2.0, 2.1, 2.2, 2.3]), np.exp([0.0, 0.1, 0.2, 0.3]))
    assert c.low == pytest.approx(math.exp(1.7)) and c.high == pytest.approx(math.exp(2.3))
    assert c.ratio == pytest.approx(math.exp(2.0))


VERDICTS = [  # ratio, low, high, verdict, resolved, words in the note
    (1.10, 1.03, 1.17, "SLOW", True, None),
    (0.90, 0.85, 0.95, "FAST", True, None),
    (1.06, 1.0, 1.10, "SAME", False, "unresolved"),        # the interval touches 1
    (1.08, 0.97, 1.20, "SAME", False, "unresolved"),
    (1.04, 1.01, 1.07, "SAME", False, "beyond the noise"),  # real, smaller than the factor
    (1.02, 1.01, 1.03, "SAME", True, "beyond the noise"),
    (1.00, 0.98, 1.02, "SAME", True, None),
    (0.97, 0.96, 0.99, "SAME", True, "beyond the noise"),
    (1.30, -math.inf, math.inf, "SAME", False, "too few calls"),
    (1.05, 1.01, 1.09, "SLOW", True, None),                 # exactly the factor counts
]


@pytest.mark.parametrize("ratio, low, high, verdict, resolved, words", VERDICTS)
def test_verdicts(ratio, low, high, verdict, resolved, words):
    c = stats.Comparison(ratio, low, high, paired=True, n=10, confidence=0.95, factor=1.05)
    assert c.verdict == verdict and c.resolved == resolved
    assert (c.note is None) if words is None else (words in c.note)
    assert c.as_dict()["verdict"] == verdict


TARGETS = [  # ratio, low, high, cmp, target, met
    (1.2, 1.1, 1.3, "≤", 1.5, "yes"),
    (1.6, 1.55, 1.7, "≤", 1.5, "no"),
    (1.4, 1.3, 1.6, "≤", 1.5, "unresolved (estimate: yes)"),
    (5.5, 5.1, 6.0, "≥", 5.0, "yes"),
    (4.9, 4.5, 5.2, "≥", 5.0, "unresolved (estimate: no)"),
    (1.2, -math.inf, math.inf, "≤", 1.5, "unresolved (estimate: yes)"),
]


@pytest.mark.parametrize("ratio, low, high, cmp, target, met", TARGETS)
def test_targets_met_beyond_the_noise(ratio, low, high, cmp, target, met):
    c = stats.Comparison(ratio, low, high, paired=True, n=10, confidence=0.95, factor=1.05)
    assert stats.target_met(c, cmp, target) == met


SPREADS = [([1, 2, 3, 4, 5], 2 / 3), ([2, 2, 2], 0.0), ([1, 3], 0.5), ([5], math.nan), ([], math.nan)]


@pytest.mark.parametrize("times, spread", SPREADS)
def test_relative_spread_is_iqr_over_median(times, spread):
    got = stats.relative_spread(times)
    assert (math.isnan(got) and math.isnan(spread)) or got == pytest.approx(spread)


# ---------------------------------------------------------------------------------------
# Verdicts on synthetic timings with known shifts
# ---------------------------------------------------------------------------------------


def _sample(rng, n, sigma, scale=1.0, outliers=0.0, modes=None):
    """``n`` lognormal times around ``scale`` (relative noise ``sigma``); a fraction
    ``outliers`` of them 10× slower; ``modes``: (fraction, factor) of a second mode."""
    t = scale * np.exp(rng.normal(0.0, sigma, n))
    if outliers:
        t[rng.random(n) < outliers] *= 10.0
    if modes:
        frac, factor = modes
        t[rng.random(n) < frac] *= factor
    return t


SCENARIOS = [  # name, n, sigma, head / base, extra, verdict
    ("identical", 20, 0.05, 1.00, {}, "SAME"),
    ("10% slower", 20, 0.05, 1.10, {}, "SLOW"),
    ("10% faster", 20, 0.05, 0.90, {}, "FAST"),
    ("2% slower (under the factor)", 20, 0.01, 1.02, {}, "SAME"),
    ("10% slower, drowned in noise", 5, 0.5, 1.10, {}, "SAME"),
    ("10% slower, 10% outliers", 30, 0.03, 1.10, dict(outliers=0.1), "SLOW"),
    ("identical, 10% outliers", 30, 0.03, 1.00, dict(outliers=0.1), "SAME"),
    ("identical, bimodal", 40, 0.02, 1.00, dict(modes=(0.3, 2.0)), "SAME"),
]


@pytest.mark.parametrize("name, n, sigma, shift, extra, verdict", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_unpaired_verdicts_of_known_shifts(name, n, sigma, shift, extra, verdict):
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # a seed per scenario, the same in every process
    base = _sample(rng, n, sigma, 1.0, **extra)
    head = _sample(rng, n, sigma, shift, **extra)
    assert stats.compare_unpaired(head, base).verdict == verdict


def test_pairs_see_through_a_drift_that_hides_the_difference_from_independent_samples():
    """Interleaved rounds: a load that changes from round to round (×0.6–1.6) hits both
    cases of a round; their ratio (1.1) is resolved from the pairs, not from the samples."""
    rng = np.random.default_rng(7)
    drift = np.exp(rng.uniform(-0.5, 0.5, 15))
    den = drift * np.exp(rng.normal(0, 0.01, 15))
    num = 1.1 * drift * np.exp(rng.normal(0, 0.01, 15))
    paired = stats.compare_paired(num, den)
    unpaired = stats.compare_unpaired(num, den)
    assert paired.verdict == "SLOW" and paired.low > 1.05 and paired.high < 1.15
    assert unpaired.verdict == "SAME" and not unpaired.resolved


def test_false_slow_rate_detection_rate_and_coverage():
    """Over many synthetic experiments: identical cases are called SLOW at most as often as
    the interval's level allows (2.5 %), a 10 % slowdown under 3 % noise is found, and the
    paired interval covers the true ratio about 95 % of the time."""
    rng = np.random.default_rng(2024)
    trials = 300
    false_slow = detected = covered = 0
    for _ in range(trials):
        base = _sample(rng, 15, 0.1, outliers=0.05)
        same = _sample(rng, 15, 0.1, outliers=0.05)
        false_slow += stats.compare_unpaired(same, base).verdict == "SLOW"
        detected += stats.compare_unpaired(_sample(rng, 15, 0.03, 1.1), _sample(rng, 15, 0.03)).verdict == "SLOW"
        den = _sample(rng, 12, 0.05)
        c = stats.compare_paired(1.07 * den * np.exp(rng.normal(0, 0.03, 12)), den)
        covered += c.low <= 1.07 <= c.high
    assert false_slow / trials <= 0.03
    assert detected / trials >= 0.95
    assert 0.90 <= covered / trials <= 0.99


# ---------------------------------------------------------------------------------------
# The runner, on a scripted timer and clock
# ---------------------------------------------------------------------------------------


class Script:
    """A fake timer: each case's calls take the next of its scripted times (cycled);
    ``clock`` advances by each time returned; ``calls`` records the order."""

    def __init__(self, times):
        self.times = {k: list(v) for k, v in times.items()}
        self.i = {k: 0 for k in times}
        self.now = 0.0
        self.calls = []

    def case(self, key, **kw):
        def time_one(fn):
            fn()
            seq = self.times[key]
            t = seq[self.i[key] % len(seq)]
            self.i[key] += 1
            self.now += t
            return t

        return runner.Case(key, f"case {key}", lambda: self.calls.append(key), timers.Timer("script", time_one), **kw)

    def clock(self):
        return self.now


RUNNER = [  # policy kwargs, scripted times, max_rounds, expected rounds per case, noisy cases
    # steady cases: the minimum of rounds
    (dict(repeats=5, max_spread=0.05, max_repeats=50), {"a": [1.0], "b": [2.0]}, {}, {"a": 5, "b": 5}, set()),
    # a case that never settles: up to max_repeats, then flagged
    (dict(repeats=5, max_spread=0.05, max_repeats=12, max_seconds=1e3), {"a": [1.0], "b": [1.0, 2.0]}, {},
     {"a": 12, "b": 12},
     {"b"}),
    # fixed rounds (no target): exactly repeats, flagged against the default target
    (dict(repeats=3, max_spread=None, max_repeats=50), {"a": [1.0, 2.0]}, {}, {"a": 3}, {"a"}),
    # the time budget: rounds of 1.5 and 2.5 s; after round 4 (8 s) the next would end past 9 s
    (dict(repeats=2, max_spread=0.05, max_repeats=50, max_seconds=9.0), {"a": [1.0], "b": [0.5, 1.5]}, {},
     {"a": 4, "b": 4}, {"b"}),
    # a noisy case limited to 3 rounds leaves them, and no longer keeps the others going
    (dict(repeats=2, max_spread=0.05, max_repeats=50), {"a": [1.0], "b": [1.0, 3.0]}, {"b": 3}, {"a": 3, "b": 3},
     {"b"}),
]


@pytest.mark.parametrize("policy, times, limited, rounds, noisy", RUNNER)
def test_runner_rounds(policy, times, limited, rounds, noisy):
    script = Script(times)
    cases = [script.case(k, max_rounds=limited.get(k)) for k in times]
    got, notes = runner.timed_rounds(cases, runner.Policy(**policy), clock=script.clock)
    assert {k: len(v) for k, v in got.items()} == rounds
    flagged = {k for k, v in got.items()
               if runner.Stats(v, 0.0, "script", 1, max_spread=policy["max_spread"]).noisy}
    assert flagged == noisy


def test_rounds_rotate_the_order_of_the_cases():
    script = Script({"a": [1.0], "b": [1.0], "c": [1.0]})
    cases = [script.case(k) for k in "abc"]
    runner.timed_rounds(cases, runner.Policy.fixed(4), clock=script.clock)
    assert "".join(script.calls) == "abc" + "bca" + "cab" + "abc"


def test_measure_with_a_policy_times_until_the_spread_is_met():
    seq = iter([9.0] + [1.0, 1.5] * 3 + [1.0] * 40)  # first call, then noisy, then steady

    def time_one(fn):
        fn()
        return next(seq)

    st = runner.measure(lambda: None, repeats=3, warmup=1, timer=("fake", time_one),
                        policy=runner.Policy(max_spread=0.05, max_repeats=100))
    assert st.first == 9.0 and 6 < len(st.times) < 40 and st.spread <= 0.05 and not st.noisy


PARSE = [(["vmap=0.1"], {"vmap": 0.1}), (["a=b=0.2", "x=1"], {"a=b": 0.2, "x": 1.0}), ([], {})]


@pytest.mark.parametrize("items, parsed", PARSE)
def test_parse_injections(items, parsed):
    assert runner.parse_injections(items) == parsed


def test_parse_injections_rejects_a_missing_fraction():
    with pytest.raises(ValueError, match="CASE=FRACTION"):
        runner.parse_injections(["vmap"])


def test_an_injected_slowdown_adds_its_fraction_of_the_case_time():
    from benchmarks.suites.selfcheck import Simulated

    sim = Simulated(sigma=0.0, outliers=0.0)
    case = runner.Case("w", "simulated 2 ms", sim.case(0.002), sim.timer())
    policy = runner.Policy(repeats=5, max_spread=None, inject={"simulated 2 ms": 0.5})
    times, notes = runner.timed_rounds([case], policy)
    np.testing.assert_allclose(times["w"], 0.003)
    assert "INJECTED SLOWDOWN: +50%" in notes["w"][0] and policy.unmatched() == []
    assert runner.Policy(inject={"nothing": 0.1}).unmatched() == ["nothing"]
    # on the CPU the wait is a busy loop of the wall clock
    assert timers.cpu_timer().time_one(lambda: timers.slowed(lambda: None, 0.002, timers.cpu_timer())()) >= 0.002


# ---------------------------------------------------------------------------------------
# compare: two JSON files written here
# ---------------------------------------------------------------------------------------


def _results(suite, cases, settings=None):
    """A results dict: ``cases`` is ``{(network, batch, key): times_ms}``, plus a nested table."""
    rows = [dict(network=net, batch=b, key=k, method=f"method {k}", times_ms=list(t))
            for (net, b, k), t in cases.items()]
    return dict(suite=suite, settings=settings or {"numpy": "2.0"}, rows=rows,
                gemm=dict(before=dict(times_ms=[5.0, 5.1, 5.0, 4.9, 5.0, 5.05])),
                ratios=[dict(ratio="not a case", times_ms=[1.0])])


def _write(tmp_path, name, results):
    path = tmp_path / name
    path.write_text(json.dumps(results))
    return str(path)


def _steady(scale, n=10, seed=0):
    rng = np.random.default_rng(seed)
    return list(scale * np.exp(rng.normal(0, 0.01, n)))


def test_compare_reports_a_slow_case_and_exits_1(capsys, tmp_path):
    base = _results("dp", {("mlp", 32, "ghost"): _steady(10.0, seed=1), ("mlp", 32, "batched"): _steady(8.0, seed=2),
                           ("cnn", 32, "ghost"): _steady(20.0, seed=3)})
    head = _results("dp", {("mlp", 32, "ghost"): _steady(11.0, seed=4), ("mlp", 32, "batched"): _steady(8.0, seed=5),
                           ("mlp", 128, "ghost"): _steady(30.0, seed=6)}, settings={"numpy": "2.1"})
    status = cli_main(["compare", _write(tmp_path, "base.json", base), _write(tmp_path, "head.json", head),
                       "--json", str(tmp_path / "report.json")])
    out = capsys.readouterr().out
    assert status == 1
    report = json.loads((tmp_path / "report.json").read_text())
    verdicts = {r["case"]: r["verdict"] for r in report["rows"]}
    assert verdicts == {"network mlp · batch 32: method ghost": "SLOW", "network mlp · batch 32: method batched": "SAME",
                        "gemm · before": "SAME"}
    assert report["only_base"] == ["network cnn · batch 32: method ghost"]
    assert report["only_head"] == ["network mlp · batch 128: method ghost"]
    assert "| numpy | 2.0 | 2.1 |" in out and "**SLOW**" in out and "3 cases: 1 SLOW, 0 FAST, 2 SAME" in out


def test_compare_of_a_run_with_itself_is_all_same(capsys, tmp_path):
    base = _results("dp", {("mlp", 32, "ghost"): _steady(10.0)})
    path = _write(tmp_path, "base.json", base)
    assert cli_main(["compare", path, path]) == 0
    assert "2 cases: 0 SLOW, 0 FAST, 2 SAME" in capsys.readouterr().out


@pytest.mark.parametrize("head, words", [
    (_results("per_example", {("mlp", 32, "ghost"): [1.0] * 5}), "different suites"),
    (dict(suite="dp", rows=[dict(key="x", median_ms=1.0)]), "no case in common"),
])
def test_compare_exits_2_when_the_files_cannot_be_compared(capsys, tmp_path, head, words):
    base = _results("dp", {("mlp", 32, "ghost"): [1.0] * 5})
    base.pop("gemm")
    assert cli_main(["compare", _write(tmp_path, "b.json", base), _write(tmp_path, "h.json", head)]) == 2
    assert words in capsys.readouterr().out


def test_compare_finds_nested_cases_and_flags_a_run_wide_drift(capsys, tmp_path):
    """The conv suite's cases sit in tables of dicts; when every case moved alike the
    report says the machine changed."""
    def conv(scale):
        return dict(suite="conv", tables=dict(gflops=[
            dict(layer=f"conv{i}", batch=32, op="forward", im2col=dict(times_ms=_steady(scale * i, seed=i)),
                 oneDNN=dict(times_ms=_steady(scale * i / 2, seed=10 + i))) for i in (1, 2)]))

    status = cli_main(["compare", _write(tmp_path, "b.json", conv(1.0)), _write(tmp_path, "h.json", conv(0.8))])
    out = capsys.readouterr().out
    assert status == 0  # faster is not a failure
    assert "tables · gflops · layer conv2 · batch 32 · op forward · im2col" in out
    assert "4 cases: 0 SLOW, 4 FAST" in out and "every case moved" in out


def _rounds(machine, slow_ghost, seed, n=12):
    """dp-like rows timed in n interleaved rounds: every round's load ×0.7–1.4 hits all
    cases alike; the whole machine ×``machine``; ghost ×``slow_ghost``."""
    rng = np.random.default_rng(seed)
    load = machine * np.exp(rng.uniform(-0.35, 0.35, n))
    cases = {}
    for key, ms in (("batched", 10.0), ("ghost", 12.0), ("jit_batched", 8.0)):
        factor = slow_ghost if key == "ghost" else 1.0
        cases[("mlp", 32, key)] = list(ms * factor * load * np.exp(rng.normal(0, 0.01, n)))
    return _results("dp", cases)


@pytest.mark.parametrize("slow_ghost, status, verdicts", [
    (1.10, 1, {"batched": "REF", "ghost": "SLOW", "jit_batched": "SAME"}),
    (1.00, 0, {"batched": "REF", "ghost": "SAME", "jit_batched": "SAME"}),
])
def test_compare_relative_to_a_case_cancels_a_slower_machine(capsys, tmp_path, slow_ghost, status, verdicts):
    """The head run's machine is 1.5× slower throughout: by their times every case is
    SLOW; by their per-round ratios to `batched` only a slowed ghost is."""
    base = _write(tmp_path, "b.json", _rounds(1.0, 1.0, seed=1))
    head = _write(tmp_path, "h.json", _rounds(1.5, slow_ghost, seed=2))
    assert cli_main(["compare", base, head]) == 1
    assert "every case moved" in capsys.readouterr().out
    report = tmp_path / "r.json"
    assert cli_main(["compare", base, head, "--relative-to", "batched", "--json", str(report)]) == status
    rows = json.loads(report.read_text())["rows"]
    got = {r["identity"][-1][1]: r["verdict"] for r in rows if r["identity"][0][0] == "network"}
    assert got == verdicts
    assert "the reference of --relative-to" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# The self-check, end to end (on its simulated clock, which no machine's load disturbs)
# ---------------------------------------------------------------------------------------

SELFCHECK = ["selfcheck", "--workload", "simulated", "--progress", "off", "--no-plot"]


def test_selfcheck_finds_the_injected_slowdown_and_nothing_else(capsys, tmp_path):
    path = tmp_path / "a.json"
    assert cli_main(SELFCHECK + ["--json", str(path)]) == 0
    out = capsys.readouterr().out
    res = json.loads(path.read_text())
    assert res["passed"] and "self-check passed" in out
    verdicts = {r["identity"][-1][1]: r["verdict"] for r in res["comparison"]["rows"]}
    assert verdicts == {"sim_0.5ms": "SAME", "sim_1ms": "SLOW", "sim_2ms": "SAME"}
    slow = next(r for r in res["comparison"]["rows"] if r["verdict"] == "SLOW")
    assert 1.05 < slow["ratio"] < 1.15 and slow["ci_low"] > 1.0
    # the second run of the same command, compared with the first's JSON: no SLOW anywhere
    assert cli_main(SELFCHECK + ["--no-json", "--compare-to", str(path)]) == 0
    assert "3 cases: 0 SLOW" in capsys.readouterr().out


def test_selfcheck_fails_when_the_slowdown_is_below_the_factor(capsys):
    """A 1 % slowdown is real but under --factor 1.05: not SLOW, so the check fails (exit 1)."""
    assert cli_main(SELFCHECK + ["--slowdown", "0.01", "--no-json"]) == 1
    assert "self-check FAILED" in capsys.readouterr().out


def test_an_injection_that_names_no_case_is_an_error(capsys):
    assert cli_main(SELFCHECK + ["--no-json", "--inject-slowdown", "nothing=0.1"]) == 2
    assert "no case is named 'nothing'" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# GPU timers on a fake CuPy (the real one: tests/benchmarks/test_benchmarks.py, marked gpu)
# ---------------------------------------------------------------------------------------


class FakeCupy:
    """Records what the GPU timers ask of CuPy, in order."""

    def __init__(self, capture_fails=False):
        self.log = []
        self.capture_fails = capture_fails
        self.total = 1000
        fake = self

        class Event:
            def record(self, stream=None):
                fake.log.append("record")

            def synchronize(self):
                fake.log.append("sync event")

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def record(self):
                return Event()

            def wait_event(self, e):
                pass

            def begin_capture(self, mode=None):
                fake.log.append("begin capture")

            def end_capture(self):
                fake.log.append("end capture")
                if fake.capture_fails:
                    raise RuntimeError("operation not permitted when stream is capturing")
                return Graph()

            def synchronize(self):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class Graph:
            def launch(self, stream=None):
                fake.log.append("launch graph")

        class Device:
            id = 0

            def synchronize(self):
                fake.log.append("sync device")

        class Buffer:
            def __init__(self, n):
                fake.log.append(f"alloc {4 * n}")

            def fill(self, v):
                fake.log.append("flush")

        class Pool:
            def free_all_blocks(self):
                fake.log.append("free blocks")
                fake.total = 1000

            def total_bytes(self):
                return fake.total

            def malloc(self, n):
                return None

        class Runtime:
            streamCaptureModeThreadLocal = 1

            @staticmethod
            def getDeviceProperties(i):
                return {"l2CacheSize": 50 << 20}

        class Cuda:
            pass

        cuda = Cuda()
        cuda.Event, cuda.Stream, cuda.Device, cuda.runtime, cuda.MemoryPool = Event, Stream, Device, Runtime, Pool
        cuda.get_current_stream = lambda: Stream()
        cuda.get_elapsed_time = lambda a, b: 2.5
        cuda.using_allocator = lambda malloc: Stream()
        self.cuda = cuda
        self.empty = lambda n, dtype=None: Buffer(n)
        self.get_default_memory_pool = lambda: Pool()

        class RawKernel:
            def __init__(self, src, name):
                assert "globaltimer" in src

            def __call__(self, grid, block, args):
                fake.log.append(f"spin {int(args[0])} ns")

        self.RawKernel = RawKernel


def test_cupy_event_timer_flushes_l2_outside_the_timed_span():
    cp = FakeCupy()
    timer = timers.cupy_event_timer(cp, l2_flush=True)
    assert timer.kind == "cupy" and timer.name == "CUDA events (CuPy), L2 flushed"
    assert timer.time_one(lambda: cp.log.append("call")) == pytest.approx(2.5e-3)
    assert timer.time_one(lambda: cp.log.append("call")) == pytest.approx(2.5e-3)
    # twice the 50 MiB L2, allocated once; every call: sync, flush, events around the call
    assert cp.log == ["sync device", f"alloc {100 << 20}", "flush", "record", "call", "record", "sync event",
                      "sync device", "flush", "record", "call", "record", "sync event"]
    unflushed = FakeCupy()
    timers.cupy_event_timer(unflushed, l2_flush=False).time_one(lambda: None)
    assert "flush" not in unflushed.log


@pytest.mark.parametrize("fails", [False, True])
def test_cupy_graph_replays_or_says_why_not(fails):
    cp = FakeCupy(capture_fails=fails)
    replay, note = timers.cupy_graph(lambda: cp.log.append("call"), cp)
    assert cp.log[:3] == ["call", "begin capture", "call"]
    if fails:
        assert replay is None and "not captured as a CUDA graph (RuntimeError" in note
    else:
        replay()
        assert cp.log[-1] == "launch graph" and note == "timed as CUDA-graph replays"


def test_cupy_pool_peak_and_gpu_injection():
    cp = FakeCupy()

    def call():
        cp.total += 4096  # the pool grew by a block during the call
        return "out"

    assert peaks.cupy_pool_peak(call, cp) == 4096 and cp.log[:2] == ["sync device", "free blocks"]
    timer = timers.cupy_event_timer(cp, l2_flush=False)
    slow = timers.slowed(lambda: cp.log.append("call"), 0.0015, timer)
    slow()
    assert cp.log[-2:] == ["call", "spin 1500000 ns"]
    with pytest.raises(ValueError, match="cannot be slowed"):
        timers.slowed(lambda: None, 0.001, timers.Timer("CUDA events (torch)", None, "torch"))
    assert timers.Timer("x", None, "torch").wait is None and timers.Timer("x", None).wait is timers.spin_cpu
