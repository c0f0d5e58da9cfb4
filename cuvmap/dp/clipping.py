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
import numpy as np

from cuvmap import backend, core, lax, tree
from cuvmap import numpy as cnp
from cuvmap.lax import indexing
from cuvmap.core.bfloat16 import kind_of


#: The neighbouring relations a clipped sum's sensitivity is stated for, with the factor of
#: the clipping bound each gives (NOTE [sensitivity as data]).
RELATIONS = {"add_remove": 1.0, "replace": 2.0}
_RELATION_WORDS = {"add_remove": "add/remove-one", "replace": "replace-one"}
_UNITS = ("example", "user")


# NOTE [sensitivity as data]
# The Gaussian mechanism's noise must be calibrated to the L2 sensitivity of the exact value
# it is added to: Δ = max ‖S(D) − S(D')‖ over neighbouring datasets D, D'. For the clipped sum
# S = Σ_u clip(g_u) over the units u of a batch (examples, or users with user-level
# clipping), each unit's contribution has norm at most C, so
#   add/remove-one unit (D' = D with one unit more or less):  Δ = C;
#   replace-one unit (D' = D with one unit swapped):           Δ = 2C;
# and with group-wise clipping (bound C_k on the part of a unit's gradient in group k)
# the unit's contribution has norm at most √(Σ_k C_k²), which replaces C. The noise std is
# then σ·Δ and the accountant's noise multiplier is σ (noise std over sensitivity).
# Every peer library leaves Δ to the user, who passes a C that may not be the one the
# sum was clipped with, adds noise for a sum to a mean (jax_privacy#383: B times too much)
# or for add/remove-one to a replace-one sum (half the noise needed). So the clipped sum is
# a value that carries Δ: ClippedGradient holds the sum, the norms and, as static data
# (pytree metadata, so it survives jit and vmap and is checked when tracing), the bound,
# the relation, the unit and the groups; add_noise and private_gradient take σ and derive
# the noise from Δ, refusing a max_norm that is not the sum's own bound. A ClippedGradient
# cannot be scaled (no "mean" whose sensitivity would be stale): the normalisation happens
# after the noise, in private_gradient, by a number said by name (NOTE [normalising the
# private gradient]). Its one operation is +, the clipped sums of disjoint microbatches
# (gradient accumulation: the noise once on the total, the sensitivity unchanged). A user
# function mapped over it (tree.map(lambda x: 2 * x, clipped)) may change the sensitivity
# (to 2C there), so tree.map returns the mapped sum as a plain pytree, which states none:
# noise on it then needs an explicit max_norm (NOTE [nodes whose meaning a mapped function
# changes] in cuvmap/tree.py). jit, vmap and grad rebuild it unchanged.
#
# NOTE [a clipped sum reduced over an axis]
# Under a data-parallel axis (data_parallel's processes, or vmap(axis_name=)) a clipped sum
# is one member's share, and its noise is kept on member 0 alone so that the members'
# shares, added, carry it once (NOTE [noise once over a data-parallel axis] in
# cuvmap/dp/noise.py). A psum is an addition of clipped sums too: lax.psum(clipped, "batch")
# gives the total, the same on every member, with the same sensitivity (each unit is in
# one member's batch). Noise on the total must then be one draw that every member adds:
# kept on member 0 alone, the other members would get a noise-free gradient and the
# replicas would diverge. So the psum records the axes in reduced_over (its
# __collective__, NOTE [nodes that rebuild themselves after a collective] in
# cuvmap/lax/collective_operands.py), and add_noise and private_gradient broadcast member
# 0's draw over them (a psum of the noise, masked to member 0: one all-reduce of the
# parameters' size more than noising each share before the psum, which stays the cheaper
# recipe). The norms are not reduced: they stay this member's (the members' batches may
# have other sizes). Any other collective of a clipped sum gives a plain pytree.
class ClippedGradient:
    """A sum of clipped gradients and the facts its privacy rests on: what
    :func:`cuvmap.dp.clipped_grad` and :func:`cuvmap.dp.clipped_sum` return, and what
    :func:`cuvmap.dp.private_gradient` and :func:`cuvmap.dp.add_noise` take.

    Arrays: ``summed``, the sum over the batch's units of their clipped gradients (a
    pytree like the parameters), ``norms``, each unit's gradient norm before clipping
    (``(B,)`` per example; per user slot with user-level clipping) and, with groups,
    ``group_norms``, one such array per group. Static facts (kept through ``jit`` and
    ``vmap`` as pytree metadata): ``max_norm``, the bound on one unit's contribution
    (the clipping bound ``C``, or ``√(Σ_k C_k²)`` with groups), ``relation``
    (``"add_remove"`` or ``"replace"``), ``unit`` (``"example"`` or ``"user"``) and
    ``groups`` (``((label, C_k), ...)`` or None). ``sensitivity`` is the sum's L2
    sensitivity under its relation: ``C`` for add/remove-one, ``2C`` for replace-one
    (NOTE [sensitivity as data]). ``reduced_over``: the named axes a ``psum`` summed it
    over (``()`` for one member's share; NOTE [a clipped sum reduced over an axis]): its
    ``summed`` is then the total, the same on every member, and ``norms`` stay this
    member's.

    It unpacks as ``summed, norms = result`` (and ``result[0]``, ``result[1]`` are those two).
    """

    __slots__ = ("summed", "norms", "group_norms", "max_norm", "relation", "unit", "groups", "reduced_over")

    def __init__(self, summed, norms, group_norms=None, *, max_norm, relation="add_remove", unit="example",
                 groups=None, reduced_over=()):
        self.summed, self.norms, self.group_norms = summed, norms, group_norms
        self.max_norm = float(max_norm)
        self.relation = check_relation(relation, "ClippedGradient")
        if unit not in _UNITS:
            raise ValueError(f"ClippedGradient: unit must be one of {_UNITS}, got {unit!r}")
        self.unit = unit
        self.groups = None if groups is None else tuple((label, float(c)) for label, c in groups)
        self.reduced_over = tuple(reduced_over)

    @property
    def sensitivity(self):
        """The L2 sensitivity of ``summed`` under ``relation``: ``max_norm`` for add/remove-one,
        ``2 · max_norm`` for replace-one (a Python float)."""
        return RELATIONS[self.relation] * self.max_norm

    def describe(self):
        """The sensitivity in words, for messages."""
        bound = f"C={self.max_norm:g}" if self.groups is None else \
            f"√(Σ C_k²)={self.max_norm:g} over {len(self.groups)} groups"
        over = f", summed over {', '.join(map(repr, self.reduced_over))}" if self.reduced_over else ""
        return (f"L2 sensitivity {self.sensitivity:g}: each {self.unit} clipped to {bound}, "
                f"{_RELATION_WORDS[self.relation]} {self.unit}s{over}")

    def __iter__(self):
        yield self.summed
        yield self.norms

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return (self.summed, self.norms)[i]

    def __repr__(self):
        return (f"ClippedGradient(summed={tree.describe(self.summed)}, norms={tree.describe(self.norms)}, "
                f"{self.describe()})")

    def __add__(self, other):
        """The clipped sum of two disjoint batches (gradient accumulation over microbatches):
        the sums added, the norms concatenated, the sensitivity unchanged, since each example
        is in one of them. Both must carry the same bound, relation and groups; user-level
        sums are refused (a user split over two sums would contribute up to 2C)."""
        if not isinstance(other, ClippedGradient):
            return NotImplemented
        mine, theirs = _flatten_clipped(self)[1], _flatten_clipped(other)[1]
        if mine != theirs:
            raise ValueError(f"ClippedGradient + ClippedGradient: the two clipped sums have different sensitivities "
                             f"({self.describe()}; {other.describe()}); accumulate sums clipped the same way")
        if self.unit != "example":
            raise ValueError("ClippedGradient + ClippedGradient: user-level clipped sums cannot be accumulated (a "
                             "user whose examples are split over the two sums would contribute up to 2C): clip "
                             "each user's examples in one call")
        summed = tree.map(cnp.add, self.summed, other.summed)
        norms = cnp.concatenate([self.norms, other.norms])
        group_norms = None if self.group_norms is None else \
            tuple(cnp.concatenate([a, b]) for a, b in zip(self.group_norms, other.group_norms))
        return ClippedGradient(summed, norms, group_norms, max_norm=self.max_norm, relation=self.relation,
                               unit=self.unit, groups=self.groups, reduced_over=self.reduced_over)

    def __collective__(self, op, names, apply):
        """What a collective over named axes makes of a clipped sum (NOTE [a clipped sum
        reduced over an axis]): ``psum`` sums ``summed`` over the members and records the
        axes in ``reduced_over`` (the norms stay this member's); any other collective (a
        ``pmean`` divides the sensitivity, a ``pmax`` has none) gives its result on
        ``summed`` as a plain pytree."""
        if op != "psum":
            return apply(self.summed)
        over = tuple(getattr(a, "name", a) for a in names)
        return ClippedGradient(apply(self.summed), self.norms, self.group_norms, max_norm=self.max_norm,
                               relation=self.relation, unit=self.unit, groups=self.groups,
                               reduced_over=self.reduced_over + over)

    def num_dropped(self, mask=None):
        """How many units have a norm that is not finite (a NaN or an infinity in their
        gradient): those that ``nan_safe=True`` gave a zero contribution (and that make
        ``summed`` NaN without it). With ``mask``, only the real ones (``mask != 0``)
        count. A 0-d integer array (traced under ``jit``)."""
        bad = cnp.logical_not(finite_rows(self.norms))
        if mask is not None:
            bad = cnp.logical_and(bad, cnp.not_equal(mask, 0))
        return cnp.sum(cnp.astype(bad, np.int64))


def _flatten_clipped(c):
    return (c.summed, c.norms, c.group_norms), (c.max_norm, c.relation, c.unit, c.groups, c.reduced_over)


def _unflatten_clipped(meta, children):
    max_norm, relation, unit, groups, reduced_over = meta
    return ClippedGradient(*children, max_norm=max_norm, relation=relation, unit=unit, groups=groups,
                           reduced_over=reduced_over)


def _mapped_clipped(meta, children):
    """What ``tree.map(f, clipped)`` returns: the mapped sum alone, a plain pytree (NOTE
    [sensitivity as data]: ``f`` may change the sensitivity)."""
    return children[0]


tree.register_pytree_node(
    ClippedGradient, _flatten_clipped, _unflatten_clipped, mapped=_mapped_clipped,
    hint="a ClippedGradient is a clipped sum with its sensitivity, not a pytree like the parameters: pass its "
         ".summed (the clipped sum), or dp.private_gradient(clipped, ...) for the noised gradient an optimizer takes")


def check_relation(relation, where):
    """``relation`` checked to be one of :data:`RELATIONS`."""
    if relation not in RELATIONS:
        raise ValueError(f"{where}: relation must be one of {', '.join(map(repr, RELATIONS))} (the neighbouring "
                         f"relation the sensitivity is stated for), got {relation!r}")
    return relation


def check_max_norm(max_norm, where, error=ValueError, hint=""):
    """``max_norm`` as a float: a positive real number (a 0-d array too), else ``error``
    naming ``where`` (and ``hint``, what to do instead)."""
    shape = tuple(getattr(max_norm, "shape", ()))
    dtype = getattr(max_norm, "dtype", None)
    if (isinstance(max_norm, bool) or shape != () or (dtype is not None and kind_of(np.dtype(dtype)) not in "fiu")
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


# NOTE [clipping by group and by user]
# Two refinements of the per-example clipping, shared by clipped_sum and clipped_grad.
#
# Groups (fastDP's layer-wise, param-wise and block-wise clipping; Opacus' per-layer
# clipping): the parameter leaves are split into groups k = 1..K with bounds C_k, and
# each example's gradient is clipped group by group::
#
#     ḡ_b^k = g_b^k · min(1, C_k / (‖g_b^k‖₂ + tiny))
#
# so one example's contribution has norm at most √(Σ_k C_k²): the sum's sensitivity under
# add/remove-one (Opacus' DPPerLayerOptimizer states the same bound). A single number
# C gives every group C / √K (the total bound stays C); a mapping {label: C_k}
# gives each its own.
#
# Users (user-level DP): examples carry a user id u_b; each user's summed gradient
# G_u = Σ_{b: u_b = u} m_b g_b is clipped to C, and the clipped sum is
# Σ_u min(1, C / (‖G_u‖ + tiny)) · G_u: adding or removing one user (all their examples)
# changes it by at most C, so the sensitivity is C per user, and the sampler must
# sample users (:func:`cuvmap.dp.sample_users`). Because Σ_u s_u G_u = Σ_b s_{u_b} m_b g_b,
# only the users' norms need the users' sums; the clipped sum is the per-example one with
# each example weighted by its user's factor (book-keeping carries over unchanged). User ids
# are slots 0 .. B−1 of the batch (sample_users relabels them), so every shape is
# static and the step runs under jit; NOTE [user norms from factored gradients] in
# :mod:`cuvmap.dp.ghost` says how ghost norms extend to users.

GROUP_STYLES = ("param", "layer")


class Groups:
    """The groups of a parameter pytree: ``of_leaf[i]`` the group of leaf ``i``, ``labels``
    and ``bounds`` (``C_k``) in the order of first appearance, ``total = √(Σ_k C_k²)``, and
    ``spec``, the ``((label, C_k), ...)`` a :class:`ClippedGradient` carries (None for the
    flat clipping of every leaf together)."""

    def __init__(self, of_leaf, labels, bounds, flat):
        self.of_leaf, self.labels, self.bounds = list(of_leaf), tuple(labels), tuple(bounds)
        self.total = math.sqrt(sum(c * c for c in self.bounds))
        self.spec = None if flat else tuple(zip(self.labels, self.bounds))

    def __len__(self):
        return len(self.labels)


def _label(path):
    return tree.keystr(path) or "(root)"


def resolve_groups(params, groups, max_norm, where):
    """The :class:`Groups` of the leaves of ``params`` (a pytree; per-example gradients have
    its structure) for ``groups`` (NOTE [clipping by group and by user]):

    * None: one group, every leaf (bound ``max_norm``);
    * ``"param"``: each leaf its own group, labelled by its path (``"['w']"``);
    * ``"layer"``: the leaves that share a parent node (a layer's weight and bias),
      labelled by the parent's path;
    * a pytree prefix of ``params`` whose leaves are labels (strings or ints): block-wise,
      every leaf under one prefix leaf in that label's group.

    ``max_norm``: a number ``C`` (each of ``K`` groups gets ``C / √K``) or, with groups, a
    dict ``{label: C_k}`` naming every group."""
    paths, leaves, _ = tree.flatten_with_path(params)
    if groups is None:
        if isinstance(max_norm, dict):
            raise ValueError(f"{where}: max_norm is a dict of group bounds, but groups is None (pass groups=)")
        return Groups([0] * len(leaves), ("(all)",), (check_max_norm(max_norm, where),), flat=True)
    if isinstance(groups, str):
        if groups not in GROUP_STYLES:
            raise ValueError(f"{where}: groups must be None, one of {', '.join(map(repr, GROUP_STYLES))} or a pytree "
                             f"prefix of the parameters whose leaves are group labels, got {groups!r}")
        names = [_label(p) if groups == "param" else _label(p[:-1]) for p in paths]
    else:
        try:
            names = tree.broadcast_prefix(groups, params, lambda x: isinstance(x, (str, numbers.Integral)))
        except ValueError as err:
            raise ValueError(f"{where}: groups must be a pytree prefix of the parameters whose leaves are group "
                             f"labels (strings or ints): {err}") from None
    labels = list(dict.fromkeys(names))
    of_leaf = [labels.index(n) for n in names]
    if isinstance(max_norm, dict):
        missing = [lb for lb in labels if lb not in max_norm]
        extra = [lb for lb in max_norm if lb not in labels]
        if missing or extra:
            raise ValueError(f"{where}: max_norm must give a bound for every group: the groups are {labels}"
                             + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else ""))
        bounds = [check_max_norm(max_norm[lb], f"{where}: group {lb!r}") for lb in labels]
    else:
        c = check_max_norm(max_norm, where)
        bounds = [c / math.sqrt(len(labels))] * len(labels)
    return Groups(of_leaf, labels, bounds, flat=False)


def check_users(users, size, where):
    """``users``, ``(B,)`` integer user slots in ``[0, B)``: the shape and dtype when
    called, the range where the values are (a ValueError for NumPy arrays now; an
    IndexError from the bounds-check primitive for CuPy arrays, and under ``jit`` when the
    program runs: an id out of range would merge two users and break the per-user bound)."""
    shape = tuple(core.shape_of(users))
    if shape != (size,):
        raise ValueError(f"{where}: users has shape {shape}, but the batch has {size} examples (one user id per "
                         f"example, shape ({size},))")
    if kind_of(core.dtype_of(users)) not in "iu":
        raise ValueError(f"{where}: users must be integer user slots, got dtype {core.dtype_of(users)}")
    if not size:
        return users
    if isinstance(users, core.Tracer) or backend.is_cupy_array(users):
        # 2·u − B lies in [-B, B) exactly when u lies in [0, B); the slots are then read back
        # from the checked values, so that the check stays in a staged program
        twice = cnp.subtract(cnp.multiply(users, 2), size)
        checked = indexing.check_index_bounds(twice, size, where, f"the user slots u (as 2·u − {size}; u must be "
                                                                  f"in 0 .. {size - 1})")
        return cnp.floor_divide(cnp.add(checked, size), 2)
    lo, hi = int(np.min(users)), int(np.max(users))
    if lo < 0 or hi >= size:
        raise ValueError(f"{where}: user ids must be slots 0 .. {size - 1} of the batch (relabel them, as "
                         f"dp.sample_users does), got ids from {lo} to {hi}")
    return users


def per_user(x, users, mask):
    """``G[u] = Σ_{b: users_b = u} m_b x[b]``: the rows of ``x`` ``(B, ...)`` summed into ``B``
    user slots (one scatter-add, no ``B × B`` one-hot)."""
    shape = tuple(core.shape_of(x))
    if mask is not None:
        m = cnp.astype(cnp.reshape(mask, (shape[0],) + (1,) * (len(shape) - 1)), core.dtype_of(x))
        x = cnp.multiply(x, m)
    return indexing.take_transpose_p.bind(x, users, axis=0, shape=shape)


def group_clip(squares, groups, tiny, mask=None):
    """From each group's squared norms (a list of ``(B,)`` arrays, one per group) the unit
    norms ``√(Σ_k sq_k)``, the group norms (None without groups) and each group's clip
    factors ``m_b · min(1, C_k / (‖·‖_k + tiny))``."""
    group_norms = [cnp.sqrt(cnp.maximum(sq, 0)) for sq in squares]
    if len(squares) == 1:
        norms = group_norms[0]
    else:
        total = squares[0]
        for sq in squares[1:]:
            total = cnp.add(total, sq)
        norms = cnp.sqrt(cnp.maximum(total, 0))
    scales = [clip_scale(n, c, tiny, mask) for n, c in zip(group_norms, groups.bounds)]
    return norms, (None if groups.spec is None else tuple(group_norms)), scales


def clipped_sum(per_example_grads, max_norm, *, mask=None, tiny=1e-6, return_norms=True, nan_safe=False,
                relation="add_remove", groups=None, users=None):
    """``Σ_b m_b · clip(g_b, C)``: the clipped per-example gradients summed over the batch,
    each weighted by its mask entry ``m_b`` (1 for a real example, 0 for padding), as a
    :class:`ClippedGradient` that carries its L2 sensitivity (NOTE [sensitivity as data]);
    with ``groups``, clipped group by group, and with ``users``, each user's summed
    gradient clipped (NOTE [clipping by group and by user]).

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
      max_norm: the clipping bound ``C > 0``; with ``groups``, a number (each of ``K``
        groups gets ``C / √K``) or a dict ``{label: C_k}``.
      mask: ``(B,)`` bool or numeric weights, or ``None`` for all ones.
      tiny: added to the norm in the denominator.
      return_norms: kept for compatibility: the result always carries the norms (and
        unpacks as ``summed, norms``).
      nan_safe: a unit (example, or user) whose gradient is not finite (a NaN or infinite
        norm) contributes zero instead of making the sum NaN (as
        :func:`cuvmap.dp.clipped_grad`'s ``nan_safe``); ``result.num_dropped()`` counts them.
      relation: the neighbouring relation the sensitivity is stated for:
        ``"add_remove"`` (``Δ = C``) or ``"replace"`` (``Δ = 2C``).
      groups: None (one global norm), ``"param"``, ``"layer"`` or a pytree prefix of the
        gradients' structure with group labels at its leaves (block-wise).
      users: ``(B,)`` integer user slots in ``[0, B)`` (as :func:`cuvmap.dp.sample_users`
        gives them): user-level clipping, the norms then per user slot.

    Returns:
      A :class:`ClippedGradient`: ``summed`` (a pytree shaped like one example's gradient,
      leaves in their dtypes), ``norms`` (``(B,)``: per example, padding rows included, or
      per user slot), ``group_norms`` with groups, and the sensitivity.

    Example::

        (x, y), mask = pad_batch((xs, ys), bucket_for(len(ys), buckets))
        clipped = clipped_sum(vmap(grad(loss), in_axes=(None, 0, 0))(params, x, y), 1.0, mask=mask)
        clipped.sensitivity   # 1.0
        clipped_sum(per_example, {"['w']": 0.8, "['b']": 0.6}, groups="param").sensitivity   # 1.0
    """
    relation = check_relation(relation, "clipped_sum")
    leaves, treedef, size = _batched_leaves(per_example_grads, "clipped_sum")
    grp = resolve_groups(per_example_grads, groups, max_norm, "clipped_sum")
    if mask is not None and tuple(core.shape_of(mask)) != (size,):
        raise ValueError(f"clipped_sum: mask has shape {tuple(core.shape_of(mask))}, but the per-example "
                         f"gradients have batch size {size} (the mask needs shape ({size},))")
    unit_mask = mask
    if users is not None:
        users = check_users(users, size, "clipped_sum")
        leaves = [per_user(leaf, users, mask) for leaf in leaves]
        unit_mask = None   # the mask is in the users' sums
    squares = [squared_norms([x for x, k in zip(leaves, grp.of_leaf) if k == g], size) for g in range(len(grp))]
    norms, group_norms, scales = group_clip(squares, grp, tiny, unit_mask)
    finite = finite_rows(norms) if nan_safe else None
    out = []
    for leaf, k in zip(leaves, grp.of_leaf):
        s = cnp.astype(zero_rows(scales[k], finite), core.dtype_of(leaf))
        out.append(cnp.tensordot(s, zero_rows(leaf, finite), axes=1))
    return ClippedGradient(tree.unflatten(treedef, out), norms, group_norms, max_norm=grp.total, relation=relation,
                           unit="example" if users is None else "user", groups=grp.spec)
