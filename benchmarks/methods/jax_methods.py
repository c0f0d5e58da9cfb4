"""JAX's rows: ``jit(vmap(grad))`` of the benchmark CNN on ``lax.conv_general_dilated`` and
``jit(grad)`` of its mean loss (the per_example suite), and ``jit(grad)`` of an RNN as a
``jax.lax.scan`` (the control_flow suite). JAX exposes no CUDA events: its rows are timed
by the wall clock around ``block_until_ready``."""
import os

import numpy as np

from benchmarks import models
from benchmarks.methods import Method
from benchmarks.rounds.timers import cpu_timer


def setup(args, notes, fw):
    """Imports JAX when installed and its default backend is the suite's device (strict
    float32 matmuls); None with the reason in ``notes`` otherwise."""
    if args.no_jax:
        notes.append("JAX: skipped (--no-jax)")
        return None
    if args.device == "gpu":
        # do not let JAX take 75 % of the GPU memory that CuPy's and torch's pools share
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax  # optional: a peer, compared with where installed
    except ImportError:
        notes.append("JAX: skipped (jax is not installed)")
        return None
    backend = jax.default_backend()
    if (args.device == "gpu") != (backend in ("gpu", "cuda", "rocm")):
        notes.append(f"JAX: skipped (its default backend is {backend}, the benchmark runs on {args.device})")
        return None
    jax.config.update("jax_default_matmul_precision", "highest")  # strict float32 (no TF32)
    fw["jax"] = (f"{jax.__version__}, backend {backend} ({jax.devices()[0].device_kind}); XLA's own threading "
                 f"(not set); matmul precision 'highest'; timed by the wall clock around block_until_ready")
    return jax


def per_example_methods(args, jax, params, xs, ys):
    """(f) ``jit(vmap(grad))``, and ``jit(grad)`` of the mean loss for reference."""
    import jax.numpy as jnp  # jax is optional: imported where installed

    p = {k: jnp.asarray(v) for k, v in params.items()}
    x = jnp.asarray(xs)
    y = jnp.asarray(ys.astype(np.int32))
    per_example = jax.jit(jax.vmap(jax.grad(models.jax_per_example_loss), in_axes=(None, 0, 0)))
    batched = jax.jit(jax.grad(models.jax_batch_loss))
    timer = cpu_timer()
    return [
        Method("jax_vmap", "JAX: jit(vmap(grad))", "jax", lambda: jax.block_until_ready(per_example(p, x, y)),
               timer, "per_example", note="compiled: the first call includes XLA's compilation"),
        Method("jax_batched", "JAX: jit(grad) of the mean loss (batched, reference)", "jax",
               lambda: jax.block_until_ready(batched(p, x, y)), timer, "batched"),
    ]


def rnn_scan_grad(jax, w, u, h0, xs):
    """``jit(grad)`` with respect to ``w`` and ``u`` of ``sum(h_T ** 2)`` for
    ``h_t = tanh(h_{t-1} @ w + x_t @ u)`` as a ``jax.lax.scan``: a function of no arguments
    (compiled and run once here)."""
    import jax.numpy as jnp  # jax is optional: imported where installed

    def loss(w, u, h0, xs):
        h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x @ u), None), h0, xs)
        return jnp.sum(h * h)

    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    operands = [jnp.asarray(a) for a in (w, u, h0, xs)]
    jax.block_until_ready(g(*operands))
    return lambda: jax.block_until_ready(g(*operands))
