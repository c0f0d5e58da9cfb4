"""cuvmap's rows: per-example gradients of the benchmark CNN (the per_example suite) and
DP-SGD's clipped gradient sum (the dp suite), on the suite's weights and data."""
import numpy as np

import cuvmap as cv
from cuvmap import backend, dp

from benchmarks import models
from benchmarks.methods import Method
from benchmarks.rounds.timers import timer_for


def to_numpy(a):
    """A cuvmap array (NumPy or CuPy) as a NumPy array."""
    return np.asarray(cv.device_put(a, "cpu"))


def _on_device(args, *trees):
    return tuple(cv.device_put(t, args.device) for t in trees)


def per_example_methods(args, params, xs, ys, batch):
    """(a) a Python loop of ``grad`` over the first ``--loop-examples`` examples (scaled to
    the batch), (b) ``vmap(grad)``, (c) with ``chunk_size``, (d) ``grad`` of the mean loss,
    (d') ``jit(vmap(grad))`` and ``jit(grad)`` of the mean loss."""
    timer = timer_for(backend.xp_for(args.device))
    p, x, y = _on_device(args, params, xs, ys)
    grad_one = cv.grad(models.cuvmap_per_example_loss)
    n_loop = max(1, min(batch, args.loop_examples))

    def loop():
        return [grad_one(p, x[i], y[i]) for i in range(n_loop)]

    per_example = cv.vmap(cv.grad(models.cuvmap_per_example_loss), in_axes=(None, 0, 0))
    chunked = cv.vmap(cv.grad(models.cuvmap_per_example_loss), in_axes=(None, 0, 0), chunk_size=args.chunk_size)
    batched = cv.grad(models.cuvmap_batch_loss)
    jitted = cv.jit(per_example)
    jitted_batched = cv.jit(batched)
    chunk_note = (f"chunk_size {args.chunk_size} ≥ batch: one chunk, the same call as vmap(grad)"
                  if args.chunk_size >= batch else f"{-(-batch // args.chunk_size)} chunks")
    loop_note = f"{n_loop} of {batch} examples timed, scaled ×{batch / n_loop:g}" if n_loop < batch else None
    return [
        Method("loop", "cuvmap: Python loop of grad", "cuvmap", loop, timer, "loop", to_numpy, scale=batch / n_loop,
               note=loop_note),
        Method("vmap", "cuvmap: vmap(grad)", "cuvmap", lambda: per_example(p, x, y), timer, "per_example", to_numpy),
        Method("chunked", f"cuvmap: vmap(grad, chunk_size={args.chunk_size})", "cuvmap",
               lambda: chunked(p, x, y), timer, "per_example", to_numpy, note=chunk_note),
        Method("batched", "cuvmap: grad of the mean loss (batched)", "cuvmap", lambda: batched(p, x, y), timer,
               "batched", to_numpy, note="the ordinary batched backward pass: no per-example gradients"),
        Method("jit_vmap", "cuvmap: jit(vmap(grad))", "cuvmap", lambda: jitted(p, x, y), timer, "per_example",
               to_numpy, note="staged: the first call includes the tracing and planning"),
        Method("jit_batched", "cuvmap: jit(grad of the mean loss)", "cuvmap", lambda: jitted_batched(p, x, y), timer,
               "batched", to_numpy, note="(d) staged: the batched backward pass as a planned program"),
    ]


def clipped_sum_methods(args, params, per_example_loss, batch_loss, xs, ys, max_norm):
    """(a) ``grad`` of the mean loss (non-private), (b) ``vmap(grad)`` then
    ``dp.clipped_sum``, (c) ``dp.clipped_grad``, and the same under ``jit`` unless
    ``--no-jit``; with the methods ``dp.clipped_grad`` chose per parameter."""
    timer = timer_for(backend.xp_for(args.device))
    p, x, y = _on_device(args, params, xs, ys)

    def batched(p, x, y):
        return cv.grad(batch_loss)(p, x, y)

    def vmap_clip(p, x, y):
        per_example = cv.vmap(cv.grad(per_example_loss), in_axes=(None, 0, 0))(p, x, y)
        return dp.clipped_sum(per_example, max_norm, return_norms=True)

    clipped = dp.clipped_grad(per_example_loss, max_norm)

    def ghost(p, x, y):
        return tuple(clipped(p, x, y))

    memory = args.device == "cpu"
    rows = [("batched", "cuvmap: grad of the mean loss (non-private, batched)", batched, "batched"),
            ("vmap_clip", "cuvmap: vmap(grad) + dp.clipped_sum", vmap_clip, "clipped"),
            ("ghost", "cuvmap: dp.clipped_grad (ghost/BK)", ghost, "clipped")]
    if not args.no_jit:
        rows += [("jit_batched", "cuvmap: jit(grad of the mean loss)", cv.jit(batched), "batched"),
                 ("jit_vmap_clip", "cuvmap: jit(vmap(grad) + dp.clipped_sum)", cv.jit(vmap_clip), "clipped"),
                 ("jit_ghost", "cuvmap: jit(dp.clipped_grad)", cv.jit(ghost), "clipped")]
    methods = [Method(key, label, "cuvmap", (lambda f: lambda: f(p, x, y))(f), timer, kind, to_numpy, memory=memory)
               for key, label, f, kind in rows]
    return methods, clipped.methods(p, x, y)
