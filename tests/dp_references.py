"""Independent references shared by the tests of ``cuvmap.dp`` (tests/dp/): per-example
gradients as pytrees, their norms, clipping and clipped sums by a Python loop over the
examples in NumPy (float64), and a small tanh network with its data."""
import numpy as np

import cuvmap.numpy as cnp
from cuvmap import nn, tree


def per_example_pytree(rng, b, dtype=np.float64):
    """Per-example gradients of several leaves, nested, with mixed ranks."""
    return {
        "conv": {"w": rng.standard_normal((b, 2, 3, 3)).astype(dtype), "b": rng.standard_normal((b, 2)).astype(dtype)},
        "dense": (rng.standard_normal((b, 5, 4)).astype(dtype), rng.standard_normal((b, 4)).astype(dtype)),
        "scale": rng.standard_normal((b,)).astype(dtype),
    }


def loop_norms(grads):
    """‖g_b‖ over every leaf, example by example."""
    leaves = tree.leaves(grads)
    b = leaves[0].shape[0]
    return np.array([np.linalg.norm(np.concatenate([np.ravel(np.asarray(x)[i]) for x in leaves])) for i in range(b)])


def loop_clip(grads, max_norm, tiny=1e-6):
    """g_b · min(1, C / (‖g_b‖ + tiny)), example by example."""
    leaves, treedef = tree.flatten(grads)
    b = leaves[0].shape[0]
    out = [np.empty_like(np.asarray(x)) for x in leaves]
    for i in range(b):
        n = np.linalg.norm(np.concatenate([np.ravel(np.asarray(x)[i]) for x in leaves]))
        c = min(1.0, max_norm / (n + tiny))
        for o, x in zip(out, leaves):
            o[i] = np.asarray(x)[i] * c
    return tree.unflatten(treedef, out)


def loop_clipped_sum(grads, max_norm):
    """Σ_b clip(g_b): the per-example loop, summed."""
    return tree.map(lambda x: np.asarray(x).sum(axis=0), loop_clip(grads, max_norm))


def assert_tree_close(a, b, **kw):
    """The same structure, and every leaf close (``np.testing.assert_allclose``'s keywords)."""
    assert tree.structure(a) == tree.structure(b)
    for x, y in zip(tree.leaves(a), tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


def tanh_net_loss(params, x, y):
    """The cross-entropy of one example through a tanh layer and a linear one."""
    return nn.cross_entropy((cnp.tanh(x @ params["w"] + params["b"]) @ params["v"])[None], y[None])


def tanh_net_problem(seed=0, n=8):
    """``(params, xs, ys)`` of ``tanh_net_loss``: 5 inputs, 6 hidden units, 3 classes."""
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((5, 6)) * 0.5, "b": np.zeros(6), "v": rng.standard_normal((6, 3)) * 0.5}
    return params, rng.standard_normal((n, 5)), rng.integers(0, 3, n)
