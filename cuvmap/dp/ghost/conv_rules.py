r"""Ghost clipping's rules for the convolution family (every case of functorch's
``BatchRulesConvolution.cpp``: groups, stride, padding, dilation, 1-3 spatial dims,
transposed), registered into :data:`cuvmap.dp.ghost.rules.RULES`.

With ``U(x)`` the unfolded input (``N·positions × C/groups·kernel`` per group),
``∇_W L_b = U(x)ᵀ G`` per group and the ghost norm is ``Σ_g ⟨U Uᵀ, G Gᵀ⟩``. A transposed
convolution's weight gradient is the regular one's with ``x`` and the output's cotangent
swapped: there ``U`` unfolds the cotangent (at the input's positions) and ``x`` plays ``G``.
Book-keeping: ``conv_backward_weight`` of the re-weighted cotangents, the batch folded into
``N``. The bias: ``∇_b L_b = Σ_{N, positions} g_b``, always explicit (``O`` numbers).
"""
import numpy as np

from cuvmap import api, core, lax
from cuvmap import numpy as cnp
from cuvmap.dp.ghost.rules import Rule, batched_inner, prod, random_array, rule, scaled_rows, unscaled
from cuvmap.lax import convolution
from cuvmap.lax import indexing as lax_indexing

_CONV_PARAMS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def fold_batch(x):
    """``(B, N, ...)`` -> ``(B·N, ...)``."""
    s = tuple(core.shape_of(x))
    return lax.reshape(x, (s[0] * s[1],) + s[2:])


def unfold(x, kernel, stride, padding, dilation, positions):
    """The patches of ``x`` ``(M, C, S...)`` that a convolution with ``kernel``, ``stride``,
    ``padding`` (zeros) and ``dilation`` reads at its first ``positions`` output positions:
    ``(M, C, prod(kernel), prod(positions))``, ``u[m, c, k, t] = x_pad[m, c, t·s + k·d]``."""
    nd = len(kernel)
    shape = tuple(core.shape_of(x))
    x = lax.pad(x, 0.0, ((0, 0, 0), (0, 0, 0)) + tuple((p, p, 0) for p in padding))
    taps = []
    for k in np.ndindex(*kernel):
        slices = [(0, shape[0], 1), (0, shape[1], 1)]
        for j in range(nd):
            start = k[j] * dilation[j]
            slices.append((start, start + (positions[j] - 1) * stride[j] + 1, stride[j]))
        taps.append(lax_indexing.slice(x, slices))
    u = cnp.stack(taps, axis=2)
    return lax.reshape(u, shape[:2] + (len(taps), prod(positions)))


@rule(convolution.conv_p, 1)
class Conv(Rule):
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
        taps = prod(self.w_aval.shape[2:])
        if p["transposed"]:
            positions = prod(self.x_aval.shape[2:])
            self.dims = (groups, n * positions, (o // groups) * taps, c // groups)
        else:
            positions = prod(self.out_aval.shape[2:])
            self.dims = (groups, n * positions, (c // groups) * taps, o // groups)
        self.unfolded = self.dims[0] * self.dims[1] * self.dims[2]

    def _conv_params(self):
        return {k: self.static[k] for k in _CONV_PARAMS}

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
        t = prod(positions)
        (source, m_source), (target, m_target) = scaled_rows(source), scaled_rows(target)
        u = unfold(fold_batch(source), kernel, p["stride"], p["padding"], p["dilation"], positions)
        u = lax.reshape(u, (size, n, groups, source_ch // groups, prod(kernel), t))
        gram_u = lax.dot_general(u, u, (((3, 4), (3, 4)), ((0, 2), (0, 2))))      # (B, G, N, T, N, T)
        v = lax.reshape(target, (size, n, groups, target_ch // groups, t))
        gram_v = lax.dot_general(v, v, (((3,), (3,)), ((0, 2), (0, 2))))         # (B, G, N, T, N, T)
        return unscaled(batched_inner(gram_u, gram_v), m_source, m_target)

    def per_example_grads(self, acts, g):
        (x,) = acts
        params = self._conv_params()
        shape = self.w_aval.shape
        return api.vmap(lambda gb, xb: lax.conv_backward_weight(gb, xb, shape, **params))(g, x)

    def weighted_sum(self, acts, g):
        (x,) = acts
        return lax.conv_backward_weight(fold_batch(g), fold_batch(x), self.w_aval.shape, **self._conv_params())

    def example_inputs(self, size, rng, xp):
        return [random_array(rng, xp, (size,) + self.x_aval.shape, self.x_aval.dtype)], \
            random_array(rng, xp, (size,) + self.out_aval.shape, self.out_aval.dtype)


@rule(convolution.conv_p, 2)
class ConvBias(Rule):
    """The bias of ``conv(x, W, bias)``: its per-example gradient sums g over N and the
    positions (explicit only)."""

    has_ghost = False

    def per_example_grads(self, acts, g):
        rank = len(core.shape_of(g))
        return lax.reduce_sum(g, (1,) + tuple(range(3, rank)))
