r"""The Gaussian mechanism of DP-SGD: noise for the clipped sum, and the private gradient.

``G̃ = (Σ_b m_b · clip(g_b, C) + σ C z) / n`` with ``z ~ N(0, I)``: the clipped sum has L2
sensitivity ``C``, so Gaussian noise of standard deviation ``σ·C`` (``σ`` the *noise
multiplier*) makes it a sampled Gaussian mechanism, whose privacy loss
:mod:`cuvmap.dp.accounting` bounds; ``n`` normalises by the batch size (under Poisson
sampling by the *expected* batch size ``q·N``, see :func:`private_gradient`).

NOTE [sensitivity as data]
Every peer has shipped a mis-scaled DP step: noise scaled by a clipping bound that is not
the one the sum was clipped to, calibrated for a sum but added to a mean, or normalised by a
batch size the data decides. Here the clipped sum states its own scale: a
:class:`~cuvmap.dp.ClippedGradient` (from ``clipped_grad``, or ``clipped_sum(...,
return_norms=True)``) carries its L2 ``sensitivity`` (``C`` for adding or removing one
example, ``2C`` for replacing one) as pytree metadata, so it survives ``jit``. Given one,
:func:`add_noise` and :func:`private_gradient` draw noise of standard deviation ``σ ×
sensitivity`` and refuse (ValueError naming both values) a ``max_norm`` that differs from the
sum's ``C``, eagerly and while ``jit`` traces (``max_norm=None`` takes the sum's own). And
under Poisson sampling, which a ``mask`` (a padded batch) signals, :func:`private_gradient`
refuses to divide by the number of real examples (data-dependent, so it leaks: opacus#571)
unless asked by name (``normalize="actual"``); ``expected_batch_size=q·N`` is the default
recipe.
"""
import numpy as np

from cuvmap import backend, core, tree
from cuvmap import numpy as cnp
from cuvmap.dp.clipping import RELATIONS, ClippedGradient, check_max_norm, clipped_sum


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
    if isinstance(summed_grads, ClippedGradient):  # NOTE [sensitivity as data]
        sensitivity = stated_sensitivity(summed_grads, max_norm, "add_noise")
        summed_grads = summed_grads.summed
    else:
        if max_norm is None or not max_norm > 0:
            raise ValueError(f"add_noise: max_norm must be positive, got {max_norm!r}")
        sensitivity = float(max_norm)
    z = _normal_like(summed_grads, rng, "add_noise")
    return _scaled_add(summed_grads, z, float(noise_multiplier) * sensitivity)


def stated_sensitivity(clipped, max_norm, where):
    """The sensitivity ``clipped`` (a :class:`ClippedGradient`) states, checked against the
    ``max_norm`` the caller gives (``None``: the sum's own); a sum of unknown sensitivity
    (made by hand) takes ``max_norm`` (NOTE [sensitivity as data])."""
    if clipped.sensitivity is None:
        if max_norm is None:
            raise ValueError(f"{where}: this ClippedGradient states no sensitivity; pass max_norm")
        return check_max_norm(max_norm, where)
    bound = clipped.sensitivity / RELATIONS[clipped.relation]
    if max_norm is not None:
        given = check_max_norm(max_norm, where)
        if not abs(given - bound) <= 1e-12 * bound:
            raise ValueError(
                f"{where}: max_norm={given!r} differs from the clipping bound C={bound!r} of the clipped sum "
                f"it is given (sensitivity {clipped.sensitivity!r}, relation {clipped.relation!r}): the noise "
                f"would be scaled for another bound; pass max_norm={bound!r}, or max_norm=None to use the sum's")
    return clipped.sensitivity


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
                     expected_batch_size=None, mask=None, noise=None, tiny=1e-6, return_norms=False,
                     normalize=None):
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
      (``B = 0``, or a mask of zeros) is then valid and yields pure noise. With a ``mask``
      (a padded Poisson batch) and no ``expected_batch_size`` it raises, unless
      ``normalize="actual"`` asks by name for the number of real examples
      (NOTE [sensitivity as data]).

    A batch padded by :func:`pad_batch` (with its ``mask``) gives the gradient of the
    unpadded batch (NOTE [padding Poisson batches]).

    In place of per-example gradients it takes what :func:`cuvmap.dp.clipped_grad` returns
    (a :class:`ClippedGradient`: the clipped sum and the norms, computed for the same
    ``max_norm`` and mask); the clipping is then done already, and ``mask`` only sets the
    normalisation.

    The whole computation is made of cuvmap primitives once ``z`` is given, so it runs
    under ``jit``: pass ``noise=standard_normal_like(params, rng)`` drawn outside the
    jitted step instead of ``rng``.

    Args:
      per_example_grads: pytree of arrays with a common leading batch dim ``B``, or a
        :class:`ClippedGradient` from :func:`cuvmap.dp.clipped_grad`.
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
      normalize: ``"actual"`` divides a masked batch by its number of real examples (only
        right for batches whose size does not depend on the data); ``None`` refuses to.

    With a :class:`ClippedGradient`, the noise std is ``σ`` times the sensitivity it
    carries, and a ``max_norm`` other than its bound raises (``max_norm=None`` takes it).

    Returns:
      A pytree shaped like one example's gradient (leaves without the batch dim), or
      ``(gradient, norms)``.
    """
    if not noise_multiplier >= 0:
        raise ValueError(f"private_gradient: noise_multiplier must be >= 0, got {noise_multiplier!r}")
    if noise is not None and rng is not None:
        raise ValueError("private_gradient: pass either rng (to draw the noise) or noise (drawn already), not both")
    if normalize not in (None, "actual"):
        raise ValueError(f"private_gradient: normalize must be None or 'actual', got {normalize!r}")
    if isinstance(per_example_grads, ClippedGradient):
        sensitivity = stated_sensitivity(per_example_grads, max_norm, "private_gradient")
        summed, norms = per_example_grads
        size = core.shape_of(norms)[0]
        if mask is not None and tuple(core.shape_of(mask)) != (size,):
            raise ValueError(f"private_gradient: mask has shape {tuple(core.shape_of(mask))}, but the clipped "
                             f"gradient has {size} per-example norms (the mask needs shape ({size},))")
    else:
        summed, norms = clipped = clipped_sum(per_example_grads, max_norm, mask=mask, tiny=tiny, return_norms=True)
        sensitivity = clipped.sensitivity
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
    elif normalize != "actual":
        raise ValueError(
            "private_gradient: a mask marks a padded (Poisson) batch, whose number of real examples depends on "
            "the data: dividing by it leaks it (opacus#571). Pass expected_batch_size=q*N (the sampling rate "
            "times the dataset size), or normalize='actual' if the batches have a fixed size")
    else:
        # the real examples (traced under jit); a batch without any (possible under Poisson
        # sampling) is normalised by 1, not 0: its sum is the noise alone
        n = cnp.maximum(cnp.sum(cnp.astype(mask, core.dtype_of(norms))), 1)
    if noise is None:
        noisy = add_noise(summed, noise_multiplier, sensitivity, rng)
    else:
        _check_noise(noise, summed)
        noisy = _scaled_add(summed, noise, float(noise_multiplier) * sensitivity)
    if isinstance(n, (int, float)):
        out = tree.map(lambda leaf: cnp.divide(leaf, core.dtype_of(leaf).type(n)), noisy)
    else:
        out = tree.map(lambda leaf: cnp.divide(leaf, cnp.astype(n, core.dtype_of(leaf))), noisy)
    return (out, norms) if return_norms else out
