"""DP-SGD's clipped gradient sum: ghost clipping and book-keeping against per-example
gradients, every method side by side in one run.

    python -m benchmarks dp [--batch 32 128 512] [--models mlp cnn] [--device cpu|gpu]
        [--no-jit] [--no-torch] [--no-opacus] [--slow-seconds 2] [--repeats 5] [--json PATH]

Two networks (``benchmarks/models.py``), float32, cross entropy with integer labels: the
benchmark CNN (conv 1→16 k5, relu, conv 16→32 k5, relu, dense 12800 → 10; the
per_example suite's, not the README's first snippet) and an MLP
784 → 1024 → 1024 → 10 with relu (``--mlp-widths`` changes its widths); and, with
``--models tanh_cnn``, Tramèr & Boneh's tanh CNN of ``examples/dp_fashion_mnist.py`` (at its
batch, ``--batch 2048``: ``jit_ghost / opacus_ghost`` is issue 37's per-step, hence per-epoch, ratio). Every method but
the first computes the sum over the batch of the per-example gradients clipped to L2 norm
C = 1, and the per-example norms (no noise: it costs the same in every method):

  (a) cuvmap ``grad`` of the mean loss: the non-private batched gradient, the floor;
  (b) cuvmap ``vmap(grad(loss))`` then ``dp.clipped_sum``: every per-example gradient;
  (c) cuvmap ``dp.clipped_grad(loss, C)``: ghost norms or per-layer per-example gradients
      by the cost model, then book-keeping's weighted sums (NOTE [ghost clipping]);
  (a') (b') (c') the same under ``cuvmap.jit`` (skipped with ``--no-jit``);
  (d) torch: the batched gradient of an ``nn.Module`` (reference), and torch.func
      ``vmap(grad)`` then the clipped sum in torch (when torch is installed);
  (e) Opacus (when installed): ``GradSampleModuleFastGradientClipping`` with ghost
      clipping (its norms from the first backward pass, the clipped sum from a second one),
      and ``GradSampleModule``'s per-sample hooks then the clipped sum in torch.

Timing: the methods of one (network, batch) run in turn, round after round (interleaved
rounds in rotating order, so a slow minute of the machine hits them alike; more rounds
while a method's IQR / median is above ``--max-spread``: ``benchmarks/rounds/runner.py``), all
under the host-memory setting that ``jit`` applies at its first CPU plan (NOTE [keeping
freed host memory]), after ``--warmup`` calls each (the first timed alone: 'first call');
medians. A method whose first two calls take longer than ``--slow-seconds`` each is timed
in two rounds only (the per-example gradients of the MLP at batch 512 are 3.8 GB). Each
ratio comes with a confidence interval from the paired rounds and a verdict, FAST, SLOW or
SAME (``benchmarks/rounds/stats.py``). Peak memory, after the timed calls: on the CPU
tracemalloc's peak during one call, which counts NumPy's buffers (not torch's: '–'); on the
GPU what CuPy's memory pool (cuvmap's rows) or torch's allocator (torch's and Opacus' rows)
had to add for one call. Under jit the program's buffer pool keeps buffers across calls,
so its rows count less than they use.
Each clipped method's sum and norms are compared with (b)'s (with (c)'s where (b) did not
run): the largest |difference| over the leaves, relative to the largest |value|.

Targets (issue 18): (c) ≤ 1.3 × (a) on the MLP at batch 128 and ≤ 1.5 × on the benchmark
CNN; (b) ≥ 2 × (c) on the MLP at batch 512; (c)'s peak memory ≤ 1.5 × (a)'s.
The figures of ``docs/performance/dp.md`` and of the README's table come from
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks dp --batch 32 128 --save-to-docs``
(``OPENBLAS_CORETYPE`` halves NumPy's GEMM rate on some machines), then
``python -m benchmarks report``; the page says which command made them.
"""
import numpy as np

import cuvmap as cv
from cuvmap import dp
from cuvmap.cpu import onednn
from cuvmap.transforms import executor

from benchmarks import models
from benchmarks.methods import cuvmap_methods, max_relative_diff, opacus_methods, torch_methods
from benchmarks.report.progress import Progress
from benchmarks.report.tables import DocTable, markdown_table, settings_table, spread_cell, timing_lines
from benchmarks.rounds import ratios, runner
from benchmarks.rounds import stats as bstats
from benchmarks.rounds.scopes import time_per_scope

SUMMARY = "DP-SGD's clipped sum: dp.clipped_grad (ghost/BK) vs vmap(grad)+clip, the batched gradient, torch.func, Opacus"
DEFAULTS = dict(repeats=7, warmup=2)  # 7 rounds at least: a 95 % interval of a paired ratio needs 6
MAX_NORM = 1.0

# the torch row each cuvmap row is held against under load (--alternate-load)
TORCH_COUNTERPART = {"batched": "torch_batched", "jit_batched": "torch_batched", "vmap_clip": "torch_func_clip",
                     "jit_vmap_clip": "torch_func_clip", "ghost": "opacus_ghost", "jit_ghost": "opacus_ghost"}

TARGETS = [  # network, batch, numerator, denominator, comparison, target
    ("mlp", 128, "ghost", "batched", "≤", 1.3),
    ("cnn", 128, "ghost", "batched", "≤", 1.5),
    ("mlp", 512, "vmap_clip", "ghost", "≥", 2.0),
    ("tanh_cnn", 2048, "jit_ghost", "opacus_ghost", "≤", 1.0),   # issue 37: the Fashion-MNIST step vs Opacus
]
PEAK_TARGET = 1.5
INFO_RATIOS = [  # numerator, denominator: reported for every (network, batch) where both ran
    ("vmap_clip", "ghost"), ("jit_ghost", "jit_batched"), ("opacus_ghost", "ghost"), ("torch_func_clip", "ghost"),
]

NETWORKS = {"cnn": "benchmark CNN (conv 1→16 k5, conv 16→32 k5, dense 12800→10)", "mlp": "MLP",
            "tanh_cnn": "Tramèr & Boneh's tanh CNN of examples/dp_fashion_mnist.py (26,010 parameters)"}



def _x_batched(row, run):
    base = next(r for r in run["rows"] if (r["network"], r["batch"], r["key"]) == (row["network"], row["batch"],
                                                                                  "batched"))
    return row["median_ms"] / base["median_ms"]


DOC_TABLES = [
    DocTable("Time and peak memory per batch, every method on the same weights and data", "rows", [
        ("network", "network", "l"), ("batch", "batch", "r"), ("method", "method", "l"),
        ("median ms", "median_ms", "r"), ("× cuvmap batched", _x_batched, "r"), ("peak MiB", "peak_mib", "r"),
        ("rel. diff", "rel_diff", "r"), ("timed calls", "repeats", "r"),
        ("IQR / median", lambda row, run: spread_cell(row), "r")],
        note="peak MiB: on the CPU tracemalloc's peak during one call (NumPy's buffers; not torch's: –). rel. diff: "
             "the largest |difference| of the clipped sum and of the norms from cuvmap `vmap(grad)` + "
             "`dp.clipped_sum`'s, relative to the largest |value|."),
    DocTable("dp.clipped_grad's method per parameter", lambda run: list(run["layer_methods"].items()), [
        ("network", lambda row, run: row[0], "l"),
        ("method per parameter (auto)", lambda row, run: ", ".join(f"{k}: {v}" for k, v in row[1].items()), "l")]),
]


def add_arguments(parser):
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128, 512], help="batch sizes")
    parser.add_argument("--models", nargs="+", choices=sorted(NETWORKS), default=["mlp", "cnn"], help="networks")
    parser.add_argument("--mlp-widths", type=int, nargs="+", default=list(models.MLP_WIDTHS),
                        help="the MLP's layer widths, input to output")
    parser.add_argument("--slow-seconds", type=float, default=2.0,
                        help="a method whose first two calls each take longer is timed in two rounds only")
    parser.add_argument("--no-jit", action="store_true", help="skip the jitted cuvmap rows")
    parser.add_argument("--no-torch", action="store_true", help="skip torch and torch.func even when installed")
    parser.add_argument("--no-opacus", action="store_true", help="skip Opacus even when installed")
    parser.add_argument("--scopes", action="store_true",
                        help="after the timings, the time per named scope (the layers, the loss and their "
                             "transpose(...)) of cuvmap's jit(dp.clipped_grad) for each case (cuvmap.profiler)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (the data use seed + 1)")


def _network(name, args):
    """``(params, per-example loss, batch loss, data(batch), torch module factory, torch loss)``."""
    if name == "cnn":
        return (models.cnn_params(seed=args.seed), models.cuvmap_per_example_loss, models.cuvmap_batch_loss,
                lambda b: models.cnn_data(b, seed=args.seed + 1), models.torch_cnn_module,
                models.torch_per_example_loss)
    if name == "tanh_cnn":
        return (models.tanh_cnn_params(seed=args.seed), models.cuvmap_tanh_cnn_per_example_loss,
                models.cuvmap_tanh_cnn_batch_loss, lambda b: models.tanh_cnn_data(b, seed=args.seed + 1),
                models.torch_tanh_cnn_module, models.torch_tanh_cnn_per_example_loss)
    widths = tuple(args.mlp_widths)
    return (models.mlp_params(widths, seed=args.seed), models.cuvmap_mlp_per_example_loss,
            models.cuvmap_mlp_batch_loss, lambda b: models.mlp_data(b, widths, seed=args.seed + 1),
            models.torch_mlp_module, models.torch_mlp_per_example_loss)


def _time_interleaved(methods, args, progress, where):
    """First calls (their outputs kept) and warm-up per method, then the interleaved rounds
    (:mod:`benchmarks.rounds.runner`; two rounds only for a method slower than
    ``--slow-seconds``): ``{key: (Stats, case)}``."""
    cases = [m.case() for m in methods]
    stats = runner.run_cases(cases, runner.policy_of(args), progress, f"{where}: ", slow_seconds=args.slow_seconds,
                             keep_outputs=True)
    progress.step(f"{where}: {len(stats[cases[0].key].times)} rounds")
    return {c.key: (stats[c.key], c) for c in cases}


def run(args, settings):
    notes = []
    fw = {}
    if args.device == "cpu":
        onednn.available()      # cuvmap's libdnnl (and its libgomp) before torch's, as benchmarks per_example
    torch = torch_methods.setup(args, notes, fw, "torch, torch.func and Opacus")
    opacus = opacus_methods.setup(args, notes, fw) if torch is not None else None
    print(f"# DP-SGD's clipped gradient sum on the {args.device}: float32, C = {MAX_NORM:g}, the benchmark CNN and an "
          f"MLP {'→'.join(map(str, args.mlp_widths))}")
    print()
    run_settings = dict(settings)
    run_settings.update(fw)
    run_settings["timing"] = (f"{args.warmup} warm-up call(s) per method (the first timed alone), then interleaved "
                              "rounds (see 'rounds'); medians; " + ("perf_counter" if args.device == "cpu" else
                                                                    "CUDA events after a device synchronisation"))
    run_settings["peak memory"] = ("tracemalloc's peak during one call (NumPy buffers; not torch's)" if args.device == "cpu"
                                   else "what CuPy's pool (cuvmap) or torch's allocator (torch, Opacus) had to add for "
                                        "one call")
    if args.device == "cpu":
        # every row under the allocator setting jit applies at its first CPU plan (as the
        # per_example suite does: NOTE [keeping freed host memory])
        run_settings["host memory"] = executor.keep_host_memory()
    print(settings_table(run_settings))

    cases = [(name, b) for name in args.models for b in args.batch]
    per_case = 3 * (1 + (not args.no_jit)) + (2 if torch is not None else 0) + (2 if opacus is not None else 0)
    progress = Progress(len(cases) * (per_case + 1), args.progress)
    rows, by_case, layer_methods = [], {}, {}
    for name, batch in cases:
        params, per_example_loss, batch_loss, data, make_module, torch_loss = _network(name, args)
        xs, ys = data(batch)
        methods, layer_methods[name] = cuvmap_methods.clipped_sum_methods(args, params, per_example_loss, batch_loss,
                                                                          xs, ys, MAX_NORM)
        if torch is not None:
            methods += torch_methods.clipped_sum_methods(args, torch, params, make_module, torch_loss, xs, ys,
                                                         MAX_NORM)
        if opacus is not None:
            methods += opacus_methods.clipped_sum_methods(args, torch, opacus, params, make_module, xs, ys, MAX_NORM)
        where = f"{name} batch {batch}"
        measured = _time_interleaved(methods, args, progress, where)
        outputs = {}
        for m in methods:
            progress.set(f"{where}: {m.label} (peak memory)")
            peak = m.peak_mib(args.device, torch)
            stats, case = measured[m.key]
            if m.kind == "clipped":
                outputs[m.key] = m.numpy(case.output)
            case.output = None
            row = dict(network=name, batch=batch, key=m.key, method=m.label, framework=m.framework,
                       peak_mib=peak, note=m.note, **stats.as_dict())
            rows.append(row)
            by_case.setdefault((name, batch), {})[m.key] = row
        ref_key = "vmap_clip" if "vmap_clip" in outputs else "ghost"
        for key, out in outputs.items():
            by_case[(name, batch)][key]["rel_diff"] = max_relative_diff(out, outputs[ref_key])
            by_case[(name, batch)][key]["diff_vs"] = ref_key
    progress.close()

    print("\n## Time and peak memory per batch, every method on the same weights and data\n")
    table = []
    for r in rows:
        case = by_case[(r["network"], r["batch"])]
        base = case["batched"]
        table.append((r["network"], r["batch"], r["method"], r["median_ms"], r["min_ms"], r["max_ms"],
                      r["median_ms"] / base["median_ms"], r["first_call_ms"], r["peak_mib"],
                      None if r["peak_mib"] is None or not base["peak_mib"] else r["peak_mib"] / base["peak_mib"],
                      r.get("rel_diff"), r["repeats"], spread_cell(r)))
    print(markdown_table(
        ["network", "batch", "method", "median ms", "min ms", "max ms", "× cuvmap batched", "first call ms",
         "peak MiB", "× batched peak", "rel. diff", "timed calls", "IQR / median"], table, "lrlrrrrrrrrrr"))
    print("\n- rel. diff: the largest |difference| of the clipped sum's leaves and of the norms from cuvmap "
          "vmap(grad) + dp.clipped_sum's (from dp.clipped_grad's where that did not run), relative to the "
          "largest |value|")
    for name, methods in layer_methods.items():
        print(f"- {name}: dp.clipped_grad's method per parameter (auto): {methods}")
    for n in notes:
        print(f"- {n}")
    for line in timing_lines(rows, lambda r: f"{r['network']} batch {r['batch']}, {r['method']}", args):
        print(line)

    conf = f"{100 * getattr(args, 'confidence', bstats.DEFAULT_CONFIDENCE):g}% CI"
    print(f"\n## Ratios against the targets (medians, this run; {conf} and verdict from the paired rounds)\n")
    ratio_rows, judged = [], []

    def add(cells, entry):
        ratio_rows.append((entry["ratio"],) + cells)
        judged.append(entry)

    for name, batch, num, den, cmp, target in TARGETS:
        case = by_case.get((name, batch), {})
        label = f"{num} / {den} ({name}, batch {batch})"
        add(*(ratios.judge(label, case[num], case[den], args, cmp, target) if num in case and den in case
              else ratios.not_measured(label, cmp, target)))
    for (name, batch), case in by_case.items():
        g, b = case["ghost"]["peak_mib"], case["batched"]["peak_mib"]
        label = f"ghost peak memory / batched peak memory ({name}, batch {batch})"
        value = None if g is None or not b else g / b
        met = None if value is None else value <= PEAK_TARGET
        add((value, "", "", f"≤ {PEAK_TARGET:g}", "not measured" if met is None else ("yes" if met else "no")),
            dict(ratio=label, value=value, target=f"≤ {PEAK_TARGET:g}", met=met))
        for num, den in INFO_RATIOS:
            if num in case and den in case:
                add(*ratios.judge(f"{num} / {den} ({name}, batch {batch})", case[num], case[den], args))
    print(markdown_table(["ratio", "value (medians)", conf, "verdict", "target", "met"], ratio_rows, "lrllll"))
    print()
    print(ratios.verdict_legend(args, memory=True))

    scopes = []
    if getattr(args, "scopes", False):
        for name, batch in cases:
            params, per_example_loss, _, data, _, _ = _network(name, args)
            operands = cv.device_put((params, *data(batch)), args.device)
            scopes.append(time_per_scope(f"cuvmap jit(dp.clipped_grad), {name} at batch {batch}",
                                         dp.clipped_grad(per_example_loss, MAX_NORM), operands,
                                         policy=getattr(args, "policy", None)))

    series = {}
    for r in rows:
        series.setdefault(f"{r['network']}: {r['method']}", []).append((r["batch"], r["median_ms"] / r["batch"]))
    title = f"DP-SGD clipped sums, {args.device} — {settings['device']}"
    return dict(config=dict(batch=args.batch, models=args.models, mlp_widths=args.mlp_widths, repeats=args.repeats,
                            warmup=args.warmup, seed=args.seed, max_norm=MAX_NORM, dtype="float32"),
                frameworks=fw, notes=notes, layer_methods=layer_methods, rows=rows, ratios=judged, scopes=scopes,
                plot=dict(series=series, title=title, dashed={s for s in series if "batched" in s or "backward" in s}))
