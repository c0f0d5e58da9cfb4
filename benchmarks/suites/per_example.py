"""Per-example gradients of the benchmark CNN, every method side by side in one run.

    python -m benchmarks per_example [--batch 32 128] [--device cpu|gpu] [--chunk-size 32]
        [--loop-examples 16] [--no-torch] [--no-jax] [--torch-first] [--repeats 7] [--warmup 2]
        [--json PATH]

The benchmark CNN (``benchmarks/models.py``; not the README's first snippet), float32:
input (1, 28, 28), conv 1→16 k5 + relu, conv 16→32 k5 + relu, flatten, dense 12800 → 10,
cross entropy with integer labels. The same weights and data (NumPy, fixed seeds) go to
every method:

  (a) a Python loop of cuvmap ``grad`` over the examples — only ``--loop-examples`` of
      them are timed and the time is scaled to the batch (the output says so);
  (b) cuvmap ``vmap(grad(loss), in_axes=(None, 0, 0))``;
  (c) the same with ``chunk_size`` (one chunk when the batch is not larger);
  (d) cuvmap ``grad`` of the mean loss over the batch: the ordinary batched backward
      pass, the floor that per-example gradients are measured against;
  (d') cuvmap ``jit(vmap(grad))``: (b) staged once and run by the planned executor (its
      first call includes the tracing), and ``jit`` of (d);
  (e) torch.func ``vmap(grad)`` of a functional net on ``torch.nn.functional.conv2d``,
      and torch's batched gradient for reference (when torch is installed);
  (f) JAX ``jit(vmap(grad))`` with ``lax.conv_general_dilated``, and ``jit(grad)`` of the
      mean loss for reference (when JAX is installed).

The methods of a batch size are timed in interleaved rounds (each once per round, in
rotating order; more rounds while a method's IQR / median is above ``--max-spread``:
``benchmarks/rounds/runner.py``), and each ratio between two methods comes with a confidence
interval from the paired rounds and a verdict, FAST, SLOW or SAME (``benchmarks/rounds/stats.py``);
a target is met when the whole interval meets it. On the GPU each row also carries the
device memory its call needed at its peak (CuPy's pool for cuvmap, torch's allocator for
torch).

Each row carries the largest absolute difference of its per-example gradients from
cuvmap's ``vmap(grad)`` (for batched gradients: from the mean of cuvmap's per-example
gradients), over all parameters, and the minor page faults per timed call (``getrusage``'s
``ru_minflt`` before and after each call: pages the call touched for the first time).

Before the methods run, the suite applies what cuvmap's ``jit`` applies when it first
plans a CPU program — glibc's malloc keeps freed memory mapped (NOTE [keeping freed host
memory] in cuvmap/transforms/executor.py) — so that every row runs under the same
allocator (the settings table says which applied). The gain that this setting brings is
measured by running the suite again with glibc's default thresholds fixed:
``MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072 python -m benchmarks per_example``
(the user's setting wins; then every call faults its fresh pages in, eager or jitted).

The compute floor is the network's FLOPs per example — 6 × multiply-adds (2 per
multiply-add, 3 × the forward for forward + backward) — over the float32 GEMM rate of
``matmul`` on square matrices measured in the same run (before and after the methods;
the faster of the two is used).

Ratios reported against the project's targets: vmap(grad) / batched gradient ≤ 1.5,
loop / vmap(grad) ≥ 5, vmap(grad) / torch.func vmap(grad) ≤ 1, cuvmap's batched gradient
/ torch's ≤ 1.2 (eager), and jitted, jit(vmap(grad)) / torch.func vmap(grad) ≤ 1 and
jit(grad) / torch's batched gradient ≤ 1 (issue 36's targets).

cuvmap's CPU convolutions run on oneDNN where ``auto`` measures it faster (the settings
table's ``oneDNN`` row says which version, OpenMP wait policy and threading mode). torch
ships its own ``libgomp.so.1``. By default the suite loads cuvmap's oneDNN before it
imports torch, so that both run on the libgomp cuvmap loaded (with ``OMP_WAIT_POLICY=PASSIVE``
unless the command line sets a policy: NOTE [OpenMP threads beside OpenBLAS] in
cuvmap/cpu/onednn.py). ``--torch-first`` imports torch before NumPy and cuvmap, as a
script that starts with ``import torch`` does: oneDNN then gets torch's libgomp with the
command line's policy (by default its idle workers spin after each region), and cuvmap
joins that team: its convolutions on OpenMP's threads, its GEMMs on one OpenBLAS thread
while the team still spins (NOTE [oneDNN beside another OpenMP user];
``CUVMAP_ONEDNN_THREADING=threads`` runs the convolutions on cuvmap's own threads instead).

The figures of ``docs/performance/per_example.md`` and of the README's table come from
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks per_example --batch 32 128
--save-to-docs`` (``OPENBLAS_CORETYPE`` halves NumPy's GEMM rate on some machines), then
``python -m benchmarks report``; the page says which command made them.
"""
import gc

import numpy as np

import cuvmap as cv
from cuvmap import backend
from cuvmap.cpu import onednn
from cuvmap.transforms import executor

from benchmarks import models
from benchmarks.machine import settings as machine_settings
from benchmarks.machine.gemm import gemm_rate
from benchmarks.methods import cuvmap_methods, jax_methods, torch_methods
from benchmarks.report.progress import Progress
from benchmarks.report.tables import DocTable, markdown_table, settings_table, spread_cell, timing_lines
from benchmarks.rounds import peaks, ratios, runner
from benchmarks.rounds.scopes import time_per_scope

SUMMARY = "per-example gradients of the benchmark CNN: loop, vmap(grad), chunked, batched, jit(vmap(grad)), torch.func, JAX"
DEFAULTS = dict(repeats=7, warmup=2)

# per-example gradients differing from cuvmap vmap(grad)'s by more than this times the
# largest |per-example gradient| count as "off" (float32 agreement is ~1e-6 of it)
DIFF_TOL = 1e-4

# the torch row each cuvmap row is held against under load (--alternate-load; the loop of
# single-example grads has none)
TORCH_COUNTERPART = {"vmap": "torch_vmap", "chunked": "torch_vmap", "jit_vmap": "torch_vmap",
                     "batched": "torch_batched", "jit_batched": "torch_batched"}

TARGETS = [  # name, numerator, denominator, comparison, target
    ("vmap(grad) / batched gradient", "vmap", "batched", "≤", 1.5),
    ("loop / vmap(grad)", "loop", "vmap", "≥", 5.0),
    ("vmap(grad) / torch.func vmap(grad)", "vmap", "torch_vmap", "≤", 1.0),
    ("batched gradient / torch batched gradient", "batched", "torch_batched", "≤", 1.2),
    ("jit(vmap(grad)) / torch.func vmap(grad)", "jit_vmap", "torch_vmap", "≤", 1.0),
    ("jit(grad) batched / torch batched gradient", "jit_batched", "torch_batched", "≤", 1.0),
]
INFO_RATIOS = [  # name, numerator, denominator: reported where both ran, no target
    ("vmap(grad, chunk_size) / vmap(grad)", "chunked", "vmap"),
    ("cuvmap jit(vmap(grad)) / cuvmap vmap(grad)", "jit_vmap", "vmap"),
    ("cuvmap jit(grad) / cuvmap grad, batched", "jit_batched", "batched"),
    ("cuvmap jit(vmap(grad)) / JAX jit(vmap(grad))", "jit_vmap", "jax_vmap"),
    ("cuvmap vmap(grad) / JAX jit(vmap(grad))", "vmap", "jax_vmap"),
    ("torch.func vmap(grad) / torch batched", "torch_vmap", "torch_batched"),
    ("JAX jit(vmap(grad)) / JAX batched", "jax_vmap", "jax_batched"),
]



def _x_batched(row, run):
    base = next(r for r in run["rows"] if r["batch"] == row["batch"] and r["key"] == "batched")
    return row["median_ms"] / base["median_ms"]


DOC_TABLES = [
    DocTable("Time per batch, every method on the same weights and data", "rows", [
        ("batch", "batch", "r"), ("method", "method", "l"), ("median ms", "median_ms", "r"),
        ("ms / example", "ms_per_example", "r"), ("× cuvmap batched", _x_batched, "r"),
        ("IQR / median", lambda row, run: spread_cell(row), "r"), ("rounds", "repeats", "r"),
        ("first call ms", "first_call_ms", "r"), ("max abs diff", "diff_vs_cuvmap_vmap", "r")],
        note="max abs diff: the largest |difference| over all parameters from cuvmap `vmap(grad)`'s per-example "
             "gradients (batched rows: from their mean). The loop times some of the examples and is scaled to the "
             "batch; first call: tracing, compilation, the kernels' choice."),
    DocTable("Compute floor", lambda run: [run], [
        ("MFLOP per example (forward + backward)", lambda row, run: run["flops"]["train"] / 1e6, "r"),
        ("float32 GEMM GFLOP/s, this run", lambda row, run: run["gemm"]["gflops_used"], "r"),
        ("floor µs per example", lambda row, run: run["floor_ms_per_example"] * 1e3, "r")],
        note="The floor is the network's FLOPs per example over the machine's GEMM rate measured in the same run."),
]


def add_arguments(parser):
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128], help="batch sizes")
    parser.add_argument("--chunk-size", type=int, default=32, help="chunk_size of method (c)")
    parser.add_argument("--loop-examples", type=int, default=16,
                        help="examples timed in the Python loop (a), scaled to the batch")
    parser.add_argument("--gemm-size", type=int, default=None,
                        help="n of the n×n float32 GEMM that measures the machine's rate (1024 on cpu, 4096 on gpu)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch.func even when installed")
    parser.add_argument("--no-jax", action="store_true", help="skip JAX even when installed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (the data use seed + 1)")
    parser.add_argument("--interleave", action="store_true",
                        help="(the default, kept for old command lines) the methods of a batch size are timed round "
                             "by round, each once per round")
    parser.add_argument("--torch-first", action="store_true",
                        help="import torch before NumPy and cuvmap, so that its libgomp (and the OpenMP wait policy "
                             "of the environment) serves cuvmap's oneDNN too; by default cuvmap loads oneDNN first "
                             "and torch shares the libgomp it loaded")
    parser.add_argument("--scopes", action="store_true",
                        help="after the timings, the time per named scope (conv1, conv2, dense, loss and their "
                             "transpose(...)) of cuvmap's jit(vmap(grad)) at each batch size (cuvmap.profiler)")


# ---------------------------------------------------------------------------------------
# Comparing the methods' gradients, counting page faults
# ---------------------------------------------------------------------------------------


def _diff(method, grads, reference, tol):
    """``(max_abs, n_off, n)``: the largest |difference| over all parameters between
    ``grads`` (NumPy, as the method returned them) and cuvmap's per-example gradients
    ``reference``, and for per-example methods how many of the ``n`` examples compared
    differ by more than ``tol`` (``None`` for batched gradients)."""
    worst = 0.0
    per_example = None
    for name in models.PARAM_NAMES:
        ref = reference[name].astype(np.float64)
        if method.kind == "per_example":
            got = grads[name]
        elif method.kind == "loop":
            got = np.stack([g[name] for g in grads])
            ref = ref[: len(grads)]
        else:  # batched: the gradient of the mean loss is the mean of per-example gradients
            got = grads[name]
            ref = ref.mean(axis=0)
        if got.shape != ref.shape:
            raise AssertionError(f"{method.label}: gradient of {name} has shape {got.shape}, expected {ref.shape}")
        d = np.abs(got.astype(np.float64) - ref)
        worst = max(worst, float(d.max()))
        if method.kind != "batched":
            e = d.reshape(d.shape[0], -1).max(axis=1)
            per_example = e if per_example is None else np.maximum(per_example, e)
    if per_example is None:
        return worst, None, None
    return worst, int(np.sum(per_example > tol)), len(per_example)


class _FaultCounter:
    """``fn`` that also records the minor page faults (``ru_minflt``) of each call."""

    def __init__(self, fn):
        self.fn, self.faults = fn, []

    def __call__(self):
        before = _minor_faults()
        out = self.fn()
        after = _minor_faults()
        if before is not None:
            self.faults.append(after - before)
        return out

    def per_call(self, skip):
        """The mean over the calls after the first ``skip`` (None where not counted)."""
        timed = self.faults[skip:]
        return float(np.mean(timed)) if timed else None


def _minor_faults():
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def _measure_interleaved(methods, args, progress, batch):
    """``{key: (Stats, _FaultCounter)}``: every method's first call and warm-up calls, then
    rounds that time each method once (:mod:`benchmarks.rounds.runner`)."""
    counters = {m.key: _FaultCounter(m.fn) for m in methods}
    stats = runner.run_cases([m.case(counters[m.key]) for m in methods], runner.policy_of(args), progress,
                             f"batch {batch}: ")
    return {m.key: (stats[m.key], counters[m.key]) for m in methods}


def run(args, settings):
    xp = backend.xp_for(args.device)
    params = models.cnn_params(seed=args.seed)
    flops = models.cnn_flops()
    notes = []
    fw = {}
    if args.device == "cpu" and not args.torch_first:
        onednn.available()      # cuvmap's libdnnl (and its libgomp) before torch's
    torch = torch_methods.setup(args, notes, fw, "torch.func")
    jax = jax_methods.setup(args, notes, fw)
    gemm_n = args.gemm_size or (4096 if args.device == "gpu" else 1024)

    methods_per_batch = 5 + 2 * (torch is not None) + 2 * (jax is not None)
    progress = Progress(len(args.batch) * methods_per_batch + 2, args.progress)

    header = (f"# per-example gradients of the benchmark CNN on the {args.device}: float32, input 1×28×28, "
              f"conv 1→16 k5 + relu, conv 16→32 k5 + relu, dense 12800→10, cross entropy")
    print(header)
    print()
    run_settings = dict(settings)
    for name, desc in fw.items():
        run_settings[name] = desc
    run_settings["timing"] = (f"{args.warmup} warm-up call(s) (the first timed alone: 'first call'), then "
                              "median/min/max of interleaved rounds (see 'rounds'); " +
                              ("perf_counter" if args.device == "cpu" else "CUDA events after a device synchronisation"))
    # (in the JSON's settings too: the docs page heads each order's section with it)
    settings["import order"] = run_settings["import order"] = (
        "torch before NumPy and cuvmap (--torch-first)" if args.torch_first else
        "cuvmap's oneDNN loaded before torch is imported")
    run_settings["loop (a)"] = (f"{args.loop_examples} examples (or the batch, if smaller) timed per call, "
                                f"the time scaled to the batch")
    if args.device == "cpu":
        run_settings["host memory"] = executor.keep_host_memory()
    print(settings_table(run_settings))
    for n in notes:
        print(f"\n- {n}")

    # -- the machine's GEMM rate, before the methods -------------------------------------
    progress.set(f"float32 GEMM {gemm_n}³")
    rate0, gemm0 = gemm_rate(xp, gemm_n, repeats=args.repeats, warmup=args.warmup)
    progress.step("GEMM (before)")

    rows = []
    by_batch = {}
    ref_scale = {}
    for batch in args.batch:
        xs, ys = models.cnn_data(batch, seed=args.seed + 1)
        methods = cuvmap_methods.per_example_methods(args, params, xs, ys, batch)
        if torch is not None:
            methods += torch_methods.per_example_methods(args, torch, params, xs, ys)
        if jax is not None:
            methods += jax_methods.per_example_methods(args, jax, params, xs, ys)
        reference = None
        results = {}
        gc.collect()
        measured = _measure_interleaved(methods, args, progress, batch)
        for m in methods:
            progress.set(f"batch {batch}: {m.label}")
            stats, counted = measured[m.key]
            faults = counted.per_call(skip=max(1, args.warmup))  # the timed calls
            peak = m.peak_mib(args.device, torch) if args.device == "gpu" else None
            grads = m.numpy(m.fn())
            if m.key == "vmap":
                reference = grads
                ref_scale[batch] = max(float(np.max(np.abs(g))) for g in grads.values())
            results[m.key] = (m, stats, grads, faults, peak)
            progress.step(f"batch {batch}: {m.label}: {stats.median * 1e3:.1f} ms")
        tol = DIFF_TOL * ref_scale[batch]
        for key, (m, stats, grads, faults, peak) in results.items():
            diff, n_off, n_cmp = _diff(m, grads, reference, tol)
            row = dict(batch=batch, key=key, method=m.label, framework=m.framework, kind=m.kind,
                       diff_vs_cuvmap_vmap=diff, examples_off=n_off, examples_compared=n_cmp, diff_tol=tol,
                       note=m.note, minor_faults_per_call=faults, device_peak_mib=peak, **stats.as_dict())
            row["ms_per_example"] = row["median_ms"] / batch
            rows.append(row)
            by_batch.setdefault(batch, {})[key] = row

    rate1, gemm1 = gemm_rate(xp, gemm_n, repeats=args.repeats, warmup=args.warmup)
    progress.step("GEMM (after)")
    progress.close()
    rate = max(rate0, rate1)
    floor_ms = flops["train"] / rate * 1e3

    # -- table: the methods ----------------------------------------------------------------
    print("\n## Time per batch (ms) and per example, every method on the same weights and data\n")
    table = []
    for r in rows:
        base = by_batch[r["batch"]]["batched"]["median_ms"]
        table.append((r["batch"], r["method"], r["median_ms"], r["min_ms"], r["max_ms"],
                       spread_cell(r), r["repeats"],
                       r["ms_per_example"], r["ms_per_example"] / floor_ms, r["median_ms"] / base, r["first_call_ms"],
                       r["diff_vs_cuvmap_vmap"],
                       "–" if r["examples_off"] is None else f"{r['examples_off']}/{r['examples_compared']}",
                       "–" if r["minor_faults_per_call"] is None else f"{r['minor_faults_per_call']:.0f}")
                      + ((r["device_peak_mib"],) if args.device == "gpu" else ()))
    print(markdown_table(
        ["batch", "method", "median ms", "min ms", "max ms", "IQR / median", "rounds", "ms / example", "× floor",
         "× cuvmap batched", "first call ms", "max abs diff", "examples off", "page faults / call"]
        + (["device peak MiB"] if args.device == "gpu" else []), table,
        "rlrrrrrrrrrrrr" + ("r" if args.device == "gpu" else "")))
    print()
    for line in timing_lines(rows, lambda r: f"batch {r['batch']}, {r['method']}", args):
        print(line)
    loop_rows = [r for r in rows if r["key"] == "loop" and r["note"]]
    for r in loop_rows:
        print(f"- batch {r['batch']}, loop (a): {r['note']} (median/min/max are of the scaled figure)")
    for r in rows:
        if r["key"] == "chunked":
            print(f"- batch {r['batch']}, chunked (c): {r['note']}")
    print("- max abs diff: largest |difference| over all parameters from cuvmap vmap(grad)'s per-example "
          "gradients (batched rows: from their mean; the loop: on its timed examples); the largest "
          "|per-example gradient| is " + ", ".join(f"{v:.3g} (batch {b})" for b, v in ref_scale.items()))
    print(f"- examples off: per-example gradients that differ from cuvmap vmap(grad)'s by more than "
          f"{DIFF_TOL:g} × the largest |per-example gradient|, of those compared")
    if any(r["examples_off"] for r in rows):
        print("- **some examples are off**: when only a few examples are, it is usually relu's kink — a "
              "pre-activation within float32 rounding of 0 whose sign differs between two computations "
              "(different GEMM blocking or BLAS kernel), which flips that unit's gradient; when most are, "
              "it is a bug")
    print("- page faults / call: minor page faults (getrusage ru_minflt) per timed call, the pages it wrote for "
          "the first time (the loop: per call of its timed examples, unscaled)"
          + (f"; host memory: {run_settings['host memory']}" if "host memory" in run_settings else ""))
    for batch, rs in by_batch.items():
        if "jit_vmap" in rs and rs["vmap"]["minor_faults_per_call"] is not None:
            e, j = rs["vmap"], rs["jit_vmap"]
            print(f"- batch {batch}: cuvmap vmap(grad) {e['minor_faults_per_call']:.0f} page faults per call, "
                  f"jit(vmap(grad)) {j['minor_faults_per_call']:.0f}; medians {e['median_ms']:.1f} ms eager, "
                  f"{j['median_ms']:.1f} ms jitted ({e['median_ms'] / j['median_ms']:.2f}× faster under jit)")
    if jax is not None:
        print("- JAX is compiled (jit); cuvmap's vmap(grad), chunked, batched and torch.func run eagerly; the first "
              "calls of JAX and of cuvmap's jit include compilation (tracing)")

    # -- the compute floor -----------------------------------------------------------------
    print("\n## Compute floor\n")
    per_layer = ", ".join(f"{k} {v:,}" for k, v in flops["per_layer"].items())
    print(f"- multiply-adds per example (forward): {flops['macs']:,} ({per_layer})")
    print(f"- FLOPs per example for a gradient: 6 × multiply-adds = 3 × forward (2 FLOPs per multiply-add; "
          f"the backward pass ≈ 2 × the forward) = {flops['train'] / 1e6:.2f} MFLOP "
          f"(without the first layer's unneeded input gradient: {flops['train_exact'] / 1e6:.2f} MFLOP; "
          f"biases, relu and softmax left out)")
    print(f"- float32 GEMM rate, {xp.__name__}.matmul {gemm_n}×{gemm_n}×{gemm_n}, median of {args.repeats}: "
          f"{rate0 / 1e9:.1f} GFLOP/s before the methods, {rate1 / 1e9:.1f} GFLOP/s after; "
          f"floor uses {rate / 1e9:.1f} GFLOP/s")
    print(f"- floor: {flops['train'] / 1e6:.2f} MFLOP / {rate / 1e9:.1f} GFLOP/s = **{floor_ms:.4f} ms per example** "
          f"({floor_ms * 1e3:.1f} µs)")

    if args.device == "cpu":
        fw["onednn"] = onednn.describe()
        print(f"- cuvmap's CPU convolutions: {fw['onednn']}; "
              f"libgomp: {', '.join(machine_settings.libgomp_paths()) or 'not loaded'}")

    # -- ratios ----------------------------------------------------------------------------
    conf = f"{100 * args.confidence:g}% CI" if hasattr(args, "confidence") else "95% CI"
    print(f"\n## Ratios against the project's targets (medians, this run; {conf} and verdict from the paired "
          "rounds)\n")
    ratio_rows, judged = [], []
    for batch, rs in by_batch.items():
        for name, num, den, cmp, target in TARGETS:
            if num in rs and den in rs:
                cells, entry = ratios.judge(name, rs[num], rs[den], args, cmp, target)
            else:
                cells, entry = ratios.not_measured(name, cmp, target, "not measured (torch.func skipped: see above)")
            ratio_rows.append((batch, name) + cells)
            judged.append(dict(batch=batch, **entry))
        for name, num, den in INFO_RATIOS:
            if num in rs and den in rs:
                cells, entry = ratios.judge(name, rs[num], rs[den], args)
                ratio_rows.append((batch, name) + cells)
                judged.append(dict(batch=batch, **entry))
        v = rs["vmap"]["ms_per_example"] / floor_ms
        ratio_rows.append((batch, "cuvmap vmap(grad) / compute floor", v, "", "", "(for information)", ""))
        judged.append(dict(batch=batch, ratio="cuvmap vmap(grad) / compute floor", value=v, target=None, met=None))
    print(markdown_table(["batch", "ratio", "value (medians)", conf, "verdict", "target", "met"], ratio_rows,
                         "rlrllll"))
    print()
    print(ratios.verdict_legend(args))

    # -- time per named scope (--scopes) -----------------------------------------------
    scopes = []
    if getattr(args, "scopes", False):
        per_example = cv.vmap(cv.grad(models.cuvmap_per_example_loss), in_axes=(None, 0, 0))
        for batch in args.batch:
            xs, ys = models.cnn_data(batch, seed=args.seed + 1)
            operands = cv.device_put((params, xs, ys), args.device)
            scopes.append(time_per_scope(f"cuvmap jit(vmap(grad)) at batch {batch}", per_example, operands,
                                         policy=getattr(args, "policy", None)))

    # -- plot data -------------------------------------------------------------------------
    series = {}
    for r in rows:
        series.setdefault(r["method"], []).append((r["batch"], r["ms_per_example"]))
    title = (f"benchmark CNN per-example gradients, {args.device} — {settings['device']}\n"
             f"OPENBLAS_CORETYPE={settings['OPENBLAS_CORETYPE']}; numpy {settings['numpy']}")
    return dict(
        config=dict(batch=args.batch, chunk_size=args.chunk_size, loop_examples=args.loop_examples,
                    repeats=args.repeats, warmup=args.warmup, seed=args.seed, dtype="float32",
                    model="benchmark CNN: conv 1→16 k5, relu, conv 16→32 k5, relu, dense 12800→10, cross entropy"),
        frameworks=fw, notes=notes,
        flops=dict(flops, formula="train = 6 × multiply-adds (2 FLOPs per multiply-add, forward + backward = 3 × forward)"),
        gemm=dict(n=gemm_n, gflops_before=rate0 / 1e9, gflops_after=rate1 / 1e9, gflops_used=rate / 1e9,
                  before=gemm0.as_dict(), after=gemm1.as_dict()),
        floor_ms_per_example=floor_ms,
        rows=rows, ratios=judged, scopes=scopes,
        plot=dict(series=series, title=title, hlines={f"compute floor {floor_ms * 1e3:.1f} µs": floor_ms},
                  dashed={r["method"] for r in rows if r["kind"] == "batched"}),
    )
