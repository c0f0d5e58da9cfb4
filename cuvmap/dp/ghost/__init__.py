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

The package stages the per-example loss (as ``jit`` does), finds the parameters' uses in
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
from cuvmap.dp.ghost.choice import clear_measured_choices, measured_choices  # noqa: F401
from cuvmap.dp.ghost.clipped_grad import clipped_grad  # noqa: F401
from cuvmap.dp.ghost.rules import RULES, Rule, rule  # noqa: F401

# NOTE [ghost clipping]
# The per-example loss is staged on one example's avals (a program whose inputs are the
# parameter leaves and one example of the batch), and each parameter's uses are read off
# its equations, following norm-preserving views (transpose, reshape, squeeze,
# expand_dims, a float conversion: analysis.VIEWS) from the parameter to the equation
# that uses it, where the rule registered for (primitive, operand) in rules.RULES reads it
# (a use no rule matches makes the parameter fall back, below):
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
#   mul(x̂, γ) with γ broadcast against x̂ (LayerNorm's and GroupNorm's scale, any affine
#     scale): ∇_γ L_b sums x̂_b ⊙ g_b over the broadcast dims, always explicit (γ's size).
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
# ELEMENT_COST multiply-adds (memory traffic, not arithmetic, bounds the explicit path):
#   ghost     H·T²·(d + p) for the two Grams, 2·H·T² elements (their product), H·T·d for
#             an unfolded conv input, plus book-keeping's batched GEMM H·T·d·p;
#   explicit  H·T·d·p for the per-example gradient, 3·H·d·p elements (written, squared,
#             summed with the clip weights);
#   (take: ghost T²·R + T²; explicit 3·n·R elements, for a table of n rows of R numbers).
# Ghost wins by far on dense layers without positions (T = 1: d + p against d·p) and loses
# on early conv layers (T² ≫ d·p, fastDP's rule 2T² < p·d is the same comparison). Where
# the two estimates are within a factor CLOSE of each other, method="auto" times both on
# random operands of the layer's shapes on its device the first time it meets the layer
# (batch size bucketed to a power of two) and keeps the faster, in the MeasuredChoices
# table kind the conv strategy uses (NOTE [conv strategy]); measured_choices() lists what
# it measured. Under cv.config.deterministic nothing is timed: the lower estimate wins
# (NOTE [reproducible runs]). method="ghost" takes
# the ghost norm wherever the use allows one, method="per_example" the explicit gradient
# everywhere.
#
# Fallback: a parameter that is used more than once (tied weights, a weight used twice:
# the norm then has cross terms between the uses) gets its explicit per-example gradient
# as the sum of its uses' a_bᵀ g_b, from the same a and g. A parameter used in any other
# way (an exponent, an operand of a custom derivative or a checkpointed region, an output
# of the loss, the lhs of a convolution) enters the batched pass as B
# broadcast copies, and the vjp gives its per-example gradient directly: the vmap(grad)
# path for that parameter only. Unused parameters get zeros.
#
# Non-finite examples: with nan_safe=True an example whose norm is not finite (a NaN or an
# infinity in its gradient, or a squared norm past the dtype's range) gets the clip weight
# 0, and its rows of every operand of the sums (the explicit per-example gradients, a ghost
# layer's a and g) are set to 0 before they are summed, since 0 · NaN is NaN: the sum is
# the other examples', and the dropped example's sensitivity is 0 ≤ C.

# NOTE [ghost norms without overflow]
# The Grams of a and g hold products of their entries: float32 activations of 1e19 give
# ‖a_b‖² = inf, and where the layer's cotangent is exactly 0 (a saturated tanh after it)
# the ghost norm would be inf · 0 = NaN although the per-example gradient a_bᵀ g_b is 0.
# So each ghost rule divides a_b and g_b by their largest magnitudes m_a, m_g (rules.
# scaled_rows; 1 for an all-zero row), takes the Grams of the scaled rows (entries at most
# T·d), and returns ((√⟨Â Âᵀ, Ĝ Ĝᵀ⟩ · m_a) · m_g)² (rules.unscaled): 0 where m_g = 0, and
# out of range only where ‖a_bᵀ g_b‖² is (as the explicit path's squared norms are) or
# where ‖a_b‖ itself is. It costs one max-reduction and one division over a and g per
# ghost layer.


# NOTE [user norms from factored gradients]
# Under user-level clipping (clipped_grad(loss, C)(params, *batch, users=u), NOTE [clipping
# by group and by user] in cuvmap/dp/clipping.py) the norm that is clipped is a user's,
# ‖Σ_{b∈u} m_b ∇_W L_b‖, the norm of a sum of per-example gradients, which the per-example
# ghost norms do not give. For a factored layer (∇_W L_b = A_bᵀ G_b per batch index h)
#     ‖Σ_{b∈u} m_b A_bᵀ G_b‖² = Σ_{b,b'∈u} m_b m_b' ⟨A_b A_b'ᵀ, G_b G_b'ᵀ⟩:
# the ghost norm of one "example" whose positions are all its user's examples' positions.
# The T×T Grams of one example become the (B·T)×(B·T) Grams of the whole batch, of which
# the pairs of one user are kept and summed per user slot (rules.Dot.ghost_user_sq_norms,
# rows scaled as in NOTE [ghost norms without overflow], the cross terms by both examples'
# scales). That costs H·(B·T)²·(d + p): quadratic in the batch instead of linear, so the
# cost model (Rule.user_costs, estimates only, nothing timed) takes it for wide dense
# layers without positions (T = 1) while B·(d + p) stays below d·p, and otherwise the
# explicit form: the layer's per-example gradients from the same backward pass, summed per
# user by one scatter-add into B user slots. Rules without a user form (convolutions,
# embeddings, biases, scales, tied and fallback parameters) always take the explicit form;
# a conv's user Gram would need its unfolded positions across examples, a block of
# (B·positions)² entries. Book-keeping carries over unchanged: Σ_u s_u G_u = Σ_b s_{u_b} m_b
# ∇L_b, so a ghost layer's clipped sum is its batched weight gradient with every cotangent
# weighted by its user's clip factor; no per-user gradient of a ghost layer exists. With
# nan_safe a user whose norm is not finite is dropped, every one of its examples zeroed.
