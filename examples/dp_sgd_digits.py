"""Differentially private training (DP-SGD) of a small CNN on scikit-learn's digits.

    python examples/dp_sgd_digits.py [--device cpu|gpu] [--epochs 15] [--clipping ghost|per_example]
        [--eager] [--no-dp] [--help]
    python examples/dp_sgd_digits.py --processes 2      # or: mpiexec -n 2 python examples/dp_sgd_digits.py

Each step draws a Poisson-sampled batch (every training example independently with
probability q = batch / N), clips each example's gradient to L2 norm C over the whole
parameter pytree, sums, adds Gaussian noise N(0, σ²C²) and divides by the expected batch
size (Abadi et al. 2016), then takes an Adam step. One ``dp.Plan``, built once from
(N, q, σ, C, steps) and the public expected batch size, gives the sampler, the padding
buckets, the clipping, the noise, the normalisation and the accountant, so that they
cannot disagree (NOTE [one plan] in cuvmap/dp/plan.py). The clipped sum comes from
``dp.clipped_grad`` (the default, ``--clipping ghost``: ghost clipping and book-keeping,
each layer's per-example gradient norm from its activations and output gradients, NOTE
[ghost clipping] in cuvmap/dp/ghost/__init__.py) or, with ``--clipping per_example``, from
every example's full gradient, ``vmap(grad(loss))``, clipped and summed
(``plan.clipped_sum``): the same values; either carries its sensitivity, which the plan's
``private_gradient`` checks. The plan's accountant (RDP of the sampled Gaussian mechanism,
and any other registered in ``dp.ACCOUNTANTS``) gives the (ε, δ) spent. ``--no-dp`` trains the same network with ordinary mini-batch gradients, for
comparison.

The whole step — the clipped per-example gradients, the masked sum, the noise and the Adam
update — runs under ``cuvmap.jit``; the noise is drawn outside it and passed in. A Poisson
batch changes size every step, so it is padded to the smallest size of a short ladder
(``dp.batch_buckets``) with a mask that gives the padding zero weight in the clipped sum
(``dp.pad_batch``, NOTE [padding Poisson batches] in cuvmap/dp/padding.py): the step traces once
per size met, and neither the gradient nor ε changes. ``--eager`` runs the same step op by
op on the unpadded batches.

Data parallel (``--processes P``, which starts the job under ``mpiexec``, or any launcher
line such as ``mpiexec -n P python examples/dp_sgd_digits.py``): process ``r`` of ``P``
holds the training examples ``r, r + P, ...``. Every process draws the same Poisson mask
over all ``N`` training examples (the same generator and seed everywhere) and keeps its own
examples of it, so the processes' batches together are the one-process batch. Each
computes its share of the private gradient ``(Σ_b clip(g_b) + σCz) / (qN)`` over its
examples; every process draws ``z`` from the same generator, and ``private_gradient``,
which sees the axis of processes, keeps process 0's draw alone (NOTE [noise once over a
data-parallel axis] in cuvmap/dp/noise.py), so that the ``psum`` over the axis of processes
that adds the shares (``cuvmap.distributed.data_parallel``) carries the noise once in
total, not once per process, and every process takes the same Adam step. The accountant
is unchanged (same q, σ and steps), and the run equals the one-process run to float
rounding.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuvmap as cv  # noqa: E402
import cuvmap.numpy as cnp  # noqa: E402
from cuvmap import distributed, dp, lax, nn  # noqa: E402
from cuvmap.nn import layers  # noqa: E402
from cli import (Progress, add_progress_option, example_parser, open_unit_interval,  # noqa: E402
                 positive_float, positive_int)
from digits import load_digits  # noqa: E402

# conv 1→16 (3×3) → relu → 2×2 max pool → conv 16→32 → relu → 2×2 max pool → dense 10
MODEL = layers.Serial(
    layers.Conv(16, 3, padding=1), layers.Relu, layers.MaxPool(2),
    layers.Conv(32, 3, padding=1), layers.Relu, layers.MaxPool(2),
    layers.Flatten, layers.Dense(10),
)


def loss(params, x, y):
    """Cross entropy of one example (x: (1, 8, 8)) or of a batch."""
    logits = MODEL.apply(params, x)
    if logits.ndim == 1:
        logits, y = logits[None], y[None]
    return nn.cross_entropy(logits, y)


def accuracy(params, x, y):
    return float(cnp.mean(cnp.argmax(MODEL.apply(params, x), axis=-1) == y))


def main(argv=None):
    parser = example_parser(__doc__)
    parser.add_argument("--epochs", type=positive_float, default=15, help="passes over the training set")
    parser.add_argument("--batch", type=positive_int, default=256, help="expected batch size (Poisson sampling)")
    parser.add_argument("--lr", type=positive_float, default=3e-2, help="Adam's learning rate")
    parser.add_argument("--max-norm", type=positive_float, default=1.0, help="per-example clipping norm C")
    parser.add_argument("--noise", type=positive_float, default=2.0, help="noise multiplier σ")
    parser.add_argument("--delta", type=open_unit_interval, default=1e-5, help="the δ of the (ε, δ) reported")
    parser.add_argument("--clipping", choices=["ghost", "per_example"], default="ghost",
                        help="ghost: dp.clipped_grad (ghost norms and book-keeping, per layer); per_example: "
                             "clip every example's vmap(grad) gradient")
    parser.add_argument("--no-dp", action="store_true", help="ordinary mini-batch training instead")
    parser.add_argument("--eager", action="store_true",
                        help="run the training step op by op on unpadded batches instead of under cuvmap.jit")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="use only the first LIMIT training examples (None: all of them)")
    parser.add_argument("--processes", type=positive_int, default=None,
                        help="train data parallel on this many processes, started under mpiexec (under a launcher "
                             "already, the job's processes are used)")
    parser.add_argument("--save", metavar="PATH", default=None,
                        help="write the trained parameters to PATH (.npz; from process 0)")
    add_progress_option(parser)
    args = parser.parse_args(argv)
    if args.processes and args.processes > 1 and distributed.detect().launcher is None:
        return _relaunch(args.processes, sys.argv[1:] if argv is None else argv)
    group = distributed.initialize() if args.processes or distributed.detect().launcher else distributed.ProcessGroup()
    if args.processes and args.processes != group.size:
        parser.error(f"--processes {args.processes}, but the launcher started {group.size} processes")
    quiet = group.rank != 0

    x_train, y_train, x_test, y_test = load_digits(args.device)
    if args.limit:
        x_train, y_train = x_train[:args.limit], y_train[:args.limit]
    n = len(y_train)
    x_train, y_train = x_train[group.rank::group.size], y_train[group.rank::group.size]  # this process's examples
    q = min(1.0, args.batch / n)
    steps = int(np.ceil(args.epochs / q))
    # the public normalisation: the expected batch size chosen (the whole set when --batch exceeds it)
    plan = dp.Plan(dataset_size=n, sample_rate=q, noise_multiplier=args.noise, max_norm=args.max_norm, steps=steps,
                   expected_batch_size=min(args.batch, n))
    rng = np.random.default_rng(0)
    noise_rng = cv.backend.xp_for(args.device).random.default_rng(1)
    init_rng = noise_rng if args.device == "gpu" else rng
    _, params = MODEL.init(init_rng, (-1, 1, 8, 8))
    opt = nn.optim.adam(args.lr)
    state = opt.init(params)
    per_example_grad = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))
    clipped_grad = plan.clipped_grad(loss)
    batch_grad = cv.grad(loss)

    def dp_step(params, state, x, y, mask, noise):
        """One DP-SGD step: ``mask`` marks the real examples of the (padded) batch, ``noise``
        holds standard normal draws shaped like the parameters."""
        if args.clipping == "ghost":
            clipped = clipped_grad(params, x, y, mask=mask)   # the clipped sum and the norms
        else:                                                 # from every example's gradient
            clipped = plan.clipped_sum(per_example_grad(params, x, y), mask=mask)
        grads = plan.private_gradient(clipped, noise=noise)   # σ·Δ·z, then / the expected batch size
        if group.size > 1:  # the processes' shares of the gradient (the noise is process 0's alone)
            grads = lax.psum(grads, "batch")
        return opt.update(grads, state, params)

    def sgd_step(params, state, x, y):
        grads = batch_grad(params, x, y)
        if group.size > 1:  # the mean over all the processes' examples
            share = len(y) / min(args.batch, n)
            grads = lax.psum(cv.tree.map(lambda g: g * share, grads), "batch")
        return opt.update(grads, state, params)

    step_fn = sgd_step if args.no_dp else dp_step
    if not args.eager:
        step_fn = cv.jit(step_fn)
    jitted = step_fn
    if group.size > 1:
        step_fn = distributed.data_parallel(step_fn, axis_name="batch", group=group)
    buckets = plan.buckets_for(len(y_train))    # this process's examples
    mode = "ordinary SGD (no privacy)" if args.no_dp else \
        f"DP-SGD (C={args.max_norm}, σ={args.noise}, q={q:.4f}, {args.clipping} clipping)"
    how = "eager" if args.eager else ("jit" if args.no_dp else "jit, batches padded to " +
                                      ", ".join(map(str, buckets[:3])) + (", ..." if len(buckets) > 3 else ""))
    where = f" on {group.size} processes (this is process {group.rank})" if group.size > 1 else ""
    say = (lambda *a, **k: None) if quiet else print
    say(f"digits CNN on {args.device}{where}: {n} training and {len(y_test)} test images, {steps} steps of {mode} "
        f"[{how}]")

    step_times, batch_sizes, padded_sizes = [], [], set()
    t_start = time.perf_counter()
    with Progress(steps, "train", "off" if quiet else args.progress) as bar:
        for step in range(steps):
            distributed.step(step, group=group)   # the collective check compares it (a skipped step is named)
            t0 = time.perf_counter()
            if args.no_dp:
                # the same draw on every process; each takes its examples of it
                idx = _own(rng.choice(n, size=min(args.batch, n), replace=False), group)
                params, state = step_fn(params, state, x_train[idx], y_train[idx])
            else:
                # the plan's Poisson sample: the same on every process, each keeps its examples
                idx = _own(plan.sample(rng), group)
                size = len(idx) if args.eager else dp.bucket_for(len(idx), buckets)
                batch_sizes.append(len(idx))
                padded_sizes.add(size)
                (xb, yb), mask = dp.pad_batch((x_train[idx], y_train[idx]), size)
                noise = plan.noise(params, noise_rng)   # drawn everywhere, kept on process 0
                params, state = step_fn(params, state, xb, yb, mask, noise)
            step_times.append(time.perf_counter() - t0)
            if step % 20 == 0 or step == steps - 1:
                info = f"test accuracy {accuracy(params, x_test, y_test):.3f}"
            bar.update(info=info)
    elapsed = time.perf_counter() - t_start

    acc = accuracy(params, x_test, y_test)
    mean_ms, median_ms = np.mean(step_times) * 1e3, np.median(step_times) * 1e3
    say(f"test accuracy {acc:.3f} after {args.epochs:g} epochs ({steps} steps, {mean_ms:.1f} ms per step, "
        f"median {median_ms:.1f}; {elapsed:.1f} s in all)")
    if not args.eager:
        traces = f"jit: {jitted.trace_count} trace{'s' * (jitted.trace_count != 1)}"
        if args.no_dp:
            say(traces)
        else:
            say(f"{traces}, batches of {min(batch_sizes)}-{max(batch_sizes)} examples padded to "
                f"{', '.join(map(str, sorted(padded_sizes)))}")
    eps = None
    if not args.no_dp:
        epsilons = plan.epsilons(args.delta)    # every accountant of the plan's sampler, for its steps
        eps = epsilons.pop("rdp")
        eps_pld = epsilons.pop("pld")
        say(f"privacy: (ε = {eps:.2f}, δ = {args.delta:g}) by the RDP accountant of the Poisson-subsampled Gaussian, "
            f"ε = {eps_pld:.2f} by its privacy loss distribution (PLD)")
        for name, value in epsilons.items():
            say(f"privacy: (ε = {value:.2f}, δ = {args.delta:g}) by the {name.upper()} accountant")
    if args.save and not quiet:
        np.savez(args.save, **{"/".join(map(str, path)): cv.device_put(leaf, "cpu")
                               for path, leaf in zip(*cv.tree.flatten_with_path(params)[:2])})
    return acc, eps


def _relaunch(processes, argv):
    """Runs this script again as a job of ``processes`` processes under mpiexec."""
    result = distributed.launch(processes, [os.path.abspath(__file__), *argv])
    if result.returncode:
        raise SystemExit(result.returncode)
    return None


def _own(idx, group):
    """The examples of ``idx`` (indices into the whole training set) that this process
    holds (``r, r + P, ...``), as indices into its own examples."""
    mine = idx[idx % group.size == group.rank]
    return mine // group.size


if __name__ == "__main__":
    main()
