"""Convolution throughput, measured side by side in one run.

    python -m benchmarks.bench_conv [--device cpu|gpu] [--batch 32 128] [--repeats 5] [--json out.json]

Tables (all on the shapes of the README CNN: 1→16→32 channels, 5×5 kernels, 28×28 input):

1. conv forward / backward-input / backward-weight in GFLOP/s, against the machine's
   matmul GFLOP/s (a float32 GEMM of the same inner size, measured in this run);
2. the vmap-folded cases against a Python loop over the examples: per-example weight
   gradients (grad_output and input batched: groups·B), model ensembling (input and weight
   batched), batched weights on shared inputs;
3. the seed's TODO: the folded grouped convolution (groups·B) against an explicit unfold +
   batched matmul of the same per-example weight gradient (and, on the GPU, cuDNN against
   the CuPy unfold path).

On the CPU set ``OPENBLAS_CORETYPE`` as you wish before running (it changes NumPy's GEMM
speed on some machines); the value in force is printed with the figures, and every ratio
compares methods under the same setting.
"""
import argparse
import importlib
import json
import os
import platform
import statistics
import time

import numpy as np

import cuvmap as cv
from cuvmap import backend, lax

LAYERS = [  # name, C, O, input spatial, kernel
    ("conv1 1→16", 1, 16, 28, 5),
    ("conv2 16→32", 16, 32, 24, 5),
]


def _sync(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def timeit(fn, repeats, xp=np):
    """Median and min seconds (CUDA events on the GPU)."""
    fn()
    if xp is not np:
        from cuvmap.cuda import device

        times = [device.time_gpu(fn, repeats=1) / 1e3 for _ in range(repeats)]
    else:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def conv_flops(n, c, o, out_hw, k, groups=1):
    return 2.0 * n * o * (c // groups) * k * k * out_hw * out_hw


def matmul_gflops(xp, dtype, m, k, n, repeats):
    a = xp.asarray(np.random.default_rng(0).standard_normal((m, k)).astype(dtype))
    b = xp.asarray(np.random.default_rng(1).standard_normal((k, n)).astype(dtype))
    med, _ = timeit(lambda: a @ b, repeats, xp)
    return 2.0 * m * k * n / med / 1e9


def settings_line(xp):
    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}",
             f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}",
             f"cores {os.cpu_count()}"]
    try:
        from threadpoolctl import threadpool_info

        blas = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, {i.get('num_threads')} threads)"
                for i in threadpool_info() if i.get("user_api") == "blas"]
        parts.append("BLAS " + ", ".join(blas))
    except ImportError:
        pass
    if xp is not np:
        from cuvmap.cuda import device

        parts.append(device.describe())
    return "; ".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description="cuvmap convolution benchmark")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loop-examples", type=int, default=16,
                        help="examples timed in the per-example loop (scaled to the batch)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)

    xp = backend.xp_for(args.device)
    dtype = np.float32
    rng = np.random.default_rng(0)
    results = {"settings": settings_line(xp), "device": args.device, "tables": {}}
    put = (lambda a: a) if xp is np else xp.asarray

    print(f"# cuvmap conv benchmark on {args.device}, float32, median of {args.repeats}")
    print(f"# {results['settings']}")

    # -- 1. GFLOP/s against matmul -------------------------------------------------------
    print("\n## 1. Convolution GFLOP/s against matmul GFLOP/s (same run)\n")
    print("| layer | batch | op | ms | GFLOP/s | matmul GFLOP/s | ratio |")
    print("|---|---:|---|---:|---:|---:|---:|")
    rows = []
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
            mm = matmul_gflops(xp, dtype, o, c * k * k, batch * out_hw * out_hw, args.repeats)
            ops = [
                ("forward", lambda: lax.conv(x, w, **params)),
                ("backward_input", lambda: lax.conv_backward_input(g, w, x.shape, **params)),
                ("backward_weight", lambda: lax.conv_backward_weight(g, x, w.shape, **params)),
            ]
            for op, fn in ops:
                med, _ = timeit(fn, args.repeats, xp)
                gf = flops / med / 1e9
                rows.append(dict(layer=name, batch=batch, op=op, ms=med * 1e3, gflops=gf, matmul_gflops=mm))
                print(f"| {name} | {batch} | {op} | {med * 1e3:.2f} | {gf:.1f} | {mm:.1f} | {gf / mm:.2f} |")
    results["tables"]["gflops"] = rows

    # -- 2. vmap-folded cases against a per-example loop ----------------------------------
    print("\n## 2. vmap-folded batching cases against a Python loop over examples\n")
    print("| layer | batch | case | vmap ms | loop ms | loop / vmap |")
    print("|---|---:|---|---:|---:|---:|")
    rows = []
    for batch in args.batch:
        for name, c, o, hw, k in LAYERS:
            out_hw = hw - k + 1
            p = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1)
            xs = put(rng.standard_normal((batch, 1, c, hw, hw)).astype(dtype))
            gs = put(rng.standard_normal((batch, 1, o, out_hw, out_hw)).astype(dtype))
            ws = put(rng.standard_normal((batch, o, c, k, k)).astype(dtype))
            w = ws[0]
            x_shared = xs[:, 0]
            cases = [
                ("per-example weight grad (g, x batched)",
                 cv.vmap(lambda g, x: lax.conv_backward_weight(g, x, (o, c, k, k), **p)), (gs, xs)),
                ("ensembling forward (x, w batched)",
                 cv.vmap(lambda x, w: lax.conv(x, w, **p)), (xs, ws)),
                ("batched weights, shared input (w batched)",
                 cv.vmap(lambda w: lax.conv(x_shared[:8], w, **p)), (ws,)),
                ("per-example input grad (g batched, shared w)",
                 cv.vmap(lambda g: lax.conv_backward_input(g, w, (1, c, hw, hw), **p)), (gs,)),
            ]
            for case, f, operands in cases:
                med_v, _ = timeit(lambda: f(*operands), args.repeats, xp)
                n_loop = min(batch, args.loop_examples)
                inner = {
                    "per-example weight grad (g, x batched)": lambda i: lax.conv_backward_weight(gs[i], xs[i], (o, c, k, k), **p),
                    "ensembling forward (x, w batched)": lambda i: lax.conv(xs[i], ws[i], **p),
                    "batched weights, shared input (w batched)": lambda i: lax.conv(x_shared[:8], ws[i], **p),
                    "per-example input grad (g batched, shared w)": lambda i: lax.conv_backward_input(gs[i], w, (1, c, hw, hw), **p),
                }[case]
                med_l, _ = timeit(lambda: [inner(i) for i in range(n_loop)], max(1, args.repeats // 2), xp)
                med_l *= batch / n_loop
                rows.append(dict(layer=name, batch=batch, case=case, vmap_ms=med_v * 1e3, loop_ms=med_l * 1e3))
                print(f"| {name} | {batch} | {case} | {med_v * 1e3:.2f} | {med_l * 1e3:.2f} | {med_l / med_v:.1f} |")
    results["tables"]["vmap_vs_loop"] = rows
    print(f"\n(the loop runs {args.loop_examples} examples and is scaled to the batch)")

    # -- 3. grouped conv against unfold + matmul (the seed's TODO) ------------------------
    print("\n## 3. Per-example weight gradient: folded grouped conv (groups·B) against unfold + batched matmul\n")
    print("| layer | batch | method | ms | × fastest |")
    print("|---|---:|---|---:|---:|")
    rows = []
    conv_module = importlib.import_module("cuvmap.lax.conv")  # (cuvmap.lax.conv the attribute is the function)
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

            methods = [("grouped conv (groups·B)", grouped), ("unfold + batched matmul", unfold_matmul)]
            if xp is not np:
                from cuvmap.cuda import cudnn

                if cudnn.available():
                    def with_strategy(s):
                        def run():
                            prev = conv_module.set_strategy(s)
                            try:
                                return grouped()
                            finally:
                                conv_module.set_strategy(prev)
                        return run
                    methods = [("cuDNN grouped conv (groups·B)", with_strategy("cudnn")),
                               ("CuPy unfold + batched matmul", with_strategy("unfold")),
                               ("explicit unfold + matmul", unfold_matmul)]
            timed = [(m, timeit(fn, args.repeats, xp)[0]) for m, fn in methods]
            best = min(t for _, t in timed)
            for m, t in timed:
                rows.append(dict(layer=name, batch=batch, method=m, ms=t * 1e3))
                print(f"| {name} | {batch} | {m} | {t * 1e3:.2f} | {t / best:.2f} |")
    results["tables"]["grouped_vs_unfold"] = rows

    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
