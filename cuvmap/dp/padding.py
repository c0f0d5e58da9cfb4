r"""Padding Poisson-sampled batches to a few sizes, so that a jitted DP-SGD step traces once
per size met (NOTE [padding Poisson batches]).

``batch_buckets(q·N, N)`` is a geometric ladder of sizes from the expected batch size up to
``N``; ``bucket_for(B, buckets)`` the smallest rung holding ``B`` examples;
``pad_batch(batch, size)`` pads every leaf to ``size`` rows and returns the mask ``m``
(``m_b = 1`` on the real rows, 0 on the padding), which the clipped sum uses as weights:
``Σ_b m_b · clip(g_b, C)`` equals the sum over the real examples.
"""
import math

import numpy as np

from cuvmap import core, tree
from cuvmap import numpy as cnp


# NOTE [padding Poisson batches]
# Under Poisson sampling the batch size B ~ Binomial(N, q) changes every step, and a jitted
# step traces once per argument shape. So the batch is padded up to the smallest size of a
# short fixed ladder (batch_buckets: geometric above the expected size q·N, capped at N)
# and a mask m marks the real examples (m_b = 1) and the padding (m_b = 0); the clipped sum
# weights each example by m_b (clipped_sum), which is how JAX DP-SGD code usually handles
# variable batches. Padding changes neither the gradient nor the privacy accounting:
#
# - the gradient: a padding row enters the sum as m_b · s_b · g_b = 0 · s_b · g_b, an exact
#   zero whenever g_b is finite, so the padded sum equals the sum over the real examples
#   (up to the order of the additions) and does not depend on what the padding holds;
# - the privacy: the released value (Σ_b m_b clip(g_b) + σCz) / (qN) is then the same
#   function of the sampled set S as without padding, hence the same mechanism: adding or
#   removing one example still changes the sum by at most C, and the noise and the
#   normalisation q·N do not depend on the padded size. The padded size is a function of
#   |S| only; it is not released (the gradient's value and distribution do not depend on
#   it), and the accountant's ε is a function of (q, σ, steps, δ) alone.
#
# The ladder trades traces for wasted work: B is concentrated within a few sqrt(qN(1−q))
# of q·N, so a growth of 1/8 per rung keeps the padding under about 1/8 of the batch while a
# run meets two or three sizes (one trace each).


def _round_up(x, multiple):
    return int(math.ceil(x / multiple - 1e-12)) * multiple


def batch_buckets(expected_batch_size, max_batch_size, *, growth=1.125, multiple=8):
    """The padded batch sizes for Poisson-sampled batches: a geometric ladder from the
    expected batch size up to the largest possible one.

    ``r₀ = ⌈expected⌉`` rounded up to a multiple of ``multiple``, then
    ``r_{k+1} = max(r_k + multiple, ⌈growth · r_k⌉ rounded up likewise)``, every rung
    capped at ``max_batch_size`` (the dataset size ``N``, which a Poisson batch never
    exceeds), which is always the last rung. ``growth=2`` with ``multiple=1`` and a
    power-of-two expected size gives powers of two. See NOTE [padding Poisson batches].

    Args:
      expected_batch_size: ``q·N`` (> 0).
      max_batch_size: ``N`` (≥ 1).
      growth: the ratio between rungs (> 1).
      multiple: every rung but the cap is a multiple of it (≥ 1).

    Returns:
      An increasing tuple of ints ending with ``max_batch_size``.

    Example::

        batch_buckets(256, 1438)   # (256, 288, 328, 376, ..., 1432, 1438)
    """
    if not expected_batch_size > 0:
        raise ValueError(f"batch_buckets: expected_batch_size must be positive, got {expected_batch_size!r}")
    if not (isinstance(max_batch_size, (int, np.integer)) and max_batch_size >= 1):
        raise ValueError(f"batch_buckets: max_batch_size must be a positive integer, got {max_batch_size!r}")
    if not growth > 1:
        raise ValueError(f"batch_buckets: growth must be > 1, got {growth!r}")
    if not (isinstance(multiple, (int, np.integer)) and multiple >= 1):
        raise ValueError(f"batch_buckets: multiple must be a positive integer, got {multiple!r}")
    cap = int(max_batch_size)
    rung = min(cap, _round_up(expected_batch_size, multiple))
    rungs = [rung]
    while rung < cap:
        rung = min(cap, max(rung + multiple, _round_up(rung * growth, multiple)))
        rungs.append(rung)
    return tuple(rungs)


def bucket_for(batch_size, buckets):
    """The smallest of ``buckets`` (an increasing sequence, see :func:`batch_buckets`)
    that holds ``batch_size`` examples."""
    i = int(np.searchsorted(np.asarray(buckets), batch_size, side="left"))
    if i == len(buckets):
        raise ValueError(f"bucket_for: a batch of {batch_size} examples is larger than the largest bucket "
                         f"{buckets[-1]} (the last bucket must be the dataset size)")
    return int(buckets[i])


def pad_batch(batch, size):
    """Pads every leaf of ``batch`` along axis 0 to ``size`` rows, and the mask of the real ones.

    The padding rows repeat the batch's first example (so their gradients are finite
    whenever the real ones are; they get weight 0 in :func:`clipped_sum` and
    :func:`private_gradient`); an empty batch is padded with zeros. The arrays stay on
    their device (NumPy or CuPy). See NOTE [padding Poisson batches].

    Args:
      batch: a pytree of arrays with a common leading dim ``B ≤ size`` (e.g. ``(x, y)``).
      size: the padded size, e.g. ``bucket_for(B, buckets)``.

    Returns:
      ``(padded, mask)``: the pytree with leading dim ``size`` (the first ``B`` rows are
      ``batch``'s; with ``size == B`` its leaves themselves), and a ``(size,)`` bool array,
      True on the first ``B`` rows, on the leaves' device.

    Example::

        idx = np.flatnonzero(rng.random(n) < q)                 # a Poisson batch
        (x, y), mask = pad_batch((x_train[idx], y_train[idx]), bucket_for(len(idx), buckets))
    """
    leaves, treedef = tree.flatten(batch)
    if not leaves:
        raise ValueError("pad_batch: the batch has no array leaves")
    sizes = [core.shape_of(leaf)[0] if len(core.shape_of(leaf)) else None for leaf in leaves]
    b = sizes[0]
    if b is None or any(s != b for s in sizes):
        raise ValueError(f"pad_batch: every leaf needs the same leading batch dim; got leading dims {sizes}")
    if not (isinstance(size, (int, np.integer)) and size >= b):
        raise ValueError(f"pad_batch: size must be an integer >= the batch size {b}, got {size!r}")
    size = int(size)
    rows = cnp.arange(size, like=leaves[0])
    mask = rows < b
    out = []
    for leaf in leaves:
        shape = tuple(core.shape_of(leaf))
        if size == b:
            out.append(leaf)
        elif b == 0:
            out.append(cnp.zeros((size,) + shape[1:], core.dtype_of(leaf), like=leaf))
        else:
            out.append(cnp.take(leaf, cnp.where(mask, rows, 0), axis=0))
    return tree.unflatten(treedef, out), mask
