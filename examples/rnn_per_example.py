"""Per-example gradients of a small RNN written with ``lax.scan``, jitted, and DP-SGD with it.

    python examples/rnn_per_example.py [--device cpu|gpu] [--batch 64] [--length 24] [--steps 150] [--help]

The task is synthetic: each sequence is ``length`` steps of 4 noisy features, and its label
says whether the first feature's running sum ended above zero, which the network must carry
through its hidden state. ``loss`` is written for ONE sequence; the recurrence is a
``lax.scan`` over time, so the step is staged once whatever the length (no unrolled Python
loop), and ``jit(vmap(grad(loss)))`` gives every sequence's gradient in one batched
backward scan. The script checks those against a loop of ``grad`` over a few sequences,
then trains with DP-SGD: each example's gradient clipped to ``--max-norm``, Gaussian noise
``σ·C``, Poisson-sampled batches padded to a few sizes, the RDP accountant's ε.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuvmap as cv  # noqa: E402
import cuvmap.numpy as cnp  # noqa: E402
from cli import example_parser, positive_float, positive_int  # noqa: E402
from cuvmap import dp, lax, nn  # noqa: E402

FEATURES, HIDDEN = 4, 32


def init_params(rng, dtype=np.float32):
    def glorot(shape):
        return (rng.standard_normal(shape) * np.sqrt(1.0 / shape[0])).astype(dtype)

    return {"w_in": glorot((FEATURES, HIDDEN)), "w_h": glorot((HIDDEN, HIDDEN)) * 0.5,
            "b": np.zeros(HIDDEN, dtype), "w_out": glorot((HIDDEN, 2)), "b_out": np.zeros(2, dtype)}


def final_state(params, xs, h0):
    """The last hidden state of the RNN over ``xs`` (time first: ``(length, ...)``)."""
    def cell(h, x):
        return cnp.tanh(x @ params["w_in"] + h @ params["w_h"] + params["b"]), None

    return lax.scan(cell, h0, xs)[0]


def loss(params, xs, y):
    """Cross entropy of one sequence: ``xs`` (length, FEATURES), ``y`` an integer label."""
    h = final_state(params, xs, cnp.zeros(HIDDEN, dtype=xs.dtype, like=xs))  # on the device of xs
    logits = h @ params["w_out"] + params["b_out"]
    return nn.cross_entropy(logits[None], y[None])


def predict(params, xs):
    """Labels of a batch of sequences ``xs`` (batch, length, FEATURES)."""
    h = final_state(params, cnp.transpose(xs, (1, 0, 2)), cnp.zeros((xs.shape[0], HIDDEN), dtype=xs.dtype, like=xs))
    return cnp.argmax(h @ params["w_out"] + params["b_out"], axis=-1)


def make_data(rng, n, length, dtype=np.float32):
    xs = rng.standard_normal((n, length, FEATURES)).astype(dtype)
    ys = (xs[:, :, 0].sum(axis=1) > 0).astype(np.int64)
    return xs, ys


def main(argv=None):
    parser = example_parser(__doc__)
    parser.add_argument("--batch", type=positive_int, default=64, help="expected batch size (Poisson sampling)")
    parser.add_argument("--length", type=positive_int, default=24, help="sequence length")
    parser.add_argument("--train", type=positive_int, default=2048, help="training sequences")
    parser.add_argument("--steps", type=positive_int, default=150, help="DP-SGD steps")
    parser.add_argument("--lr", type=positive_float, default=1e-2, help="Adam's learning rate")
    parser.add_argument("--max-norm", type=positive_float, default=1.0, help="per-example clipping norm C")
    parser.add_argument("--noise", type=positive_float, default=1.0, help="noise multiplier σ")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    params = cv.device_put(init_params(rng), args.device)
    x_train, y_train = (cv.device_put(a, args.device) for a in make_data(rng, args.train, args.length))
    x_test, y_test = (cv.device_put(a, args.device) for a in make_data(rng, 512, args.length))

    # per-example gradients: one batched backward scan, checked against a loop of grad
    per_example_grad = cv.jit(cv.vmap(cv.grad(loss), in_axes=(None, 0, 0)))
    check = min(4, args.batch)
    grads = per_example_grad(params, x_train[:check], y_train[:check])
    worst = 0.0
    for i in range(check):
        one = cv.grad(loss)(params, x_train[i], y_train[i])
        for k in params:
            worst = max(worst, float(np.abs(cv.device_put(grads[k][i], "cpu") - cv.device_put(one[k], "cpu")).max()))
    print(f"RNN on {args.device}: {args.train} sequences of {args.length} steps, hidden {HIDDEN}; per-example "
          f"gradients by jit(vmap(grad)) over a scan, max |vmap - loop| {worst:.1e} on {check} sequences")

    n = args.train
    q = min(1.0, args.batch / n)
    expected = q * n
    opt = nn.optim.adam(args.lr)
    state = opt.init(params)
    accountant = dp.RDPAccountant()
    buckets = dp.batch_buckets(expected, n)
    noise_rng = cv.backend.xp_for(args.device).random.default_rng(1)

    @cv.jit
    def dp_step(params, state, xs, ys, mask, noise):
        per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
        g = dp.private_gradient(per_example, args.max_norm, args.noise, mask=mask, noise=noise,
                                expected_batch_size=expected)
        return opt.update(g, state, params)

    accuracy = lambda p: float(np.mean(cv.device_put(predict(p, x_test), "cpu") == cv.device_put(y_test, "cpu")))
    start_acc = accuracy(params)
    times = []
    for _ in range(args.steps):
        idx = np.flatnonzero(rng.random(n) < q)  # Poisson sampling
        (xb, yb), mask = dp.pad_batch((x_train[idx], y_train[idx]), dp.bucket_for(len(idx), buckets))
        t0 = time.perf_counter()
        params, state = dp_step(params, state, xb, yb, mask, dp.standard_normal_like(params, noise_rng))
        times.append(time.perf_counter() - t0)
        accountant.step(args.noise, q)
    acc = accuracy(params)
    eps = accountant.get_epsilon(1e-5)
    print(f"DP-SGD: {args.steps} steps (C={args.max_norm}, σ={args.noise}, q={q:.4f}), median step "
          f"{np.median(times) * 1e3:.1f} ms, {dp_step.trace_count} traces; test accuracy {start_acc:.3f} -> {acc:.3f}")
    print(f"privacy: (ε = {eps:.2f}, δ = 1e-05)")
    return worst, acc, eps


if __name__ == "__main__":
    main()
