"""The harness checks itself: two runs back to back, one case slowed on purpose.

    python -m benchmarks selfcheck [--workload arrays|simulated] [--slowdown 0.1] [--slow-case KEY] [--device cpu|gpu]

A few cases are timed twice in this process, as two runs of a suite would be (warm-up and
interleaved rounds each time, ``benchmarks/rounds/runner.py``): the second time, the timed calls of
one case (``--slow-case``, by default the second) are made slower by ``--slowdown`` of their
own time (``--inject-slowdown``'s mechanism: a busy wait on the CPU, a spinning kernel on
the GPU). The two runs are then compared as ``python -m benchmarks compare`` compares two
JSON files. The check passes when the slowed case is SLOW and no other case is: the
verdicts see a 10 % change and do not see the noise of two runs of the same code. The exit
status is 1 when it fails.

Workloads: ``arrays`` (the default) times NumPy's (CuPy's with ``--device gpu``) GEMM,
an elementwise chain, a reduction and cuvmap's ``grad`` of a small function: real work,
which a busy machine slows unevenly between the two runs (``compare`` says when every case
moved alike). ``simulated`` times three cases of 0.5, 1 and 2 ms on a simulated clock, with
lognormal noise of 3 % and one call in 20 three times slower (a fixed seed): the check of
the statistics and of the plumbing (runner, injection, comparison) that no machine's load
can disturb, which the tests run.
"""
import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend

from benchmarks.report import compare
from benchmarks.report.progress import Progress
from benchmarks.report.tables import DocTable, settings_table
from benchmarks.rounds import runner
from benchmarks.rounds import stats as bstats
from benchmarks.rounds.timers import Timer, timer_for

SUMMARY = "the harness's self-check: one case slowed by a tenth on purpose is SLOW, the other cases are not"
DEFAULTS = dict(repeats=10, warmup=2)


DOC_TABLES = [
    DocTable("The two runs compared", lambda run: run["comparison"]["rows"], [
        ("case", "case", "l"), ("run 1 median ms", "base_median_ms", "r"), ("run 2 median ms", "head_median_ms", "r"),
        ("run 2 / run 1", "ratio", "r"), ("95% CI", "interval", "l"), ("verdict", "verdict", "l")]),
]


def add_arguments(parser):
    parser.add_argument("--workload", choices=["arrays", "simulated"], default="arrays",
                        help="arrays: GEMM, elementwise, reduction, cuvmap grad; simulated: noisy cases of 0.5, 1 "
                             "and 2 ms on a simulated clock")
    parser.add_argument("--slowdown", type=float, default=0.10, help="the fraction injected (default 0.1: 10%%)")
    parser.add_argument("--slow-case", default=None, help="the key of the case slowed (default: the second case)")
    parser.add_argument("--size", type=int, default=256, help="n of the arrays workload's n×n GEMM")


class Simulated:
    """A clock that advances only by what its cases take: each call of a case of ``seconds``
    takes ``seconds × exp(N(0, sigma))``, three times that one call in 20 (seeded)."""

    def __init__(self, seed=0, sigma=0.03, outliers=0.05):
        self.now = 0.0
        self.rng = np.random.default_rng(seed)
        self.sigma, self.outliers = sigma, outliers

    def case(self, seconds):
        def call():
            t = seconds * float(np.exp(self.rng.normal(0.0, self.sigma)))
            self.now += 3 * t if self.rng.random() < self.outliers else t

        return call

    def wait(self, seconds):
        self.now += seconds

    def timer(self):
        def time_one(fn):
            start = self.now
            fn()
            return self.now - start

        return Timer("simulated clock", time_one, "simulated", wait=self.wait)


def _cases(args):
    if args.workload == "simulated":
        sim = Simulated()
        return [runner.Case(f"sim_{ms:g}ms", f"simulated {ms:g} ms", sim.case(ms / 1e3), sim.timer())
                for ms in (0.5, 1.0, 2.0)]
    xp = backend.xp_for(args.device)
    timer = timer_for(xp)
    rng = np.random.default_rng(0)
    n = args.size
    a = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
    b = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
    v = xp.asarray(rng.standard_normal(1 << 18).astype(np.float32))
    w = xp.asarray(rng.standard_normal((64, 64)).astype(np.float32) / 8)
    x = xp.asarray(rng.standard_normal((32, 64)).astype(np.float32))
    grad = cv.grad(lambda w: cnp.sum(cnp.tanh(cnp.tanh(x @ w) @ w)))
    return [
        runner.Case("gemm", f"{xp.__name__}.matmul {n}×{n} float32", lambda: xp.matmul(a, b), timer),
        runner.Case("elementwise", f"{xp.__name__} sin(v) * v + v, 2^18 float32", lambda: xp.sin(v) * v + v, timer),
        runner.Case("reduction", f"{xp.__name__}.sum(v * v), 2^18 float32", lambda: xp.sum(v * v), timer),
        runner.Case("cuvmap_grad", "cuvmap grad of a 2-layer tanh net (32×64)", lambda: grad(w), timer),
    ]


def _rows(cases, stats):
    return [dict(key=c.key, method=c.label, **stats[c.key].as_dict()) for c in cases]


def run(args, settings):
    policy = runner.policy_of(args)
    cases = _cases(args)
    slow = args.slow_case or cases[1].key
    if slow not in {c.key for c in cases}:
        raise SystemExit(f"python -m benchmarks selfcheck: --slow-case {slow!r} is none of "
                         f"{', '.join(c.key for c in cases)}")
    print(f"# self-check of the harness on the {args.device}: the {args.workload} workload timed twice, "
          f"+{100 * args.slowdown:g}% injected into {slow!r} the second time")
    print()
    print(settings_table(settings))
    progress = Progress(2, args.progress)
    plain = policy.with_repeats(policy.repeats)
    plain.inject = {}
    injected = policy.with_repeats(policy.repeats)
    injected.inject = {slow: args.slowdown}
    base = _rows(cases, runner.run_cases(cases, plain, progress, "run 1: "))
    progress.step("run 1")
    head = _rows(cases, runner.run_cases(cases, injected, progress, "run 2: "))
    progress.step("run 2")
    progress.close()
    report = compare.compare_results(dict(suite="selfcheck", rows=base), dict(suite="selfcheck", rows=head),
                                     args.factor, args.confidence)
    print()
    compare.print_report(report, "run 1", "run 2")
    verdicts = {r["identity"][-1][1]: r["verdict"] for r in report["rows"]}
    wrong = [k for k, v in verdicts.items() if (v == bstats.SLOW) != (k == slow)]
    passed = not wrong
    print()
    if passed:
        print(f"**self-check passed**: {slow} (+{100 * args.slowdown:g}%) is SLOW and no other case is")
    else:
        print("**self-check FAILED**: " + "; ".join(
            f"{k} is {verdicts[k]}" + (f" (+{100 * args.slowdown:g}% injected)" if k == slow else "") for k in wrong))
    return dict(config=dict(workload=args.workload, slowdown=args.slowdown, slow_case=slow, size=args.size),
                rows=head, base_rows=base, comparison=report, passed=passed, exit_status=0 if passed else 1)
