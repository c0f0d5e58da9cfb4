"""Control flow: the gradient of an RNN over a long sequence as a ``lax.scan`` against the
same recurrence as an unrolled Python loop, both under ``jit``.

    python -m benchmarks control_flow [--length 1000] [--hidden 64] [--batch 32] [--repeats 5] [--no-jax]

The loss is ``sum(h_T ** 2)`` of ``h_t = tanh(h_{t-1} @ W + x_t @ U)`` over ``length``
steps, hidden size ``hidden``, a batch of ``batch`` sequences, float32; the gradient is
taken with respect to ``W`` and ``U``. Reported, all in this run:

- trace time: staging ``grad(loss)`` into a program (``make_jaxpr``), for the scan at the
  full length and at length 1, the one-step recurrence (the unrolled loop of length 1),
  and the unrolled loop at the full length; the scan's should not grow with the length
  (full length ≤ 2× length 1) and stay near the one-step trace (≤ 2×: the scan also stages
  its body alone and derives the body's forward and backward programs from it);
- run time per step of the jitted gradient, scan against the unrolled loop (interleaved
  rounds; target ≤ 1.5×), and JAX's ``jit(grad)`` of its ``lax.scan`` where JAX is
  installed (``--no-jax`` skips it).
"""
import math
import time

import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend, lax

from benchmarks import harness
from benchmarks import stats as bstats

SUMMARY = "jit(grad) of a long scan (an RNN) against the unrolled loop: trace time and per-step run time"
DEFAULTS = dict(repeats=5, warmup=1)


def add_arguments(parser):
    parser.add_argument("--length", type=int, default=1000, help="sequence length (scan steps)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--batch", type=int, default=32, help="sequences per batch")
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


def _host(x):
    return np.asarray(backend.device_put(x, "cpu"))


def _trace_seconds(f, args, repeats):
    """The median time of staging ``grad(f)`` on ``args`` (the first call of a jitted
    function pays it)."""
    grad_f = cv.grad(f, argnums=(0, 1))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cv.make_jaxpr(grad_f)(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _jax_case(args, w, u, h0, xs, notes):
    if args.no_jax:
        notes.append("JAX: skipped (--no-jax)")
        return None
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        notes.append("JAX: skipped (jax is not installed)")
        return None
    if args.device == "gpu":
        notes.append("JAX: skipped on --device gpu (its CPU build is what this machine has)")
        return None

    def loss(w, u, h0, xs):
        h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x @ u), None), h0, xs)
        return jnp.sum(h * h)

    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    jargs = [jnp.asarray(a) for a in (w, u, h0, xs)]
    jax.block_until_ready(g(*jargs))
    notes.append(f"JAX {jax.__version__}: jit(grad) of jax.lax.scan, the same loss")
    return lambda: jax.block_until_ready(g(*jargs))


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
    print(harness.settings_table(settings))
    print()

    repeats = max(1, args.repeats)
    trace_scan = _trace_seconds(loss_scan, (w, u, h0, xs), repeats)
    trace_scan_one = _trace_seconds(loss_scan, (w, u, h0, xs[:1]), repeats)
    trace_one = _trace_seconds(loss_unrolled, (w, u, h0, xs[:1]), repeats)
    trace_unrolled = _trace_seconds(loss_unrolled, (w, u, h0, xs), 1)
    scan_grad = cv.jit(cv.grad(loss_scan, argnums=(0, 1)))
    unrolled_grad = cv.jit(cv.grad(loss_unrolled, argnums=(0, 1)))
    for g in (scan_grad, unrolled_grad):
        g(w, u, h0, xs)  # traced and planned
    ref = cv.grad(loss_unrolled, argnums=(0, 1))(w, u, h0, xs[:8])
    got = cv.grad(loss_scan, argnums=(0, 1))(w, u, h0, xs[:8])
    worst = max(float(np.abs(_host(a) - _host(b)).max()) for a, b in zip(got, ref))
    notes = [f"scan and unrolled gradients agree to {worst:.1e} (8 steps, float32)"]
    cases = [("cuvmap jit(grad(scan))", lambda: scan_grad(w, u, h0, xs)),
             ("cuvmap jit(grad(unrolled loop))", lambda: unrolled_grad(w, u, h0, xs))]
    jax_fn = _jax_case(args, _host(w), _host(u), _host(h0), _host(xs),
                       notes)
    if jax_fn is not None:
        cases.append(("JAX jit(grad(scan))", jax_fn))
    timed = [harness.Case(name, name, fn, harness.timer_for(xp)) for name, fn in cases]
    policy = harness.policy_of(args).with_repeats(repeats, 1)
    # the first calls above traced and planned; the rounds alternate the cases, so that
    # the machine's load reaches every case alike
    times, timing_notes = harness.timed_rounds(timed, policy)
    stats = {c.key: harness.Stats(times[c.key], math.nan, c.timer.name + ", interleaved", 1, 1.0,
                                  policy.max_spread if policy.adaptive else None, timing_notes[c.key])
             for c in timed}
    medians = [stats[name].median for name, _ in cases]
    rows = []
    table = []
    unrolled = stats[cases[1][0]]
    for (name, _), med in zip(cases, medians):
        st = stats[name]
        per_step = med / n * 1e6
        c = harness.compare_rows(dict(times_ms=st.times), dict(times_ms=unrolled.times), args)
        rows.append(dict(case=name, ms=med * 1e3, us_per_step=per_step, x_unrolled=med / medians[1],
                         x_unrolled_comparison=c.as_dict(), times_s=st.times, **st.as_dict()))
        table.append((name, med * 1e3, per_step, harness.spread_text(st), len(st.times), med / medians[1],
                      c.interval()))
    print(harness.markdown_table(["run (median)", "ms per call", "µs per step", "IQR / median", "rounds",
                                  "× unrolled", f"× unrolled, {100 * getattr(args, 'confidence', 0.95):g}% CI"],
                                 table))
    print()
    trace_rows = [("grad of the scan, full length", trace_scan * 1e3, trace_scan / trace_one),
                  ("grad of the scan, length 1", trace_scan_one * 1e3, trace_scan_one / trace_one),
                  ("grad of one step (unrolled, length 1)", trace_one * 1e3, 1.0),
                  ("grad of the unrolled loop, full length", trace_unrolled * 1e3, trace_unrolled / trace_one)]
    print(harness.markdown_table(["trace (make_jaxpr)", "ms", "× one step"], trace_rows))
    print()
    targets = [("scan trace, full length / length 1", trace_scan / trace_scan_one, 2.0),
               ("scan trace / one-step (unrolled) trace", trace_scan / trace_one, 2.0),
               ("scan per-step run / unrolled per-step run", medians[0] / medians[1], 1.5)]
    run_ratio = rows[0]["x_unrolled_comparison"]
    met_ci = bstats.target_met(harness.compare_rows(dict(times_ms=stats[cases[0][0]].times),
                                                    dict(times_ms=unrolled.times), args), "≤", targets[2][2])
    print(harness.markdown_table(["target", "measured", "≤", "met", "met beyond noise (CI of the paired rounds)"],
                                 [(name, value, limit, "yes" if value <= limit else "no",
                                   met_ci if k == 2 else "(one trace per repeat: no pairs)")
                                  for k, (name, value, limit) in enumerate(targets)], "lrrll"))
    print()
    for note in notes:
        print(f"- {note}")
    return dict(config=dict(length=n, hidden=hidden, batch=batch), rows=rows,
                trace_ms=dict(scan=trace_scan * 1e3, scan_length_1=trace_scan_one * 1e3, one_step=trace_one * 1e3,
                              unrolled=trace_unrolled * 1e3),
                targets={name: dict(measured=value, limit=limit, **(dict(met_beyond_noise=met_ci, comparison=run_ratio)
                                                                     if k == 2 else {}))
                         for k, (name, value, limit) in enumerate(targets)}, notes=notes)


def main(argv=None):
    """``python -m benchmarks.bench_control_flow ARGS`` is ``python -m benchmarks control_flow ARGS``."""
    import sys

    from benchmarks.__main__ import main as cli_main

    return cli_main(["control_flow"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
