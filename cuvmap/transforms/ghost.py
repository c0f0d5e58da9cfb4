r"""Ghost clipping and book-keeping: the clipped sum of per-example gradients, and their norms,
from one forward and one backward pass of the batch, without per-example weight gradients.

For a per-example loss ``L_b(θ) = loss(θ, x_b, y_b)`` and a clipping bound ``C``,
:func:`clipped_grad` returns

    S = Σ_b m_b c_b ∇L_b(θ),   c_b = min(1, C / (‖∇L_b(θ)‖₂ + tiny)),   and   ‖∇L_b(θ)‖₂,

the norm taken over the whole parameter pytree and ``m`` the mask of a padded batch: what
``dp.clipped_sum(vmap(grad(loss))(θ, xs, ys), C, mask=m, return_norms=True)`` computes.

A weight ``W`` that enters the loss once, through ``y = a ⋆ W`` with ``⋆`` linear in
``W`` (a dense layer's ``dot_general``, a convolution, an embedding's gather), has the
per-example gradient ``∇_W L_b = a_bᵀ g_b`` (with the unfolded input for a convolution),
where ``a_b`` is the layer's input and ``g_b = ∂L_b/∂y_b`` its output cotangent for
example ``b`` (a bias added to ``y`` has the per-example gradient ``g_b`` summed over its
broadcast dims). Both come out of one ordinary forward and backward pass of the batch. Then

* **ghost norm** (Goodfellow 2015; Li et al. 2021, ghost clipping):
  ``‖a_bᵀ g_b‖² = ⟨a_b a_bᵀ, g_b g_bᵀ⟩``, two ``T × T`` Gram matrices (``T`` positions:
  a sequence, the output pixels of a convolution), ``‖a_b‖² ‖g_b‖²`` when ``T = 1``;
* or the **explicit** per-example gradient ``a_bᵀ g_b`` of that layer alone, whichever
  the layer's cost model says is cheaper (Bu et al. 2022, mixed ghost clipping);
* **book-keeping** (Bu et al. 2023): with the norms known, the clipped sum of a ghost layer
  is ``Σ_b a_bᵀ (m_b c_b g_b)``, the layer's ordinary batched weight gradient with
  re-weighted cotangents, computed from the kept ``a`` and ``g``: no second backward pass.

The transform stages the per-example loss (as ``jit`` does), finds the parameters' uses in
the program, and runs it batched (``vmap``) under one ``vjp`` that yields every layer's
``g``; parameters used any other way get their explicit per-example gradients from that
same backward pass (NOTE [ghost clipping] says how, and when each method is taken).

References:

* I. Goodfellow. *Efficient Per-Example Gradient Computations.* arXiv:1510.01799, 2015.
* X. Li, F. Tramèr, P. Liang, T. Hashimoto. *Large Language Models Can Be Strong
  Differentially Private Learners.* ICLR 2022, arXiv:2110.05679 (ghost clipping).
* Z. Bu, J. Mao, S. Xu. *Scalable and Efficient Training of Large Convolutional Neural
  Networks with Differential Privacy.* NeurIPS 2022, arXiv:2205.10683 (mixed ghost clipping).
* Z. Bu, Y.-X. Wang, S. Zha, G. Karypis. *Differentially Private Optimization on Large
  Model at Small Cost.* ICML 2023, arXiv:2210.00038 (book-keeping).
"""
import math
import threading
import time
from types import SimpleNamespace

import numpy as np

from cuvmap import api, api_util, backend, core, lax, tree
from cuvmap import numpy as cnp
from cuvmap.api_util import TransformError
from cuvmap.dp import clipping
from cuvmap.transforms import ir

# NOTE [ghost clipping]
# The per-example loss is staged on one example's avals (a program whose inputs are the
# parameter leaves and one example of the batch), and each parameter's uses are read off
# its equations, following norm-preserving views (transpose, reshape, squeeze,
# expand_dims, a float conversion) from the parameter to the equation that uses it:
#
#   dot_general(a, W) (either operand; W's dims: batch H, contracted d, free p; a's free
#     dims are the T positions):  ∇_W L_b = per h: A_hᵀ G_h with A_h: T×d, G_h: T×p;
#     ghost  ‖∇_W L_b‖² = Σ_h ⟨A_h A_hᵀ, G_h G_hᵀ⟩;   book-keeping Σ_b A_bᵀ(s_b G_b).
#   conv(x, W[, bias]) (every case of BatchRulesConvolution.cpp: groups, stride, padding,
#     dilation, 1-3 spatial dims, transposed):  with U(x) the unfolded input (N·positions ×
#     C/groups·kernel per group), ∇_W L_b = per group U(x)ᵀ G; ghost Σ_g ⟨U Uᵀ, G Gᵀ⟩. A
#     transposed conv's weight gradient is the regular conv's with x and the output's
#     cotangent swapped: there U unfolds the cotangent (at the input's positions) and x
#     plays G. Book-keeping: conv_backward_weight of the re-weighted cotangents, the batch
#     folded into N. The bias: ∇_b L_b = Σ_{N, positions} g_b, always explicit (O numbers).
#   take(W, idx, axis) (an embedding): ∇_W L_b scatter-adds the rows g_{b,t} at idx_{b,t};
#     ghost ‖∇_W L_b‖² = Σ_{t,t'} [idx_t = idx_t'] ⟨g_t, g_t'⟩ (a T×T Gram masked by equal
#     ids); book-keeping: one take_transpose of the re-weighted rows of the whole batch.
#   add(y, b) with b broadcast against y (a dense layer's bias): ∇_b L_b sums g_b over the
#     broadcast dims, always explicit (b's size).
#
# Each such use gets a zero z_k added to its output, and one vjp of the batched loss with
# respect to the z's (and the fallback parameters below) gives every g_k = ∂(Σ_b L_b)/∂y_k
# at once; its rows are the per-example cotangents because y_{k,b} only reaches L_b. A
# layer whose output feeds nothing but a recognised bias add (y = a ⋆ W, then y + b) has
# that sum's cotangent, so the two share one z. The layer inputs a_k come out of the same
# forward pass (those that are views of a batch argument are read from the batch). The
# weights of these layers are not differentiated: the backward pass computes the
# activations' cotangents only, and the weight gradients are the book-keeping sums after
# the norms; each a_k and g_k is released after the last sum that reads it.
#
# Cost model, per example, in multiply-adds, with an element written or read counted as
# _ELEMENT_COST multiply-adds (memory traffic, not arithmetic, bounds the explicit path):
#   ghost     H·T²·(d + p) for the two Grams, 2·H·T² elements (their product), H·T·d for
#             an unfolded conv input, plus book-keeping's batched GEMM H·T·d·p;
#   explicit  H·T·d·p for the per-example gradient, 3·H·d·p elements (written, squared,
#             summed with the clip weights);
#   (take: ghost T²·R + T²; explicit 3·n·R elements, for a table of n rows of R numbers).
# Ghost wins by far on dense layers without positions (T = 1: d + p against d·p) and loses
# on early conv layers (T² ≫ d·p, fastDP's rule 2T² < p·d is the same comparison). Where
# the two estimates are within a factor _CLOSE of each other, method="auto" times both on
# random operands of the layer's shapes on its device the first time it meets the layer
# (batch size bucketed to a power of two) and keeps the faster, as the conv strategy does
# (NOTE [conv strategy]); measured_choices() lists what it measured. method="ghost" takes
# the ghost norm wherever the use allows one, method="per_example" the explicit gradient
# everywhere.
#
# Fallback: a parameter that is used more than once (tied weights, a weight used twice:
# the norm then has cross terms between the uses) gets its explicit per-example gradient
# as the sum of its uses' a_bᵀ g_b, from the same a and g. A parameter used in any other
# way (a scale, a layer norm's weight, an operand of a custom derivative or a checkpointed
# region, an output of the loss, the lhs of a convolution) enters the batched pass as B
# broadcast copies, and the vjp gives its per-example gradient directly: the vmap(grad)
# path for that parameter only. Unused parameters get zeros.

#: multiply-adds that one element of memory traffic costs, in the cost model
_ELEMENT_COST = 32
#: estimates within this factor of each other are settled by timing both methods
_CLOSE = 4.0
_METHODS = ("auto", "ghost", "per_example")

_measured = {}
_measure_lock = threading.Lock()


def measured_choices():
    """The layers ``method="auto"`` has timed so far: ``{key: (choice, {method: ms})}``."""
    with _measure_lock:
        return dict(_measured)


def clear_measured_choices():
    """Forgets the timed choices (the next call of each layer times it again)."""
    with _measure_lock:
        _measured.clear()


# ---------------------------------------------------------------------------------------
# The primitives the transform recognises
# ---------------------------------------------------------------------------------------

_prims = []


def _primitives():
    """The primitive objects whose uses the transform reads, found in one place through the
    ``cuvmap.lax`` package (a renamed lax module is a one-line change here)."""
    if not _prims:
        _prims.append(SimpleNamespace(
            dot_general=lax.linalg.dot_general_p, conv=lax.convolution.conv_p, take=lax.indexing.take_p,
            take_transpose=lax.indexing.take_transpose_p, transpose=lax.shape.transpose_p,
            reshapes=(lax.shape.reshape_p, lax.shape.squeeze_p, lax.shape.expand_dims_p),
            convert=lax.elementwise.convert_element_type_p, add=lax.elementwise.add_p,
        ))
    return _prims[0]


def _prod(xs):
    return int(np.prod(xs, dtype=np.int64))


def _shift(dims, by=1):
    return tuple(d + by for d in dims)


def _batched_inner(x, y):
    """``Σ_{i...} x[b, i...] · y[b, i...]`` for each ``b`` (``x`` and ``y`` of one shape)."""
    rest = tuple(range(1, len(core.shape_of(x))))
    return lax.dot_general(x, y, ((rest, rest), ((0,), (0,))))


# ---------------------------------------------------------------------------------------
# Layers: a parameter's use in one operand of one equation
# ---------------------------------------------------------------------------------------


class _Layer:
    """A recognised use: ``operand`` of equation ``eqn_index`` is (a view of) a parameter,
    and ``needs`` are the operands whose batched values the norms and sums read. Subclasses
    give, from those values and the output cotangents ``g`` (each with a leading batch dim):
    ``ghost_sq_norms`` (B,) (where ``has_ghost``), ``per_example_grads`` (B, *W.shape) and
    ``weighted_sum``, the book-keeping sum over the batch of re-weighted cotangents. ``dims``
    is ``(H, T, d, p)`` of the cost model, ``unfolded`` the elements of an unfolded input,
    ``static`` the equation's params (for the keys of measured choices)."""

    has_ghost = True
    needs = ()
    unfolded = 0
    static = {}

    def __init__(self, eqn_index, eqn, operand):
        self.eqn_index = eqn_index
        self.operand = operand
        self.w_aval = eqn.inputs[operand].aval
        self.out_aval = eqn.outs[0].aval

    def costs(self):
        """``(ghost, explicit)`` estimated multiply-adds per example (NOTE [ghost clipping])."""
        h, t, d, p = self.dims
        ghost = h * t * t * (d + p) + _ELEMENT_COST * (2 * h * t * t + self.unfolded) + h * t * d * p
        explicit = h * t * d * p + _ELEMENT_COST * 3 * h * d * p
        return ghost, explicit

    def key(self):
        return (type(self).__name__, self.w_aval.shape, self.w_aval.dtype.str, self.out_aval.shape, self.dims,
                tuple(sorted(self.static.items())))


class _Dot(_Layer):
    """``dot_general(x, y)`` with the parameter as ``x`` (operand 0) or ``y`` (operand 1)."""

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
        self.dims = (_prod([a_aval.shape[i] for i in a_batch]), _prod([a_aval.shape[i] for i in a_free]),
                     _prod([a_aval.shape[i] for i in a_contract]), _prod([self.w_aval.shape[i] for i in w_free]))
        self.a_aval = a_aval

    def ghost_sq_norms(self, acts, g):
        (a,) = acts
        gram_a = lax.dot_general(a, a, ((_shift(self.a_contract),) * 2, ((0,) + _shift(self.a_batch),) * 2))
        gram_g = lax.dot_general(g, g, ((_shift(self.g_wfree),) * 2, ((0,) + _shift(self.g_batch),) * 2))
        return _batched_inner(gram_a, gram_g)

    def per_example_grads(self, acts, g):
        (a,) = acts
        out = lax.dot_general(a, g, ((_shift(self.a_free), _shift(self.g_afree)),
                                     ((0,) + _shift(self.a_batch), (0,) + _shift(self.g_batch))))
        return lax.transpose(out, (0,) + _shift(self.to_w))

    def weighted_sum(self, acts, g):
        (a,) = acts
        out = lax.dot_general(a, g, (((0,) + _shift(self.a_free), (0,) + _shift(self.g_afree)),
                                     (_shift(self.a_batch), _shift(self.g_batch))))
        return lax.transpose(out, self.to_w)

    def example_inputs(self, size, rng, xp):
        return [_random(rng, xp, (size,) + self.a_aval.shape, self.a_aval.dtype)], \
            _random(rng, xp, (size,) + self.out_aval.shape, self.out_aval.dtype)


class _Conv(_Layer):
    """The weight of ``conv(x, W[, bias])``, regular or transposed."""

    needs = (0,)

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        p = eqn.params
        self.static = dict(p)
        self.x_aval = eqn.inputs[0].aval
        n, c = self.x_aval.shape[:2]
        o = self.out_aval.shape[1]
        groups = p["groups"]
        taps = _prod(self.w_aval.shape[2:])
        if p["transposed"]:
            positions = _prod(self.x_aval.shape[2:])
            self.dims = (groups, n * positions, (o // groups) * taps, c // groups)
        else:
            positions = _prod(self.out_aval.shape[2:])
            self.dims = (groups, n * positions, (c // groups) * taps, o // groups)
        self.unfolded = self.dims[0] * self.dims[1] * self.dims[2]

    def _conv_params(self):
        return {k: self.static[k] for k in ("stride", "padding", "dilation", "transposed", "output_padding", "groups")}

    def ghost_sq_norms(self, acts, g):
        (x,) = acts
        p = self.static
        size = core.shape_of(x)[0]
        n, c = self.x_aval.shape[:2]
        o = self.out_aval.shape[1]
        groups = p["groups"]
        kernel = self.w_aval.shape[2:]
        # ∇W = U(source)ᵀ · target per group, at the positions of target: a regular conv
        # unfolds its input against g; a transposed conv is the regular conv from its output
        # to its input, so it unfolds g against x
        if p["transposed"]:
            source, source_ch, target, target_ch, positions = g, o, x, c, self.x_aval.shape[2:]
        else:
            source, source_ch, target, target_ch, positions = x, c, g, o, self.out_aval.shape[2:]
        t = _prod(positions)
        u = _unfold(_fold_batch(source), kernel, p["stride"], p["padding"], p["dilation"], positions)
        u = lax.reshape(u, (size, n, groups, source_ch // groups, _prod(kernel), t))
        gram_u = lax.dot_general(u, u, (((3, 4), (3, 4)), ((0, 2), (0, 2))))      # (B, G, N, T, N, T)
        v = lax.reshape(target, (size, n, groups, target_ch // groups, t))
        gram_v = lax.dot_general(v, v, (((3,), (3,)), ((0, 2), (0, 2))))         # (B, G, N, T, N, T)
        return _batched_inner(gram_u, gram_v)

    def per_example_grads(self, acts, g):
        (x,) = acts
        params = self._conv_params()
        shape = self.w_aval.shape
        return api.vmap(lambda gb, xb: lax.conv_backward_weight(gb, xb, shape, **params))(g, x)

    def weighted_sum(self, acts, g):
        (x,) = acts
        return lax.conv_backward_weight(_fold_batch(g), _fold_batch(x), self.w_aval.shape, **self._conv_params())

    def example_inputs(self, size, rng, xp):
        return [_random(rng, xp, (size,) + self.x_aval.shape, self.x_aval.dtype)], \
            _random(rng, xp, (size,) + self.out_aval.shape, self.out_aval.dtype)


class _ConvBias(_Layer):
    """The bias of ``conv(x, W, bias)``: its per-example gradient sums g over N and the
    positions (explicit only)."""

    has_ghost = False
    dims = (1, 1, 1, 1)

    def per_example_grads(self, acts, g):
        rank = len(core.shape_of(g))
        return lax.reduce_sum(g, (1,) + tuple(range(3, rank)))


class _Bias(_Layer):
    """A parameter added to an activation of the output's shape, broadcast along the other
    dims (a dense layer's ``y + b``): its per-example gradient sums g over those dims
    (explicit only: it has the parameter's size)."""

    has_ghost = False
    dims = (1, 1, 1, 1)

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        out, w = self.out_aval.shape, self.w_aval.shape
        lead = len(out) - len(w)
        self.flow = 1 - operand   # the operand the cotangent flows through unchanged
        self.axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(w) if s == 1 and out[lead + i] != 1)

    def per_example_grads(self, acts, g):
        size = core.shape_of(g)[0]
        if self.axes:
            g = lax.reduce_sum(g, _shift(self.axes))
        return lax.reshape(g, (size,) + self.w_aval.shape)


class _Take(_Layer):
    """The table of ``take(W, idx, axis)`` (an embedding lookup)."""

    needs = (1,)

    def __init__(self, eqn_index, eqn, operand):
        super().__init__(eqn_index, eqn, operand)
        self.axis = eqn.params["axis"]
        self.static = dict(eqn.params)
        self.idx_aval = eqn.inputs[1].aval
        shape = self.w_aval.shape
        self.rows = shape[self.axis]
        self.lookups = _prod(self.idx_aval.shape)
        self.row_size = _prod(shape[:self.axis] + shape[self.axis + 1:])

    def costs(self):
        t, r, n = self.lookups, self.row_size, self.rows
        ghost = t * t * r + _ELEMENT_COST * (2 * t * t + 2 * t * r)
        explicit = _ELEMENT_COST * (3 * n * r + t * r)
        return ghost, explicit

    @property
    def dims(self):
        return (1, self.lookups, self.rows, self.row_size)

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
        rows = self._idx_first(g)
        gram = lax.dot_general(rows, rows, (((2,), (2,)), ((0,), (0,))))
        return _batched_inner(same, gram)

    def per_example_grads(self, acts, g):
        (idx,) = acts
        scatter = _primitives().take_transpose
        axis, shape = self.axis, self.w_aval.shape
        return api.vmap(lambda gb, ib: scatter.bind(gb, ib, axis=axis, shape=shape))(g, idx)

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
        return _primitives().take_transpose.bind(g, flat, axis=self.axis, shape=shape)

    def example_inputs(self, size, rng, xp):
        idx = xp.asarray(rng.integers(0, max(self.rows, 1), (size,) + self.idx_aval.shape).astype(self.idx_aval.dtype))
        return [idx], _random(rng, xp, (size,) + self.out_aval.shape, self.out_aval.dtype)


def _random(rng, xp, shape, dtype):
    return xp.asarray(rng.standard_normal(shape).astype(dtype))


def _fold_batch(x):
    """``(B, N, ...)`` -> ``(B·N, ...)``."""
    s = tuple(core.shape_of(x))
    return lax.reshape(x, (s[0] * s[1],) + s[2:])


def _unfold(x, kernel, stride, padding, dilation, positions):
    """The patches of ``x`` ``(M, C, S...)`` that a convolution with ``kernel``, ``stride``,
    ``padding`` (zeros) and ``dilation`` reads at its first ``positions`` output positions:
    ``(M, C, prod(kernel), prod(positions))``, ``u[m, c, k, t] = x_pad[m, c, t·s + k·d]``."""
    nd = len(kernel)
    shape = tuple(core.shape_of(x))
    x = lax.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding))
    taps = []
    for k in np.ndindex(*kernel):
        slices = [(0, shape[0], 1), (0, shape[1], 1)]
        for j in range(nd):
            start = k[j] * dilation[j]
            slices.append((start, start + (positions[j] - 1) * stride[j] + 1, stride[j]))
        taps.append(lax.slice(x, slices))
    u = cnp.stack(taps, axis=2)
    return lax.reshape(u, shape[:2] + (len(taps), _prod(positions)))


# ---------------------------------------------------------------------------------------
# Analysis: each parameter's uses in the per-example program
# ---------------------------------------------------------------------------------------


class _Param:
    """How one parameter leaf is differentiated: ``uses`` (pairs of a :class:`_Layer` and
    the chain of view equations from the parameter to the used value), ``fallback`` (used
    any other way: NOTE [ghost clipping]), or neither (unused)."""

    __slots__ = ("uses", "fallback")

    def __init__(self):
        self.uses = []
        self.fallback = False


class _Other(Exception):
    """A use the transform does not read (the parameter falls back)."""


def _is_view(eqn, prims):
    """A norm-preserving view of its one operand: transpose, reshape, squeeze,
    expand_dims, or a conversion between floating dtypes."""
    if len(eqn.inputs) != 1 or eqn.primitive.multiple_results:
        return False
    p = eqn.primitive
    if p is prims.transpose or p in prims.reshapes:
        return True
    return p is prims.convert and eqn.inputs[0].aval.dtype.kind == "f" and eqn.outs[0].aval.dtype.kind == "f"


def _layer_for(eqn_index, eqn, operand, prims):
    p = eqn.primitive
    if p is prims.add and eqn.inputs[1 - operand].aval.shape == eqn.outs[0].aval.shape:
        return _Bias(eqn_index, eqn, operand)
    if p is prims.dot_general:
        return _Dot(eqn_index, eqn, operand)
    if p is prims.conv and operand == 1:
        return _Conv(eqn_index, eqn, operand)
    if p is prims.conv and operand == 2:
        return _ConvBias(eqn_index, eqn, operand)
    if p is prims.take and operand == 0:
        return _Take(eqn_index, eqn, operand)
    raise _Other


def _collect_uses(var, chain, consumers, jaxpr, outvars, prims):
    uses = []
    if var in outvars:
        raise _Other
    for eqn_index, operand in consumers.get(var, ()):
        eqn = jaxpr.eqns[eqn_index]
        if sum(1 for x in eqn.inputs if x is var) > 1:
            raise _Other
        if _is_view(eqn, prims):
            uses += _collect_uses(eqn.outs[0], chain + (eqn,), consumers, jaxpr, outvars, prims)
        else:
            uses.append((_layer_for(eqn_index, eqn, operand, prims), chain))
    return uses


def _analyse(jaxpr, num_params):
    """A :class:`_Param` for each of the program's first ``num_params`` inputs, and the
    consumers of each variable (``{var: [(equation index, operand index)]}``)."""
    prims = _primitives()
    consumers = {}
    for k, eqn in enumerate(jaxpr.eqns):
        for i, x in enumerate(eqn.inputs):
            if type(x) is ir.Var:
                consumers.setdefault(x, []).append((k, i))
    outvars = {v for v in jaxpr.outvars if type(v) is ir.Var}
    plans = []
    for var in jaxpr.invars[:num_params]:
        plan = _Param()
        try:
            plan.uses = _collect_uses(var, (), consumers, jaxpr, outvars, prims)
        except _Other:
            plan.fallback = True
        plans.append(plan)
    return plans, consumers


def _pull_back(chain, ct, batched):
    """The cotangent of a parameter from that of its view at the end of ``chain`` (each view
    is linear and its transpose undoes it); ``batched``: ``ct`` has a leading batch dim."""
    prims = _primitives()
    lead = tuple(core.shape_of(ct)[:1]) if batched else ()
    for eqn in reversed(chain):
        aval = eqn.inputs[0].aval
        if eqn.primitive is prims.transpose:
            inverse = tuple(int(i) for i in np.argsort(eqn.params["permutation"]))
            ct = lax.transpose(ct, (0,) + _shift(inverse) if batched else inverse)
        elif eqn.primitive is prims.convert:
            ct = lax.convert_element_type(ct, aval.dtype)
        else:
            ct = lax.reshape(ct, lead + aval.shape)
    return ct


# ---------------------------------------------------------------------------------------
# Choosing ghost or explicit per layer
# ---------------------------------------------------------------------------------------


def _choose(layer, method, size, device):
    """``"ghost"`` or ``"per_example"`` for a parameter's only use (NOTE [ghost clipping])."""
    if not layer.has_ghost or method == "per_example":
        return "per_example"
    if method == "ghost":
        return "ghost"
    ghost, explicit = layer.costs()
    if ghost * _CLOSE <= explicit or size == 0:
        return "ghost" if ghost <= explicit else "per_example"
    if explicit * _CLOSE <= ghost:
        return "per_example"
    bucket = 1 << (size - 1).bit_length()   # the power of two at or above the batch size
    key = layer.key() + (device or "cpu", bucket)
    with _measure_lock:
        hit = _measured.get(key)
    if hit is not None:
        return hit[0]
    times = _time_both(layer, bucket, device or "cpu")
    choice = min(times, key=times.get)
    with _measure_lock:
        _measured[key] = (choice, times)
    return choice


def _time_both(layer, size, device):
    """Milliseconds of each method's work for ``layer`` (norms, then the weighted sum) on
    random operands of its shapes for a batch of ``size``, on ``device``: the faster of two
    calls after a warm-up call (CUDA events on the GPU)."""
    xp = backend.xp_for("gpu" if device.startswith("gpu") else "cpu")
    rng = np.random.default_rng(0)
    acts, g = layer.example_inputs(size, rng, xp)
    weights = xp.asarray(rng.random(size).astype(g.dtype))

    def ghost():
        layer.ghost_sq_norms(acts, g)
        layer.weighted_sum(acts, cnp.multiply(g, _per_row(weights, g)))

    def explicit():
        grads = layer.per_example_grads(acts, g)
        clipping.squared_norms([grads], size)
        cnp.tensordot(weights, grads, axes=1)

    # at trace time under jit: run the candidates, do not stage them
    with core.staging(None):
        return {"ghost": _time_call(ghost, xp), "per_example": _time_call(explicit, xp)}


def _time_call(fn, xp):
    if xp is not np:
        from cuvmap.cuda import device as cuda_device

        return cuda_device.time_gpu(fn, repeats=2)
    fn()
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def _per_row(weights, like):
    """``weights`` ``(B,)`` shaped to broadcast along the rows of ``like`` ``(B, ...)``, in its dtype."""
    rank = len(core.shape_of(like))
    return cnp.astype(lax.reshape(weights, tuple(core.shape_of(weights)) + (1,) * (rank - 1)), core.dtype_of(like))


# ---------------------------------------------------------------------------------------
# The forward and backward pass
# ---------------------------------------------------------------------------------------


class _Tap:
    """An equation with recognised uses (``layers``). ``operands``: the operands its layers
    read; ``from_batch``: those that are a batch argument or a reshape of one, ``{operand:
    (batch leaf, per-example shape)}``, read from the batch itself instead of being kept;
    ``z``: the index of the zero added to its output, or None where its output's cotangent
    is another tap's (``ct_from``, the equation whose z gives it)."""

    __slots__ = ("layers", "operands", "from_batch", "z", "ct_from")

    def __init__(self):
        self.layers = []
        self.operands = []
        self.from_batch = {}
        self.z = None
        self.ct_from = None


def _link_taps(jaxpr, taps, consumers, num_params):
    """Fills in the taps' ``from_batch``, ``ct_from`` and ``z``.

    A layer whose output feeds nothing but a bias added to it (``y = a ⋆ W``, then ``y + b``)
    has the cotangent of the sum, so it reads the bias tap's: one z and one cotangent for
    both (NOTE [ghost clipping])."""
    prims = _primitives()
    batch_view = {v: j for j, v in enumerate(jaxpr.invars[num_params:])}
    for eqn in jaxpr.eqns:
        if eqn.primitive in prims.reshapes and eqn.inputs[0] in batch_view:
            batch_view[eqn.outs[0]] = batch_view[eqn.inputs[0]]
    outvars = {v for v in jaxpr.outvars if type(v) is ir.Var}
    flows = {k: tap.layers[0].flow for k, tap in taps.items()
             if len(tap.layers) == 1 and isinstance(tap.layers[0], _Bias)}
    num_zs = 0
    for k, tap in taps.items():
        eqn = jaxpr.eqns[k]
        for i in tap.operands:
            x = eqn.inputs[i]
            if type(x) is ir.Var and x in batch_view:
                tap.from_batch[i] = (batch_view[x], x.aval.shape)
        target = k
        while True:
            out = jaxpr.eqns[target].outs[0]
            users = consumers.get(out, [])
            if out in outvars or len(users) != 1 or flows.get(users[0][0]) != users[0][1]:
                break
            target = users[0][0]
        tap.ct_from = target
    for k, tap in taps.items():
        if tap.ct_from == k:
            tap.z = num_zs
            num_zs += 1


def _eval_tapped(jaxpr, consts, args, taps, zs):
    """Evaluates ``jaxpr`` (binding each equation, as :func:`ir.eval_jaxpr`), adding
    ``zs[tap.z]`` to the output of each tap that has a z. Returns ``(outputs, kept)``:
    ``kept`` holds the taps' operands (but those read from the batch), in the order of ``taps``."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    kept = {}

    def read(v):
        return v.val if type(v) is ir.Literal else env[v]

    for k, eqn in enumerate(jaxpr.eqns):
        ins = [read(x) for x in eqn.inputs]
        out = eqn.primitive.bind(*ins, **eqn.params)
        tap = taps.get(k)
        if tap is not None:
            kept[k] = [ins[i] for i in tap.operands if i not in tap.from_batch]
            if tap.z is not None:
                out = cnp.add(out, zs[tap.z])
        if eqn.primitive.multiple_results:
            env.update(zip(eqn.outs, out))
        else:
            env[eqn.outs[0]] = out
    return [read(v) for v in jaxpr.outvars], [kept[k] for k in taps]


def _forward_backward(staged):
    """One batched forward pass and one backward pass. Returns ``(outputs, kept, cts,
    fallback_grads)``: the per-example outputs (losses, aux leaves), the taps' kept operands
    and the cotangents of the z's (a leading batch dim each), and the per-example gradients
    of the fallback parameters."""
    jaxpr, consts = staged.program.jaxpr, staged.program.consts
    param_leaves, batch_leaves, size, taps = staged.param_leaves, staged.batch_leaves, staged.size, staged.taps
    fallback = staged.fallback

    def per_example(fallback_vals, zs, batch):
        params = list(param_leaves)
        for i, v in zip(fallback, fallback_vals):
            params[i] = v
        outs, kept = _eval_tapped(jaxpr, consts, params + list(batch), taps, zs)
        return outs[0], (outs[1:], kept)

    batched = api.vmap(per_example)
    if not taps and not fallback:
        losses, (aux, kept) = batched([], [], batch_leaves)
        return [losses] + list(aux), kept, [], []
    # zeros on the batch's device, broadcast (no memory): the points the cotangents are taken at
    z_avals = [jaxpr.eqns[k].outs[0].aval for k, tap in taps.items() if tap.z is not None]
    zs = [cnp.broadcast_to(cnp.zeros((), a.dtype, like=batch_leaves[0]), (size,) + a.shape) for a in z_avals]
    copies = [cnp.broadcast_to(param_leaves[i], (size,) + tuple(core.shape_of(param_leaves[i]))) for i in fallback]

    def pass_(fallback_vals, zs_):
        losses, (aux, kept) = batched(fallback_vals, zs_, batch_leaves)
        return losses, (aux, kept)

    losses, pullback, (aux, kept) = api.vjp(pass_, copies, zs, has_aux=True)
    fallback_grads, cts = pullback(core.full_like_concrete(losses, 1))
    return [losses] + list(aux), list(kept), list(cts), list(fallback_grads)


# ---------------------------------------------------------------------------------------
# clipped_grad
# ---------------------------------------------------------------------------------------


def clipped_grad(loss, max_norm, *, method="auto", argnums=0, has_aux=False, tiny=1e-6):
    """The sum of clipped per-example gradients of ``loss`` and the per-example gradient
    norms, by ghost clipping and book-keeping (NOTE [ghost clipping]).

    ``clipped_grad(loss, C)(params, *batch, mask=m)`` returns ``ClippedGradient(summed,
    norms)`` with ``summed = Σ_b m_b · min(1, C / (‖g_b‖ + tiny)) · g_b`` (a pytree like
    ``params``) and ``norms[b] = ‖g_b‖``, ``g_b = grad(loss)(params, *example_b)``: the
    values of ``dp.clipped_sum(vmap(grad(loss))(params, *batch), C, mask=m,
    return_norms=True)``, without materialising the per-example gradients of dense,
    convolution and embedding weights where their norms have a cheaper form.

    Args:
      loss: the loss of ONE example, ``loss(params, *example) -> scalar`` (or ``(scalar,
        aux)`` with ``has_aux``), written exactly as for ``vmap(grad(loss))``.
      max_norm: the clipping bound ``C > 0``.
      method: ``"auto"`` (each layer's cost model, timed where close), ``"ghost"`` (ghost
        norms wherever a layer allows them) or ``"per_example"`` (every layer's explicit
        per-example gradient, from the same single backward pass).
      argnums: the argument(s) differentiated; every other positional argument is batched
        along axis 0 (a pytree of arrays with a common leading size ``B``, which may be 0).
      has_aux: ``loss`` returns ``(value, aux)``; the per-example aux comes back batched.
      tiny: added to the norms in the clip factor, as in :func:`cuvmap.dp.clipped_sum`.

    Returns:
      a function ``(params, *batch, mask=None)`` returning a
      :class:`~cuvmap.dp.ClippedGradient` ``(summed, norms)``, or ``(ClippedGradient,
      aux)`` with ``has_aux``. ``mask``: ``(B,)`` weights (1 real, 0 padding; bool or
      float), as :func:`cuvmap.dp.pad_batch` returns. It works eagerly and under ``jit``, on
      NumPy and CuPy arrays; :func:`cuvmap.dp.private_gradient` takes its result. Its
      ``methods(params, *batch)`` says how each parameter leaf is differentiated.

    As under ``jit``, ``loss`` is traced (on one example's shapes) once per argument
    structure and per-example shapes, whatever the batch size: Python side effects in it run
    then, and arrays it closes over are read then (pass arrays that change as arguments).

    Example::

        clipped = dp.clipped_grad(loss, 1.0)
        summed, norms = clipped(params, xs, ys, mask=mask)
        g = dp.private_gradient(clipped(params, xs, ys), 1.0, 1.1, noise=z, expected_batch_size=256)
    """
    api_util.check_callable(loss, "clipped_grad")
    name = api_util.fun_name(loss)
    where = f"clipped_grad({name})"
    if not max_norm > 0:
        raise TransformError(f"{where}: max_norm must be positive, got {max_norm!r}")
    if method not in _METHODS:
        raise TransformError(f"{where}: method must be one of {', '.join(map(repr, _METHODS))}, got {method!r}")

    # per-example programs by argument structure and per-example avals, and their lock
    cache = ({}, threading.Lock())

    @api_util.with_context(where, loss)
    def clipped(*args, mask=None):
        return _clipped(loss, where, args, mask, float(max_norm), method, argnums, has_aux, tiny, cache)

    @api_util.with_context(where, loss)
    def methods(*args):
        """How each parameter leaf of ``args`` would be differentiated, a pytree like the
        parameters: ``"ghost"``, ``"per_example"``, ``"per_example, k uses"`` (a parameter
        used k times), ``"vmap"`` (used some other way) or ``"unused"`` (NOTE [ghost
        clipping])."""
        return _Staged(loss, where, args, method, argnums, has_aux, cache).methods()

    clipped.methods = methods
    return clipped


class _Program:
    """The per-example program of a loss for one argument structure and per-example avals,
    and how each parameter leaf is used in it: what does not depend on the batch size, so
    one serves every batch (:data:`_PROGRAMS_KEPT` of them are kept per function)."""

    def __init__(self, program, params, taps, fallback, out_tree):
        self.program, self.params, self.taps, self.fallback, self.out_tree = program, params, taps, fallback, out_tree


#: per-example programs a clipped_grad function keeps (argument structures and shapes met)
_PROGRAMS_KEPT = 8


class _Staged:
    """A call: its parameter and batch leaves, the per-example program (traced, or found in
    ``cache``, a pair of a dict and its lock), and the method of each parameter with one use for this batch size."""

    def __init__(self, loss, where, args, method, argnums, has_aux, cache):
        self.single, nums = api_util.normalize_argnums(loss, argnums, len(args))
        api_util.check_float_inputs(loss, args, nums, "clipped_grad")
        batch_nums = [i for i in range(len(args)) if i not in nums]
        if not batch_nums:
            raise TransformError(f"{api_util.fun_name(loss)} was called with no batch argument: every positional "
                                 "argument not in argnums is a batch of examples along axis 0")
        param_paths, self.param_leaves, self.param_tree = tree.flatten_with_path(tuple(args[i] for i in nums))
        param_paths = [(0, nums[p[0]]) + tuple(p[1:]) for p in param_paths]
        batch_paths, self.batch_leaves, batch_tree = tree.flatten_with_path(tuple(args[i] for i in batch_nums))
        batch_paths = [(0, batch_nums[p[0]]) + tuple(p[1:]) for p in batch_paths]
        _, self.size = api_util.check_mapped_sizes(loss, batch_paths, self.batch_leaves,
                                                   [0] * len(self.batch_leaves), None)
        # the per-example program: the parameters, then one example of the batch
        avals = [api_util.leaf_aval(loss, p, x, where) for p, x in zip(param_paths, self.param_leaves)]
        for p, x in zip(batch_paths, self.batch_leaves):
            a = api_util.leaf_aval(loss, p, x, where)
            avals.append(core.ShapedArray(a.shape[1:], a.dtype, False, a.device))
        key = (tree.structure(args), tuple(avals))
        programs, lock = cache
        with lock:
            program = programs.get(key)
        if program is None:
            program = _trace(loss, where, args, nums, batch_nums, self.param_tree, batch_tree,
                             param_paths + batch_paths, avals, has_aux)
            if not any(isinstance(c, core.Tracer) for c in program.program.consts):
                # (a program holding tracers of this call's transforms is for this call only)
                with lock:
                    while len(programs) >= _PROGRAMS_KEPT:
                        programs.pop(next(iter(programs)))
                    programs[key] = program
        self.program, self.params, self.taps = program.program, program.params, program.taps
        self.fallback, self.out_tree = program.fallback, program.out_tree
        device = avals[0].device if avals else None
        self.method = [_choose(plan.uses[0][0], method, self.size, device)
                       if not plan.fallback and len(plan.uses) == 1 else None for plan in self.params]

    def methods(self):
        """How each parameter leaf is differentiated, a pytree like the parameters."""
        names = []
        for plan, method in zip(self.params, self.method):
            if plan.fallback:
                names.append("vmap")
            elif not plan.uses:
                names.append("unused")
            elif len(plan.uses) == 1:
                names.append(method)
            else:
                names.append(f"per_example, {len(plan.uses)} uses")
        out = tree.unflatten(self.param_tree, names)
        return out[0] if self.single else out


def _trace(loss, where, args, nums, batch_nums, param_tree, batch_tree, paths, avals, has_aux):
    """Stages the per-example loss on ``avals`` (the parameter leaves, then one example's
    batch leaves) and reads each parameter's uses: a :class:`_Program`."""
    num_params = param_tree.num_leaves

    def rebuild(traced):
        full = list(args)
        for i, v in zip(nums, tree.unflatten(param_tree, list(traced[:num_params]))):
            full[i] = v
        for i, v in zip(batch_nums, tree.unflatten(batch_tree, list(traced[num_params:]))):
            full[i] = v
        return full, {}

    def per_example(*full):
        value, aux = api_util.split_aux(loss, loss(*full), has_aux)
        leaves = tree.leaves(value)
        if len(leaves) != 1 or leaves[0] is not value or core.shape_of(value) != () or not core.is_float(value):
            raise TransformError(f"{api_util.fun_name(loss)} must return a float scalar per example (the loss "
                                 f"of one example), got {tree.describe(value)}")
        return value, aux

    per_example.__name__ = api_util.fun_name(loss)
    closed, out_tree = api_util.trace_program(per_example, where, None, paths, avals, rebuild)
    program = ir.optimize(closed)
    params, consumers = _analyse(program.jaxpr, num_params)
    taps = {}
    for plan in params:
        for layer, _ in ([] if plan.fallback else plan.uses):
            tap = taps.setdefault(layer.eqn_index, _Tap())
            tap.layers.append(layer)
            tap.operands.extend(i for i in layer.needs if i not in tap.operands)
    taps = dict(sorted(taps.items()))
    _link_taps(program.jaxpr, taps, consumers, num_params)
    fallback = [i for i, plan in enumerate(params) if plan.fallback]
    return _Program(program, params, taps, fallback, out_tree)


def _clipped(loss, where, args, mask, max_norm, method, argnums, has_aux, tiny, cache):
    staged = _Staged(loss, where, args, method, argnums, has_aux, cache)
    size = staged.size
    if mask is not None and tuple(core.shape_of(mask)) != (size,):
        raise TransformError(f"mask has shape {tuple(core.shape_of(mask))}, but the batch has {size} examples "
                             f"(the mask needs shape ({size},))")
    outs, kept, cts, fallback_grads = _forward_backward(staged)
    summed, norms = _clip_and_sum(staged, outs[0], kept, cts, fallback_grads, mask, max_norm, tiny)
    del kept, cts, fallback_grads
    summed = tree.unflatten(staged.param_tree, [api_util.to_array_result(s) for s in summed])
    result = clipping.ClippedGradient(summed[0] if staged.single else summed, api_util.to_array_result(norms))
    if not has_aux:
        return result
    return result, tree.unflatten(staged.out_tree, outs)[1]


class _TapValues:
    """The batched operands and output cotangent of each tap, released (set free for the
    allocator) as soon as the last layer that reads them is done."""

    def __init__(self, staged, kept, cts):
        self.values, self.cts, self.readers = {}, {}, {}
        for t, (k, tap) in enumerate(staged.taps.items()):
            own = iter(kept[t])
            self.values[k] = {}
            for i in tap.operands:
                if i in tap.from_batch:
                    j, shape = tap.from_batch[i]
                    self.values[k][i] = lax.reshape(staged.batch_leaves[j], (staged.size,) + shape)
                else:
                    self.values[k][i] = next(own)
            kept[t] = None
            self.cts[k] = cts[staged.taps[tap.ct_from].z]
            self.readers[k] = len(tap.layers)
        cts[:] = [None] * len(cts)

    def inputs(self, layer):
        k = layer.eqn_index
        return [self.values[k][i] for i in layer.needs], self.cts[k]

    def done(self, layer):
        k = layer.eqn_index
        self.readers[k] -= 1
        if not self.readers[k]:
            del self.values[k], self.cts[k]


def _clip_and_sum(staged, losses, kept, cts, fallback_grads, mask, max_norm, tiny):
    """The per-example norms over every parameter, then each parameter's clipped sum. The
    lists ``kept``, ``cts`` and ``fallback_grads`` are emptied, so that each array is freed
    when its last use is done."""
    taps = _TapValues(staged, kept, cts)
    size, param_leaves = staged.size, staged.param_leaves
    squares = []
    ghost, explicit = [], []   # (param, layer, chain) and [param, per-example grads, chain]
    for i, plan in enumerate(staged.params):
        if plan.fallback:
            j = staged.fallback.index(i)
            explicit.append([i, fallback_grads[j], ()])
            fallback_grads[j] = None
        elif len(plan.uses) == 1 and staged.method[i] == "ghost":
            layer, chain = plan.uses[0]
            squares.append(layer.ghost_sq_norms(*taps.inputs(layer)))
            ghost.append((i, layer, chain))
        elif len(plan.uses) == 1:
            layer, chain = plan.uses[0]
            explicit.append([i, layer.per_example_grads(*taps.inputs(layer)), chain])
            taps.done(layer)
        elif plan.uses:
            # several uses: the sum of the uses' gradients (cross terms included), in W's layout
            total = None
            for layer, chain in plan.uses:
                g_use = _pull_back(chain, layer.per_example_grads(*taps.inputs(layer)), batched=True)
                taps.done(layer)
                total = g_use if total is None else cnp.add(total, g_use)
            explicit.append([i, total, ()])
    for _, grads, _ in explicit:
        squares.append(clipping.squared_norms([grads], size))
    if squares:
        total = squares[0]
        for s in squares[1:]:
            total = cnp.add(total, s)
        norms = cnp.sqrt(cnp.maximum(total, 0))
    else:  # no parameter reaches the loss
        norms = cnp.zeros_like(losses)
    scale = clipping.clip_scale(norms, max_norm, tiny, mask)
    summed = [None] * len(param_leaves)
    # the explicit sums first: a bias's per-example gradients may be its tap's cotangents,
    # which the ghost layer's sum then releases
    for entry in explicit:
        i, grads, chain = entry
        entry[1] = None
        summed[i] = _pull_back(chain, cnp.tensordot(cnp.astype(scale, core.dtype_of(grads)), grads, axes=1),
                               batched=False)
        del grads
    for i, layer, chain in ghost:
        acts, g = taps.inputs(layer)
        weighted = layer.weighted_sum(acts, cnp.multiply(g, _per_row(scale, g)))
        del acts, g
        taps.done(layer)
        summed[i] = _pull_back(chain, weighted, batched=False)
    for i, leaf in enumerate(param_leaves):
        if summed[i] is None:
            summed[i] = cnp.zeros_like(leaf)
        elif core.dtype_of(summed[i]) != core.dtype_of(leaf):
            summed[i] = cnp.astype(summed[i], core.dtype_of(leaf))
    return summed, norms
