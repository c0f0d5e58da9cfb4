r"""The layer rules of ghost clipping: one class per way a parameter ``W`` enters one
operand of one primitive, registered by :func:`rule` into :data:`RULES`, the table keyed by
``(primitive, operand)`` (as fastDP's ``_supported_layers_norm_sample_AND_clipping`` and
Opacus's ``register_norm_sampler``). A new layer type is one class and one decorator line.

Each rule reads, for the examples ``b`` of a batch, the operands it ``needs`` (the layer
input ``a_b``) and the cotangent ``g_b = ∂L_b/∂y_b`` of the equation's output ``y``, and gives

* ``per_example_grads``: ``∇_W L_b``, ``(B, *W.shape)``;
* ``weighted_sum``: book-keeping's ``Σ_b ∇_W L_b`` of re-weighted cotangents (``g_b`` already
  multiplied by the clip weight ``s_b``), without the per-example gradients;
* where ``has_ghost``, ``ghost_sq_norms``: ``‖∇_W L_b‖²`` from ``a_b`` and ``g_b`` alone
  (Goodfellow 2015, Li et al. 2021), ``(B,)``;
* where ``has_user_ghost``, ``ghost_user_sq_norms``: each user's ``‖Σ_{b∈u} ∇_W L_b‖²``
  from the same ``a`` and ``g`` (NOTE [user norms from factored gradients] in
  :mod:`cuvmap.dp.ghost`), ``(B,)`` user slots, and ``user_costs(B)`` for choosing it;
* ``dims = (H, T, d, p)`` and ``costs()`` for the cost model (NOTE [ghost clipping] in
  :mod:`cuvmap.dp.ghost`), ``example_inputs`` for timing it.

The convolutions' rules are in :mod:`cuvmap.dp.ghost.conv_rules`. A new layer type, for
example a scale ``x̂ · γ`` (LayerNorm's and GroupNorm's weight), is one class and its
decorator line; :class:`Scale` below is exactly that::

    @rule(elementwise.mul_p, 0, 1)              # γ as either operand of a multiplication
    class Scale(_Broadcast):
        needs = (the activation's operand,)
        def per_example_grads(self, acts, g): ...   # Σ x̂_b ⊙ g_b over the broadcast dims
"""
import numpy as np

from cuvmap import api, core, lax
from cuvmap import numpy as cnp
from cuvmap.lax import elementwise, indexing, linalg, slicing_gather
from cuvmap.transforms import ir

#: ``{(primitive, operand): rule class}``: the layers ghost clipping reads
RULES = {}
#: multiply-adds that one element of memory traffic costs, in the cost model
#: (memory traffic, not arithmetic, bounds the explicit path: NOTE [ghost clipping])
ELEMENT_COST = 32


def rule(primitive, *operands):
    """Class decorator: the rule for a parameter used as ``operands`` of ``primitive``."""

    def register(cls):
        for operand in operands:
            RULES[(primitive, operand)] = cls
        return cls

    return register


def rule_for(eqn, operand):
    """The rule class for a parameter used as ``operand`` of ``eqn``, or None."""
    cls = RULES.get((eqn.primitive, operand))
    return cls if cls is not None and cls.applies(eqn, operand) else None


# ---------------------------------------------------------------------------------------
# Helpers the rules share (every operand with a leading batch dim B)
# ---------------------------------------------------------------------------------------


def prod(xs):
    return int(np.prod(xs, dtype=np.int64))


def shift(dims, by=1):
    return tuple(d + by for d in dims)


def batched_inner(x, y):
    """``Σ_{i...} x[b, i...] · y[b, i...]`` for each ``b`` (``x`` and ``y`` of one shape)."""
    rest = tuple(range(1, len(core.shape_of(x))))
    return lax.dot_general(x, y, ((rest, rest), ((0,), (0,))))


def per_row(weights, like):
    """``weights`` ``(B,)`` shaped to broadcast along the rows of ``like`` ``(B, ...)``, in its dtype."""
    rank = len(core.shape_of(like))
    return cnp.astype(lax.reshape(weights, tuple(core.shape_of(weights)) + (1,) * (rank - 1)), core.dtype_of(like))


def scaled_rows(x):
    """``(x̂, m)``: ``x`` divided per example by ``m_b = max |x_b|`` (by 1 where ``x_b`` is all
    zeros), so that the Grams of ``x̂`` cannot overflow (NOTE [ghost norms without overflow]
    in :mod:`cuvmap.dp.ghost`)."""
    m = lax.reduce_max(cnp.abs(x), tuple(range(1, len(core.shape_of(x)))))
    safe = cnp.where(cnp.greater(m, 0), m, cnp.ones_like(m))
    return cnp.divide(x, per_row(safe, x)), m


def unscaled(sq, *scales):
    """``‖∇_W L_b‖²`` from the squared norm ``sq`` of the gradient of scaled rows and their
    scales ``m``: ``((√sq · m_1) · m_2)²``, never ``sq · m_1² · m_2²`` (NOTE [ghost norms
    without overflow])."""
    norm = cnp.sqrt(cnp.maximum(sq, 0))
    for m in scales:
        norm = cnp.multiply(norm, cnp.astype(m, core.dtype_of(norm)))
    return cnp.multiply(norm, norm)


def random_array(rng, xp, shape, dtype):
    return xp.asarray(rng.standard_normal(shape).astype(dtype))


# ---------------------------------------------------------------------------------------
# The base rule
# ---------------------------------------------------------------------------------------


class Rule:
    """A recognised use: ``operand`` of equation ``eqn_index`` is (a view of) a parameter,
    and ``needs`` are the operands whose batched values the norms and sums read. ``flow``:
    for a rule whose equation passes the cotangent of its output unchanged to the other
    operand (a bias add), that operand (NOTE [ghost clipping]: the layer before shares its
    cotangent). ``unfolded`` counts the elements of an unfolded input, ``static`` the
    equation's params (for the keys of measured choices)."""

    has_ghost = True
    has_user_ghost = False
    needs = ()
    unfolded = 0
    static = {}
    flow = None
    dims = (1, 1, 1, 1)

    def __init__(self, eqn_index, eqn, operand):
        self.eqn_index = eqn_index
        self.operand = operand
        self.w_aval = eqn.inputs[operand].aval
        self.out_aval = eqn.outs[0].aval

    @classmethod
    def applies(cls, eqn, operand):
        """Whether this use of the parameter is one the rule reads (the table's key matched)."""
        return True

    def costs(self):
        """``(ghost, explicit)`` estimated multiply-adds per example (NOTE [ghost clipping])."""
        h, t, d, p = self.dims
        ghost = h * t * t * (d + p) + ELEMENT_COST * (2 * h * t * t + self.unfolded) + h * t * d * p
        explicit = h * t * d * p + ELEMENT_COST * 3 * h * d * p
        return ghost, explicit

    def key(self):
        return (type(self).__name__, self.w_aval.shape, self.w_aval.dtype.str, self.out_aval.shape, self.dims,
                tuple(sorted(self.static.items())))


# ---------------------------------------------------------------------------------------
# Dense layers, biases, scales, embeddings
# ---------------------------------------------------------------------------------------


@rule(linalg.dot_general_p, 0, 1)
class Dot(Rule):
    """``dot_general(x, y)`` with the parameter as ``x`` (operand 0) or ``y`` (operand 1),
    batch dimensions included (per-head weights): ``∇_W L_b = A_hᵀ G_h`` per batch index h."""

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        (xc, yc), (xb, yb) = eqn.params["dimension_numbers"]
        self.static = dict(eqn.params)
        other = 1 - operand
        self.needs = (other,)
        a_aval = eqn.inputs[other].aval
        if operand == 1:
            a_contract, w_contract, a_batch, w_batch = xc, yc, xb, yb
        else:
            a_contract, w_contract, a_batch, w_batch = yc, xc, yb, xb
        a_free = [i for i in range(a_aval.ndim) if i not in a_contract and i not in a_batch]
        w_free = [i for i in range(self.w_aval.ndim) if i not in w_contract and i not in w_batch]
        nb = len(a_batch)
        g_afree = tuple(range(nb, nb + len(a_free))) if operand == 1 else \
            tuple(range(nb + len(w_free), nb + len(w_free) + len(a_free)))
        g_wfree = tuple(range(nb + len(a_free), nb + len(a_free) + len(w_free))) if operand == 1 else \
            tuple(range(nb, nb + len(w_free)))
        self.a_contract, self.a_batch, self.a_free = tuple(a_contract), tuple(a_batch), tuple(a_free)
        self.g_batch, self.g_afree, self.g_wfree = tuple(range(nb)), g_afree, g_wfree
        # a contraction of a with g over the positions gives W's dims in the order
        # [batch][a's contracted dims, ascending][W's free dims]; `to_w` puts them in W's
        order = list(w_batch) + [w_contract[list(a_contract).index(a)] for a in sorted(a_contract)] + w_free
        self.to_w = tuple(int(i) for i in np.argsort(order))
        self.dims = (prod([a_aval.shape[i] for i in a_batch]), prod([a_aval.shape[i] for i in a_free]),
                     prod([a_aval.shape[i] for i in a_contract]), prod([self.w_aval.shape[i] for i in w_free]))
        self.a_aval = a_aval

    def ghost_sq_norms(self, acts, g):
        (a, ma), (g, mg) = scaled_rows(acts[0]), scaled_rows(g)
        gram_a = lax.dot_general(a, a, ((shift(self.a_contract),) * 2, ((0,) + shift(self.a_batch),) * 2))
        gram_g = lax.dot_general(g, g, ((shift(self.g_wfree),) * 2, ((0,) + shift(self.g_batch),) * 2))
        return unscaled(batched_inner(gram_a, gram_g), ma, mg)

    has_user_ghost = True

    def ghost_user_sq_norms(self, acts, g, users, mask):
        """``‖Σ_{b∈u} m_b A_bᵀ G_b‖² = Σ_{b,b'∈u} m_b m_b' Σ_h ⟨A_{b,h} A_{b',h}ᵀ, G_{b,h} G_{b',h}ᵀ⟩``
        for each user slot ``u``: the ``(B·T) × (B·T)`` Grams of every position of every
        example per batch index ``h``, their product summed within each pair of examples,
        masked to the pairs of one user, summed per user (NOTE [user norms from factored
        gradients]). Rows scaled to at most 1 as in :meth:`ghost_sq_norms`."""
        (a, ma), (g, mg) = scaled_rows(acts[0]), scaled_rows(g)
        h, t, d, p = self.dims
        size = core.shape_of(a)[0]
        a = lax.reshape(lax.transpose(a, (0,) + shift(self.a_batch) + shift(self.a_free) + shift(self.a_contract)),
                        (size, h, t, d))
        g = lax.reshape(lax.transpose(g, (0,) + shift(self.g_batch) + shift(self.g_afree) + shift(self.g_wfree)),
                        (size, h, t, p))
        grams = []
        for x, k in ((a, d), (g, p)):
            rows = lax.reshape(lax.transpose(x, (1, 0, 2, 3)), (h, size * t, k))
            grams.append(lax.dot_general(rows, rows, (((2,), (2,)), ((0,), (0,)))))
        pairs = lax.reduce_sum(lax.reshape(lax.reduce_sum(cnp.multiply(*grams), (0,)), (size, t, size, t)), (1, 3))
        w = cnp.multiply(cnp.astype(ma, core.dtype_of(pairs)), cnp.astype(mg, core.dtype_of(pairs)))
        if mask is not None:
            w = cnp.multiply(w, cnp.astype(mask, core.dtype_of(pairs)))
        pairs = cnp.multiply(pairs, cnp.multiply(lax.reshape(w, (size, 1)), lax.reshape(w, (1, size))))
        # (a select, not a product: a NaN example must not reach the other users' sums)
        same = cnp.equal(lax.reshape(users, (size, 1)), lax.reshape(users, (1, size)))
        pairs = cnp.where(same, pairs, cnp.zeros_like(pairs))
        return indexing.take_transpose_p.bind(lax.reduce_sum(pairs, (1,)), users, axis=0, shape=(size,))

    def user_costs(self, size):
        """``(ghost, explicit)`` multiply-adds for a batch of ``size`` under user-level clipping:
        the Grams of all ``B·T`` positions against the per-example gradients, summed per user."""
        h, t, d, p = self.dims
        bt = size * t
        ghost = h * bt * bt * (d + p) + ELEMENT_COST * (2 * h * bt * bt + size * size) + size * h * t * d * p
        explicit = size * (h * t * d * p + ELEMENT_COST * 4 * h * d * p)
        return ghost, explicit

    def per_example_grads(self, acts, g):
        (a,) = acts
        out = lax.dot_general(a, g, ((shift(self.a_free), shift(self.g_afree)),
                                     ((0,) + shift(self.a_batch), (0,) + shift(self.g_batch))))
        return lax.transpose(out, (0,) + shift(self.to_w))

    def weighted_sum(self, acts, g):
        (a,) = acts
        out = lax.dot_general(a, g, (((0,) + shift(self.a_free), (0,) + shift(self.g_afree)),
                                     (shift(self.a_batch), shift(self.g_batch))))
        return lax.transpose(out, self.to_w)

    def example_inputs(self, size, rng, xp):
        return [random_array(rng, xp, (size,) + self.a_aval.shape, self.a_aval.dtype)], \
            random_array(rng, xp, (size,) + self.out_aval.shape, self.out_aval.dtype)


class _Broadcast(Rule):
    """A parameter combined elementwise with an activation of the output's shape and
    broadcast along the other dims: its per-example gradient sums ``∂y/∂W ⊙ g`` over those
    dims (explicit only: it has the parameter's size)."""

    has_ghost = False

    @classmethod
    def applies(cls, eqn, operand):
        return eqn.inputs[1 - operand].aval.shape == eqn.outs[0].aval.shape

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        out, w = self.out_aval.shape, self.w_aval.shape
        lead = len(out) - len(w)
        self.axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(w) if s == 1 and out[lead + i] != 1)

    def _sum_to_w(self, g):
        size = core.shape_of(g)[0]
        if self.axes:
            g = lax.reduce_sum(g, shift(self.axes))
        return lax.reshape(g, (size,) + self.w_aval.shape)


@rule(elementwise.add_p, 0, 1)
class Bias(_Broadcast):
    """A bias added to an activation (a dense layer's ``y + b``): ``∇_b L_b = Σ g_b`` over
    the broadcast dims."""

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        self.flow = 1 - operand   # the operand the cotangent flows through unchanged

    def per_example_grads(self, acts, g):
        return self._sum_to_w(g)


@rule(elementwise.mul_p, 0, 1)
class Scale(_Broadcast):
    """A scale multiplying an activation: LayerNorm's and GroupNorm's ``weight`` (``x̂ · γ``),
    any affine scale: ``∇_γ L_b = Σ x̂_b ⊙ g_b`` over the broadcast dims."""

    @classmethod
    def applies(cls, eqn, operand):   # the activation a variable: a literal has no batch to keep
        return type(eqn.inputs[1 - operand]) is ir.Var and super().applies(eqn, operand)

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        self.needs = (1 - operand,)

    def per_example_grads(self, acts, g):
        (a,) = acts
        return self._sum_to_w(cnp.multiply(cnp.astype(a, core.dtype_of(g)), g))


@rule(indexing.take_p, 0)
class Take(Rule):
    """The table of ``take(W, idx, axis)`` (an embedding lookup): ``∇_W L_b`` scatter-adds the
    rows ``g_{b,t}`` at ``idx_{b,t}``; ghost ``Σ_{t,t'} [idx_t = idx_t'] ⟨g_t, g_t'⟩``."""

    needs = (1,)

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        self.static = dict(eqn.params)
        self._lookups(eqn.params["axis"], eqn.inputs[1].aval)

    def _lookups(self, axis, idx_aval):
        self.axis = axis
        self.idx_aval = idx_aval
        shape = self.w_aval.shape
        self.rows = shape[self.axis]
        self.lookups = prod(self.idx_aval.shape)
        self.row_size = prod(shape[:self.axis] + shape[self.axis + 1:])
        self.dims = (1, self.lookups, self.rows, self.row_size)

    def costs(self):
        t, r, n = self.lookups, self.row_size, self.rows
        ghost = t * t * r + ELEMENT_COST * (2 * t * t + 2 * t * r)
        explicit = ELEMENT_COST * (3 * n * r + t * r)
        return ghost, explicit

    def _idx_first(self, g):
        """``g`` ``(B, W[:axis], idx..., W[axis+1:])`` -> ``(B, lookups, row_size)``."""
        k = self.idx_aval.ndim
        rank = len(core.shape_of(g))
        idx_dims = tuple(range(1 + self.axis, 1 + self.axis + k))
        perm = (0,) + idx_dims + tuple(i for i in range(1, rank) if i not in idx_dims)
        return lax.reshape(lax.transpose(g, perm), (core.shape_of(g)[0], self.lookups, self.row_size))

    def ghost_sq_norms(self, acts, g):
        (idx,) = acts
        size = core.shape_of(idx)[0]
        ids = lax.reshape(idx, (size, self.lookups))
        ids = cnp.where(ids < 0, ids + self.rows, ids)
        same = cnp.astype(cnp.equal(ids[:, :, None], ids[:, None, :]), self.out_aval.dtype)
        rows, mg = scaled_rows(self._idx_first(g))
        gram = lax.dot_general(rows, rows, (((2,), (2,)), ((0,), (0,))))
        return unscaled(batched_inner(same, gram), mg)

    def per_example_grads(self, acts, g):
        (idx,) = acts
        axis, shape = self.axis, self.w_aval.shape
        return api.vmap(lambda gb, ib: indexing.take_transpose_p.bind(gb, ib, axis=axis, shape=shape))(g, idx)

    def weighted_sum(self, acts, g):
        (idx,) = acts
        size = core.shape_of(idx)[0]
        rank = len(core.shape_of(g))
        # B next to the index dims: (W[:axis], B, idx..., W[axis+1:]) -> (W[:axis], B·lookups, ...)
        perm = tuple(range(1, 1 + self.axis)) + (0,) + tuple(range(1 + self.axis, rank))
        g = lax.transpose(g, perm)
        shape = self.w_aval.shape
        g = lax.reshape(g, shape[:self.axis] + (size * self.lookups,) + shape[self.axis + 1:])
        flat = lax.reshape(idx, (size * self.lookups,))
        return indexing.take_transpose_p.bind(g, flat, axis=self.axis, shape=shape)

    def example_inputs(self, size, rng, xp):
        idx = xp.asarray(rng.integers(0, max(self.rows, 1), (size,) + self.idx_aval.shape).astype(self.idx_aval.dtype))
        return [idx], random_array(rng, xp, (size,) + self.out_aval.shape, self.out_aval.dtype)


def _take_axis(eqn):
    """The axis of a gather that is a ``take`` of whole rows along one axis, with the
    take's layout (``W[:axis] + idx.shape + W[axis+1:]``) and clamped indices, as JAX's
    ``jnp.take`` and embedding lookups spell it with ``lax.gather``; None for any other."""
    p = eqn.params
    d = p["dimension_numbers"]
    w, idx = eqn.inputs[0].aval, eqn.inputs[1].aval
    if d.operand_batching_dims or len(d.start_index_map) != 1 or tuple(d.collapsed_slice_dims) != tuple(
            d.start_index_map) or p["mode"] is slicing_gather.GatherScatterMode.FILL_OR_DROP:
        return None
    axis = d.start_index_map[0]
    k = idx.ndim - 1
    if tuple(p["slice_sizes"]) != tuple(w.shape[:axis]) + (1,) + tuple(w.shape[axis + 1:]):
        return None
    if tuple(d.offset_dims) != tuple(range(axis)) + tuple(range(axis + k, w.ndim - 1 + k)):
        return None
    return axis


@rule(slicing_gather.gather_p, 0)
class GatherTake(Take):
    """The table of a ``lax.gather`` that is a take of rows (:func:`_take_axis`): the
    :class:`Take` rule on the indices without their index-vector dim, clamped into
    ``[0, rows)`` as the gather clamps them."""

    @classmethod
    def applies(cls, eqn, operand):
        return _take_axis(eqn) is not None and super().applies(eqn, operand)

    def __init__(self, eqn_index, eqn, operand):
        Rule.__init__(self, eqn_index, eqn, operand)
        axis = _take_axis(eqn)
        self.static = {"axis": axis}
        full = eqn.inputs[1].aval
        self._lookups(axis, core.ShapedArray(tuple(full.shape[:-1]), full.dtype))

    def _rows(self, acts):
        (idx,) = acts
        idx = lax.squeeze(idx, (len(core.shape_of(idx)) - 1,))
        return (cnp.clip(idx, 0, self.rows - 1),)

    def ghost_sq_norms(self, acts, g):
        return super().ghost_sq_norms(self._rows(acts), g)

    def per_example_grads(self, acts, g):
        return super().per_example_grads(self._rows(acts), g)

    def weighted_sum(self, acts, g):
        return super().weighted_sum(self._rows(acts), g)

    def example_inputs(self, size, rng, xp):
        (idx,), g = super().example_inputs(size, rng, xp)
        return [idx[..., None]], g
