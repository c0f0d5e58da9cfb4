"""Python overhead of cuvmap's dispatch: a chain of small elementwise ops under each
transform level, against the same chain in plain NumPy.

    python -m benchmarks.bench_dispatch [--ops 100] [--size 16] [--repeats 30]

Reported per op of the chain (the user's op; under a transform one user op is several
binds: the transform's rule plus the primitives it binds below) in microseconds, with the
ratio to plain NumPy on the same arrays, all measured in this run. The arrays are tiny
(16 floats by default), so the figures are overhead, not arithmetic.
"""
import argparse
import os
import platform
import statistics
import time

import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp


def chain(x, ops, lib):
    """``ops`` elementwise ops cycling through mul, add, sin, sub, tanh, called as
    ``lib.multiply(...)`` so that plain NumPy arrays also go through cuvmap's bind."""
    y = x
    for i in range(ops):
        k = i % 5
        if k == 0:
            y = lib.multiply(y, 1.001)
        elif k == 1:
            y = lib.add(y, x)
        elif k == 2:
            y = lib.sin(y)
        elif k == 3:
            y = lib.subtract(y, 0.5)
        else:
            y = lib.tanh(y)
    return lib.sum(y)


def timeit(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description="cuvmap dispatch overhead")
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="vmap batch size")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.size)
    xs = rng.standard_normal((args.batch, args.size))
    n = args.ops
    f = lambda x: chain(x, n, cnp)  # noqa: E731
    cases = [
        ("numpy (reference)", lambda: chain(x, n, np)),
        ("cuvmap eval", lambda: f(x)),
        ("vmap", lambda: cv.vmap(f)(xs)),
        ("grad", lambda: cv.grad(f)(x)),
        ("vmap(grad)", lambda: cv.vmap(cv.grad(f))(xs)),
        ("jvp", lambda: cv.jvp(f, (x,), (x,))),
        ("grad(grad) (hvp)", lambda: cv.grad(lambda x: cnp.sum(cv.grad(f)(x) * x))(x)),
    ]
    print(f"# dispatch overhead: {n}-op elementwise chain on float64[{args.size}] (vmap batch {args.batch}); "
          f"median of {args.repeats}")
    print(f"# python {platform.python_version()}, numpy {np.__version__}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print()
    print("| case | µs per op (median) | µs per op (min) | × numpy |")
    print("|---|---:|---:|---:|")
    base = None
    for name, fn in cases:
        med, best = timeit(fn, args.repeats)
        per_op = med / n * 1e6
        if base is None:
            base = per_op
        print(f"| {name} | {per_op:.2f} | {best / n * 1e6:.2f} | {per_op / base:.1f} |")


if __name__ == "__main__":
    main()
