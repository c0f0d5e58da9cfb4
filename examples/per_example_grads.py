"""The plain recipe: per-example gradients of a CNN with ``vmap(grad(loss))``.

    python examples/per_example_grads.py [--device cpu|gpu] [--batch 64] [--help]

``loss`` is written for ONE example; ``grad`` differentiates it with respect to the
parameters; ``vmap`` maps that over the batch, sharing the parameters (``in_axes=None``).
Under ``vmap`` the convolutions' batching rules fold the batch into the groups of one
grouped convolution per layer, so the whole batch costs about one ordinary backward pass.
The script prints the per-example gradient norms and checks them against a Python loop.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuvmap as cv  # noqa: E402
from cli import example_parser, positive_int  # noqa: E402
from cuvmap import nn  # noqa: E402


def init_params(rng, dtype=np.float32):
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)

    return {
        "conv1": {"w": he((8, 1, 3, 3), 9), "b": np.zeros(8, dtype)},
        "conv2": {"w": he((16, 8, 3, 3), 72), "b": np.zeros(16, dtype)},
        "dense": {"w": he((16 * 7 * 7, 10), 16 * 7 * 7), "b": np.zeros(10, dtype)},
    }


def loss(params, x, y):
    """Cross entropy of one example: x (1, 28, 28), y an integer label."""
    h = nn.relu(nn.conv(x, params["conv1"]["w"], params["conv1"]["b"], stride=2, padding=1))   # (8, 14, 14)
    h = nn.relu(nn.conv(h, params["conv2"]["w"], params["conv2"]["b"], stride=2, padding=1))   # (16, 7, 7)
    logits = h.reshape(-1) @ params["dense"]["w"] + params["dense"]["b"]
    return nn.cross_entropy(logits[None], y[None])


def main(argv=None):
    parser = example_parser(__doc__)
    parser.add_argument("--batch", type=positive_int, default=64, help="number of examples")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    params = cv.device_put(init_params(rng), args.device)
    xs = cv.device_put(rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32), args.device)
    ys = cv.device_put(rng.integers(0, 10, args.batch), args.device)

    per_example_grad = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))
    per_example_grad(params, xs, ys)  # warm-up
    t0 = time.perf_counter()
    grads = per_example_grad(params, xs, ys)
    t_vmap = time.perf_counter() - t0

    # the global L2 norm of each example's gradient over all parameters
    leaves = [cv.device_put(g, "cpu").reshape(args.batch, -1) for g in cv.tree.leaves(grads)]
    norms = np.sqrt(sum(np.sum(leaf.astype(np.float64) ** 2, axis=1) for leaf in leaves))

    t0 = time.perf_counter()
    looped = [cv.grad(loss)(params, xs[i], ys[i]) for i in range(args.batch)]
    t_loop = time.perf_counter() - t0
    worst = 0.0
    for leaf, *per in zip(cv.tree.leaves(grads), *(cv.tree.leaves(g) for g in looped)):
        ref = np.stack([cv.device_put(p, "cpu") for p in per])
        worst = max(worst, float(np.abs(cv.device_put(leaf, "cpu") - ref).max()))

    print(f"per-example gradients on {args.device}: batch {args.batch}, "
          f"{sum(leaf.shape[1] for leaf in leaves)} parameters per example")
    print(f"  gradient norms: min {norms.min():.3f}  median {np.median(norms):.3f}  max {norms.max():.3f}")
    print(f"  vmap(grad) {t_vmap * 1e3:.1f} ms, loop of grad {t_loop * 1e3:.1f} ms "
          f"({t_loop / t_vmap:.1f}x); max |vmap - loop| {worst:.1e}")
    return worst


if __name__ == "__main__":
    main()
