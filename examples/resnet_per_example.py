"""A small ResNet with dropout, trained with clipped per-example gradients.

    python examples/resnet_per_example.py [--device cpu|gpu] [--steps 200] [--batch 32] [--help]

The network is built from stax layers: ``Residual`` blocks (``FanOut(2)``,
``parallel(branch, Identity)``, ``FanInSum``) of convolutions and group norms, with
``Dropout`` inside the blocks and before the classifier, on scikit-learn's 8×8 digits.
``loss`` is written for ONE example and takes that example's key; a training step splits
the step's key into one key per example and maps ``grad(loss)`` over the batch with
``vmap``, so every example gets its own dropout masks — the ones a Python loop over the
examples would give it — while each convolution runs once for the whole batch. Each
example's gradient is clipped to a global L2 norm (``cuvmap.dp.clip_per_example``, the
robust-training half of DP-SGD, without noise) before averaging; Adam takes the step.

The script checks the first step's per-example gradients against a loop of ``grad`` with
the same keys, and reports the test accuracy in eval mode (dropout off).
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuvmap as cv  # noqa: E402
import cuvmap.numpy as cnp  # noqa: E402
from cuvmap import dp, nn, random  # noqa: E402
from cuvmap.nn import layers as L  # noqa: E402
from cli import Progress, add_progress_option, example_parser, positive_float, positive_int  # noqa: E402
from digits import load_digits  # noqa: E402


def resnet(width, dropout):
    def block():
        return L.Residual(L.Conv(width, 3, padding=1), L.GroupNorm(4), L.Relu, L.Dropout(dropout),
                          L.Conv(width, 3, padding=1), L.GroupNorm(4))

    return L.Serial(
        L.Conv(width, 3, padding=1), L.GroupNorm(4), L.Relu,
        block(), L.Relu,
        block(), L.Relu, L.MaxPool(2),
        L.Flatten, L.Dropout(dropout), L.Dense(10), L.LogSoftmax,
    )


def main(argv=None):
    parser = example_parser(__doc__)
    parser.add_argument("--steps", type=positive_int, default=200, help="training steps")
    parser.add_argument("--batch", type=positive_int, default=32, help="examples per step")
    parser.add_argument("--width", type=positive_int, default=16, help="channels of the residual blocks (x4)")
    parser.add_argument("--lr", type=positive_float, default=3e-3, help="Adam's learning rate")
    parser.add_argument("--max-norm", type=positive_float, default=1.0, help="per-example clipping norm")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout probability")
    add_progress_option(parser)
    args = parser.parse_args(argv)
    if not 0 <= args.dropout < 1:
        parser.error(f"argument --dropout: must be in [0, 1), got {args.dropout}")

    width = 4 * ((args.width + 3) // 4)  # group norm with 4 groups
    model = resnet(width, args.dropout)
    x_train, y_train, x_test, y_test = load_digits(args.device)
    _, params = model.init(np.random.default_rng(0), (-1, 1, 8, 8))
    params = cv.device_put(params, args.device)

    def loss(params, x, y, key):
        """Cross entropy of one example x (1, 8, 8) with label y, its dropout masks from key."""
        return -model.apply(params, x, rng=key)[y]

    per_example_grads = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0, 0))
    opt = nn.optim.adam(args.lr)
    state = opt.init(params)
    order = np.random.default_rng(1)
    base = random.key(2)
    n = len(y_train)
    print(f"ResNet ({width} channels, dropout {args.dropout}) on {args.device}: {n} training digits, "
          f"{args.steps} steps of {args.batch} clipped per-example gradients (C={args.max_norm})")
    worst = None
    t0 = time.perf_counter()
    with Progress(args.steps, "train", args.progress) as bar:
        for t in range(args.steps):
            idx = order.integers(0, n, args.batch)
            keys = cv.device_put(random.split(random.fold_in(base, t), args.batch), args.device)  # one per example
            xs, ys = x_train[idx], y_train[idx]
            grads = per_example_grads(params, xs, ys, keys)           # leaves (B, *param.shape)
            if worst is None:  # the independent check: a loop of grad with the same keys
                looped = [cv.grad(loss)(params, xs[i], ys[i], keys[i]) for i in range(args.batch)]
                worst = max(float(np.abs(cv.device_put(g[i], "cpu") - cv.device_put(r, "cpu")).max())
                            for i, one in enumerate(looped)
                            for g, r in zip(cv.tree.leaves(grads), cv.tree.leaves(one)))
            clipped = dp.clip_per_example(grads, args.max_norm)
            mean = cv.tree.map(lambda g: cnp.mean(g, axis=0), clipped)
            params, state = opt.update(mean, state, params)
            bar.update()
    elapsed = time.perf_counter() - t0

    logp = model.apply(params, x_test, mode="eval")
    acc = float(cnp.mean(cnp.argmax(logp, axis=-1) == y_test))
    print(f"test accuracy {acc:.3f} after {args.steps} steps ({elapsed / args.steps * 1e3:.1f} ms per step)")
    print(f"first step: max |vmap(grad) - loop of grad| over the per-example gradients {worst:.1e}")
    return acc, worst


if __name__ == "__main__":
    main()
