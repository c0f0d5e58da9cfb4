"""A suite on a quiet and on a busy machine, alternated: each row's slowdown under load.

    python -m benchmarks loaded [--load 1] [--pairs 2] SUITE [SUITE OPTIONS ...]

runs ``python -m benchmarks SUITE ... --background-load 0`` and ``... --background-load N``
(``--load N``, default 1) as separate processes, ``--pairs`` times each, alternated
(quiet, loaded, then loaded, quiet, ...), so that a slow minute of a shared machine falls
on both sides alike. Each row's per-call times are pooled over the runs of a side, and
the table gives per row:

- loaded / quiet: the Hodges–Lehmann ratio of the two samples with its confidence
  interval and verdict (:mod:`benchmarks.stats`), against the target ≤ ``--max-slowdown``
  (issue 27: 1.5);
- for a cuvmap row with a torch counterpart in the suite (``TORCH_COUNTERPART`` of the
  suite's module: torch.func's ``vmap(grad)`` for cuvmap's per-example gradients, torch's
  backward for the batched gradients, Opacus's ghost clipping for ``dp.clipped_grad``),
  cuvmap / torch under the same load, against the target ≤ 1.

Every run's own output goes to ``LOGDIR/run-<i>-<quiet|loaded>.txt`` with its JSON beside
it, and the load that the other processes of the machine put on it (the background loops
included) is listed with the runs. The environment and every option after SUITE go to the
runs unchanged (``CUVMAP_CPU_THREADS=fixed`` turns cuvmap's thread rule off for a
before/after comparison: NOTE [threads under a busy machine] in cuvmap/cpu/threads.py).
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import time

from benchmarks import compare, harness
from benchmarks import stats as bstats

SUMMARY = "a suite alternately quiet and under --background-load N: each row's slowdown, and cuvmap / torch under load"
MAX_SLOWDOWN = 1.5


def add_arguments(parser):
    parser.add_argument("--load", type=int, default=1, help="busy-loop processes of the loaded runs (default 1)")
    parser.add_argument("--pairs", type=int, default=2, help="quiet and loaded runs each (default 2)")
    parser.add_argument("--max-slowdown", type=float, default=MAX_SLOWDOWN,
                        help=f"target of loaded / quiet per row (default {MAX_SLOWDOWN})")
    parser.add_argument("--logdir", default=None,
                        help="where the runs' outputs and JSON go (default benchmarks/results/loaded-SUITE-TIME/)")
    parser.add_argument("--json", metavar="PATH", default=None, help="the summary's JSON (default LOGDIR/summary.json)")
    parser.add_argument("--confidence", type=float, default=bstats.DEFAULT_CONFIDENCE,
                        help="confidence of the intervals")
    parser.add_argument("--factor", type=float, default=bstats.DEFAULT_FACTOR, help="the verdicts' smallest ratio")
    parser.add_argument("suite_args", nargs=argparse.REMAINDER, metavar="SUITE ...",
                        help="the suite and its options")


def _run_one(suite_args, load, path_base):
    argv = [sys.executable, "-m", "benchmarks"] + list(suite_args) + [
        "--background-load", str(load), "--json", path_base + ".json", "--no-plot", "--progress", "off"]
    t0 = time.perf_counter()
    with open(path_base + ".txt", "w") as log:
        log.write("$ " + " ".join(argv) + "\n\n")
        log.flush()
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())
    wall = time.perf_counter() - t0
    results = None
    if os.path.exists(path_base + ".json"):
        with open(path_base + ".json") as fh:
            results = json.load(fh)
    return rc, wall, results


def _pooled(runs):
    """``{identity: (entry of the first run, times pooled over the runs)}`` of the cases in
    every run."""
    cases = [compare.timed_cases(r) for r in runs]
    common = [k for k in cases[0] if all(k in c for c in cases[1:])]
    return {k: (cases[0][k], [t for c in cases for t in c[k]["times_ms"]]) for k in common}


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _counterpart(identity, entry, counterparts):
    key = dict(identity).get("key")
    if entry.get("framework") != "cuvmap" or key not in counterparts:
        return None
    return compare.reference_of(identity, counterparts[key])


def summarize(quiet_runs, loaded_runs, counterparts, max_slowdown=MAX_SLOWDOWN, factor=bstats.DEFAULT_FACTOR,
              confidence=bstats.DEFAULT_CONFIDENCE):
    """The per-row comparison (a list of dicts) of the pooled quiet and loaded runs."""
    quiet, loaded = _pooled(quiet_runs), _pooled(loaded_runs)
    rows = []
    for ident, (entry, q_times) in quiet.items():
        if ident not in loaded:
            continue
        l_times = loaded[ident][1]
        c = bstats.compare_samples(l_times, q_times, paired=False, confidence=confidence, factor=factor)
        row = dict(case=compare.label(ident, entry), framework=entry.get("framework"),
                   quiet_ms=_median(q_times), loaded_ms=_median(l_times), slowdown=c.as_dict(),
                   slowdown_met=bstats.target_met(c, "≤", max_slowdown))
        other = _counterpart(ident, entry, counterparts)
        if other is not None and other in loaded:
            t_entry, t_times = loaded[other]
            ct = bstats.compare_samples(l_times, t_times, paired=False, confidence=confidence, factor=factor)
            row.update(torch_case=t_entry.get("method") or t_entry.get("key"), torch_loaded_ms=_median(t_times),
                       vs_torch=ct.as_dict(), vs_torch_met=bstats.target_met(ct, "≤", 1.0))
        rows.append(row)
    return rows


def _ratio_text(c):
    lo, hi = c["ci_low"], c["ci_high"]
    return f"{c['ratio']:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{c['ratio']:.2f}"


def _met_text(met):
    return met if isinstance(met, str) else "–"


def print_summary(rows, runs, max_slowdown, confidence):
    print(f"\n## Each row loaded / quiet, and cuvmap / torch under the same load ({100 * confidence:g}% CI)\n")
    table = []
    for r in rows:
        s = r["slowdown"]
        t = r.get("vs_torch")
        table.append((r["case"], r["quiet_ms"], r["loaded_ms"], _ratio_text(s), s["verdict"],
                      _met_text(r["slowdown_met"]), r.get("torch_loaded_ms"), _ratio_text(t) if t else "–",
                      _met_text(r["vs_torch_met"]) if t else "–"))
    print(harness.markdown_table(
        ["case", "quiet ms", "loaded ms", "loaded / quiet", "verdict", f"≤ {max_slowdown:g}", "torch loaded ms",
         "cuvmap / torch loaded", "≤ 1"], table, "lrrlllrll"))
    print("\n- medians of the per-call times pooled over the runs of each side; ratios: Hodges–Lehmann estimates "
          "with distribution-free intervals (benchmarks/stats.py); met: yes / no when the whole interval is on one "
          "side of the target, ? when it straddles it")
    print("\n## The runs\n")
    table = [(i, side, rc, wall, None if load is None else load.get("others_cores"),
              None if bg is None else bg.get("cores_used"), path) for i, side, rc, wall, load, bg, path in runs]
    print(harness.markdown_table(["run", "side", "exit", "wall s", "other processes' cores (loops included)",
                                  "loops' cores", "output"], table, "rlrrrrl"))


def main(args):
    if not args.suite_args:
        print("python -m benchmarks loaded: name a suite (python -m benchmarks loaded dp --batch 32)", file=sys.stderr)
        return 2
    suite_args = [a for a in args.suite_args if a != "--"]
    suite = suite_args[0]
    from benchmarks.__main__ import SUITES

    if suite not in SUITES:
        print(f"python -m benchmarks loaded: unknown suite {suite!r}", file=sys.stderr)
        return 2
    counterparts = getattr(importlib.import_module(SUITES[suite]), "TORCH_COUNTERPART", {})
    logdir = args.logdir or os.path.join(harness.RESULTS_DIR, f"loaded-{suite}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(logdir, exist_ok=True)
    order = []
    for i in range(args.pairs):
        order += [0, args.load] if i % 2 == 0 else [args.load, 0]
    quiet_runs, loaded_runs, runs = [], [], []
    for i, load in enumerate(order):
        side = "loaded" if load else "quiet"
        base = os.path.join(logdir, f"run-{i}-{side}")
        print(f"run {i + 1}/{len(order)}: {suite} {side} (--background-load {load}) ...", file=sys.stderr, flush=True)
        rc, wall, results = _run_one(suite_args, load, base)
        runs.append((i, side, rc, wall, results and results.get("machine_load"),
                     results and results.get("background_load"), base + ".txt"))
        if results is not None:
            (loaded_runs if load else quiet_runs).append(results)
    if not quiet_runs or not loaded_runs:
        print("python -m benchmarks loaded: a side has no run with results; see the logs in " + logdir, file=sys.stderr)
        return 2
    print(f"# {suite}: quiet against --background-load {args.load}, {args.pairs} run(s) each, alternated")
    print(f"\n{' '.join(suite_args)}; CUVMAP_CPU_THREADS={os.environ.get('CUVMAP_CPU_THREADS', '(unset)')}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print("\nsettings of the first run:\n")
    print(harness.settings_table(quiet_runs[0].get("settings", {})))
    rows = summarize(quiet_runs, loaded_runs, counterparts, args.max_slowdown, args.factor, args.confidence)
    print_summary(rows, runs, args.max_slowdown, args.confidence)
    path = args.json or os.path.join(logdir, "summary.json")
    harness.write_json(path, dict(suite=suite, argv=suite_args, load=args.load, pairs=args.pairs, rows=rows,
                                  runs=[dict(run=i, side=s, exit=rc, wall_s=w, machine_load=ml, background_load=bg,
                                             log=p) for i, s, rc, w, ml, bg, p in runs]))
    print(f"\nJSON: {path}")
    return 0
