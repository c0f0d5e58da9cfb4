"""Where the eager time goes: the benchmark CNN's per-example and batched gradients, eager
against jit, split into the primitives' kernels and the dispatch around them.

    python -m benchmarks eager [--batch 8 32 128] [--torch-first] [--repeats 7]

The network is the per-example suite's (``benchmarks/models.py``: conv 1→16 k5, conv
16→32 k5, dense 12800→10, float32). For each batch size:

- the cases ``vmap(grad)`` and ``grad`` of the mean loss (batched), eagerly and under
  ``jit``, timed in interleaved rounds (``benchmarks/rounds/``), with the eager / jit
  ratio paired by round: what the eager dispatch and the eager executor cost beyond the
  planned program;
- a split of the eager calls (after the rounds, ``--split-calls`` calls): ``Primitive.bind``
  wrapped so that each bind that reaches a kernel (no transform above it: the primitive's
  impl) is timed, giving the binds per call, the kernels' time per primitive and the rest,
  the dispatch (the transforms' rules, tracers, the tape, argument checks), per bind. The
  wrapper itself costs about a microsecond per bind, counted in the dispatch; and the
  function calls of an eager call as cProfile counts them (Python and C functions, the
  fewest of three calls), a measure of the dispatch that the machine's load moves only
  through the thread rule's branches;
- the dense layer's products: the skinny GEMM of the forward pass (B×12800 by 12800×10,
  float32) as cuvmap's eager ``dot_general`` runs it (OpenBLAS, with the thread count NOTE
  [threads under a busy machine] in cuvmap/cpu/threads.py asks for), and as plain
  ``numpy.matmul`` runs it on OpenBLAS's threads, limited to one, and in the transposed
  layout (10×12800 by 12800×B); and the per-example weight gradient, B outer products
  12800 ⊗ 10, as ``dot_general`` runs it (NOTE [outer products on the team] in
  cuvmap/cpu/onednn_matmul.py) and as NumPy's broadcast multiply writes it.

The JSON keeps every round's time (``eager`` and ``jit`` of each row, the GEMM rows), so
``python -m benchmarks compare BASE.json HEAD.json`` judges two runs case by case.

The settings table says which OpenMP runtime oneDNN runs on and how its convolutions use
threads (``--torch-first``: torch's libgomp, NOTE [oneDNN beside another OpenMP user] in
cuvmap/cpu/openmp.py). ``--both-orders`` runs the suite again in a child process with
``--torch-first`` (when torch is installed) and adds its rows, each row naming its import
order: torch not imported, or imported first (torch makes no call during cuvmap's rounds:
the rows show what its libgomp does to cuvmap's own calls). Where torch is installed,
torch's own profile of the same network closes each order's run (``torch.profiler``: the
ops with the most self time of torch.func ``vmap(grad)`` and of torch's batched gradient,
after cuvmap's rounds, so that "not imported" holds for them). NOTE [where the eager time
goes] in cuvmap/api_util.py reads the figures.
"""
import collections
import time

import numpy as np

import cuvmap as cv
from cuvmap.core import primitive as core_primitive
from cuvmap.cpu import onednn, threads as cpu_threads
from cuvmap.lax import conv_strategy

from benchmarks import models
from benchmarks.machine import settings as machine_settings
from benchmarks.report.tables import DocTable, markdown_table, settings_table
from benchmarks.rounds import ratios, runner
from benchmarks.rounds.timers import timer_for

SUMMARY = "where the eager time goes: vmap(grad) and batched grad of the CNN, eager against jit, kernels and dispatch"
DEFAULTS = dict(repeats=7, warmup=2)

DOC_TABLES = [
    DocTable("Eager against jit, and the eager call split into kernels and dispatch", "rows", [
        ("torch", "order", "l"), ("batch", "batch", "r"), ("transform", "transform", "l"),
        ("eager ms", "eager_ms", "r"),
        ("jit ms", "jit_ms", "r"), ("eager / jit", "eager_over_jit", "r"),
        ("95% CI", lambda row, run: ratios.interval_text(row.get("comparison")), "l"),
        ("binds per call", "binds", "r"), ("kernel calls", "kernel_calls", "r"), ("kernels ms", "kernels_ms", "r"),
        ("dispatch ms", "dispatch_ms", "r"), ("dispatch µs per bind", "dispatch_us_per_bind", "r"),
        ("Python calls per call", "python_calls", "r")],
        note="Kernels and dispatch from the split calls (Primitive.bind wrapped and timed), eager and jit from the "
             "interleaved rounds: the split's sum is a little above the eager median (the wrapper's cost). Python "
             "calls: cProfile's count of the function calls (C functions included) of an eager call, the fewest of "
             "three: the size of the dispatch and of the kernels' Python wrappers, which the machine's load moves "
             "only through the thread rule's branches (a few hundred calls; CUVMAP_CPU_THREADS=fixed pins them)."),
    DocTable("The eager kernels per primitive (the five largest of each call)", "primitives", [
        ("torch", "order", "l"), ("batch", "batch", "r"), ("transform", "transform", "l"),
        ("primitive", "primitive", "l"),
        ("calls", "calls", "r"), ("ms per call of the transform", "ms", "r"), ("share of the kernels", "share", "r")]),
    DocTable("torch's own profile of the same network (torch.profiler, the same process)", "torch_profile", [
        ("torch", "order", "l"), ("batch", "batch", "r"), ("transform", "transform", "l"), ("op", "op", "l"),
        ("calls", "calls", "r"), ("self ms per call of the transform", "ms", "r"), ("share", "share", "r")],
        note="torch.func vmap(grad) and torch's batched gradient of the same CNN on the same weights and data, after "
             "cuvmap's rounds, profiled by torch.profiler (CPU activity) over --split-calls calls: each op's self "
             "time per call (the five largest), and its share of the profiled total (the profiler's own cost "
             "included). Beside cuvmap's kernels per primitive above: aten::convolution_backward is the weight and "
             "input gradients of both convolutions, aten::bmm the per-example dense gradient, threshold_backward "
             "relu's VJP (cuvmap's select)."),
    DocTable("The kernels chosen per convolution", "conv_kernels", [
        ("torch", "order", "l"), ("op", "op", "l"), ("N (bucket)", "n", "r"), ("groups", "groups", "r"),
        ("channels per group", "channels", "l"), ("input", "spatial", "l"), ("chosen", "chosen", "l"),
        ("oneDNN ms", "onednn_ms", "r"), ("oneDNN channels-last ms", "onednn_cl_ms", "r"), ("unfold ms", "unfold_ms", "r"),
        ("oneDNN's implementation", "impl", "l")],
        note="The conv strategy \"auto\" times oneDNN's primitive and the unfold kernels (im2col + GEMM) once per "
             "key, at the key's first call, and keeps the faster (NOTE [conv strategy] in cuvmap/lax/conv_strategy.py); "
             "the implementation is what oneDNN runs for that key's plans (jit:avx512_core is its direct "
             "convolution; the reorders are its copies of the operands into and out of its blocked layouts)."),
    DocTable("The dense layer's products (forward: B×12800 by 12800×10; per-example gradient: B × 12800 ⊗ 10; "
             "float32)", "gemm", [
        ("torch", "order", "l"), ("batch", "batch", "r"), ("how", "how", "l"), ("ms", "ms", "r")],
        note="Each case once per round, in rotating order. With torch imported first, cuvmap's products run on "
             "OpenMP's spinning team (NOTE [GEMMs on the spinning team], NOTE [outer products on the team]), and "
             "in these rounds they often follow the case of plain numpy.matmul on OpenBLAS's two threads, whose "
             "idle workers then spin beside the team: cuvmap's rows of that order are several times their time "
             "alone. In a training step cuvmap's own GEMMs keep OpenBLAS to one thread while the team spins, and "
             "the per-example suite shows the products' share of a step."),
]


def add_arguments(parser):
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128], help="batch sizes")
    parser.add_argument("--split-calls", type=int, default=10,
                        help="eager calls of the split into kernels and dispatch")
    parser.add_argument("--torch-first", action="store_true",
                        help="import torch before NumPy and cuvmap (done by the CLI): oneDNN gets torch's libgomp")
    parser.add_argument("--both-orders", action="store_true",
                        help="also run the suite with --torch-first in a child process and add its rows")


def _split(fn, calls):
    """``(binds, kernel calls per primitive, kernel seconds per primitive, total seconds)``
    over ``calls`` calls of ``fn``, with Primitive.bind wrapped."""
    bind = core_primitive.Primitive.bind
    find_top = core_primitive.find_top_main
    seconds, counts, binds = collections.defaultdict(float), collections.Counter(), [0]
    clock = time.perf_counter

    def timed_bind(self, *args, **params):
        binds[0] += 1
        if find_top(self, args, params) is None:
            start = clock()
            out = bind(self, *args, **params)
            seconds[self.name] += clock() - start
            counts[self.name] += 1
            return out
        return bind(self, *args, **params)

    core_primitive.Primitive.bind = timed_bind
    try:
        start = clock()
        for _ in range(calls):
            fn()
        total = clock() - start
    finally:
        core_primitive.Primitive.bind = bind
    return binds[0], counts, seconds, total


def _python_calls(fn, calls=3):
    """The function calls of a call of ``fn``, as cProfile counts them (Python and C
    functions, each call once), the fewest of ``calls`` calls: a measure of the dispatch
    that the machine's load moves only through the thread rule's branches (NOTE [where
    the eager time goes] in cuvmap/api_util.py)."""
    import cProfile
    import pstats

    counts = []
    for _ in range(calls):
        profile = cProfile.Profile()
        profile.enable()
        try:
            fn()
        finally:
            profile.disable()
        counts.append(sum(stat[1] for stat in pstats.Stats(profile).stats.values()))
    return min(counts)


def _gemm_rows(batch, repeats, order):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 12800)).astype(np.float32)
    w = rng.standard_normal((12800, 10)).astype(np.float32)
    xt, wt = np.ascontiguousarray(x.T), np.ascontiguousarray(w.T)
    g = rng.standard_normal((batch, 10)).astype(np.float32)   # the logits' cotangent

    def one_thread():
        with cpu_threads.limited(1):
            return x @ w

    import cuvmap.numpy as cnp

    cases = [runner.Case("cnp.matmul", "cuvmap: cnp.matmul(x, w) (dot_general, eager: its thread rule)",
                         lambda: cnp.matmul(x, w), timer_for(np)),
             runner.Case("x @ w", "numpy.matmul(x, w), OpenBLAS's threads", lambda: x @ w, timer_for(np)),
             runner.Case("x @ w, 1 thread", "numpy.matmul(x, w), one thread", one_thread, timer_for(np)),
             runner.Case("w.T @ x.T", "numpy.matmul(w.T, x.T) on contiguous transposes", lambda: wt @ xt,
                         timer_for(np)),
             runner.Case("x ⊗ g", "cuvmap: per-example x ⊗ g (dot_general, batch dims only)",
                         lambda: cv.lax.dot_general(x, g, (((), ()), ((0,), (0,)))), timer_for(np)),
             runner.Case("x ⊗ g, numpy", "numpy: g[:, :, None] * x[:, None, :] (one thread)",
                         lambda: g[:, :, None] * x[:, None, :], timer_for(np))]
    policy = runner.Policy(repeats=max(repeats, 15), warmup=2)
    runner.warm_up(cases, policy.warmup)
    times, _ = runner.timed_rounds(cases, policy)
    return [dict(order=order, batch=batch, how=c.label, key=f"{c.key}, torch {order}",
                 ms=float(np.median(times[c.key])) * 1e3, times_ms=[t * 1e3 for t in times[c.key]]) for c in cases]


def _torch_profile(batches, calls, order):
    """torch's own profile (torch.profiler) of torch.func ``vmap(grad)`` and of torch's
    batched gradient of the benchmark CNN at each batch: the five ops with the most self
    CPU time per call, and their share of the profiled total; [] without torch."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return []
    # torch is optional, and imported only here, after cuvmap's rounds (the "not imported" order)
    import torch
    from torch.func import grad, vmap
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(machine_settings.blas_threads()[0])
    params = models.cnn_params()
    tp = {k: torch.tensor(v) for k, v in params.items()}
    fns = {"vmap(grad)": vmap(grad(models.torch_per_example_loss), in_dims=(None, 0, 0)),
           "batched grad": grad(models.torch_batch_loss)}
    rows = []
    for batch in batches:
        xs, ys = models.cnn_data(batch)
        tx, ty = torch.tensor(xs), torch.tensor(ys)
        for name, f in fns.items():
            for _ in range(3):
                f(tp, tx, ty)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(calls):
                    f(tp, tx, ty)
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events)
            for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:5]:
                rows.append(dict(order=order, batch=batch, transform=f"torch: {name}", op=e.key,
                                 calls=e.count // calls, ms=e.self_cpu_time_total / calls / 1e3,
                                 share=f"{e.self_cpu_time_total / total:.0%}" if total else "–"))
    return rows


def _conv_kernels(order):
    """The kernels the conv strategy chose for each convolution key it measured (oneDNN in
    its blocked or its channels-last layout, or unfold: NOTE [activation layouts] in
    cuvmap/cpu/onednn.py), with oneDNN's implementation of the chosen layout's plans of that
    op and shape."""
    plans = onednn.cached_plans()
    rows = []
    for key, (chosen, times) in sorted(conv_strategy.measured_choices().items(), key=lambda kv: str(kv[0])):
        op, device, _, n, groups, cg, og, spatial, kernel = key[:9]
        if device != "cpu":
            continue
        k = len(kernel)
        channels_last = chosen == "onednn:channels_last"
        impls = sorted({description for plan_op, shapes, description in plans
                        if plan_op == op and shapes["w"][-k:] == tuple(kernel) and shapes["x"][2:] == tuple(spatial)
                        and shapes["w"][-k - 2:-k] == (og, cg) and shapes["x"][0] <= n
                        and ("(channels_last)" in description) == channels_last})
        rows.append(dict(order=order, op=op, n=n, groups=groups, channels=f"{cg} → {og}",
                         spatial="×".join(map(str, spatial)), chosen=chosen, onednn_ms=times.get("onednn"),
                         onednn_cl_ms=times.get("onednn:channels_last"), unfold_ms=times.get("unfold"),
                         impl="; ".join(impls) if chosen.startswith("onednn") else "–"))
    return rows


def _order(args):
    return "imported first" if args.torch_first else "not imported"


def _torch_first_child(args):
    """The suite's figures with ``--torch-first``, from a child process (``--both-orders``);
    None, with a note, where torch is not installed or the child fails."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys
    import tempfile

    if importlib.util.find_spec("torch") is None:
        return None, "--both-orders: torch is not installed; the run has the rows without torch only"
    argv, skip = [], False
    for a in args.argv:
        if skip:
            skip = False
            continue
        if a in ("--json", "--plot"):
            skip = True
            continue
        if a not in ("--both-orders", "--save-to-docs", "--torch-first"):
            argv.append(a)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "eager-torch-first.json")
        cmd = [sys.executable, "-m", "benchmarks"] + argv + ["--torch-first", "--no-plot", "--json", path]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0 or not os.path.exists(path):
            return None, f"--both-orders: the --torch-first child failed ({done.returncode}): {done.stdout[-500:]}"
        with open(path) as fh:
            return json.load(fh), None


def run(args, settings):
    from cuvmap.cpu import openmp

    print(f"# where the eager time goes on the cpu: the benchmark CNN, batch {', '.join(map(str, args.batch))}")
    print()
    print(settings_table(settings))
    print()
    policy = runner.policy_of(args)
    rows, prims, gemm = [], [], []
    params = models.cnn_params()
    for batch in args.batch:
        xs, ys = models.cnn_data(batch)
        fns = {"vmap(grad)": cv.vmap(cv.grad(models.cuvmap_per_example_loss), in_axes=(None, 0, 0)),
               "batched grad": cv.grad(models.cuvmap_batch_loss)}
        cases = []
        for name, f in fns.items():
            jitted = cv.jit(f)
            cases += [runner.Case(f"{name} eager", f"{name}, eager", (lambda f: lambda: f(params, xs, ys))(f),
                                  timer_for(np)),
                      runner.Case(f"{name} jit", f"{name}, jit", (lambda f: lambda: f(params, xs, ys))(jitted),
                                  timer_for(np))]
        runner.warm_up(cases, policy.warmup)
        times, timing_notes = runner.timed_rounds(cases, policy)
        for name, f in fns.items():
            eager, jit = times[f"{name} eager"], times[f"{name} jit"]
            comparison = ratios.compare_rows(dict(times_ms=eager), dict(times_ms=jit))
            binds, counts, seconds, total = _split(lambda: f(params, xs, ys), args.split_calls)
            python_calls = _python_calls(lambda: f(params, xs, ys))
            n = args.split_calls
            kernels = sum(seconds.values()) / n
            dispatch = total / n - kernels
            rows.append(dict(order=_order(args), batch=batch, transform=name, framework="cuvmap",
                             key=f"{name}, torch {_order(args)}",
                             eager=dict(times_ms=[t * 1e3 for t in eager]), jit=dict(times_ms=[t * 1e3 for t in jit]),
                             eager_ms=float(np.median(eager)) * 1e3, jit_ms=float(np.median(jit)) * 1e3,
                             eager_over_jit=float(np.median(eager) / np.median(jit)),
                             comparison=comparison.as_dict(), binds=binds // n,
                             kernel_calls=sum(counts.values()) // n, kernels_ms=kernels * 1e3,
                             dispatch_ms=dispatch * 1e3, dispatch_us_per_bind=dispatch / max(1, binds / n) * 1e6,
                             python_calls=python_calls,
                             notes=timing_notes[f"{name} eager"]))
            for prim, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:5]:
                prims.append(dict(order=_order(args), batch=batch, transform=name, primitive=prim,
                                  calls=counts[prim] // n, ms=s / n * 1e3,
                                  share=f"{s / n / kernels:.0%}" if kernels else "–"))
        gemm += _gemm_rows(batch, policy.repeats, _order(args))
    # torch's own profile last, so that torch is imported only after cuvmap's rounds in the
    # "not imported" order
    torch_profile = _torch_profile(args.batch, args.split_calls, _order(args))
    conv_kernels = _conv_kernels(_order(args))
    notes = [f"torch {_order(args)}: oneDNN's convolutions: {openmp.mode()} mode; {openmp.settings_description()}"]
    if args.both_orders and not args.torch_first:
        child, why = _torch_first_child(args)
        if child is not None:
            rows += child["rows"]
            prims += child["primitives"]
            gemm += child["gemm"]
            torch_profile += child.get("torch_profile", [])
            conv_kernels += child.get("conv_kernels", [])
            notes.append(child["notes"][0])
        else:
            notes.append(why)
    print(markdown_table(["torch", "batch", "transform", "eager ms", "jit ms", "eager / jit", "95% CI",
                          "binds per call", "kernel calls", "kernels ms", "dispatch ms", "dispatch µs per bind",
                          "Python calls per call"],
                         [(r["order"], r["batch"], r["transform"], r["eager_ms"], r["jit_ms"], r["eager_over_jit"],
                           ratios.interval_text(r["comparison"]), r["binds"], r["kernel_calls"], r["kernels_ms"],
                           r["dispatch_ms"], r["dispatch_us_per_bind"], r.get("python_calls")) for r in rows]))
    print()
    print(markdown_table(["torch", "batch", "transform", "primitive", "calls", "ms", "share of the kernels"],
                         [(p["order"], p["batch"], p["transform"], p["primitive"], p["calls"], p["ms"], p["share"])
                          for p in prims]))
    print()
    print(markdown_table(["torch", "op", "N", "groups", "channels", "input", "chosen", "oneDNN ms", "channels-last ms",
                          "unfold ms",
                          "oneDNN's implementation"],
                         [(k["order"], k["op"], k["n"], k["groups"], k["channels"], k["spatial"], k["chosen"],
                           k["onednn_ms"], k.get("onednn_cl_ms"), k["unfold_ms"], k["impl"]) for k in conv_kernels]))
    print()
    if torch_profile:
        print(markdown_table(["torch", "batch", "transform", "op", "calls", "self ms", "share"],
                             [(t["order"], t["batch"], t["transform"], t["op"], t["calls"], t["ms"], t["share"])
                              for t in torch_profile]))
        print()
    print(markdown_table(["torch", "batch", "how", "ms"], [(g["order"], g["batch"], g["how"], g["ms"]) for g in gemm]))
    print()
    notes += ["the dispatch is the same at every batch (a fixed number of binds, each a Python rule): the share "
              "of an eager call it takes falls as the batch grows; jit(...) pays none of it",
              "torch imported first (--torch-first): torch's libgomp keeps its own wait policy, its idle workers "
              "spinning after each parallel region; cuvmap joins that team (convolutions on OpenMP's threads, "
              "GEMMs on one OpenBLAS thread while the team spins: NOTE [oneDNN beside another OpenMP user] in "
              "cuvmap/cpu/openmp.py)"]
    for note in notes:
        print(f"- {note}")
    return dict(config=dict(batch=list(args.batch), split_calls=args.split_calls), rows=rows, primitives=prims,
                gemm=gemm, torch_profile=torch_profile, conv_kernels=conv_kernels, notes=notes)
