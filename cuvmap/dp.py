r"""Differentially private SGD on top of per-example gradients: clipping, noise, accounting.

``vmap(grad(loss), in_axes=(None, 0, 0))(params, xs, ys)`` gives a pytree shaped like
``params`` whose leaves carry a leading batch dimension ``B``: one gradient per example.
DP-SGD (Abadi et al. 2016) turns those into a private update in three steps:

1. **Clip** each example's gradient ``g_b`` (the whole parameter pytree, flattened) to L2
   norm at most ``C``::

       ḡ_b = g_b · min(1, C / (‖g_b‖₂ + tiny))

   so one example changes the sum ``Σ_b ḡ_b`` by at most ``C`` (its L2 sensitivity is C
   under add/remove-one adjacency).
2. **Noise**: ``G̃ = Σ_b ḡ_b + N(0, σ² C² I)``, with ``σ`` the *noise multiplier*.
3. **Normalise**: divide by the batch size (under Poisson sampling: by the *expected* batch
   size ``q·N``, see :func:`private_gradient`).

The **accountant** bounds the privacy loss of ``T`` such steps, each on a batch drawn by
Poisson sampling with rate ``q`` (every example in independently with probability ``q``):

* one step is the *sampled Gaussian mechanism* (SGM); its Rényi DP at order ``α > 1``
  (Mironov, Talwar, Zhang 2019) is ``ε_α = log(A_α) / (α − 1)`` with
  ``A_α = E_{z∼μ₀}[(μ(z)/μ₀(z))^α]``, ``μ₀ = N(0, σ²)``, ``μ = (1−q)·μ₀ + q·N(1, σ²)``;
  see :func:`rdp_sampled_gaussian` for the integer and fractional formulas;
* RDP composes additively (Mironov 2017, Prop. 1): ``T`` steps give ``T·ε_α``;
* RDP converts to ``(ε, δ)``-DP by minimising over the orders, see :func:`rdp_to_epsilon`.

References:

* M. Abadi, A. Chu, I. Goodfellow, H. B. McMahan, I. Mironov, K. Talwar, L. Zhang.
  *Deep Learning with Differential Privacy.* CCS 2016, arXiv:1607.00133.
* I. Mironov. *Rényi Differential Privacy.* CSF 2017, arXiv:1702.07476.
* I. Mironov, K. Talwar, L. Zhang. *Rényi Differential Privacy of the Sampled Gaussian
  Mechanism.* arXiv:1908.10530, 2019 (Sec. 3.3: the series for fractional orders).
* B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato. *Hypothesis Testing Interpretations
  and Rényi Differential Privacy.* AISTATS 2020, arXiv:1905.09982 (Theorem 21).
* C. Canonne, G. Kamath, T. Steinke. *The Discrete Gaussian for Differential Privacy.*
  NeurIPS 2020, arXiv:2004.00010 (Proposition 12).

Example::

    import numpy as np
    import cuvmap as cv
    from cuvmap import dp

    per_ex = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    g = dp.private_gradient(per_ex, max_norm=1.0, noise_multiplier=1.1,
                            rng=np.random.default_rng(), expected_batch_size=256)
    params = cv.tree.map(lambda p, d: p - lr * d, params, g)

    acct = dp.RDPAccountant()
    acct.step(noise_multiplier=1.1, sample_rate=256 / 60000, num_steps=steps)
    eps = acct.get_epsilon(delta=1e-5)
"""
import math
import warnings

import numpy as np

from cuvmap import backend, core, lax, tree
from cuvmap import numpy as cnp

__all__ = [
    "DEFAULT_ORDERS",
    "RDPAccountant",
    "add_noise",
    "batch_buckets",
    "bucket_for",
    "clip_per_example",
    "clipped_sum",
    "epsilon",
    "pad_batch",
    "per_example_global_norms",
    "private_gradient",
    "rdp_sampled_gaussian",
    "rdp_to_epsilon",
    "standard_normal_like",
]

#: Opacus' default RDP orders: 1.1, 1.2, ..., 10.9, then 12, 13, ..., 63.
DEFAULT_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


# ---------------------------------------------------------------------------------------
# Per-example clipping and noise
# ---------------------------------------------------------------------------------------


def _batched_leaves(grads, what):
    """The leaves of ``grads`` with their paths; checks they share a leading batch dim."""
    paths, leaves, treedef = tree.flatten_with_path(grads)
    if not leaves:
        raise ValueError(f"{what}: the gradient pytree has no array leaves")
    size = None
    for path, leaf in zip(paths, leaves):
        shape = tuple(core.shape_of(leaf))
        if len(shape) == 0:
            raise ValueError(
                f"{what}: leaf {tree.keystr(path) or '(root)'} is a scalar; per-example gradients "
                "need a leading batch dimension (use vmap(grad(loss), in_axes=(None, 0, ...)))"
            )
        if size is None:
            size, first = shape[0], path
        elif shape[0] != size:
            raise ValueError(
                f"{what}: leaf {tree.keystr(path) or '(root)'} has batch size {shape[0]} along axis 0, "
                f"but leaf {tree.keystr(first) or '(root)'} has {size}"
            )
    return leaves, treedef, size


def _squared_norms(leaves, size):
    """``Σ_leaves Σ_i leaf[b, i]²`` for each example ``b``: per leaf one batched dot product
    of the flattened example with itself (a ``(B,)`` result, no ``(B, ...)`` array of squares)."""
    total = None
    for leaf in leaves:
        per_example = int(np.prod(core.shape_of(leaf)[1:], dtype=np.int64))  # explicit: B may be 0
        flat = cnp.reshape(leaf, (size, per_example))
        sq = lax.dot_general(flat, flat, (((1,), (1,)), ((0,), (0,))))
        total = sq if total is None else cnp.add(total, sq)
    return total


def per_example_global_norms(grads):
    """The L2 norm of each example's gradient over the whole parameter pytree.

    ``norms[b] = sqrt(Σ_leaves Σ_i leaf[b, i]²)``: every leaf is flattened per example and
    the squares of all leaves are summed, as one flat vector per example (the "global norm"
    of ``tf.clip_by_global_norm`` and of Opacus' flat clipping).

    Args:
      grads: a pytree whose leaves all have the same leading batch dimension ``B``
        (NumPy or CuPy arrays, or tracers: the computation is made of cuvmap primitives,
        so it can itself be transformed).

    Returns:
      An array of shape ``(B,)`` (in the promoted dtype of the leaves).

    Example::

        norms = per_example_global_norms({"w": g_w, "b": g_b})   # g_w: (B, 3, 4), g_b: (B, 4)
    """
    leaves, _, size = _batched_leaves(grads, "per_example_global_norms")
    return cnp.sqrt(_squared_norms(leaves, size))


def clip_per_example(grads, max_norm, *, tiny=1e-6, return_norms=False):
    """Clips each example's gradient to global L2 norm at most ``max_norm``.

    Each example ``b`` is scaled by ``min(1, max_norm / (‖g_b‖₂ + tiny))`` (Abadi et al.
    2016, Algorithm 1), all examples at once: one scale vector of shape ``(B,)`` broadcast
    against every leaf; the loop is over the leaves, never over the examples. Examples whose
    norm is at most ``max_norm - tiny`` come back unchanged; the others end with norm just
    below ``max_norm``. ``tiny`` keeps an all-zero gradient from dividing by zero (Opacus
    uses the same 1e-6).

    Args:
      grads: per-example gradients, a pytree of arrays with a common leading dim ``B``.
      max_norm: the clipping bound ``C > 0``.
      tiny: added to the norm in the denominator.
      return_norms: also return the norms before clipping.

    Returns:
      The clipped pytree (same structure, shapes and dtypes), or ``(clipped, norms)``.

    Example::

        clipped, norms = clip_per_example(per_ex, 1.0, return_norms=True)
    """
    if not max_norm > 0:
        raise ValueError(f"clip_per_example: max_norm must be positive, got {max_norm!r}")
    leaves, treedef, size = _batched_leaves(grads, "clip_per_example")
    norms = cnp.sqrt(_squared_norms(leaves, size))
    scale = cnp.minimum(1.0, cnp.divide(max_norm, cnp.add(norms, tiny)))
    out = []
    for leaf in leaves:
        ndim = len(core.shape_of(leaf))
        s = cnp.astype(cnp.reshape(scale, (size,) + (1,) * (ndim - 1)), core.dtype_of(leaf))
        out.append(cnp.multiply(leaf, s))
    clipped = tree.unflatten(treedef, out)
    return (clipped, norms) if return_norms else clipped


def clipped_sum(per_example_grads, max_norm, *, mask=None, tiny=1e-6, return_norms=False):
    """``Σ_b m_b · clip(g_b, C)``: the clipped per-example gradients summed over the batch,
    each weighted by its mask entry ``m_b`` (1 for a real example, 0 for padding).

    Each example's scale ``s_b = m_b · min(1, C / (‖g_b‖₂ + tiny))`` (as in
    :func:`clip_per_example`) is applied in the sum itself: one contraction
    ``Σ_b s_b g_b`` per leaf (a matrix-vector product over the batch dim), never the
    clipped ``(B, ...)`` arrays. Padding rows get the weight exactly 0, so they add exact
    zeros: the result does not depend on their values as long as their gradients are
    finite (``0 · inf`` is NaN; :func:`pad_batch` repeats a real example so that they are).
    See NOTE [padding Poisson batches].

    Args:
      per_example_grads: a pytree of arrays with a common leading batch dim ``B`` (``B``
        may be 0: the sum is then zeros).
      max_norm: the clipping bound ``C > 0``.
      mask: ``(B,)`` bool or numeric weights, or ``None`` for all ones.
      tiny: added to the norm in the denominator.
      return_norms: also return the ``(B,)`` norms before clipping (padding rows included).

    Returns:
      A pytree shaped like one example's gradient (leaves without the batch dim, in their
      dtypes), or ``(summed, norms)``.

    Example::

        (x, y), mask = pad_batch((xs, ys), bucket_for(len(ys), buckets))
        summed = clipped_sum(vmap(grad(loss), in_axes=(None, 0, 0))(params, x, y), 1.0, mask=mask)
    """
    if not max_norm > 0:
        raise ValueError(f"clipped_sum: max_norm must be positive, got {max_norm!r}")
    leaves, treedef, size = _batched_leaves(per_example_grads, "clipped_sum")
    norms = cnp.sqrt(_squared_norms(leaves, size))
    scale = cnp.minimum(1.0, cnp.divide(max_norm, cnp.add(norms, tiny)))
    if mask is not None:
        if tuple(core.shape_of(mask)) != (size,):
            raise ValueError(f"clipped_sum: mask has shape {tuple(core.shape_of(mask))}, but the per-example "
                             f"gradients have batch size {size} (the mask needs shape ({size},))")
        scale = cnp.multiply(scale, cnp.astype(mask, core.dtype_of(scale)))
    out = []
    for leaf in leaves:
        s = cnp.astype(scale, core.dtype_of(leaf))
        out.append(cnp.tensordot(s, leaf, axes=1))
    summed = tree.unflatten(treedef, out)
    return (summed, norms) if return_norms else summed


# ---------------------------------------------------------------------------------------
# Padding Poisson batches to a few sizes (for jit)
# ---------------------------------------------------------------------------------------

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


def _rng_is_cupy(rng):
    return type(rng).__module__.startswith("cupy")


def _standard_normal(rng, shape, dtype):
    """Standard normal samples of ``shape`` in ``dtype`` (drawn in float32/float64 directly)."""
    dtype = np.dtype(dtype)
    if dtype in (np.float32, np.float64):
        try:
            return rng.standard_normal(size=shape, dtype=dtype)
        except TypeError:  # a generator without the dtype argument (e.g. RandomState)
            pass
    return rng.standard_normal(size=shape).astype(dtype)


def _generator_for(leaf, rng, fresh, what):
    """The generator that draws for ``leaf``: ``rng`` (checked to be on the leaf's device),
    or with ``rng=None`` a fresh OS-seeded one per backend, kept in ``fresh``."""
    name = backend.backend_name(leaf)
    if rng is None:
        if name not in fresh:
            fresh[name] = backend.xp_of(leaf).random.default_rng()
        return fresh[name]
    gen_name = "gpu" if _rng_is_cupy(rng) else "cpu"
    if gen_name != name:
        raise ValueError(
            f"{what}: a {'CuPy' if gen_name == 'gpu' else 'NumPy'} generator cannot draw noise "
            f"for a leaf on the {name}; pass "
            f"{'cupy.random.default_rng()' if name == 'gpu' else 'numpy.random.default_rng()'}"
        )
    return rng


def _normal_like(tree_, rng, what):
    fresh = {}

    def draw(leaf):
        dtype = core.dtype_of(leaf)
        if dtype.kind not in "fc":
            raise ValueError(f"{what}: a leaf has dtype {dtype}; noise needs floating-point leaves")
        return _standard_normal(_generator_for(leaf, rng, fresh, what), tuple(core.shape_of(leaf)), dtype)

    return tree.map(draw, tree_)


def standard_normal_like(like, rng=None):
    """Standard normal draws ``z ~ N(0, I)`` shaped like each leaf of ``like`` (its shapes,
    dtypes and devices), leaf by leaf in the pytree's order, as :func:`add_noise` draws them.

    Noise for a jitted DP-SGD step: a generator cannot be called inside ``jit`` (its draws
    would be traced once and become constants of the program, the same noise at every
    step), so the step takes ``z`` as an argument, drawn outside it by this function, and
    :func:`private_gradient` scales it (``noise=z``). The draws are the ones
    ``add_noise(tree, σ, C, rng)`` would make from the same generator state.

    Args:
      like: a pytree of floating-point arrays (e.g. the parameters: one example's gradient
        has their shapes).
      rng: a NumPy/CuPy ``Generator`` on the leaves' device, or ``None`` (a fresh OS-seeded
        one per backend).

    Returns:
      A pytree of the same structure, shapes and dtypes.

    Example::

        z = standard_normal_like(params, np.random.default_rng(1))
    """
    return _normal_like(like, rng, "standard_normal_like")


def add_noise(summed_grads, noise_multiplier, max_norm, rng=None):
    """Adds ``N(0, (noise_multiplier · max_norm)²)`` noise to every leaf (the Gaussian
    mechanism applied to the sum of clipped gradients, whose L2 sensitivity is ``max_norm``).

    Each leaf gets independent noise of its own shape and dtype, drawn on the leaf's device:
    NumPy leaves from a ``numpy.random.Generator``, CuPy leaves from a
    ``cupy.random.Generator`` (``cupy.random.default_rng(seed)``). Passing a generator of
    the other kind raises, rather than silently drawing on the host and copying.

    Note: NumPy's and CuPy's generators are not cryptographically secure; the formal
    guarantee assumes ideal Gaussian samples (as TF Privacy and Opacus outside its secure
    mode do).

    Args:
      summed_grads: a pytree of arrays (typically ``Σ_b`` of the clipped gradients).
      noise_multiplier: ``σ ≥ 0``, the ratio of the noise std to the clipping norm.
      max_norm: the clipping norm ``C``.
      rng: a NumPy/CuPy ``Generator``; ``None`` draws a fresh, OS-seeded one per backend.

    Returns:
      The noisy pytree, same structure, shapes and dtypes.

    Example::

        noisy = add_noise(summed, 1.1, 1.0, np.random.default_rng(0))
    """
    if not noise_multiplier >= 0:
        raise ValueError(f"add_noise: noise_multiplier must be >= 0, got {noise_multiplier!r}")
    if not max_norm > 0:
        raise ValueError(f"add_noise: max_norm must be positive, got {max_norm!r}")
    z = _normal_like(summed_grads, rng, "add_noise")
    return _scaled_add(summed_grads, z, float(noise_multiplier) * float(max_norm))


def _scaled_add(summed, z, std):
    # A NumPy scalar (not a 0-d array: CuPy rejects NumPy arrays as operands).
    return tree.map(lambda leaf, zl: cnp.add(leaf, cnp.multiply(zl, core.dtype_of(leaf).type(std))), summed, z)


def _check_noise(noise, summed):
    """``noise`` must have the structure and shapes of one example's gradient."""
    if tree.structure(noise) != tree.structure(summed):
        raise ValueError(
            f"private_gradient: noise has the pytree structure {tree.structure(noise)}, but one example's "
            f"gradient has {tree.structure(summed)} (draw it with standard_normal_like(params, rng))"
        )
    for path, z, g in zip(tree.flatten_with_path(noise)[0], tree.leaves(noise), tree.leaves(summed)):
        if tuple(core.shape_of(z)) != tuple(core.shape_of(g)):
            raise ValueError(
                f"private_gradient: noise leaf {tree.keystr(path) or '(root)'} has shape "
                f"{tuple(core.shape_of(z))}, but the gradient leaf has {tuple(core.shape_of(g))}"
            )


def private_gradient(per_example_grads, max_norm, noise_multiplier, rng=None, *,
                     expected_batch_size=None, mask=None, noise=None, tiny=1e-6, return_norms=False):
    """The DP-SGD gradient: clip each example, sum over the batch, add noise, normalise.

    ``g̃ = (Σ_b m_b · clip(g_b, C) + σ C z) / n`` with ``z ~ N(0, I)``, the mask ``m``
    (all ones without one) and ``n`` the normalisation:

    * ``expected_batch_size=None``: ``n`` is the actual batch size: ``B`` (the leading dim),
      or with a ``mask`` the number of real examples ``Σ_b m_b``. Right for fixed-size
      batches (shuffled, or sampled without replacement).
    * ``expected_batch_size=q·N``: under Poisson sampling (each of the ``N`` examples is in
      the batch independently with probability ``q``, which is what the RDP accountant
      assumes) the batch size itself depends on the data, so dividing by it would leak;
      divide by its expectation instead (Opacus' ``expected_batch_size``). An empty batch
      (``B = 0``, or a mask of zeros) is then valid and yields pure noise.

    A batch padded by :func:`pad_batch` (with its ``mask``) gives the gradient of the
    unpadded batch (NOTE [padding Poisson batches]).

    The whole computation is made of cuvmap primitives once ``z`` is given, so it runs
    under ``jit``: pass ``noise=standard_normal_like(params, rng)`` drawn outside the
    jitted step instead of ``rng``.

    Args:
      per_example_grads: pytree of arrays with a common leading batch dim ``B``.
      max_norm: clipping norm ``C``.
      noise_multiplier: ``σ``; the noise std is ``σ·C``.
      rng: generator for the noise, as in :func:`add_noise` (not with ``noise``).
      expected_batch_size: the normalisation ``n`` (see above); keyword-only.
      mask: ``(B,)`` weights, 1 for a real example and 0 for padding (bool or float), as
        :func:`pad_batch` returns; ``None`` for all ones.
      noise: standard normal draws shaped like one example's gradient (see
        :func:`standard_normal_like`), scaled here by ``σ·C``; ``None`` draws them from ``rng``.
      tiny: as in :func:`clip_per_example`.
      return_norms: also return the per-example norms before clipping.

    Returns:
      A pytree shaped like one example's gradient (leaves without the batch dim), or
      ``(gradient, norms)``.
    """
    if not noise_multiplier >= 0:
        raise ValueError(f"private_gradient: noise_multiplier must be >= 0, got {noise_multiplier!r}")
    if noise is not None and rng is not None:
        raise ValueError("private_gradient: pass either rng (to draw the noise) or noise (drawn already), not both")
    summed, norms = clipped_sum(per_example_grads, max_norm, mask=mask, tiny=tiny, return_norms=True)
    size = core.shape_of(norms)[0]
    if expected_batch_size is not None:
        if not expected_batch_size > 0:
            raise ValueError(f"private_gradient: the normalisation must be positive; got "
                             f"expected_batch_size={expected_batch_size!r}")
        n = expected_batch_size
    elif mask is None:
        if not size > 0:
            raise ValueError(f"private_gradient: the normalisation must be positive; got a batch of size {size} "
                             "(pass expected_batch_size under Poisson sampling)")
        n = size
    else:
        # the real examples (traced under jit); a batch without any (possible under Poisson
        # sampling) is normalised by 1, not 0: its sum is the noise alone
        n = cnp.maximum(cnp.sum(cnp.astype(mask, core.dtype_of(norms))), 1)
    if noise is None:
        noisy = add_noise(summed, noise_multiplier, max_norm, rng)
    else:
        _check_noise(noise, summed)
        noisy = _scaled_add(summed, noise, float(noise_multiplier) * float(max_norm))
    if isinstance(n, (int, float)):
        out = tree.map(lambda leaf: cnp.divide(leaf, core.dtype_of(leaf).type(n)), noisy)
    else:
        out = tree.map(lambda leaf: cnp.divide(leaf, cnp.astype(n, core.dtype_of(leaf))), noisy)
    return (out, norms) if return_norms else out


# ---------------------------------------------------------------------------------------
# RDP of the sampled Gaussian mechanism
# ---------------------------------------------------------------------------------------

# NOTE [SGM series in log space]
# For an integer order α the binomial expansion of (1 − q + q·e^{(2z−1)/(2σ²)})^α is finite
# and integrates term by term against μ₀ = N(0, σ²):
#     A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)}.
# Because Σ_k C(α,k) (1−q)^{α−k} q^k = 1 and the exponent vanishes for k = 0 and 1,
#     A_α − 1 = Σ_{k=2}^{α} C(α,k) (1−q)^{α−k} q^k expm1((k²−k)/(2σ²)),
# a sum of positive terms: log A_α = log1p(A_α − 1) keeps full relative accuracy even when
# q is so small that A_α − 1 is far below the float spacing at 1.
#
# For a fractional order the series is infinite and converges only where the ratio is
# below 1, so the integral is split at z₀ = σ² log(1/q − 1) + 1/2, where
# q·e^{(2z₀−1)/(2σ²)} = 1 − q (Mironov, Talwar, Zhang 2019, Sec. 3.3):
#     z ≤ z₀:  Σ_k C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)} · ½erfc((k−z₀)/(√2σ))
#     z > z₀:  Σ_k C(α,k) q^{α−k} (1−q)^k e^{(j²−j)/(2σ²)} · ½erfc((z₀−j)/(√2σ)),   j = α−k
# (below z₀ the binomial series runs in powers of q·e^{(2z−1)/(2σ²)} / (1−q) ≤ 1, above it
# in the reciprocal).
# Writing ½erfc(x) = ½erfcx(x)·e^{−x²}, the k-th term of either part is
#     C(α,k) (1−q)^α e^{−z₀²/(2σ²)} · ½erfcx(w),  w = (k−z₀)/(√2σ)  resp.  (z₀−α+k)/(√2σ),
# (the exponentials cancel exactly): both parts carry the sign of C(α,k), which alternates
# for k > α, and for k ≥ α their magnitudes decrease (|C(α,k)| and erfcx both do). The tail is
# an alternating series with decreasing terms: truncating it errs by less than the first
# omitted term. We sum chunks of terms with a signed log-sum-exp until that term is below
# 2^-60 of the largest term (A ≥ 1, so that is below the float precision of the sum).
# Terms with w ≤ 4 use the direct form (no cancellation of large exponents); terms with
# w > 4 use the erfcx form, with erfcx from its continued fraction.
# When α is an integer the coefficients vanish for k > α and the series reduces to the
# closed form above, which the tests use to check it.

_ERFCX_SWITCH = 4.0
_CF_TERMS = 32
_REL_TOL_LOG = -60 * math.log(2.0)
_MAX_TERMS = 1 << 22


def _log_erfc_small(x):
    """log(erfc(x)) for an array of x ≤ _ERFCX_SWITCH (erfc is then ≥ 1.5e-8: no underflow)."""
    return np.log(np.array([math.erfc(v) for v in x.tolist()], dtype=np.float64))


def _log_erfcx_large(x):
    """log(erfcx(x)) = log(e^{x²} erfc(x)) for an array of x > _ERFCX_SWITCH, from the continued
    fraction erfcx(x) = 1/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))), evaluated backwards
    (32 levels give full double precision for x ≥ 4)."""
    acc = x.copy()
    for k in range(_CF_TERMS, 0, -1):
        acc = x + (0.5 * k) / acc
    return -np.log(acc) - 0.5 * math.log(math.pi)


def _log_part(m, w, alpha, log1mq, log_ratio, z0, sigma2):
    """log of the m-th term of one part of the fractional series, without C(α,k) and ½:
    (1−q)^α · (q/(1−q))^m · e^{(m²−m)/(2σ²)} · erfc(w)."""
    out = np.empty_like(w)
    small = w <= _ERFCX_SWITCH
    if small.any():
        ms, ws = m[small], w[small]
        out[small] = alpha * log1mq + ms * log_ratio + (ms * ms - ms) / (2 * sigma2) + _log_erfc_small(ws)
    big = ~small
    if big.any():
        out[big] = alpha * log1mq - z0 * z0 / (2 * sigma2) + _log_erfcx_large(w[big])
    return out


def _log_a_frac(q, sigma, alpha, upper_bound=False):
    """log A_α by the series of NOTE [SGM series in log space] (any real α > 1, 0 < q < 1).
    With ``upper_bound`` the terms' magnitudes are summed, ignoring their signs."""
    sigma2 = sigma * sigma
    log1mq = math.log1p(-q)
    log_ratio = math.log(q) - log1mq  # log(q / (1 − q)) = −(2 z₀ − 1) / (2σ²)
    z0 = -sigma2 * log_ratio + 0.5
    root2s = math.sqrt(2.0) * sigma
    logs, signs = [], []
    start, log_c, sign_c, chunk = 0, 0.0, 1.0, 64
    while True:
        k = np.arange(start, start + chunk, dtype=np.float64)
        # log|C(α,k)| and its sign by the recurrence C(α,k+1) = C(α,k)·(α−k)/(k+1).
        with np.errstate(divide="ignore"):
            step_log = np.log(np.abs(alpha - k)) - np.log1p(k)
        step_sign = np.sign(alpha - k)
        lc = log_c + np.concatenate(([0.0], np.cumsum(step_log[:-1])))
        sc = sign_c * np.concatenate(([1.0], np.cumprod(step_sign[:-1])))
        log_c, sign_c = lc[-1] + step_log[-1], sc[-1] * step_sign[-1]
        live = sc != 0
        if live.any():
            kk, lcl = k[live], lc[live]
            j = alpha - kk
            t0 = _log_part(kk, (kk - z0) / root2s, alpha, log1mq, log_ratio, z0, sigma2)
            t1 = _log_part(j, (z0 - j) / root2s, alpha, log1mq, log_ratio, z0, sigma2)
            terms = lcl + np.logaddexp(t0, t1) - math.log(2.0)
            logs.append(terms)
            signs.append(sc[live])
        start += chunk
        if sign_c == 0 or start >= _MAX_TERMS:
            break
        if start > alpha + 1 and logs:
            head = max(float(np.max(x)) for x in logs)
            if logs[-1][-1] < head + _REL_TOL_LOG:
                break
        chunk = min(2 * chunk, 1 << 16)
    logs = np.concatenate(logs)
    signs = np.concatenate(signs)
    top = float(np.max(logs))
    mags = np.exp(logs - top)
    magnitude = math.fsum(mags.tolist())
    if upper_bound:
        return top + math.log(magnitude)
    total = math.fsum((signs * mags).tolist())
    if not total > 1e-8 * magnitude:
        # Cancellation ate the precision: fall back on the (valid, looser) bound Σ|terms|.
        warnings.warn(
            f"rdp_sampled_gaussian: the series for order {alpha} (q={q}, sigma={sigma}) cancels "
            "beyond float precision; using the upper bound that sums the terms' magnitudes",
            RuntimeWarning, stacklevel=4,
        )
        return top + math.log(magnitude)
    return top + math.log(total)


def _log_expm1(x):
    """log(e^x − 1) for x > 0, stable for small and large x."""
    return x + math.log(-math.expm1(-x)) if x > 1.0 else math.log(math.expm1(x))


def _log_a_int(q, sigma, alpha):
    """log A_α for an integer α ≥ 2 from the finite sum for A_α − 1 (NOTE [SGM series in log space])."""
    if alpha < 2:
        return 0.0
    log_q, log1mq = math.log(q), math.log1p(-q)
    lg_a = math.lgamma(alpha + 1)
    terms = [
        lg_a - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
        + k * log_q + (alpha - k) * log1mq + _log_expm1((k * k - k) / (2 * sigma * sigma))
        for k in range(2, alpha + 1)
    ]
    top = max(terms)
    log_a_minus_1 = top + math.log(math.fsum(math.exp(t - top) for t in terms))
    return float(np.logaddexp(0.0, log_a_minus_1))  # log(1 + (A − 1))


def _rdp_one(q, sigma, alpha, upper_bound):
    if q == 0:
        return 0.0
    if sigma == 0 or math.isinf(alpha):
        return math.inf
    if q == 1:
        return alpha / (2 * sigma * sigma)
    if float(alpha).is_integer():
        log_a = _log_a_int(q, sigma, int(alpha))
    else:
        log_a = _log_a_frac(q, sigma, float(alpha), upper_bound)
    return log_a / (alpha - 1)


def rdp_sampled_gaussian(q, noise_multiplier, orders, *, steps=1, fractional="exact"):
    r"""Rényi DP of the Poisson-sampled Gaussian mechanism, composed over ``steps``.

    One step releases ``f(S) + N(0, σ²)`` with ``f`` of L2 sensitivity 1 (DP-SGD's clipped
    sum with noise multiplier ``σ``) on a Poisson sample ``S`` of rate ``q``. Its RDP at
    order ``α > 1`` is (Mironov, Talwar, Zhang 2019)::

        ε(α) = log(A_α) / (α − 1),   A_α = E_{z∼N(0,σ²)}[((1−q) + q·e^{(2z−1)/(2σ²)})^α]

    * integer ``α``: ``A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)}``, summed as
      ``1 + Σ_{k≥2} … expm1(…)`` in log space (accurate for tiny ``q``);
    * fractional ``α``: the two-sided series of the paper's Sec. 3.3 (split at
      ``z₀ = σ² log(1/q − 1) + 1/2``, with ``erfc`` factors), in log space, truncated once
      the alternating tail is below 2^-60 of the largest term; see NOTE [SGM series in log space];
      the signed sum keeps ``log A_α`` accurate to about 1e-16 absolute, so ``ε(α)`` loses
      relative accuracy as ``q → 0`` (about 1e-8 at ``q = 1e-4``, ``σ = 1``, ``α = 1.5``);
    * ``q = 1`` is the plain Gaussian mechanism, ``ε(α) = α / (2σ²)``; ``q = 0`` gives 0;
      ``σ = 0`` or ``α = ∞`` gives ``inf``.

    Composition over ``steps`` identical steps multiplies by ``steps`` (Mironov 2017,
    Prop. 1); for different steps add the results.

    ``fractional="upper_bound"`` sums the magnitudes of the fractional series' terms
    instead of their signed values: a valid but looser bound, which is what
    ``dp_accounting`` (hence TF Privacy) computes since version 0.4.4; use it only to
    reproduce their numbers. (``"exact"`` also falls back on it, with a warning, if the
    signed sum ever cancels beyond float precision.)

    Args:
      q: sampling rate, ``0 ≤ q ≤ 1``.
      noise_multiplier: ``σ ≥ 0``.
      orders: one order ``> 1`` or a sequence of them.
      steps: number of compositions (keyword-only).
      fractional: ``"exact"`` (default) or ``"upper_bound"``, see above.

    Returns:
      A float for a scalar order, else a float64 array of the same length.

    Example::

        rdp = rdp_sampled_gaussian(256 / 60000, 1.1, DEFAULT_ORDERS, steps=14063)
    """
    q, sigma = float(q), float(noise_multiplier)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"rdp_sampled_gaussian: q must be in [0, 1], got {q!r}")
    if not sigma >= 0:
        raise ValueError(f"rdp_sampled_gaussian: noise_multiplier must be >= 0, got {noise_multiplier!r}")
    if steps < 0:
        raise ValueError(f"rdp_sampled_gaussian: steps must be >= 0, got {steps!r}")
    if fractional not in ("exact", "upper_bound"):
        raise ValueError(f"rdp_sampled_gaussian: fractional must be 'exact' or 'upper_bound', got {fractional!r}")
    scalar = np.ndim(orders) == 0
    alphas = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if alphas.ndim != 1 or not np.all(alphas > 1):
        raise ValueError(f"rdp_sampled_gaussian: orders must be > 1, got {orders!r}")
    upper = fractional == "upper_bound"
    out = np.array([_rdp_one(q, sigma, float(a), upper) for a in alphas], dtype=np.float64)
    if steps != 1:
        out = out * steps if steps else np.zeros_like(out)
    return float(out[0]) if scalar else out


# ---------------------------------------------------------------------------------------
# RDP -> (epsilon, delta)
# ---------------------------------------------------------------------------------------


def rdp_to_epsilon(orders, rdp, delta, *, conversion="improved"):
    r"""Converts RDP guarantees ``rdp[i]`` at ``orders[i]`` into ``(ε, δ)``-DP: the smallest
    ε over the orders.

    ``conversion="improved"`` (default) — Balle et al. 2020, Theorem 21; the same bound is
    Canonne, Kamath, Steinke 2020, Proposition 12 (and Asoodeh et al. 2020, Eq. 20). It is
    what TF Privacy / ``dp_accounting`` and Opacus use now::

        ε = min_α  rdp(α) + log((α − 1)/α) − (log δ + log α) / (α − 1)

    Like ``dp_accounting``, an order whose RDP already gives ``δ ≥ sqrt(1 − e^{−rdp(α)})``
    yields ``ε = 0`` (total variation bounded through KL ≤ rdp(α), Bretagnolle–Huber), and
    the result is clipped at 0.

    ``conversion="classic"`` — Mironov 2017, Proposition 3, which TF Privacy used until
    2020 and older Opacus releases::

        ε = min_α  rdp(α) + log(1/δ) / (α − 1)

    It is never tighter than the improved bound; it is kept to reproduce published numbers.

    Args:
      orders: the RDP orders (each > 1), a sequence or a scalar.
      rdp: the RDP at each order (same length), e.g. from :func:`rdp_sampled_gaussian`.
      delta: target ``δ`` in ``(0, 1)``.
      conversion: ``"improved"`` or ``"classic"`` (keyword-only).

    Returns:
      ``(epsilon, optimal_order)`` as floats; ``(inf, nan)`` when every order gives ``inf``.
    """
    alphas = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    rdps = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    if alphas.shape != rdps.shape or alphas.ndim != 1:
        raise ValueError(f"rdp_to_epsilon: orders and rdp must have the same length, got "
                         f"{alphas.shape} and {rdps.shape}")
    if not 0 < delta < 1:
        raise ValueError(f"rdp_to_epsilon: delta must be in (0, 1), got {delta!r}")
    if not np.all(alphas > 1):
        raise ValueError("rdp_to_epsilon: orders must be > 1")
    if np.any(rdps < 0) or np.any(np.isnan(rdps)):
        raise ValueError("rdp_to_epsilon: rdp must be >= 0")
    with np.errstate(over="ignore", invalid="ignore"):
        if conversion == "improved":
            eps = rdps + np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1)
            eps = np.where(delta * delta + np.expm1(-rdps) >= 0, 0.0, eps)
        elif conversion == "classic":
            eps = rdps - math.log(delta) / (alphas - 1)
        else:
            raise ValueError(f"rdp_to_epsilon: conversion must be 'improved' or 'classic', got {conversion!r}")
    eps = np.where(np.isnan(eps), np.inf, eps)
    if np.all(np.isinf(eps)):
        return math.inf, math.nan
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(alphas[i])


# ---------------------------------------------------------------------------------------
# Accountant
# ---------------------------------------------------------------------------------------


class RDPAccountant:
    """Tracks the RDP of a sequence of sampled Gaussian steps and reports ``(ε, δ)``.

    Each :meth:`step` records ``num_steps`` applications of the Poisson-sampled Gaussian
    mechanism with ``(noise_multiplier, sample_rate)``; consecutive steps with the same
    parameters are merged, and the per-step RDP of each distinct pair is computed once.
    The total RDP is the sum over the history (composition); :meth:`get_epsilon` converts
    it with :func:`rdp_to_epsilon`.

    Args:
      orders: the RDP orders to optimise over (default :data:`DEFAULT_ORDERS`, Opacus').

    Example::

        acct = RDPAccountant()
        for _ in range(steps):
            ...  # one DP-SGD step with sampling rate q and noise multiplier sigma
            acct.step(noise_multiplier=sigma, sample_rate=q)
        eps = acct.get_epsilon(delta=1e-5)
    """

    def __init__(self, orders=DEFAULT_ORDERS):
        self.orders = tuple(float(a) for a in np.atleast_1d(orders))
        if not self.orders or min(self.orders) <= 1:
            raise ValueError("RDPAccountant: orders must be a non-empty sequence of values > 1")
        self.history = []  # [noise_multiplier, sample_rate, num_steps]
        self._cache = {}

    def step(self, noise_multiplier, sample_rate, num_steps=1):
        """Records ``num_steps`` steps with noise multiplier ``σ`` and Poisson rate ``q``."""
        noise_multiplier, sample_rate, num_steps = float(noise_multiplier), float(sample_rate), int(num_steps)
        if num_steps < 0:
            raise ValueError(f"RDPAccountant.step: num_steps must be >= 0, got {num_steps}")
        if not 0 <= sample_rate <= 1:
            raise ValueError(f"RDPAccountant.step: sample_rate must be in [0, 1], got {sample_rate}")
        if not noise_multiplier >= 0:
            raise ValueError(f"RDPAccountant.step: noise_multiplier must be >= 0, got {noise_multiplier}")
        if self.history and self.history[-1][:2] == [noise_multiplier, sample_rate]:
            self.history[-1][2] += num_steps
        else:
            self.history.append([noise_multiplier, sample_rate, num_steps])

    def __len__(self):
        """The number of steps recorded."""
        return sum(h[2] for h in self.history)

    def get_rdp(self):
        """The composed RDP at each of ``self.orders`` (a float64 array)."""
        total = np.zeros(len(self.orders))
        for sigma, q, n in self.history:
            key = (sigma, q)
            if key not in self._cache:
                self._cache[key] = rdp_sampled_gaussian(q, sigma, self.orders)
            if n:
                total = total + self._cache[key] * n
        return total

    def get_privacy_spent(self, delta, *, conversion="improved"):
        """``(epsilon, optimal_order)`` for the recorded steps at ``delta``."""
        return rdp_to_epsilon(self.orders, self.get_rdp(), delta, conversion=conversion)

    def get_epsilon(self, delta, *, conversion="improved"):
        """ε for the recorded steps at ``delta`` (see :func:`rdp_to_epsilon`)."""
        return self.get_privacy_spent(delta, conversion=conversion)[0]


def epsilon(dataset_size, batch_size, epochs, noise_multiplier, delta, *, orders=DEFAULT_ORDERS,
            conversion="improved", return_order=False):
    """ε of a whole DP-SGD run with Poisson sampling, like TF Privacy's
    ``compute_dp_sgd_privacy``.

    The sampling rate is ``q = batch_size / dataset_size`` and the number of steps
    ``ceil(epochs · dataset_size / batch_size)`` (TF Privacy's convention; ``epochs`` may be
    fractional).

    Args:
      dataset_size: ``N``, the number of training examples.
      batch_size: the (expected) batch size.
      epochs: number of epochs.
      noise_multiplier: ``σ``.
      delta: target ``δ``.
      orders: RDP orders (default Opacus'); keyword-only like the rest.
      conversion: ``"improved"`` or ``"classic"``, see :func:`rdp_to_epsilon`.
      return_order: also return the optimal order.

    Returns:
      ε, or ``(ε, optimal_order)``.

    Example::

        eps = epsilon(60000, 256, 60, 1.1, 1e-5)
    """
    if not 0 < batch_size <= dataset_size:
        raise ValueError(f"epsilon: need 0 < batch_size <= dataset_size, got {batch_size} and {dataset_size}")
    q = batch_size / dataset_size
    steps = int(math.ceil(epochs * dataset_size / batch_size))
    rdp = rdp_sampled_gaussian(q, noise_multiplier, orders, steps=steps)
    eps, order = rdp_to_epsilon(orders, rdp, delta, conversion=conversion)
    return (eps, order) if return_order else eps
