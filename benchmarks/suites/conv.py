"""Convolution throughput, measured side by side in one run.

    python -m benchmarks conv [--device cpu|gpu] [--batch 32 128] [--repeats 5] [--im2col-variants] [--json out.json]

Tables (all on the shapes of the benchmark CNN: 1→16→32 channels, 5×5 kernels, 28×28 input):

1. conv forward / backward-input / backward-weight in GFLOP/s on each CPU kernel — the
   im2col + GEMM kernels and oneDNN's (when ``libdnnl`` loads; on the GPU: the kernels
   ``auto`` picks) — against the machine's matmul GFLOP/s (a float32 GEMM of the same
   inner size, measured in this run), with the cost of making oneDNN's primitives for the
   shape (paid once per shape and batch bucket: NOTE [batch buckets] in
   cuvmap/cpu/onednn.py) and the kernel ``auto`` chose; with ``--im2col-variants`` also the
   im2col kernels forced to each column layout and to one piece (NOTEs [column layouts]
   and [cache blocking] in cuvmap/lax/conv_gemm.py);
2. the vmap-folded cases against a Python loop over the examples: per-example weight
   gradients (grad_output and input batched: groups·B), model ensembling (input and weight
   batched), batched weights on shared inputs;
3. functorch's TODO: the folded grouped convolution (groups·B) against an explicit unfold +
   batched matmul of the same per-example weight gradient (oneDNN's grouped convolution
   and the im2col one on the CPU; cuDNN's and the CuPy unfold path on the GPU).

On the CPU set ``OPENBLAS_CORETYPE`` as you wish before running (it changes NumPy's GEMM
speed on some machines; ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m
benchmarks conv`` runs without it); the value in force is printed with the figures, and
every ratio compares methods under the same setting. The plot is table 1 as ms per example
against the batch size.
"""

import numpy as np

import cuvmap as cv
from cuvmap import backend, lax
from cuvmap.lax import convolution as conv_module

from benchmarks.machine.gemm import gemm_rate
from benchmarks.report.progress import Progress
from benchmarks.report.tables import DocTable, markdown_table, settings_table
from benchmarks.rounds import runner
from benchmarks.rounds.timers import timer_for

SUMMARY = "conv forward/backward GFLOP/s against matmul, vmap-folded cases against a loop, grouped conv against unfold"
DEFAULTS = dict(repeats=5, warmup=1)

LAYERS = [  # name, C, O, input spatial, kernel
    ("conv1 1→16", 1, 16, 28, 5),
    ("conv2 16→32", 16, 32, 24, 5),
]


def forced(strategy, fn, gemm_settings=None):
    """``fn`` run under conv strategy ``strategy`` (NOTE [conv strategy]) and, for the im2col
    kernels, the ``conv_gemm`` settings ``gemm_settings`` (``{"COLUMN_LAYOUT": ...,
    "BLOCK_BYTES": ...}``)."""
    from cuvmap.lax import conv_gemm

    settings = dict(gemm_settings or {})

    def run_with():
        previous = conv_module.set_strategy(strategy)
        saved = {name: getattr(conv_gemm, name) for name in settings}
        try:
            for name, value in settings.items():
                setattr(conv_gemm, name, value)
            return fn()
        finally:
            for name, value in saved.items():
                setattr(conv_gemm, name, value)
            conv_module.set_strategy(previous)

    return run_with


# the im2col kernels with one choice of conv_gemm forced (NOTEs [column layouts] and
# [cache blocking] in cuvmap/lax/conv_gemm.py): --im2col-variants
IM2COL_VARIANTS = [
    ("im2col channel-major", {"COLUMN_LAYOUT": "channel"}),
    ("im2col pixel-major", {"COLUMN_LAYOUT": "pixel"}),
    ("im2col one piece", {"BLOCK_BYTES": 1 << 62}),
]


def cpu_kernels(im2col_variants=False):
    """The CPU kernels to compare: ``[(label, strategy, conv_gemm settings)]``: im2col as it
    chooses, its forced variants (``im2col_variants``), and oneDNN's when it loads, in its
    blocked and its channels-last layouts (NOTE [activation layouts] in cuvmap/cpu/onednn.py)."""
    from cuvmap.cpu import onednn

    kernels = [("im2col", "unfold", None)]
    if im2col_variants:
        kernels += [(label, "unfold", settings) for label, settings in IM2COL_VARIANTS]
    if onednn.available():
        kernels += [("oneDNN", "onednn", None),   # blocked, and channels-last: NOTE [activation layouts]
                    ("oneDNN channels-last", "onednn:channels_last", None)]
    return kernels


def conv_flops(n, c, o, out_hw, k, groups=1):
    return 2.0 * n * o * (c // groups) * k * k * out_hw * out_hw


def _kernel(label, field):
    return lambda row, run: (row.get(label) or {}).get(field)


DOC_TABLES = [
    DocTable("1. Convolution GFLOP/s per kernel against matmul GFLOP/s", lambda run: run["tables"]["gflops"], [
        ("layer", "layer", "l"), ("batch", "batch", "r"), ("op", "op", "l"),
        ("im2col ms", _kernel("im2col", "ms"), "r"), ("im2col GFLOP/s", _kernel("im2col", "gflops"), "r"),
        ("oneDNN ms", _kernel("oneDNN", "ms"), "r"), ("oneDNN GFLOP/s", _kernel("oneDNN", "gflops"), "r"),
        ("channels-last ms", _kernel("oneDNN channels-last", "ms"), "r"),
        ("channels-last GFLOP/s", _kernel("oneDNN channels-last", "gflops"), "r"),
        ("GPU (auto) ms", _kernel("auto", "ms"), "r"), ("matmul GFLOP/s", "matmul_gflops", "r"),
        ("auto picks", "auto_picks", "l")]),
    DocTable("2. vmap-folded batching cases against a Python loop over examples",
             lambda run: run["tables"]["vmap_vs_loop"], [
                 ("layer", "layer", "l"), ("batch", "batch", "r"), ("case", "case", "l"), ("vmap ms", "vmap_ms", "r"),
                 ("loop ms", "loop_ms", "r"), ("loop / vmap", lambda row, run: row["loop_ms"] / row["vmap_ms"], "r")]),
    DocTable("3. Per-example weight gradient: folded grouped conv against unfold + batched matmul",
             lambda run: run["tables"]["grouped_vs_unfold"], [
                 ("layer", "layer", "l"), ("batch", "batch", "r"), ("method", "method", "l"), ("ms", "ms", "r")]),
]


def add_arguments(parser):
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--loop-examples", type=int, default=16,
                        help="examples timed in the per-example loop (scaled to the batch)")
    parser.add_argument("--im2col-variants", action="store_true",
                        help="cpu: also time the im2col kernels with each column layout and in one piece "
                             "(NOTEs [column layouts] and [cache blocking] in cuvmap/lax/conv_gemm.py)")


def run(args, settings):
    """Runs the three tables; prints them as markdown and returns the figures."""
    xp = backend.xp_for(args.device)
    dtype = np.float32
    rng = np.random.default_rng(0)
    results = {"tables": {}}
    put = (lambda a: a) if xp is np else xp.asarray
    rep, warm = args.repeats, args.warmup
    policy = runner.policy_of(args)
    n_steps = len(args.batch) * len(LAYERS) * (3 + 4 + 1)
    progress = Progress(n_steps, args.progress)

    print(f"# cuvmap conv benchmark on {args.device}, float32, medians (at least {rep} calls: see rounds)")
    print()
    print(settings_table(settings))
    from cuvmap.cpu import onednn

    kernels = cpu_kernels(args.im2col_variants) if xp is np else [("auto", "auto", None)]
    labels = [label for label, _, _ in kernels]
    with_onednn = "oneDNN" in labels
    if xp is np:
        results["onednn"] = onednn.describe()
        print(f"\n- oneDNN: {results['onednn']}" + ("" if onednn.available() else " (not measured)"))

    # -- 1. GFLOP/s against matmul -------------------------------------------------------
    rows, table = [], []
    for batch in args.batch:
        for name, c, o, hw, k in LAYERS:
            out_hw = hw - k + 1
            x = put(rng.standard_normal((batch, c, hw, hw)).astype(dtype))
            w = put(rng.standard_normal((o, c, k, k)).astype(dtype))
            g = put(rng.standard_normal((batch, o, out_hw, out_hw)).astype(dtype))
            params = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False,
                          output_padding=(0, 0), groups=1)
            flops = conv_flops(batch, c, o, out_hw, k)
            # the GEMM each op reduces to: (O × CK) @ (CK × N·out) and its transposes
            mm = gemm_rate(xp, o, c * k * k, batch * out_hw * out_hw, repeats=rep, warmup=warm)[0] / 1e9
            ops = [
                ("forward", lambda: lax.conv(x, w, **params)),
                ("backward_input", lambda: lax.conv_backward_input(g, w, x.shape, **params)),
                ("backward_weight", lambda: lax.conv_backward_weight(g, x, w.shape, **params)),
            ]
            for op, fn in ops:
                progress.set(f"1. {name} batch {batch} {op}")
                row = dict(layer=name, batch=batch, op=op, matmul_gflops=mm)
                cells = []
                for label, strategy, gemm_settings in kernels:
                    created = onednn.cache_info() if label == "oneDNN" else None
                    st = runner.measure(forced(strategy, fn, gemm_settings), repeats=rep, warmup=warm, policy=policy,
                                         timer=timer_for(xp))
                    gf = flops / st.median / 1e9
                    row[label] = dict(ms=st.median * 1e3, gflops=gf, **st.as_dict())
                    cells += [st.median * 1e3, gf]
                    if created is not None:
                        after = onednn.cache_info()
                        made = after["created"] - created["created"]
                        row["onednn_plans_made"] = made
                        row["onednn_plan_ms"] = ((after["create_seconds"] - created["create_seconds"]) / made * 1e3
                                                 if made else None)
                known = set(conv_module.measured_choices())
                forced("auto", fn)()
                new = [c for k, c in conv_module.measured_choices().items() if k not in known]
                row["auto_picks"] = new[0][0] if new else ("(measured before)" if xp is np else "–")
                rows.append(row)
                extra = ([row["im2col"]["ms"] / row["oneDNN"]["ms"], row.get("onednn_plan_ms")] if with_onednn
                         else [])
                table.append([name, batch, op] + cells + [mm, max(cells[1::2]) / mm] + extra + [row["auto_picks"]])
                progress.step(f"1. {name} batch {batch} {op}")
    results["tables"]["gflops"] = rows
    print("\n## 1. Convolution GFLOP/s per kernel against matmul GFLOP/s (same run)\n")
    headers = ["layer", "batch", "op"]
    for label in labels:
        headers += [f"{label} ms", f"{label} GFLOP/s"]
    headers += ["matmul GFLOP/s", "best / matmul"]
    if with_onednn:
        headers += ["im2col / oneDNN", "oneDNN plan ms"]
    headers += ["auto picks"]
    print(markdown_table(headers, table, "lrl" + "r" * (len(headers) - 4) + "l"))
    if with_onednn:
        print("\n- oneDNN plan ms: making one oneDNN plan (the convolution primitive and its reorders) for the "
              "shape, once per shape and power-of-two batch bucket; best / matmul: the faster kernel's rate")

    # -- 2. vmap-folded cases against a per-example loop ----------------------------------
    rows, table = [], []
    for batch in args.batch:
        for name, c, o, hw, k in LAYERS:
            out_hw = hw - k + 1
            p = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1)
            xs = put(rng.standard_normal((batch, 1, c, hw, hw)).astype(dtype))
            gs = put(rng.standard_normal((batch, 1, o, out_hw, out_hw)).astype(dtype))
            ws = put(rng.standard_normal((batch, o, c, k, k)).astype(dtype))
            w = ws[0]
            x_shared = xs[:, 0]
            n_shared = min(8, batch)
            cases = [  # name, vmapped function, operands, one example of the loop
                ("per-example weight grad (g, x batched)",
                 cv.vmap(lambda g, x: lax.conv_backward_weight(g, x, (o, c, k, k), **p)), (gs, xs),
                 lambda i: lax.conv_backward_weight(gs[i], xs[i], (o, c, k, k), **p)),
                ("ensembling forward (x, w batched)",
                 cv.vmap(lambda x, w: lax.conv(x, w, **p)), (xs, ws),
                 lambda i: lax.conv(xs[i], ws[i], **p)),
                (f"batched weights, shared input of {n_shared} (w batched)",
                 cv.vmap(lambda w: lax.conv(x_shared[:n_shared], w, **p)), (ws,),
                 lambda i: lax.conv(x_shared[:n_shared], ws[i], **p)),
                ("per-example input grad (g batched, shared w)",
                 cv.vmap(lambda g: lax.conv_backward_input(g, w, (1, c, hw, hw), **p)), (gs,),
                 lambda i: lax.conv_backward_input(gs[i], w, (1, c, hw, hw), **p)),
            ]
            n_loop = max(1, min(batch, args.loop_examples))
            for case, f, operands, inner in cases:
                progress.set(f"2. {name} batch {batch} {case}")
                sv = runner.measure(lambda: f(*operands), repeats=rep, warmup=warm, timer=timer_for(xp),
                                     policy=policy)
                sl = runner.measure(lambda: [inner(i) for i in range(n_loop)], repeats=max(1, rep // 2),
                                     warmup=warm, timer=timer_for(xp), scale=batch / n_loop)
                rows.append(dict(layer=name, batch=batch, case=case, vmap_ms=sv.median * 1e3, loop_ms=sl.median * 1e3,
                                 loop_examples=n_loop, vmap=sv.as_dict(), loop=sl.as_dict()))
                table.append((name, batch, case, sv.median * 1e3, sl.median * 1e3, sl.median / sv.median))
                progress.step(f"2. {name} batch {batch} {case}")
    results["tables"]["vmap_vs_loop"] = rows
    print("\n## 2. vmap-folded batching cases against a Python loop over examples\n")
    print(markdown_table(["layer", "batch", "case", "vmap ms", "loop ms", "loop / vmap"], table, "lrlrrr"))
    print(f"\n(the loop runs {args.loop_examples} examples, or the batch if smaller, and is scaled to the batch)")

    # -- 3. grouped conv against unfold + matmul (the TODO of BatchRulesConvolution.cpp) --
    rows, table = [], []
    from cuvmap.lax import conv_gemm

    for batch in args.batch:
        for name, c, o, hw, k in LAYERS:
            out_hw = hw - k + 1
            p = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0))
            x = put(rng.standard_normal((batch, c, hw, hw)).astype(dtype))
            g = put(rng.standard_normal((batch, o, out_hw, out_hw)).astype(dtype))

            def grouped():
                # the batching rule's call: N(BO), N(BI) with groups·B
                return lax.conv_backward_weight(g.reshape(1, batch * o, out_hw, out_hw),
                                                x.reshape(1, batch * c, hw, hw),
                                                (batch * o, c, k, k), groups=batch, **p)

            def unfold_matmul():
                # explicit: unfold each example (B, C·K, L) and one batched matmul with (B, O, L)
                win = conv_gemm._windows(xp, x, (out_hw, out_hw), (k, k), (1, 1), (1, 1))  # B C oh ow kh kw
                cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(batch, c * k * k, out_hw * out_hw)
                return xp.matmul(g.reshape(batch, o, -1), cols.transpose(0, 2, 1))

            methods = [(f"{label} grouped conv (groups·B)", forced(strategy, grouped, gemm_settings))
                       for label, strategy, gemm_settings in kernels]
            methods.append(("explicit unfold + batched matmul", unfold_matmul))
            if xp is not np:
                from cuvmap.cuda import cudnn

                if cudnn.available():
                    methods = [("cuDNN grouped conv (groups·B)", forced("cudnn", grouped)),
                               ("CuPy unfold + batched matmul", forced("unfold", grouped)),
                               ("explicit unfold + matmul", unfold_matmul)]
            progress.set(f"3. {name} batch {batch}")
            timed = [(m, runner.measure(fn, repeats=rep, warmup=warm, timer=timer_for(xp), policy=policy))
                     for m, fn in methods]
            best = min(st.median for _, st in timed)
            for m, st in timed:
                rows.append(dict(layer=name, batch=batch, method=m, ms=st.median * 1e3, **st.as_dict()))
                table.append((name, batch, m, st.median * 1e3, st.median / best))
            progress.step(f"3. {name} batch {batch}")
    progress.close()
    results["tables"]["grouped_vs_unfold"] = rows
    print("\n## 3. Per-example weight gradient: folded grouped conv (groups·B) against unfold + batched matmul\n")
    print(markdown_table(["layer", "batch", "method", "ms", "× fastest"], table, "lrlrr"))

    series = {}
    for r in results["tables"]["gflops"]:
        for label in labels:
            series.setdefault(f"{r['layer']} {r['op']} ({label})", []).append((r["batch"], r[label]["ms"] / r["batch"]))
    results["plot"] = dict(series=series, title=f"cuvmap conv ops, {args.device}: {settings['device']}\n"
                                                 f"OPENBLAS_CORETYPE={settings['OPENBLAS_CORETYPE']}")
    return results
