"""DP-SGD's clipped gradient sum: ghost clipping and book-keeping against per-example
gradients, every method side by side in one run.

    python -m benchmarks dp [--batch 32 128 512] [--models mlp cnn] [--device cpu|gpu]
        [--no-jit] [--no-torch] [--no-opacus] [--slow-seconds 2] [--repeats 5] [--json PATH]

Two networks (``benchmarks/models.py``), float32, cross entropy with integer labels: the
benchmark CNN (conv 1→16 k5, relu, conv 16→32 k5, relu, dense 12800 → 10; the
per_example suite's, not the README's first snippet) and an MLP
784 → 1024 → 1024 → 10 with relu (``--mlp-widths`` changes its widths). Every method but
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
while a method's IQR / median is above ``--max-spread``: ``benchmarks/timing.py``), all
under the host-memory setting that ``jit`` applies at its first CPU plan (NOTE [keeping
freed host memory]), after ``--warmup`` calls each (the first timed alone: 'first call');
medians. A method whose first two calls take longer than ``--slow-seconds`` each is timed
in two rounds only (the per-example gradients of the MLP at batch 512 are 3.8 GB). Each
ratio comes with a confidence interval from the paired rounds and a verdict, FAST, SLOW or
SAME (``benchmarks/stats.py``). Peak memory, after the timed calls: on the CPU
tracemalloc's peak during one call, which counts NumPy's buffers (not torch's: '–'); on the
GPU what CuPy's memory pool (cuvmap's rows) or torch's allocator (torch's and Opacus' rows)
had to add for one call. Under jit the program's buffer pool keeps buffers across calls,
so its rows count less than they use.
Each clipped method's sum and norms are compared with (b)'s (with (c)'s where (b) did not
run): the largest |difference| over the leaves, relative to the largest |value|.

Targets (issue 18): (c) ≤ 1.3 × (a) on the MLP at batch 128 and ≤ 1.5 × on the benchmark
CNN; (b) ≥ 2 × (c) on the MLP at batch 512; (c)'s peak memory ≤ 1.5 × (a)'s.
The README's figures come from ``env -u OPENBLAS_CORETYPE python -m benchmarks dp``
(``OPENBLAS_CORETYPE`` halves NumPy's GEMM rate on the project's machines).
"""
import gc
import tracemalloc

import numpy as np

from benchmarks import harness, models
from benchmarks import stats as bstats

SUMMARY = "DP-SGD's clipped sum: dp.clipped_grad (ghost/BK) vs vmap(grad)+clip, the batched gradient, torch.func, Opacus"
DEFAULTS = dict(repeats=5, warmup=2)
MAX_NORM = 1.0

# the torch row each cuvmap row is held against under load (--alternate-load)
TORCH_COUNTERPART = {"batched": "torch_batched", "jit_batched": "torch_batched", "vmap_clip": "torch_func_clip",
                     "jit_vmap_clip": "torch_func_clip", "ghost": "opacus_ghost", "jit_ghost": "opacus_ghost"}

TARGETS = [  # network, batch, numerator, denominator, comparison, target
    ("mlp", 128, "ghost", "batched", "≤", 1.3),
    ("cnn", 128, "ghost", "batched", "≤", 1.5),
    ("mlp", 512, "vmap_clip", "ghost", "≥", 2.0),
]
PEAK_TARGET = 1.5

NETWORKS = {"cnn": "benchmark CNN (conv 1→16 k5, conv 16→32 k5, dense 12800→10)", "mlp": "MLP"}


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


class Method:
    """One row: ``fn()`` runs it; ``result(out)`` gives ``(summed, norms)`` as NumPy arrays
    in cuvmap's layouts (None for the batched gradients, which clip nothing)."""

    def __init__(self, key, label, framework, fn, timer, result=None, memory=True, note=None):
        self.key, self.label, self.framework, self.fn, self.timer = key, label, framework, fn, timer
        self.result, self.memory, self.note = result, memory, note


def _network(name, args):
    """``(params, per-example loss, batch loss, data(batch), torch module factory, torch loss)``."""
    if name == "cnn":
        return (models.cnn_params(seed=args.seed), models.cuvmap_per_example_loss, models.cuvmap_batch_loss,
                lambda b: models.cnn_data(b, seed=args.seed + 1), models.torch_cnn_module,
                models.torch_per_example_loss)
    widths = tuple(args.mlp_widths)
    return (models.mlp_params(widths, seed=args.seed), models.cuvmap_mlp_per_example_loss,
            models.cuvmap_mlp_batch_loss, lambda b: models.mlp_data(b, widths, seed=args.seed + 1),
            models.torch_mlp_module, models.torch_mlp_per_example_loss)


def _cuvmap_methods(args, params, per_example_loss, batch_loss, xs, ys):
    import cuvmap as cv
    from cuvmap import backend, dp

    xp = backend.xp_for(args.device)
    timer = harness.timer_for(xp)
    p, x, y = cv.device_put(params, args.device), cv.device_put(xs, args.device), cv.device_put(ys, args.device)

    def numpy(out):
        summed, norms = out
        return {k: cv.device_put(v, "cpu") for k, v in summed.items()}, cv.device_put(norms, "cpu")

    def batched(p, x, y):
        return cv.grad(batch_loss)(p, x, y)

    def vmap_clip(p, x, y):
        per_example = cv.vmap(cv.grad(per_example_loss), in_axes=(None, 0, 0))(p, x, y)
        return dp.clipped_sum(per_example, MAX_NORM, return_norms=True)

    clipped = dp.clipped_grad(per_example_loss, MAX_NORM)

    def ghost(p, x, y):
        return tuple(clipped(p, x, y))

    cpu = args.device == "cpu"
    methods = [
        Method("batched", "cuvmap: grad of the mean loss (non-private, batched)", "cuvmap",
               lambda: batched(p, x, y), timer, memory=cpu),
        Method("vmap_clip", "cuvmap: vmap(grad) + dp.clipped_sum", "cuvmap", lambda: vmap_clip(p, x, y), timer,
               numpy, memory=cpu),
        Method("ghost", "cuvmap: dp.clipped_grad (ghost/BK)", "cuvmap", lambda: ghost(p, x, y), timer, numpy,
               memory=cpu),
    ]
    if not args.no_jit:
        jitted = {name: cv.jit(fn) for name, fn in (("batched", batched), ("vmap_clip", vmap_clip), ("ghost", ghost))}
        methods += [
            Method("jit_batched", "cuvmap: jit(grad of the mean loss)", "cuvmap",
                   lambda: jitted["batched"](p, x, y), timer, memory=cpu),
            Method("jit_vmap_clip", "cuvmap: jit(vmap(grad) + dp.clipped_sum)", "cuvmap",
                   lambda: jitted["vmap_clip"](p, x, y), timer, numpy, memory=cpu),
            Method("jit_ghost", "cuvmap: jit(dp.clipped_grad)", "cuvmap", lambda: jitted["ghost"](p, x, y), timer,
                   numpy, memory=cpu),
        ]
    return methods, clipped.methods(p, x, y)


def _in_cuvmap_layout(net, names, per_example):
    """The module's ``.grad`` (or with ``per_example`` its ``.grad_sample``) as a dict in
    cuvmap's layouts: Linear weights (out, in) transposed to (in, out)."""
    out = {}
    for name, param in zip(names, net.parameters()):
        g = param.grad_sample if per_example else param.grad
        if param.ndim == 2:
            g = g.transpose(1, 2) if per_example else g.T
        out[name] = g
    return out


def _torch_methods(args, torch, params, make_module, per_example_loss, xs, ys):
    import torch.nn.functional as F
    from torch.func import grad, vmap

    dev = "cuda" if args.device == "gpu" else "cpu"
    timer = harness.torch_event_timer(torch) if dev == "cuda" else harness.cpu_timer()
    names = list(params)
    x, y = torch.tensor(xs, device=dev), torch.tensor(ys, device=dev)
    net = make_module(params).to(dev)

    def numpy(out):
        summed, norms = out
        return {k: v.detach().cpu().numpy() for k, v in summed.items()}, norms.detach().cpu().numpy()

    def clip_and_sum(per_example):
        """The clipped sum of per-example gradients ``{name: (B, ...)}`` and their norms."""
        b = x.shape[0]
        norms = torch.sqrt(sum(torch.sum(g.reshape(b, -1) ** 2, dim=1) for g in per_example.values()))
        coef = torch.clamp(MAX_NORM / (norms + 1e-6), max=1.0)
        return {k: torch.tensordot(coef, g, dims=1) for k, g in per_example.items()}, norms

    def batched():
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        return [p.grad for p in net.parameters()]

    p = {k: torch.tensor(v, device=dev) for k, v in params.items()}
    per_example_grads = vmap(grad(per_example_loss), in_dims=(None, 0, 0))

    def torch_func():
        return clip_and_sum(per_example_grads(p, x, y))

    return [
        Method("torch_batched", "torch: backward of the mean loss (non-private, reference)", "torch", batched,
               timer, memory=False),
        Method("torch_func_clip", "torch.func: vmap(grad) + clipped sum", "torch", torch_func, timer, numpy,
               memory=False),
    ], (net, names, x, y, timer, clip_and_sum, numpy)


def _opacus_methods(args, torch, make_module, params, setup, notes, fw):
    if args.no_opacus:
        notes.append("Opacus: skipped (--no-opacus)")
        return []
    try:
        import opacus
        from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
    except ImportError:
        notes.append("Opacus: skipped (opacus is not installed)")
        return []
    import torch.nn.functional as F

    fw["opacus"] = opacus.__version__
    _, names, x, y, timer, clip_and_sum, numpy = setup
    dev = x.device
    ghost_net = GradSampleModuleFastGradientClipping(make_module(params).to(dev), max_grad_norm=MAX_NORM,
                                                     use_ghost_clipping=True, loss_reduction="sum")
    hooks_net = GradSampleModule(make_module(params).to(dev), loss_reduction="sum")

    def opacus_ghost():
        # DPTensorFastGradientClipping.backward without an optimizer: the first backward's hooks
        # give the norms, the second (hooks off) the clipped sum
        ghost_net.zero_grad(set_to_none=True)
        losses = F.cross_entropy(ghost_net(x), y, reduction="none")
        losses.sum().backward(retain_graph=True)
        coef = ghost_net.get_clipping_coef()
        norms = ghost_net.per_sample_gradient_norms
        ghost_net.zero_grad(set_to_none=True)
        ghost_net.disable_hooks()
        (coef * losses).sum().backward()
        ghost_net.enable_hooks()
        return _in_cuvmap_layout(ghost_net._module, names, False), norms

    def opacus_hooks():
        hooks_net.zero_grad(set_to_none=True)
        for q in hooks_net.parameters():
            q.grad_sample = None
        F.cross_entropy(hooks_net(x), y, reduction="sum").backward()
        return clip_and_sum(_in_cuvmap_layout(hooks_net._module, names, True))

    return [
        Method("opacus_ghost", "Opacus: ghost clipping (GradSampleModuleFastGradientClipping, 2 backward passes)",
               "opacus", opacus_ghost, timer, numpy, memory=False),
        Method("opacus_hooks", "Opacus: per-sample hooks (GradSampleModule) + clipped sum", "opacus", opacus_hooks,
               timer, numpy, memory=False),
    ]


def _peak_mib(fn):
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2 ** 20
    finally:
        tracemalloc.stop()


def _method_peak_mib(m, args, torch):
    """The peak memory of one call of ``m`` (the module's docstring), None where not measured."""
    if args.device == "cpu":
        return _peak_mib(m.fn) if m.memory else None
    if m.framework == "cuvmap":
        from cuvmap import backend

        return harness.cupy_pool_peak(m.fn, backend.cupy_module()) / 2 ** 20
    return harness.torch_cuda_peak(m.fn, torch) / 2 ** 20


def _relative_diff(got, want):
    """The largest |difference| over the sums' leaves and the norms, relative to the largest |value|."""
    summed, norms = got
    ref_summed, ref_norms = want
    worst = float(np.max(np.abs(norms.astype(np.float64) - ref_norms))) / max(float(np.max(np.abs(ref_norms))), 1e-30)
    for k, ref in ref_summed.items():
        d = float(np.max(np.abs(summed[k].astype(np.float64) - ref))) / max(float(np.max(np.abs(ref))), 1e-30)
        worst = max(worst, d)
    return worst


def _time_interleaved(methods, args, progress, where):
    """First calls and warm-up per method, then the interleaved rounds of
    ``benchmarks/timing.py`` (two rounds only for a slow method, which gets no warm-up
    beyond its first two calls). Returns ``{key: Stats}`` and each method's output of its
    first call."""
    firsts, outputs, cases = {}, {}, []
    for m in methods:
        progress.set(f"{where}: {m.label} (first call)")
        gc.collect()
        time_one = m.timer[1]
        held = []
        first = time_one(lambda: held.append(m.fn()))
        outputs[m.key] = held[0]
        # slow: the second call too (the first may include one-time work: tracing, timing kernels)
        slow = first > args.slow_seconds and time_one(m.fn) > args.slow_seconds
        for _ in range(0 if slow else max(0, args.warmup - 1 - (first > args.slow_seconds))):
            m.fn()
        firsts[m.key] = first
        cases.append(harness.Case(m.key, m.label, m.fn, m.timer, max_rounds=2 if slow else None))
        progress.step(f"{where}: {m.label} first call {first * 1e3:.1f} ms")
    policy = harness.policy_of(args)
    times, notes = harness.timed_rounds(cases, policy, progress, f"{where}: ")
    progress.step(f"{where}: {len(times[methods[0].key])} rounds")
    stats = {c.key: harness.Stats(times[c.key], firsts[c.key], c.timer.name + ", interleaved", max(1, args.warmup),
                                  1.0, policy.max_spread if policy.adaptive else None, notes[c.key]) for c in cases}
    return stats, outputs


def run(args, settings):
    notes = []
    fw = {}
    if args.device == "cpu":
        from cuvmap.cpu import onednn

        onednn.available()      # cuvmap's libdnnl (and its libgomp) before torch's, as benchmarks per_example
    torch = harness.setup_torch(args, notes, fw, "torch, torch.func and Opacus")
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
        from cuvmap.transforms import executor

        # every row under the allocator setting jit applies at its first CPU plan (as the
        # per_example suite does: NOTE [keeping freed host memory])
        run_settings["host memory"] = executor.keep_host_memory()
    print(harness.settings_table(run_settings))

    cases = [(name, b) for name in args.models for b in args.batch]
    per_case = 3 * (1 + (not args.no_jit)) + (4 if torch is not None else 0)
    progress = harness.Progress(len(cases) * (per_case + 1), args.progress)
    rows, by_case, layer_methods = [], {}, {}
    for name, batch in cases:
        params, per_example_loss, batch_loss, data, make_module, torch_loss = _network(name, args)
        xs, ys = data(batch)
        methods, layer_methods[name] = _cuvmap_methods(args, params, per_example_loss, batch_loss, xs, ys)
        if torch is not None:
            torch_rows, setup = _torch_methods(args, torch, params, make_module, torch_loss, xs, ys)
            methods += torch_rows
            methods += _opacus_methods(args, torch, make_module, params, setup, notes, fw)
        where = f"{name} batch {batch}"
        stats, outputs = _time_interleaved(methods, args, progress, where)
        results = {}
        for m in methods:
            progress.set(f"{where}: {m.label} (peak memory)")
            peak = _method_peak_mib(m, args, torch)
            results[m.key] = m.result(outputs.pop(m.key)) if m.result else None
            row = dict(network=name, batch=batch, key=m.key, method=m.label, framework=m.framework,
                       peak_mib=peak, note=m.note, **stats[m.key].as_dict())
            rows.append(row)
            by_case.setdefault((name, batch), {})[m.key] = row
        ref_key = "vmap_clip" if results.get("vmap_clip") is not None else "ghost"
        for key, out in results.items():
            if out is not None:
                by_case[(name, batch)][key]["rel_diff"] = _relative_diff(out, results[ref_key])
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
                      r.get("rel_diff"), r["repeats"], harness.spread_text(r["spread"]) + (" ⚠" if r["noisy"] else "")))
    print(harness.markdown_table(
        ["network", "batch", "method", "median ms", "min ms", "max ms", "× cuvmap batched", "first call ms",
         "peak MiB", "× batched peak", "rel. diff", "timed calls", "IQR / median"], table, "lrlrrrrrrrrrr"))
    print("\n- rel. diff: the largest |difference| of the clipped sum's leaves and of the norms from cuvmap "
          "vmap(grad) + dp.clipped_sum's (from dp.clipped_grad's where that did not run), relative to the "
          "largest |value|")
    for name, methods in layer_methods.items():
        print(f"- {name}: dp.clipped_grad's method per parameter (auto): {methods}")
    for n in notes:
        print(f"- {n}")
    for line in harness.timing_lines(rows, lambda r: f"{r['network']} batch {r['batch']}, {r['method']}", args):
        print(line)

    conf = f"{100 * getattr(args, 'confidence', bstats.DEFAULT_CONFIDENCE):g}% CI"
    print(f"\n## Ratios against the targets (medians, this run; {conf} and verdict from the paired rounds)\n")
    ratio_rows, ratios = [], []

    def add_ratio(label, num, den, cmp=None, target=None):
        c = harness.compare_rows(num, den, args)
        value = num["median_ms"] / den["median_ms"]
        met = None if target is None else (value <= target if cmp == "≤" else value >= target)
        met_ci = None if target is None else bstats.target_met(c, cmp, target)
        ratio_rows.append((label, value, c.interval(), harness.verdict_text(c),
                           "(for information)" if target is None else f"{cmp} {target:g}", met_ci or ""))
        ratios.append(dict(ratio=label, value=value, target=None if target is None else f"{cmp} {target:g}", met=met,
                           met_beyond_noise=met_ci, comparison=c.as_dict()))

    for name, batch, num, den, cmp, target in TARGETS:
        case = by_case.get((name, batch))
        label = f"{num} / {den} ({name}, batch {batch})"
        if case is None or num not in case or den not in case:
            ratio_rows.append((label, None, "–", "", f"{cmp} {target:g}", "not measured"))
            ratios.append(dict(ratio=label, value=None, target=f"{cmp} {target:g}", met=None))
            continue
        add_ratio(label, case[num], case[den], cmp, target)
    for (name, batch), case in by_case.items():
        g, b = case["ghost"]["peak_mib"], case["batched"]["peak_mib"]
        label = f"ghost peak memory / batched peak memory ({name}, batch {batch})"
        value = None if g is None or not b else g / b
        met = None if value is None else value <= PEAK_TARGET
        ratio_rows.append((label, value, "", "", f"≤ {PEAK_TARGET:g}", "not measured" if met is None else
                           ("yes" if met else "no")))
        ratios.append(dict(ratio=label, value=value, target=f"≤ {PEAK_TARGET:g}", met=met))
        for num, den in (("vmap_clip", "ghost"), ("jit_ghost", "jit_batched"), ("opacus_ghost", "ghost"),
                         ("torch_func_clip", "ghost")):
            if num in case and den in case:
                add_ratio(f"{num} / {den} ({name}, batch {batch})", case[num], case[den])
    print(harness.markdown_table(["ratio", "value (medians)", conf, "verdict", "target", "met"], ratio_rows,
                                 "lrllll"))
    print(f"\n- verdict: SLOW / FAST when the numerator is slower / faster than the denominator beyond the noise (the "
          f"interval above / below 1) by more than ×{getattr(args, 'factor', bstats.DEFAULT_FACTOR):g}; SAME "
          "otherwise (? when the interval is too wide to tell); met: yes / no when the whole interval is on one "
          "side of the target (memory: one call, no interval)")

    scopes = []
    if getattr(args, "scopes", False):
        import cuvmap as cv
        from cuvmap import dp

        for name, batch in cases:
            params, per_example_loss, _, data, _, _ = _network(name, args)
            operands = cv.device_put((params, *data(batch)), args.device)
            scopes.append(harness.time_per_scope(f"cuvmap jit(dp.clipped_grad), {name} at batch {batch}",
                                                 dp.clipped_grad(per_example_loss, MAX_NORM), operands,
                                                 policy=getattr(args, "policy", None)))

    series = {}
    for r in rows:
        series.setdefault(f"{r['network']}: {r['method']}", []).append((r["batch"], r["median_ms"] / r["batch"]))
    title = f"DP-SGD clipped sums, {args.device} — {settings['device']}"
    return dict(config=dict(batch=args.batch, models=args.models, mlp_widths=args.mlp_widths, repeats=args.repeats,
                            warmup=args.warmup, seed=args.seed, max_norm=MAX_NORM, dtype="float32"),
                frameworks=fw, notes=notes, layer_methods=layer_methods, rows=rows, ratios=ratios, scopes=scopes,
                plot=dict(series=series, title=title, dashed={s for s in series if "batched" in s or "backward" in s}))


def main(argv=None):
    from benchmarks.__main__ import main as cli_main

    return cli_main(["dp"] + list(argv if argv is not None else __import__("sys").argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
