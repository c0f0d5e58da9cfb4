"""cuvmap quickstart: per-example gradients of a small MLP with ``vmap(grad(loss))``.

Runs on the GPU when CuPy sees one, on the CPU otherwise (``--device cpu|gpu`` to choose).
It trains a 2-layer classifier on synthetic data with plain gradient descent, then computes
per-example gradients with ``vmap(grad)``, checks them against a Python loop of ``grad``
and reports both timings.

    python examples/quickstart.py [--device cpu] [--steps 100] [--batch 128] [--help]
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuvmap as cv  # noqa: E402
import cuvmap.numpy as cnp  # noqa: E402
from cli import example_parser, positive_int  # noqa: E402


def init_params(rng, sizes, dtype):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params.append({"w": w.astype(dtype), "b": np.zeros(fan_out, dtype)})
    return params


def predict(params, x):
    h = x
    for layer in params[:-1]:
        h = cnp.tanh(h @ layer["w"] + layer["b"])
    return h @ params[-1]["w"] + params[-1]["b"]


def loss(params, x, y):
    """Mean cross entropy of ``predict`` on a batch (or one example: x (D,), y ())."""
    logits = predict(params, x)
    logp = logits - cnp.logsumexp(logits, axis=-1, keepdims=True)
    picked = cnp.take_along_axis(logp, cnp.expand_dims(y, -1), axis=-1)
    return -cnp.mean(picked)


def make_data(rng, n, dim, classes, dtype):
    centers = rng.standard_normal((classes, dim)) * 2.0
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.standard_normal((n, dim))
    return x.astype(dtype), y


def main(argv=None):
    parser = example_parser(__doc__)
    parser.add_argument("--steps", type=positive_int, default=100, help="gradient descent steps")
    parser.add_argument("--batch", type=positive_int, default=128, help="number of examples")
    parser.add_argument("--dim", type=positive_int, default=32, help="input features")
    parser.add_argument("--hidden", type=positive_int, default=64, help="width of the two hidden layers")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    dtype = np.float32
    classes = 4
    params = cv.device_put(init_params(rng, [args.dim, args.hidden, args.hidden, classes], dtype), args.device)
    x, y = cv.device_put(make_data(rng, args.batch, args.dim, classes, dtype), args.device)
    print(f"cuvmap {cv.__version__} on {args.device}: MLP {args.dim}-{args.hidden}-{args.hidden}-{classes}, batch {args.batch}")

    value_and_grad = cv.value_and_grad(loss)
    lr = 0.5
    for step in range(args.steps + 1):
        value, g = value_and_grad(params, x, y)
        if step % max(1, args.steps // 4) == 0:
            acc = float(cnp.mean(cnp.argmax(predict(params, x), axis=-1) == y))
            print(f"  step {step:4d}  loss {float(value):.4f}  train accuracy {acc:.3f}")
        params = cv.tree.map(lambda p, d: p - lr * d, params, g)

    per_example_grad = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))
    per_example_grad(params, x, y)  # warm-up
    t0 = time.perf_counter()
    pe = per_example_grad(params, x, y)
    t_vmap = time.perf_counter() - t0
    t0 = time.perf_counter()
    looped = [cv.grad(loss)(params, x[i], y[i]) for i in range(args.batch)]
    t_loop = time.perf_counter() - t0
    worst = 0.0
    for leaf_v, *leaf_l in zip(cv.tree.leaves(pe), *(cv.tree.leaves(g) for g in looped)):
        diff = cv.device_put(leaf_v, "cpu") - np.stack([cv.device_put(a, "cpu") for a in leaf_l])
        worst = max(worst, float(np.abs(diff).max()))
    norms = np.sqrt(sum(np.sum(cv.device_put(l, "cpu").reshape(args.batch, -1) ** 2, axis=1) for l in cv.tree.leaves(pe)))
    print(f"per-example gradient norms: min {norms.min():.4f}  median {np.median(norms):.4f}  max {norms.max():.4f}")
    print(f"vmap(grad) {t_vmap * 1e3:.1f} ms  vs  loop of grad {t_loop * 1e3:.1f} ms  "
          f"({t_loop / t_vmap:.1f}x faster); max |difference| {worst:.2e}")
    return worst


if __name__ == "__main__":
    main()
