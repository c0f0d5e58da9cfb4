"""Jacobians and Hessians of a small network: ``jacrev``, ``jacfwd`` and ``hessian``.

    python examples/jacobians.py [--device cpu|gpu] [--help]

For a 2-layer tanh network ``f(x) = W2 tanh(W1 x + b1)`` it computes the input Jacobian
both ways (reverse mode: one VJP per output; forward mode: one JVP per input, each a
single vmapped pass), checks them against each other and against the closed form
``W2 diag(1 - tanh²) W1``, then the Hessian of a scalar loss against central differences
of its gradient, and per-example input Jacobians with ``vmap(jacrev(f))``.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuvmap as cv  # noqa: E402
import cuvmap.numpy as cnp  # noqa: E402
from cli import example_parser, positive_int  # noqa: E402


def main(argv=None):
    parser = example_parser(__doc__)
    parser.add_argument("--inputs", type=positive_int, default=6, help="input size of the network")
    parser.add_argument("--hidden", type=positive_int, default=16, help="hidden width")
    parser.add_argument("--outputs", type=positive_int, default=3, help="output size")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    p = cv.device_put({
        "W1": rng.standard_normal((args.hidden, args.inputs)) / np.sqrt(args.inputs),
        "b1": rng.standard_normal(args.hidden) * 0.1,
        "W2": rng.standard_normal((args.outputs, args.hidden)) / np.sqrt(args.hidden),
    }, args.device)
    x = cv.device_put(rng.standard_normal(args.inputs), args.device)

    def f(x):
        return p["W2"] @ cnp.tanh(p["W1"] @ x + p["b1"])

    j_rev = cv.jacrev(f)(x)
    j_fwd = cv.jacfwd(f)(x)
    h = np.tanh(cv.device_put(p["W1"] @ x + p["b1"], "cpu"))
    closed = cv.device_put(p["W2"], "cpu") @ np.diag(1 - h ** 2) @ cv.device_put(p["W1"], "cpu")
    err_rev = float(np.abs(cv.device_put(j_rev, "cpu") - closed).max())
    err_fwd = float(np.abs(cv.device_put(j_fwd, "cpu") - closed).max())
    print(f"Jacobian {tuple(j_rev.shape)}: |jacrev - closed form| {err_rev:.1e}, |jacfwd - closed form| {err_fwd:.1e}")

    def loss(x):
        return cnp.sum(f(x) ** 2) + 0.1 * cnp.sum(x ** 4)

    hess = cv.device_put(cv.hessian(loss)(x), "cpu")
    eps = 1e-5
    g = cv.grad(loss)
    x_cpu = cv.device_put(x, "cpu")
    numeric = np.stack([
        (cv.device_put(g(cv.device_put(x_cpu + eps * e, args.device)), "cpu")
         - cv.device_put(g(cv.device_put(x_cpu - eps * e, args.device)), "cpu")) / (2 * eps)
        for e in np.eye(args.inputs)
    ], axis=1)
    sym = float(np.abs(hess - hess.T).max())
    print(f"Hessian {hess.shape}: |hessian - finite differences| {np.abs(hess - numeric).max():.1e}, "
          f"asymmetry {sym:.1e}, eigenvalues {np.round(np.linalg.eigvalsh((hess + hess.T) / 2), 3)}")

    xs = cv.device_put(rng.standard_normal((5, args.inputs)), args.device)
    per_example = cv.vmap(cv.jacrev(f))(xs)
    loop = np.stack([cv.device_put(cv.jacrev(f)(xs[i]), "cpu") for i in range(5)])
    err_pe = float(np.abs(cv.device_put(per_example, "cpu") - loop).max())
    print(f"per-example Jacobians {tuple(per_example.shape)} with vmap(jacrev): |vmap - loop| {err_pe:.1e}")
    return max(err_rev, err_fwd, err_pe, float(np.abs(hess - numeric).max()))


if __name__ == "__main__":
    main()
