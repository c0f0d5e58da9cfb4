r"""The Gaussian mechanism of DP-SGD: noise for the clipped sum, and the private gradient.

``G̃ = (Σ_b m_b · clip(g_b, C) + σ C z) / n`` with ``z ~ N(0, I)``: the clipped sum has L2
sensitivity ``C``, so Gaussian noise of standard deviation ``σ·C`` (``σ`` the *noise
multiplier*) makes it a sampled Gaussian mechanism, whose privacy loss
:mod:`cuvmap.dp.accounting` bounds; ``n`` normalises by the batch size (under Poisson
sampling by the *expected* batch size ``q·N``, see :func:`private_gradient`).

The noise is calibrated to the sensitivity the clipped sum carries (NOTE [sensitivity as
data] in :mod:`cuvmap.dp.clipping`), drawn once for the sum over a data-parallel axis
(NOTE [noise once over a data-parallel axis]), and the normalisation is said by name
(NOTE [normalising the private gradient]).
"""
import math

import numpy as np

from cuvmap import backend, core, lax, tree
from cuvmap import numpy as cnp
from cuvmap.dp.clipping import ClippedGradient, check_max_norm, check_relation, clipped_sum
from cuvmap.core.bfloat16 import kind_of


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
        if kind_of(dtype) not in "fc":
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



# NOTE [noise once over a data-parallel axis]
# Under cuvmap.distributed.data_parallel (an axis of processes) or vmap(f, axis_name=...)
# every member m of the axis holds a share S_m of the batch (its examples' clipped sum),
# and the released gradient is the combination of the members' results: a psum of
# (S_m + noise_m) / n, or a pmean of (S_m + noise_m) / (n / P), both (Σ_m S_m + Σ_m noise_m) / n.
# The mechanism needs Σ_m noise_m ~ N(0, σ²Δ²) once. Drawing σΔ·z_m on every member (the
# obvious code) gives P·σ²Δ² (measured 2.003× on 2 processes before this note); drawing it
# from a key shared by all gives P²·σ²Δ² after a psum. So add_noise and private_gradient
# read the named axes in scope (core.axis_env(): the processes' axis and vmap's named axes)
# and keep the noise of member 0 of them alone, z · [axis_index == 0]: whether the members
# drew independent noise, the same noise, or zeros (the README's recipe: noise on process 0,
# zeros elsewhere), the combination carries σ²Δ² once, and with σ = 0 it is the global
# clipped sum / n exactly (neither function all-reduces: the user's psum or pmean does).
# axis_name=None turns this off (each member's result is released on its own: an ensemble
# of private models under a named vmap); axis_name="name" (or a tuple) picks the axes.
# The input is each member's own share. A ClippedGradient that a psum reduced over the axis
# says so, and its noise is member 0's draw on every member (NOTE [a clipped sum reduced
# over an axis] in cuvmap/dp/clipping.py); a plain pytree reduced already (the same value on
# every member) cannot say so: pass axis_name=None and the same noise everywhere.


def data_parallel_axes(axis_name, where):
    """The names of the data-parallel axes: with ``"auto"`` every named axis in scope
    (innermost last, each once), with None none, else ``axis_name`` (a name or a tuple of
    names), each checked to be bound (NOTE [noise once over a data-parallel axis])."""
    if axis_name is None:
        return ()
    if isinstance(axis_name, str) and axis_name == "auto":
        return tuple(dict.fromkeys(frame.name for frame in core.axis_env()))
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    for name in names:
        core.axis_frame(name, f"{where} (axis_name={axis_name!r})")
    return names


def noise_once(z, names):
    """``z`` on member 0 of the axes ``names``, zeros on the others (nothing to do without
    axes): the noise of a sum over those axes, once."""
    if not names:
        return z
    leaves = tree.leaves(z)
    if not leaves:
        return z
    first = cnp.equal(lax.axis_index(names, like=leaves[0]), 0)
    return tree.map(lambda leaf: cnp.multiply(leaf, cnp.astype(first, core.dtype_of(leaf))), z)


def shared_noise(z, names, reduced_over, where):
    """The noise for a sum: ``z`` on member 0 of the axes ``names`` (NOTE [noise once over a
    data-parallel axis]); for a clipped sum a psum reduced over ``reduced_over``, that
    draw on every member of those axes (NOTE [a clipped sum reduced over an axis] in
    :mod:`cuvmap.dp.clipping`). ``names`` None: each member's own draw (axis_name=None)."""
    if names is None:
        return z
    if not reduced_over:
        return noise_once(z, names)
    bound = {frame.name for frame in core.axis_env()}
    outside = [a for a in reduced_over if a not in bound]
    if outside:
        raise ValueError(
            f"{where}: the clipped sum was summed over {', '.join(map(repr, outside))} (a psum), but no such axis is "
            "bound here: add its noise inside the data_parallel (or vmap) function that reduced it, where every "
            "member adds the same draw, or noise each member's share before the psum "
            "(NOTE [a clipped sum reduced over an axis] in cuvmap/dp/clipping.py)")
    over = tuple(dict.fromkeys(tuple(names) + tuple(reduced_over)))
    return lax.psum(noise_once(z, over), tuple(reduced_over))


def _sensitivity(clipped_or_tree, max_norm, where):
    """``(summed, Δ)``: from a :class:`ClippedGradient` its sum and sensitivity, ``max_norm``
    (if given) checked against its bound; from a plain pytree the pytree and ``max_norm``."""
    if isinstance(clipped_or_tree, ClippedGradient):
        c = clipped_or_tree
        if max_norm is not None:
            value = check_max_norm(max_norm, where)
            if value != c.max_norm:
                raise ValueError(
                    f"{where}: max_norm={max_norm!r} differs from the clipped sum's sensitivity bound "
                    f"{c.max_norm:g} ({c.describe()}); the noise must be calibrated to the sum it is added to: "
                    "omit max_norm (the clipped sum carries it) or clip with the bound you mean")
        return c.summed, c.sensitivity
    if max_norm is None:
        raise ValueError(f"{where}: max_norm is needed for a plain pytree (the L2 sensitivity of the sum it "
                         "holds); pass what dp.clipped_sum or dp.clipped_grad returns to have it checked")
    return clipped_or_tree, check_max_norm(max_norm, where)


def add_noise(summed_grads, noise_multiplier, max_norm=None, rng=None, *, axis_name="auto"):
    """Adds ``N(0, (σ·Δ)²)`` noise to every leaf: the Gaussian mechanism on a sum of
    clipped gradients of L2 sensitivity ``Δ``, with ``σ`` the noise multiplier.

    Given a :class:`~cuvmap.dp.ClippedGradient` (what :func:`~cuvmap.dp.clipped_sum` and
    :func:`~cuvmap.dp.clipped_grad` return), ``Δ`` is its ``sensitivity`` (``C``, or ``2C``
    under replace-one; NOTE [sensitivity as data]) and ``max_norm``, if given, must be its
    bound (a ValueError names both values otherwise, eagerly and under ``jit``). Given a
    plain pytree, ``Δ = max_norm``, which the caller vouches for.

    Each leaf gets independent noise of its own shape and dtype, drawn on the leaf's device:
    NumPy leaves from a ``numpy.random.Generator``, CuPy leaves from a
    ``cupy.random.Generator`` (``cupy.random.default_rng(seed)``). Passing a generator of
    the other kind raises, rather than silently drawing on the host and copying. Under a
    data-parallel axis only member 0's draw is kept (NOTE [noise once over a
    data-parallel axis]).

    Note: NumPy's and CuPy's generators are not cryptographically secure; the formal
    guarantee assumes ideal Gaussian samples (as TF Privacy and Opacus outside its secure
    mode do).

    Args:
      summed_grads: a :class:`~cuvmap.dp.ClippedGradient`, or a pytree of arrays (a sum of
        clipped gradients).
      noise_multiplier: ``σ ≥ 0``, the ratio of the noise std to the sensitivity.
      max_norm: the bound ``C``: checked against a ClippedGradient's, or the sensitivity of
        a plain pytree.
      rng: a NumPy/CuPy ``Generator``; ``None`` draws a fresh, OS-seeded one per backend.
      axis_name: the data-parallel axes over which the results are summed: ``"auto"``
        (every named axis in scope), a name or tuple of names, or None.

    Returns:
      The noisy pytree (the sum's structure, shapes and dtypes).

    Example::

        noisy = add_noise(clipped_sum(per_example, 1.0), 1.1, rng=np.random.default_rng(0))
    """
    if not noise_multiplier >= 0:
        raise ValueError(f"add_noise: noise_multiplier must be >= 0, got {noise_multiplier!r}")
    summed, sensitivity = _sensitivity(summed_grads, max_norm, "add_noise")
    names = None if axis_name is None else data_parallel_axes(axis_name, "add_noise")
    reduced = summed_grads.reduced_over if isinstance(summed_grads, ClippedGradient) else ()
    z = shared_noise(_normal_like(summed, rng, "add_noise"), names, reduced, "add_noise")
    return _scaled_add(summed, z, float(noise_multiplier) * sensitivity)


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


# NOTE [normalising the private gradient]
# DP-SGD releases a noisy *sum*; optimisers want a mean, so private_gradient divides by n
# after the noise. n must not depend on the private data: under Poisson sampling the batch
# size B ~ Binomial(N, q) is a function of which examples were drawn, and dividing by it
# (or by q·N with N the private dataset's size, Opacus' expected_batch_size) makes the
# released value's scale differ between neighbouring datasets, which the accountant of the
# sampled Gaussian does not cover (opacus#571: ε reported 1.2, audited 2.5; opacus#819).
# So the normalisation is never chosen silently: expected_batch_size=n (a public number,
# fixed before seeing the data: the expected batch size of the sampler) or, by name,
# normalize_by="batch_size": the actual number of real examples, right for fixed-size
# batches only. A batch without examples is then normalised by 1 (its sum is the noise).


def _normalisation(expected_batch_size, normalize_by, clipped, mask, size):
    if expected_batch_size is not None and normalize_by is not None:
        raise ValueError("private_gradient: pass expected_batch_size or normalize_by, not both")
    if normalize_by is None:
        normalize_by = expected_batch_size
    if normalize_by is None:
        raise ValueError(
            "private_gradient: say what the noisy sum is divided by: expected_batch_size=n (a public number fixed "
            "before seeing the data, such as the expected batch size you chose, q = n / N: Poisson sampling) or "
            "normalize_by='batch_size' (the number of real examples: fixed-size batches only; under Poisson "
            "sampling it depends on the data and leaks, opacus#571) (NOTE [normalising the private gradient])")
    if isinstance(normalize_by, str):
        if normalize_by != "batch_size":
            raise ValueError(f"private_gradient: normalize_by must be a positive number or 'batch_size', "
                             f"got {normalize_by!r}")
        if clipped.reduced_over:
            raise ValueError(f"private_gradient: normalize_by='batch_size' counts this member's examples, but the "
                             f"clipped sum is summed over {clipped.reduced_over}: pass the expected batch size of "
                             "all of them (expected_batch_size=n)")
        if clipped.unit != "example":
            raise ValueError(f"private_gradient: normalize_by='batch_size' counts examples, but the clipped sum "
                             f"is {clipped.unit}-level; pass the expected number of {clipped.unit}s per batch")
        if mask is None:
            return max(size, 1)
        # the real examples (traced under jit); a batch without any is normalised by 1, not 0
        return cnp.maximum(cnp.sum(cnp.astype(mask, core.dtype_of(clipped.norms))), 1)
    if isinstance(normalize_by, bool) or not (normalize_by > 0 and math.isfinite(normalize_by)):
        raise ValueError(f"private_gradient: the normalisation must be a positive number (a finite one), got "
                         f"{normalize_by!r}")
    return normalize_by


def private_gradient(per_example_grads, max_norm=None, noise_multiplier=None, rng=None, *,
                     expected_batch_size=None, normalize_by=None, mask=None, noise=None, tiny=1e-6,
                     return_norms=False, relation=None, axis_name="auto"):
    """The DP-SGD gradient: clip each example, sum over the batch, add noise, normalise.

    ``g̃ = (Σ_b m_b · clip(g_b, C) + σ Δ z) / n`` with ``z ~ N(0, I)``, the mask ``m`` (all
    ones without one), ``Δ`` the clipped sum's L2 sensitivity (``C``; ``2C`` under
    replace-one; NOTE [sensitivity as data]) and ``n`` the normalisation, always said by
    name (NOTE [normalising the private gradient]):

    * ``expected_batch_size=n``: a public number fixed before seeing the data. Under
      Poisson sampling (each of the ``N`` examples in the batch independently with
      probability ``q``, which the accountant assumes) the batch size depends on the data,
      so divide by its expectation ``q·N`` instead. An empty batch (``B = 0``, or a mask of
      zeros) is then valid and yields pure noise.
    * ``normalize_by="batch_size"``: the actual number of examples, ``B`` or with a mask
      ``Σ_b m_b``: right for fixed-size batches only.

    A batch padded by :func:`pad_batch` (with its ``mask``) gives the gradient of the
    unpadded batch (NOTE [padding Poisson batches]).

    In place of per-example gradients it takes a :class:`~cuvmap.dp.ClippedGradient` (what
    :func:`cuvmap.dp.clipped_grad` and :func:`cuvmap.dp.clipped_sum` return, computed for
    the same mask); the clipping is then done already, ``max_norm`` may be omitted (if
    given it must be the clipped sum's bound: a ValueError names both, eagerly and under
    ``jit``), and ``mask`` only sets ``normalize_by="batch_size"``.

    Under ``cuvmap.distributed.data_parallel`` or ``vmap(..., axis_name=)`` each member's
    result is its share, and the noise is kept on member 0 alone, so that a ``psum`` of
    the shares (each normalised by the global ``n``) or a ``pmean`` (each by ``n / P``)
    carries it once (NOTE [noise once over a data-parallel axis]); it never all-reduces.

    The whole computation is made of cuvmap primitives once ``z`` is given, so it runs
    under ``jit``: pass ``noise=standard_normal_like(params, rng)`` drawn outside the
    jitted step instead of ``rng``.

    Args:
      per_example_grads: pytree of arrays with a common leading batch dim ``B``, or a
        :class:`~cuvmap.dp.ClippedGradient`.
      max_norm: clipping norm ``C`` (optional with a ClippedGradient).
      noise_multiplier: ``σ``; the noise std is ``σ·Δ``.
      rng: generator for the noise, as in :func:`add_noise` (not with ``noise``).
      expected_batch_size: the public normalisation ``n``; keyword-only.
      normalize_by: a positive number (as ``expected_batch_size``) or ``"batch_size"``.
      mask: ``(B,)`` weights, 1 for a real example and 0 for padding (bool or float), as
        :func:`pad_batch` returns; ``None`` for all ones.
      noise: standard normal draws shaped like one example's gradient (see
        :func:`standard_normal_like`), scaled here by ``σ·Δ``; ``None`` draws them from ``rng``.
      tiny: as in :func:`clip_per_example`.
      return_norms: also return the per-example norms before clipping.
      relation: for per-example gradients, the neighbouring relation (``"add_remove"``, the
        default, or ``"replace"``); a ClippedGradient carries its own.
      axis_name: the data-parallel axes: ``"auto"`` (every named axis in scope), a name or
        a tuple of names, or None (NOTE [noise once over a data-parallel axis]).

    Returns:
      A pytree shaped like one example's gradient (leaves without the batch dim), or
      ``(gradient, norms)``.

    Example::

        g = private_gradient(clipped_grad(loss, 1.0)(params, x, y, mask=mask), noise_multiplier=1.1,
                             noise=z, expected_batch_size=256)
    """
    if noise_multiplier is None or not noise_multiplier >= 0:
        raise ValueError(f"private_gradient: noise_multiplier must be a number >= 0, got {noise_multiplier!r}")
    if noise is not None and rng is not None:
        raise ValueError("private_gradient: pass either rng (to draw the noise) or noise (drawn already), not both")
    if isinstance(per_example_grads, ClippedGradient):
        clipped = per_example_grads
        if relation is not None and check_relation(relation, "private_gradient") != clipped.relation:
            raise ValueError(f"private_gradient: relation={relation!r}, but the clipped sum's sensitivity is stated "
                             f"for {clipped.relation!r} ({clipped.describe()})")
        summed, sensitivity = _sensitivity(clipped, max_norm, "private_gradient")
        size = core.shape_of(clipped.norms)[0]
        if mask is not None and tuple(core.shape_of(mask)) != (size,):
            raise ValueError(f"private_gradient: mask has shape {tuple(core.shape_of(mask))}, but the clipped "
                             f"gradient has {size} per-example norms (the mask needs shape ({size},))")
    else:
        if max_norm is None:
            raise ValueError("private_gradient: max_norm (the clipping bound C) is needed to clip per-example "
                             "gradients")
        clipped = clipped_sum(per_example_grads, max_norm, mask=mask, tiny=tiny,
                              relation="add_remove" if relation is None else relation)
        summed, sensitivity = clipped.summed, clipped.sensitivity
        size = core.shape_of(clipped.norms)[0]
    n = _normalisation(expected_batch_size, normalize_by, clipped, mask, size)
    names = None if axis_name is None else data_parallel_axes(axis_name, "private_gradient")
    if noise is None:
        z = _normal_like(summed, rng, "private_gradient")
    else:
        _check_noise(noise, summed)
        z = noise
    z = shared_noise(z, names, clipped.reduced_over, "private_gradient")
    noisy = _scaled_add(summed, z, float(noise_multiplier) * sensitivity)
    if isinstance(n, (int, float)):
        out = tree.map(lambda leaf: cnp.divide(leaf, core.dtype_of(leaf).type(n)), noisy)
    else:
        out = tree.map(lambda leaf: cnp.divide(leaf, cnp.astype(n, core.dtype_of(leaf))), noisy)
    return (out, clipped.norms) if return_norms else out
