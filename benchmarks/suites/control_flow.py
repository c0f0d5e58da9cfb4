"""Control flow: the gradient of an RNN over a long sequence as a ``lax.scan`` against the
same recurrence as an unrolled Python loop, both under ``jit``, against JAX and against the
forward and backward passes written by hand as a NumPy loop; and the same for a scan over a
tiny carry, where a step costs little more than the interpreter's own work.

    python -m benchmarks control_flow [--length 1000] [--hidden 64] [--batch 32] [--tiny 8] [--repeats 5] [--no-jax]

The loss is ``sum(h_T ** 2)`` of ``h_t = tanh(h_{t-1} @ W + x_t @ U)`` over ``length``
steps, hidden size ``hidden``, a batch of ``batch`` sequences, float32; the gradient is
taken with respect to ``W`` and ``U``. The tiny-carry scan is ``c_t = tanh(c_{t-1} * a +
x_t)`` on vectors of ``tiny`` float32 entries, its loss ``sum(c_T ** 2)``, the gradient with
respect to ``a``. Reported, all in this run:

- trace time (the least of interleaved rounds): staging ``grad(loss)`` into a program
  (``make_jaxpr``), for the scan at the full length and at length 1, the one-step
  recurrence (the unrolled loop of length 1), and the unrolled loop at the full length
  (once); the scan's should not grow with the length
  (full length ≤ 2× length 1) and stay near the one-step trace (≤ 2×: the scan also stages
  its body alone and derives the body's forward and backward programs from it);
- run time per step of the jitted gradient (interleaved rounds): the scan against the
  unrolled loop (target ≤ 1.5×), against JAX's ``jit(grad)`` of its ``lax.scan`` where JAX
  is installed (``--no-jax`` skips it; target ≤ 1.5×), and against the hand-written NumPy
  loop (the floor: what a step's NumPy calls cost); the tiny-carry scan against its
  hand-written NumPy loop (target ≤ 3×).
"""
import time

import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend, lax

from benchmarks.methods import jax_methods, max_abs_diff
from benchmarks.methods.cuvmap_methods import to_numpy
from benchmarks.report.tables import DocTable, markdown_table, settings_table, spread_cell, targets_doc_table
from benchmarks.rounds import ratios, runner
from benchmarks.rounds import stats as bstats
from benchmarks.rounds.timers import timer_for

SUMMARY = "jit(grad) of a long scan (an RNN) against the unrolled loop: trace time and per-step run time"
DEFAULTS = dict(repeats=5, warmup=1)


DOC_TABLES = [
    DocTable("Run time of the jitted gradients", "rows", [
        ("run (median)", "case", "l"), ("ms per call", "ms", "r"), ("µs per step", "us_per_step", "r"),
        ("× unrolled", "x_unrolled", "r"), ("× NumPy loop", "x_numpy", "r"),
        ("IQR / median", lambda row, run: spread_cell(row), "r"), ("rounds", "repeats", "r")]),
    DocTable("Trace time (make_jaxpr)", lambda run: list(run["trace_ms"].items()), [
        ("staging", lambda row, run: row[0], "l"), ("ms", lambda row, run: row[1], "r")]),
    targets_doc_table(),
]


def add_arguments(parser):
    parser.add_argument("--length", type=int, default=1000, help="sequence length (scan steps)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--batch", type=int, default=32, help="sequences per batch")
    parser.add_argument("--tiny", type=int, default=8, help="size of the tiny-carry scan's carry")
    parser.add_argument("--no-jax", action="store_true", help="skip JAX even when installed")


def _cell(w, u, h, x):
    return cnp.tanh(h @ w + x @ u)


def loss_scan(w, u, h0, xs):
    h, _ = lax.scan(lambda h, x: (_cell(w, u, h, x), None), h0, xs)
    return cnp.sum(h * h)


def loss_unrolled(w, u, h0, xs):
    h = h0
    for t in range(xs.shape[0]):
        h = _cell(w, u, h, xs[t])
    return cnp.sum(h * h)


def _states(step, c0, xs):
    """The forward loop of a recurrence by hand: ``(n + 1, ...)`` states ``c_0 .. c_n`` of
    ``c_t = step(c_{t-1}, x_t)``, kept for the backward loop."""
    xp = backend.xp_of(xs)
    cs = xp.empty((xs.shape[0] + 1,) + c0.shape, c0.dtype)
    cs[0] = c = c0
    for t in range(xs.shape[0]):
        cs[t + 1] = c = step(c, xs[t])
    return cs


def numpy_rnn_grad(w, u, h0, xs):
    """The gradient of :func:`loss_scan` with respect to ``w`` and ``u``, written by hand as
    two NumPy loops (forward, keeping every ``h_t``; backward): the floor of a step."""
    xp = backend.xp_of(xs)
    n = xs.shape[0]
    hs = _states(lambda h, x: xp.tanh(h @ w + x @ u), h0, xs)
    dh = 2 * hs[n]
    dw, du = xp.zeros_like(w), xp.zeros_like(u)
    wt = w.T
    for t in range(n - 1, -1, -1):
        ht = hs[t + 1]
        ds = dh * (1 - ht * ht)
        dw += hs[t].T @ ds
        du += xs[t].T @ ds
        dh = ds @ wt
    return dw, du


def _tiny_cell(a, c, x):
    return cnp.tanh(c * a + x)


def loss_tiny(a, c0, xs):
    c, _ = lax.scan(lambda c, x: (_tiny_cell(a, c, x), None), c0, xs)
    return cnp.sum(c * c)


def loss_tiny_blocks(a, c0, xs, k=8):
    """:func:`loss_tiny` unrolled by hand: a scan over blocks of ``k`` steps whose body
    runs the ``k`` cells (what ``unroll=k`` staged before: NOTE [scan's unroll] in
    cuvmap/lax/control_flow/scan.py)."""
    def block(c, xb):
        for j in range(k):
            c = _tiny_cell(a, c, xb[j])
        return c, None

    c, _ = lax.scan(block, c0, xs.reshape((xs.shape[0] // k, k) + xs.shape[1:]))
    return cnp.sum(c * c)


def numpy_tiny_grad(a, c0, xs):
    """The gradient of :func:`loss_tiny` with respect to ``a``, by hand as NumPy loops."""
    xp = backend.xp_of(xs)
    n = xs.shape[0]
    cs = _states(lambda c, x: xp.tanh(c * a + x), c0, xs)
    dc = 2 * cs[n]
    da = xp.zeros_like(a)
    for t in range(n - 1, -1, -1):
        ct = cs[t + 1]
        ds = dc * (1 - ct * ct)
        da += ds * cs[t]
        dc = ds * a
    return da


def _trace_seconds(cases, repeats):
    """The least time of staging ``grad(f)`` on ``args`` (the first call of a jitted
    function pays it), for each ``(f, args)`` of ``cases``, over ``repeats`` interleaved
    rounds after one untimed staging each: a staging of a few milliseconds is often
    preempted on a busy machine, and the least is the one that was not."""
    stagings = [(cv.grad(f, argnums=(0, 1)), args) for f, args in cases]
    for g, args in stagings:
        cv.make_jaxpr(g)(*args)
    best = [float("inf")] * len(stagings)
    for _ in range(repeats):
        for k, (g, args) in enumerate(stagings):
            t0 = time.perf_counter()
            cv.make_jaxpr(g)(*args)
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def run(args, settings):
    xp = backend.xp_for(args.device)
    rng = np.random.default_rng(0)
    n, hidden, batch = args.length, args.hidden, args.batch
    w = xp.asarray((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    u = xp.asarray((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    h0 = xp.zeros((batch, hidden), np.float32)
    xs = xp.asarray(rng.standard_normal((n, batch, hidden)).astype(np.float32))
    print(f"# control flow: jit(grad) of an RNN (hidden {hidden}, batch {batch}, float32) over {n} steps, "
          f"lax.scan against the unrolled loop, on the {args.device}")
    print()
    print(settings_table(settings))
    print()

    repeats = max(1, args.repeats)
    trace_scan, trace_scan_one, trace_one = _trace_seconds(
        [(loss_scan, (w, u, h0, xs)), (loss_scan, (w, u, h0, xs[:1])), (loss_unrolled, (w, u, h0, xs[:1]))],
        max(repeats, 5))
    (trace_unrolled,) = _trace_seconds([(loss_unrolled, (w, u, h0, xs))], 1)
    scan_grad = cv.jit(cv.grad(loss_scan, argnums=(0, 1)))
    unrolled_grad = cv.jit(cv.grad(loss_unrolled, argnums=(0, 1)))
    for g in (scan_grad, unrolled_grad):
        g(w, u, h0, xs)  # traced and planned
    ref, got, by_hand = ([to_numpy(g) for g in f(w, u, h0, xs[:8])]
                         for f in (cv.grad(loss_unrolled, argnums=(0, 1)), cv.grad(loss_scan, argnums=(0, 1)),
                                   numpy_rnn_grad))
    worst, worst_hand = max_abs_diff(got, ref), max_abs_diff(got, by_hand)
    notes = [f"scan and unrolled gradients agree to {worst:.1e}, scan and the NumPy loop to {worst_hand:.1e} "
             "(8 steps, float32)"]
    cases = [("cuvmap jit(grad(scan))", lambda: scan_grad(w, u, h0, xs)),
             ("cuvmap jit(grad(unrolled loop))", lambda: unrolled_grad(w, u, h0, xs)),
             ("NumPy loop (forward and backward by hand)", lambda: numpy_rnn_grad(w, u, h0, xs))]
    jax = jax_methods.setup(args, notes, {})
    jax_fn = None if jax is None else jax_methods.rnn_scan_grad(jax, *(to_numpy(v) for v in (w, u, h0, xs)))
    if jax_fn is not None:
        notes.append(f"JAX {jax.__version__}: jit(grad) of jax.lax.scan, the same loss")
        cases.append(("JAX jit(grad(scan))", jax_fn))
    # the tiny-carry scan
    tiny = args.tiny
    a = xp.asarray(rng.uniform(0.5, 1.0, tiny).astype(np.float32))
    c0 = xp.zeros(tiny, np.float32)
    txs = xp.asarray(rng.standard_normal((n, tiny)).astype(np.float32))
    tiny_grad = cv.jit(cv.grad(loss_tiny))
    worst_tiny = max_abs_diff(to_numpy(tiny_grad(a, c0, txs[:8])), to_numpy(numpy_tiny_grad(a, c0, txs[:8])))
    notes.append(f"tiny-carry scan and its NumPy loop agree to {worst_tiny:.1e} (8 steps, float32)")
    tiny_cases = [(f"cuvmap jit(grad(scan)), carry of {tiny}", lambda: tiny_grad(a, c0, txs)),
                  (f"NumPy loop, carry of {tiny} (by hand)", lambda: numpy_tiny_grad(a, c0, txs))]
    if n % 8 == 0:
        blocks_grad = cv.jit(cv.grad(loss_tiny_blocks))
        tiny_cases.append((f"cuvmap, carry of {tiny}, unrolled by hand, 8 steps a body",
                           lambda: blocks_grad(a, c0, txs)))
    timed = [runner.Case(name, name, fn, timer_for(xp)) for name, fn in cases + tiny_cases]
    policy = runner.policy_of(args).with_repeats(repeats, 1)
    # the jitted gradients were traced and planned above; the rounds alternate the cases, so
    # that the machine's load reaches every case alike
    stats = runner.run_cases(timed, policy)
    medians = [stats[name].median for name, _ in cases]
    rows = []
    table = []
    unrolled = stats[cases[1][0]]
    numpy_loop = stats[cases[2][0]]
    for (name, _), med in zip(cases, medians):
        st = stats[name]
        per_step = med / n * 1e6
        c = ratios.compare_rows(dict(times_ms=st.times), dict(times_ms=unrolled.times), args)
        rows.append(dict(case=name, ms=med * 1e3, us_per_step=per_step, x_unrolled=med / medians[1],
                         x_unrolled_comparison=c.as_dict(), x_numpy=med / medians[2], times_s=st.times,
                         **st.as_dict()))
        table.append((name, med * 1e3, per_step, runner.spread_text(st), len(st.times), med / medians[1],
                      c.interval(), med / medians[2]))
    print(markdown_table(["run (median)", "ms per call", "µs per step", "IQR / median", "rounds",
                                  "× unrolled", f"× unrolled, {100 * getattr(args, 'confidence', 0.95):g}% CI",
                                  "× NumPy loop"],
                                 table))
    print()
    tiny_numpy = stats[tiny_cases[1][0]]
    tiny_rows = []
    for name, _ in tiny_cases:
        st = stats[name]
        rows.append(dict(case=name, ms=st.median * 1e3, us_per_step=st.median / n * 1e6,
                         x_numpy=st.median / tiny_numpy.median, times_s=st.times, **st.as_dict()))
        tiny_rows.append((name, st.median * 1e3, st.median / n * 1e6, runner.spread_text(st),
                          st.median / tiny_numpy.median))
    print(markdown_table(["tiny carry (median)", "ms per call", "µs per step", "IQR / median",
                                  "× NumPy loop"], tiny_rows))
    print()
    # the cell's three GEMMs: forward x @ w, backward x.T @ ct and ct @ w.T (NOTE [a loop's
    # constant operand transposed once] in cuvmap/lax/linalg.py), 100 calls a timing
    x_mat, w_mat = xs[0], w
    gemms = [("x @ w (forward)", lambda: x_mat @ w_mat), ("x.T @ ct (weight's cotangent)", lambda: x_mat.T @ x_mat),
             ("ct @ w.T (input's cotangent)", lambda: x_mat @ w_mat.T)]
    gemm_cases = [runner.Case(name, name, (lambda f: lambda: [f() for _ in range(100)])(f), timer_for(xp))
                  for name, f in gemms]
    gemm_times, _ = runner.timed_rounds(gemm_cases, policy)
    gemm_us = {name: float(np.median(gemm_times[name])) / 100 * 1e6 for name, _ in gemms}
    first = gemm_us[gemms[0][0]]
    print(markdown_table([f"a GEMM of the cell ({batch}×{hidden} by {hidden}×{hidden}, median)", "µs",
                                  "× x @ w"], [(name, us, us / first) for name, us in gemm_us.items()]))
    print()
    trace_rows = [("grad of the scan, full length", trace_scan * 1e3, trace_scan / trace_one),
                  ("grad of the scan, length 1", trace_scan_one * 1e3, trace_scan_one / trace_one),
                  ("grad of one step (unrolled, length 1)", trace_one * 1e3, 1.0),
                  ("grad of the unrolled loop, full length", trace_unrolled * 1e3, trace_unrolled / trace_one)]
    print(markdown_table(["trace (make_jaxpr)", "ms", "× one step"], trace_rows))
    print()
    scan_stats = stats[cases[0][0]]
    # (name, measured, limit, numerator, denominator): run targets are judged beyond noise too
    targets = [("scan trace, full length / length 1", trace_scan / trace_scan_one, 2.0, None, None),
               ("scan trace / one-step (unrolled) trace", trace_scan / trace_one, 2.0, None, None),
               ("scan per-step run / unrolled per-step run", medians[0] / medians[1], 1.5, scan_stats, unrolled)]
    if jax_fn is not None:
        jax_stats = stats[cases[3][0]]
        targets.append(("scan per-step run / JAX per-step run", medians[0] / medians[3], 1.5, scan_stats, jax_stats))
    tiny_stats = stats[tiny_cases[0][0]]
    targets.append(("tiny-carry scan per-step run / its NumPy loop", tiny_stats.median / tiny_numpy.median, 3.0,
                    tiny_stats, tiny_numpy))
    comparisons = {name: ratios.compare_rows(dict(times_ms=num.times), dict(times_ms=den.times), args)
                   for name, _, _, num, den in targets if num is not None}
    met_ci = {name: bstats.target_met(c, "≤", limit) for (name, _, limit, _, _), c in
              ((t, comparisons.get(t[0])) for t in targets) if c is not None}
    print(markdown_table(["target", "measured", "≤", "met", "met beyond noise (CI of the paired rounds)"],
                                 [(name, value, limit, "yes" if value <= limit else "no",
                                   met_ci.get(name, "(one trace per repeat: no pairs)"))
                                  for name, value, limit, _, _ in targets], "lrrll"))
    print()
    notes.append(f"the NumPy loops are NumPy calls only, the floor of a step: {numpy_loop.median / n * 1e6:.1f} µs "
                 f"per step for the RNN, {tiny_numpy.median / n * 1e6:.2f} for the tiny carry")
    for note in notes:
        print(f"- {note}")
    return dict(config=dict(length=n, hidden=hidden, batch=batch, tiny=tiny), rows=rows, gemm_us=gemm_us,
                trace_ms=dict(scan=trace_scan * 1e3, scan_length_1=trace_scan_one * 1e3, one_step=trace_one * 1e3,
                              unrolled=trace_unrolled * 1e3),
                targets={name: dict(measured=value, limit=limit,
                                    **(dict(met_beyond_noise=met_ci[name], comparison=comparisons[name].as_dict())
                                       if name in comparisons else {}))
                         for name, value, limit, _, _ in targets}, notes=notes)
