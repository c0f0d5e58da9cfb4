"""Memory budgets: the chunk ``memory_budget=`` chooses against the unchunked call and a
sweep of hand-picked chunk sizes, in peak memory and time.

    python -m benchmarks memory [--batch 512] [--fraction 0.25] [--chunks 16 32 64 128 256]
        [--cases cnn_dp mlp_dp mlp_norms cnn_grads] [--repeats 5]

The networks are the benchmarks' (``benchmarks/models.py``): the per-example suite's CNN
and the DP suite's MLP (784 → 1024 → 1024 → 10), float32, at ``--batch`` examples. The
cases:

- ``cnn_dp``, ``mlp_dp``: the DP step ``dp.clipped_grad(loss, 1.0, method="per_example")``
  (every layer's per-example gradient formed, clipped and summed: the case chunking is
  for, jax_privacy's ``microbatch_size`` and Opacus's ``max_physical_batch_size``);
- ``mlp_norms``: ``vmap`` of each example's gradient norm (the per-example gradients
  exist inside the map only);
- ``cnn_grads``: ``vmap(grad(loss))``, whose results, the per-example gradients, are more
  than a quarter of its unchunked peak: its budget is the results plus ``--fraction`` of
  the rest (the working memory), since no chunking can hold the results in less.

For each case: the unchunked call (the transform without a budget) gives the peak; the
budget is ``--fraction`` of it; the budgeted call (``memory_budget=budget``) chooses its
chunk from the staged program's planned peak (:mod:`cuvmap.memory_budget`); and the same
runner with each ``--chunks`` size fixed is the sweep (``clipped_grad(chunk_size=c)``, and
for the vmaps the runner of ``vmap(chunk_size="auto")`` with the chunk set). Peaks are
tracemalloc's on the CPU (NumPy reports its arrays to it; a vendor library's own scratch
memory is not in it) and CuPy's pool on the GPU, over what existed before the call, on a
warm call (the choice made, the conv strategies measured). Times come from interleaved
rounds of the budgeted call, the sweep and the unchunked call.

Targets: the budgeted call's peak at most the budget + 10%; its time at most 1.15 × the
best time of the sweep's chunk sizes whose peak is within the budget (the hand-picked
sizes a user could keep).
"""
import math

import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import api, backend, dp, memory_budget as mb

from benchmarks import models
from benchmarks.methods import max_abs_diff
from benchmarks.methods.cuvmap_methods import to_numpy
from benchmarks.report.tables import DocTable, markdown_table, settings_table, targets_doc_table
from benchmarks.rounds import peaks, ratios, runner
from benchmarks.rounds import stats as bstats
from benchmarks.rounds.timers import timer_for

SUMMARY = "memory_budget=: the chosen chunk's peak and time against the unchunked call and a sweep of chunk sizes"
DEFAULTS = dict(repeats=5, warmup=1)
CASES = ("cnn_dp", "mlp_dp", "mlp_norms", "cnn_grads")
PEAK_LIMIT = 1.10   # the budgeted call's peak over the budget
TIME_LIMIT = 1.15   # its time over the best in-budget chunk of the sweep


DOC_TABLES = [
    DocTable("Peak memory and time: the budgeted call, the unchunked call, the sweep", "rows", [
        ("case", "case", "l"), ("run", "run", "l"), ("chunk", "chunk", "r"),
        ("peak MiB", lambda row, run: row["peak_bytes"] / 2 ** 20, "r"), ("× budget", "peak_over_budget", "r"),
        ("within the budget", lambda row, run: "yes" if row["within_budget"] else "no", "l"),
        ("ms (median)", "ms", "r"), ("× best in-budget chunk", "x_best_in_budget", "r")]),
    targets_doc_table(),
]


def add_arguments(parser):
    parser.add_argument("--batch", type=int, default=512, help="examples per call")
    parser.add_argument("--fraction", type=float, default=0.25, help="the budget as a fraction of the unchunked peak")
    parser.add_argument("--chunks", type=int, nargs="+", default=[16, 32, 64, 128, 256],
                        help="the hand-picked chunk sizes of the sweep (those below the batch)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="which cases to run")
    parser.add_argument("--mlp-widths", type=int, nargs="+", default=list(models.MLP_WIDTHS),
                        help="the MLP's layer widths")


def _norms_fn(loss):
    def norm(p, x, y):
        g = cv.grad(loss)(p, x, y)
        return cnp.sqrt(sum(cnp.sum(v * v) for v in cv.tree.leaves(g)))
    norm.__name__ = "grad_norm"
    return norm


def _fixed_vmap(f, in_axes, chunk):
    """``vmap(f, in_axes)`` run by the budgeted vmap's runner with ``chunk`` fixed (the sweep)."""
    where = f"vmap({cv.api_util.fun_name(f)}, chunk {chunk})"
    chunked = mb.ChunkedMap(where, api.vmap_combine(0))

    def call(*args):
        paths, leaves, treedef = cv.tree.flatten_with_path((args, {}))
        axes = cv.api_util.flat_in_axes(f, in_axes, args, {})
        axes, size = cv.api_util.check_mapped_sizes(f, paths, leaves, axes, None)
        outs, out_tree = chunked(api._vmap_body(f, where, treedef, axes, 0), leaves, axes, size, chunk, None,
                                 key=treedef)
        return cv.tree.unflatten(out_tree, outs)

    return call


def _case(name, args):
    """``(label, args, make(memory_budget=None, chunk=None), stacked)`` of a case."""
    if name.startswith("cnn"):
        loss, data = models.cuvmap_per_example_loss, (models.cnn_params(),) + models.cnn_data(args.batch)
        net = "CNN"
    else:
        widths = tuple(args.mlp_widths)
        loss = models.cuvmap_mlp_per_example_loss
        data = (models.mlp_params(widths),) + models.mlp_data(args.batch, widths)
        net = "MLP " + "→".join(map(str, widths))
    if name.endswith("_dp"):
        def make(budget=None, chunk=None):
            kw = dict(memory_budget=budget) if budget is not None else dict(chunk_size=chunk)
            return dp.clipped_grad(loss, 1.0, method="per_example", **kw)
        return f"{net}: DP step (clipped_grad, per_example)", data, make, False
    f = _norms_fn(loss) if name == "mlp_norms" else cv.grad(loss)
    what = "vmap of gradient norms" if name == "mlp_norms" else "vmap(grad) (per-example gradients)"

    def make(budget=None, chunk=None):
        if chunk is not None:
            return _fixed_vmap(f, (None, 0, 0), chunk)
        return cv.vmap(f, in_axes=(None, 0, 0), memory_budget=budget)
    return f"{net}: {what}", data, make, name == "cnn_grads"


def _peak(fn, xp):
    """Bytes allocated at the peak of one call of ``fn`` over what existed before."""
    return peaks.host_peak(fn) if xp is np else peaks.cupy_pool_peak(fn, xp)


def _results_bytes(out):
    return sum(int(getattr(v, "nbytes", 0)) for v in cv.tree.leaves(out))


def _run_case(name, args, xp, policy):
    label, data, make, stacked = _case(name, args)
    data = tuple(cv.tree.map(xp.asarray, d) for d in data)
    batch = args.batch
    plain = make(budget=None, chunk=None)  # the transform without a budget
    call = lambda f: (lambda: f(*data))  # noqa: E731
    ref = plain(*data)  # warm (conv strategies measured)
    unchunked = _peak(call(plain), xp)
    results = _results_bytes(ref)
    budget = int(results + args.fraction * (unchunked - results)) if stacked else int(args.fraction * unchunked)
    notes = []
    rows = []
    auto = make(budget=budget)
    plan = auto.memory_plan(*data)
    auto(*data)  # the choice and the first chunks' plans
    auto_peak = _peak(call(auto), xp)
    diff = max_abs_diff(*([to_numpy(v) for v in cv.tree.leaves(out)] for out in (auto(*data), ref)))
    sweep = [c for c in sorted(set(args.chunks)) if c < batch]
    fixed = {c: make(chunk=c) for c in sweep}
    sweep_peaks = {}
    for c, f in fixed.items():
        f(*data)
        sweep_peaks[c] = _peak(call(f), xp)
    cases = [runner.Case("auto", f"memory_budget (chunk {plan.chunk})", call(auto), timer_for(xp)),
             runner.Case("unchunked", "unchunked", call(plain), timer_for(xp))]
    cases += [runner.Case(f"chunk {c}", f"chunk {c}", call(f), timer_for(xp)) for c, f in fixed.items()]
    times, timing_notes = runner.timed_rounds(cases, policy)
    med = {k: float(np.median(v)) for k, v in times.items()}
    in_budget = [c for c in sweep if sweep_peaks[c] <= budget]  # what a user picking by hand must keep to
    best = min(in_budget, key=lambda c: med[f"chunk {c}"]) if in_budget else None
    best_key = f"chunk {best}" if best is not None else None

    def row(key, chunk, peak):
        ratio = med[key] / med[best_key] if best_key else math.nan
        rows.append(dict(case=name, run=key, chunk=chunk, peak_bytes=peak, peak_over_budget=peak / budget,
                         within_budget=peak <= budget, ms=med[key] * 1e3, x_best_in_budget=ratio,
                         times_s=times[key], notes=timing_notes[key]))
        return (key if key != "auto" else f"**memory_budget** → chunk {chunk}", chunk, peak / 2 ** 20,
                peak / budget, "yes" if peak <= budget else "no", med[key] * 1e3, ratio)

    table = [row("unchunked", batch, unchunked), row("auto", plan.chunk, auto_peak)]
    table += [row(f"chunk {c}", c, sweep_peaks[c]) for c in sweep]
    print(f"## {label}, batch {batch}")
    print()
    print(f"budget {mb.fmt_bytes(budget)} ({'results ' + mb.fmt_bytes(results) + ' + ' if stacked else ''}"
          f"{args.fraction:g} × the unchunked {'working memory' if stacked else 'peak'}); unchunked peak "
          f"{mb.fmt_bytes(unchunked)}; planned: chunk {plan.chunk}, one chunk's program "
          f"{mb.fmt_bytes(plan.planned_peak or 0)}, results {mb.fmt_bytes(plan.results)}")
    print()
    print(markdown_table(["run", "chunk", "peak MiB", "× budget", "within the budget", "ms (median)",
                                  "× best in-budget chunk"], table))
    print()
    comparison = (ratios.compare_rows(dict(times_ms=times["auto"]), dict(times_ms=times[best_key]))
                  if best_key else None)
    targets = [(f"{name}: peak / budget", auto_peak / budget, PEAK_LIMIT, "–"),
               (f"{name}: time / best in-budget chunk ({best_key or 'none'})",
                med["auto"] / med[best_key] if best_key else math.nan, TIME_LIMIT,
                bstats.target_met(comparison, "≤", TIME_LIMIT) if comparison is not None else "–")]
    notes.append(f"{name}: the budgeted call's results differ from the unchunked call's by at most {diff:.1e}")
    return rows, targets, notes, dict(budget=budget, unchunked_peak=unchunked, results=results, chunk=plan.chunk,
                                      planned_peak=plan.planned_peak, auto_peak=auto_peak, sweep_peaks=sweep_peaks)


def run(args, settings):
    xp = backend.xp_for(args.device)
    print(f"# memory budgets on the {args.device}: batch {args.batch}, a budget of {args.fraction:g} × the unchunked "
          f"peak, chunk sweep {', '.join(map(str, sorted(set(args.chunks))))}")
    print()
    print(settings_table(settings))
    print()
    policy = runner.policy_of(args)
    all_rows, all_targets, all_notes, figures = [], [], [], {}
    for name in args.cases:
        rows, targets, notes, fig = _run_case(name, args, xp, policy)
        all_rows += rows
        all_targets += targets
        all_notes += notes
        figures[name] = fig
    print(markdown_table(["target", "measured", "≤", "met", "met beyond noise (CI of the paired rounds)"],
                                 [(t, v, lim, "yes" if v <= lim else "no", ci) for t, v, lim, ci in all_targets],
                                 "lrrll"))
    print()
    for note in all_notes:
        print(f"- {note}")
    print("- peaks: " + ("tracemalloc (NumPy's arrays; oneDNN's scratch memory is not in it)" if xp is np
                         else "CuPy's default pool (the pool emptied before each measured call)"))
    return dict(config=dict(batch=args.batch, fraction=args.fraction, chunks=sorted(set(args.chunks)),
                            cases=list(args.cases)),
                rows=all_rows, figures=figures,
                targets={t: dict(measured=v, limit=lim, met_beyond_noise=ci) for t, v, lim, ci in all_targets},
                notes=all_notes)
