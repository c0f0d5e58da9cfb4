r"""Per-example clipping to a global L2 norm over the parameter pytree, and the clipped sum.

``vmap(grad(loss), in_axes=(None, 0, 0))(params, xs, ys)`` gives a pytree shaped like
``params`` whose leaves carry a leading batch dimension ``B``: one gradient per example.
DP-SGD (Abadi et al. 2016) clips each example's gradient ``g_b`` (the whole parameter
pytree, flattened) to L2 norm at most ``C``::

    ḡ_b = g_b · min(1, C / (‖g_b‖₂ + tiny))

so that one example changes the sum ``Σ_b ḡ_b`` by at most ``C`` (its L2 sensitivity is C
under add/remove-one adjacency). A padded batch weights each example by its mask entry
``m_b`` (1 for a real example, 0 for padding): ``Σ_b m_b ḡ_b``.

:func:`cuvmap.dp.clipped_grad` computes the same clipped sum and norms from the loss
itself, without materialising every per-example gradient (ghost clipping and book-keeping,
:mod:`cuvmap.dp.ghost`).
"""
import math
import numbers
import warnings
from typing import Any, NamedTuple

import numpy as np

from cuvmap import core, lax, tree
from cuvmap import numpy as cnp


class _ClippedPair(NamedTuple):
    summed: Any
    norms: Any


# the neighbouring relations a clipped sum's sensitivity is stated for: adding or removing
# one example changes the sum by at most C; replacing one by another, by at most 2C
RELATIONS = {"add_remove": 1.0, "replace": 2.0}


class ClippedGradient(_ClippedPair):
    """What :func:`cuvmap.dp.clipped_grad` (and :func:`clipped_sum` with ``return_norms``)
    return: ``summed``, the sum over the batch of the clipped per-example gradients (a
    pytree like the parameters), and ``norms``, the ``(B,)`` per-example gradient norms
    before clipping; it unpacks as ``summed, norms``. It carries its L2 ``sensitivity``
    (the most the sum changes between neighbouring batches: ``C`` for adding or removing
    one example, ``2C`` for replacing one) and that ``relation``, as data
    (NOTE [sensitivity as data] in cuvmap/dp/noise.py): :func:`cuvmap.dp.private_gradient`
    and :func:`cuvmap.dp.add_noise` scale the noise by it and refuse a ``max_norm`` that
    disagrees. Both are static (pytree metadata): they survive ``jit``."""

    def __new__(cls, summed, norms, sensitivity=None, relation="add_remove"):
        if relation not in RELATIONS:
            raise ValueError(f"ClippedGradient: relation must be one of {sorted(RELATIONS)}, got {relation!r}")
        self = super().__new__(cls, summed, norms)
        self.sensitivity = None if sensitivity is None else float(sensitivity)
        self.relation = relation
        return self

    def __repr__(self):
        return (f"ClippedGradient(summed={self.summed!r}, norms={self.norms!r}, sensitivity={self.sensitivity}, "
                f"relation={self.relation!r})")

    def num_dropped(self, mask=None):
        """How many examples have a norm that is not finite (a NaN or an infinity in their
        gradient): those that ``nan_safe=True`` gave a zero contribution (and that make
        ``summed`` NaN without it). With ``mask``, only the real examples (``mask != 0``)
        count. A 0-d integer array (traced under ``jit``)."""
        bad = cnp.logical_not(finite_rows(self.norms))
        if mask is not None:
            bad = cnp.logical_and(bad, cnp.not_equal(mask, 0))
        return cnp.sum(cnp.astype(bad, np.int64))


with warnings.catch_warnings():  # a namedtuple's subclass with metadata of its own, in cuvmap's namespace
    warnings.simplefilter("ignore", UserWarning)
    tree.register_pytree_node(
        ClippedGradient, lambda c: ((c.summed, c.norms), (c.sensitivity, c.relation)),
        lambda meta, children: ClippedGradient(*children, sensitivity=meta[0], relation=meta[1]))


def sensitivity_of(max_norm, relation):
    """The L2 sensitivity of a sum of gradients clipped to ``max_norm`` under ``relation``."""
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {sorted(RELATIONS)}, got {relation!r}")
    return RELATIONS[relation] * max_norm


def check_max_norm(max_norm, where, error=ValueError, hint=""):
    """``max_norm`` as a float: a positive real number (a 0-d array too), else ``error``
    naming ``where`` (and ``hint``, what to do instead)."""
    shape = tuple(getattr(max_norm, "shape", ()))
    dtype = getattr(max_norm, "dtype", None)
    if (isinstance(max_norm, bool) or shape != () or (dtype is not None and np.dtype(dtype).kind not in "fiu")
            or (dtype is None and not isinstance(max_norm, numbers.Real))):
        got = f"an array of shape {shape}" if shape else f"{max_norm!r} of type {type(max_norm).__name__}"
        raise error(f"{where}: max_norm must be a positive number (the clipping bound C), got {got}{hint}")
    value = float(max_norm)
    if not value > 0:
        raise error(f"{where}: max_norm must be positive, got {max_norm!r}")
    return value


def finite_rows(norms):
    """``(B,)`` booleans: the examples whose norm is finite (neither NaN nor infinite)."""
    return cnp.less(cnp.abs(norms), math.inf)


def zero_rows(x, keep):
    """``x`` ``(B, ...)`` with the rows where ``keep`` ``(B,)`` is False set to zero (a NaN
    or an infinity too); ``x`` itself when ``keep`` is None."""
    if keep is None:
        return x
    rank = len(core.shape_of(x))
    return cnp.where(lax.reshape(keep, tuple(core.shape_of(keep)) + (1,) * (rank - 1)), x, cnp.zeros_like(x))


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


def squared_norms(leaves, size):
    """``Σ_leaves Σ_i leaf[b, i]²`` for each example ``b``: per leaf one batched dot product
    of the flattened example with itself (a ``(B,)`` result, no ``(B, ...)`` array of squares)."""
    total = None
    for leaf in leaves:
        per_example = int(np.prod(core.shape_of(leaf)[1:], dtype=np.int64))  # explicit: B may be 0
        flat = cnp.reshape(leaf, (size, per_example))
        sq = lax.dot_general(flat, flat, (((1,), (1,)), ((0,), (0,))))
        total = sq if total is None else cnp.add(total, sq)
    return total


def clip_scale(norms, max_norm, tiny, mask=None):
    """Each example's weight in the clipped sum: ``s_b = m_b · min(1, C / (norms_b + tiny))``
    (``m_b = 1`` without a mask), in the dtype of ``norms``."""
    scale = cnp.minimum(1.0, cnp.divide(max_norm, cnp.add(norms, tiny)))
    if mask is not None:
        scale = cnp.multiply(scale, cnp.astype(mask, core.dtype_of(scale)))
    return scale


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
    return cnp.sqrt(squared_norms(leaves, size))


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
    max_norm = check_max_norm(max_norm, "clip_per_example")
    leaves, treedef, size = _batched_leaves(grads, "clip_per_example")
    norms = cnp.sqrt(squared_norms(leaves, size))
    scale = clip_scale(norms, max_norm, tiny)
    out = []
    for leaf in leaves:
        ndim = len(core.shape_of(leaf))
        s = cnp.astype(cnp.reshape(scale, (size,) + (1,) * (ndim - 1)), core.dtype_of(leaf))
        out.append(cnp.multiply(leaf, s))
    clipped = tree.unflatten(treedef, out)
    return (clipped, norms) if return_norms else clipped


def clipped_sum(per_example_grads, max_norm, *, mask=None, tiny=1e-6, return_norms=False, nan_safe=False,
                relation="add_remove"):
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
      nan_safe: an example whose gradient is not finite (a NaN or infinite norm)
        contributes zero instead of making the sum NaN (as :func:`cuvmap.dp.clipped_grad`'s
        ``nan_safe``); ``ClippedGradient(summed, norms).num_dropped(mask)`` counts them.
      relation: the neighbouring relation the sensitivity is stated for, ``"add_remove"``
        (``C``) or ``"replace"`` (``2C``).

    Returns:
      A pytree shaped like one example's gradient (leaves without the batch dim, in their
      dtypes), or with ``return_norms`` a :class:`ClippedGradient` (``summed, norms``,
      carrying its sensitivity).

    Example::

        (x, y), mask = pad_batch((xs, ys), bucket_for(len(ys), buckets))
        summed = clipped_sum(vmap(grad(loss), in_axes=(None, 0, 0))(params, x, y), 1.0, mask=mask)
    """
    max_norm = check_max_norm(max_norm, "clipped_sum")
    sensitivity_of(max_norm, relation)  # checks the relation before any work
    leaves, treedef, size = _batched_leaves(per_example_grads, "clipped_sum")
    norms = cnp.sqrt(squared_norms(leaves, size))
    if mask is not None and tuple(core.shape_of(mask)) != (size,):
        raise ValueError(f"clipped_sum: mask has shape {tuple(core.shape_of(mask))}, but the per-example "
                         f"gradients have batch size {size} (the mask needs shape ({size},))")
    finite = finite_rows(norms) if nan_safe else None
    scale = zero_rows(clip_scale(norms, max_norm, tiny, mask), finite)
    out = []
    for leaf in leaves:
        s = cnp.astype(scale, core.dtype_of(leaf))
        out.append(cnp.tensordot(s, zero_rows(leaf, finite), axes=1))
    summed = tree.unflatten(treedef, out)
    if not return_norms:
        return summed
    return ClippedGradient(summed, norms, sensitivity_of(max_norm, relation), relation)
