"""``--scopes``: the time per named scope of a staged function (``cuvmap.profiler``)."""
import cuvmap as cv

from benchmarks.report.tables import markdown_table


def time_per_scope(label, fn, args, rounds=10, policy=None):
    """``--scopes``: the median time per call of each named scope of ``fn(*args)``, staged
    as ``jit`` stages it (``cuvmap.profiler.time_by_scope``, NOTE [time per scope] in
    cuvmap/profiler.py), with the background loops of ``--alternate-load`` (``policy.load``)
    paused. Prints a table; returns it as a dict for the JSON."""
    load = getattr(policy, "load", None)
    if load is not None:
        load.set_running(False)
        label += ", the background loops paused"
    times = cv.profiler.time_by_scope(fn, *args, rounds=rounds)
    total = sum(times.seconds.values()) or 1.0
    rows = [dict(scope=k, steps=times.steps[k], ms=t * 1e3, share=t / total) for k, t in times.seconds.items()]
    print(f"\n## Time per named scope: {label} ({times.rounds} rounds, medians; cuvmap.profiler)\n")
    print(markdown_table(["scope", "steps", "ms", "share"],
                         [(r["scope"], r["steps"], r["ms"], f"{r['share']:.1%}") for r in rows], "lrrr"))
    print(f"\nthe steps take {times.total * 1e3:.3g} ms together, the untimed call {times.call * 1e3:.3g} ms "
          "(the difference: the clock reads around every step)")
    # per layer, each scope's backward folded into its row (NOTE [a scope's backward folds into its row])
    layers = [dict(scope=k, forward_ms=f * 1e3, backward_ms=b * 1e3) for k, (f, b) in times.by_scope(1).items()]
    print("\nper layer (depth 1, the backward folded in):\n")
    print(markdown_table(["scope", "forward ms", "backward ms", "ms"],
                         [(r["scope"], r["forward_ms"], r["backward_ms"], r["forward_ms"] + r["backward_ms"])
                          for r in layers], "lrrr"))
    return dict(label=label, rows=rows, layers=layers, total_ms=times.total * 1e3, call_ms=times.call * 1e3)
