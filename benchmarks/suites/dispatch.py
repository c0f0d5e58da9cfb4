"""Python overhead of cuvmap's dispatch: a chain of small elementwise ops under each
transform level, eagerly and under ``jit``, against the same chain in plain NumPy.

    python -m benchmarks dispatch [--ops 100] [--size 16] [--batch 8] [--repeats 30] [--device cpu|gpu]

Reported per op of the chain (the user's op; under a transform one user op is several
binds: the transform's rule plus the primitives it binds below) in microseconds, with the
ratio to plain NumPy on the same arrays, all measured in this run. The arrays are tiny
(16 floats by default), so the figures are overhead, not arithmetic. On the GPU the
reference is the same chain in plain CuPy, and each case is timed with CUDA events.
"""
import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend

from benchmarks.report.progress import Progress
from benchmarks.report.tables import DocTable, markdown_table, noisy_lines, settings_table, spread_cell
from benchmarks.rounds import ratios, runner
from benchmarks.rounds.timers import timer_for

SUMMARY = "Python overhead of cuvmap's dispatch: an elementwise chain under each transform, against NumPy"
DEFAULTS = dict(repeats=30, warmup=1)


def chain(x, ops, lib):
    """``ops`` elementwise ops cycling through mul, add, sin, sub, tanh, called as
    ``lib.multiply(...)`` so that plain NumPy arrays also go through cuvmap's bind."""
    y = x
    for i in range(ops):
        k = i % 5
        if k == 0:
            y = lib.multiply(y, 1.001)
        elif k == 1:
            y = lib.add(y, x)
        elif k == 2:
            y = lib.sin(y)
        elif k == 3:
            y = lib.subtract(y, 0.5)
        else:
            y = lib.tanh(y)
    return lib.sum(y)


DOC_TABLES = [
    DocTable("Overhead per op of the chain", "rows", [
        ("case", "case", "l"), ("µs per op (median)", "us_per_op", "r"), ("µs per op (min)", "us_per_op_min", "r"),
        ("× reference", "x_reference", "r"),
        ("95% CI", lambda row, run: ratios.interval_text(row.get("x_reference_comparison")), "l"),
        ("IQR / median", lambda row, run: spread_cell(row), "r"), ("rounds", "repeats", "r")]),
]


def add_arguments(parser):
    parser.add_argument("--ops", type=int, default=100, help="length of the elementwise chain")
    parser.add_argument("--size", type=int, default=16, help="floats per array")
    parser.add_argument("--batch", type=int, default=8, help="vmap batch size")


def run(args, settings):
    xp = backend.xp_for(args.device)
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal(args.size))
    xs = xp.asarray(rng.standard_normal((args.batch, args.size)))
    n = args.ops
    f = lambda x: chain(x, n, cnp)  # noqa: E731
    ref = "numpy" if xp is np else "cupy"
    cases = [
        (f"{ref} (reference)", lambda: chain(x, n, xp)),
        ("cuvmap eval", lambda: f(x)),
        ("vmap", lambda: cv.vmap(f)(xs)),
        ("grad", lambda: cv.grad(f)(x)),
        ("vmap(grad)", lambda: cv.vmap(cv.grad(f))(xs)),
        ("jvp", lambda: cv.jvp(f, (x,), (x,))),
        ("grad(grad) (hvp)", lambda: cv.grad(lambda x: cnp.sum(cv.grad(f)(x) * x))(x)),
    ]
    # the same under jit: traced on the warm-up call, then the planned program runs
    jitted = [
        ("jit", cv.jit(f), (x,)),
        ("jit(vmap)", cv.jit(cv.vmap(f)), (xs,)),
        ("jit(grad)", cv.jit(cv.grad(f)), (x,)),
        ("jit(vmap(grad))", cv.jit(cv.vmap(cv.grad(f))), (xs,)),
        ("jit(grad(grad)) (hvp)", cv.jit(cv.grad(lambda x: cnp.sum(cv.grad(f)(x) * x))), (x,)),
    ]
    cases += [(name, (lambda g, a: lambda: g(*a))(g, a)) for name, g, a in jitted]
    print(f"# dispatch overhead: {n}-op elementwise chain on float64[{args.size}] (vmap batch {args.batch}) "
          f"on the {args.device}; medians of interleaved rounds, each timing every case once")
    print()
    print(settings_table(settings))
    print()
    # interleaved: every round times each case once, so that a change of the machine's
    # load during the run reaches every case alike (the ratios are what this reports)
    timer = timer_for(xp)
    keys = [name for name, _ in cases]
    timed = [runner.Case(name, name, fn, timer) for name, fn in cases]
    with Progress(len(cases) + 1, args.progress) as progress:
        stats = runner.run_cases(timed, runner.policy_of(args), progress)
        progress.step("rounds")
    rows, table = [], []
    reference = stats[keys[0]]
    for name in keys:
        st = stats[name]
        per_op = st.median / n * 1e6
        c = ratios.compare_rows(dict(times_ms=st.times), dict(times_ms=reference.times), args)
        rows.append(dict(case=name, us_per_op=per_op, us_per_op_min=st.min / n * 1e6,
                         us_per_op_max=st.max / n * 1e6, x_reference=per_op / (reference.median / n * 1e6),
                         x_reference_comparison=c.as_dict(), **st.as_dict()))
        table.append((name, per_op, st.min / n * 1e6, st.max / n * 1e6, runner.spread_text(st), len(st.times),
                      per_op / (reference.median / n * 1e6), c.interval() if name != keys[0] else "(reference)"))
    print(markdown_table(["case", "µs per op (median)", "µs per op (min)", "µs per op (max)", "IQR / median",
                                  "rounds", f"× {ref}", f"× {ref}, {100 * getattr(args, 'confidence', 0.95):g}% CI"],
                                 table))
    for line in noisy_lines(rows, lambda r: r["case"], runner.policy_of(args).max_spread):
        print(line)
    return dict(config=dict(ops=n, size=args.size, batch=args.batch), rows=rows)
