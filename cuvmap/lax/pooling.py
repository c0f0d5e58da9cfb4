"""The pooling family: ``max_pool``, ``avg_pool`` and their derivative primitives
``max_pool_gather``, ``max_pool_scatter`` and ``avg_pool_transpose``.

Layout ``N C S...`` with 1, 2 or 3 spatial dims; every channel of every example is pooled
on its own (a ``reduce_window`` over the spatial dims). With window ``k``, stride ``s``
and symmetric padding ``p`` per spatial dim, output position ``y`` reads the window

    W(y) = { y·s − p + t : 0 ≤ t < k }        (one tap ``t`` per window element)

of a padded input ``x̃`` (``x`` inside, the padding value outside), and

    max_pool(x)[n, c, y] = max_{i ∈ W(y)} x̃[n, c, i]                    x̃ = −∞ outside
    avg_pool(x)[n, c, y] = (1 / D(y)) · Σ_{i ∈ W(y)} x̃[n, c, i]         x̃ = 0 outside

with ``D(y) = Π k`` when ``count_include_pad`` (torch's default) and ``D(y)`` = the number
of taps of ``W(y)`` inside ``x`` otherwise. The output has ``⌊(S + 2p − k)/s⌋ + 1`` positions
per dim; padding is at most ``k // 2`` (as torch requires), so every window holds an element
of ``x``.

Derivatives. Let ``m = max_pool(x)`` be the window maxima and ``a(x, m)[n, c, y]`` the
*selected* position of window ``W(y)``: the first tap, in row-major tap order, where
``x̃[n, c, i] = m[n, c, y]`` (a NaN matching a NaN; see NOTE [max pool ties]); with
``m = max_pool(x)`` that is the first position attaining the maximum. Then

    max_pool_gather(t, x, m)[n, c, y] = t[n, c, a(x, m)[n, c, y]]                (gather; JVP of max_pool)
    max_pool_scatter(g, x, m)[n, c, i] = Σ_{y : a(x, m)[n, c, y] = i} g[n, c, y]  (scatter; VJP of max_pool)

(a window with no tap equal to ``m[y]`` gathers 0 and scatters nothing; that never happens
for ``m = max_pool(x)``). Both are linear in their first operand and adjoint to each other,
``⟨max_pool_gather(t, x, m), g⟩ = ⟨t, max_pool_scatter(g, x, m)⟩``, and piecewise constant
in ``x`` and ``m`` (their derivative there is zero wherever ``a`` is locally constant, i.e.
away from ties). So ``max_pool(x) = max_pool_gather(x, x, max_pool(x))``, its JVP is
``max_pool_gather(ẋ, x, y)`` and its VJP ``max_pool_scatter(ḡ, x, y)`` with ``y`` its own
output: the backward pass reads the maxima the forward computed instead of recomputing them
from ``x`` (NOTE [the maxima as a residual]). The gather and the scatter are each other's
transposes and pass ``x`` and ``m`` on unchanged, which closes the family under every
transform (``hessian``, ``vmap(grad)``, ``grad(grad)``).
``avg_pool`` is linear; its transpose ``avg_pool_transpose`` spreads ``g[y] / D(y)`` back over
``W(y)`` (accumulating where windows overlap), and the transpose of that is ``avg_pool``.

Batching: pooling is per (example, channel), so every batching rule folds the vmap dim into
``N`` (``B N -> (B N)``), runs one pooling call and splits it back out. An unbatched operand
beside a batched one is broadcast first (see NOTE [pooling batching]).

Impls (NumPy and CuPy alike, through ``xp``): one strided slice of the padded input per
window tap (``cuvmap/window.py``: the taps the im2col kernels unfold, reduced on the fly
instead), so the loop runs over the ``Π k`` taps, never over examples, channels or pixels.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax.elementwise import select_impl, select_into
from cuvmap.lru import LRU
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.transforms.batching import bdim_at_front, split_bdim_out_of
from cuvmap.window import interior, output_spatial, pad_spatial, padded_spatial, spatial_tuple, tap_slices, taps

# ---------------------------------------------------------------------------------------
# Declarations and public wrappers
# ---------------------------------------------------------------------------------------

max_pool_p = Primitive("max_pool")
max_pool_gather_p = Primitive("max_pool_gather")
max_pool_scatter_p = Primitive("max_pool_scatter")
avg_pool_p = Primitive("avg_pool")
avg_pool_transpose_p = Primitive("avg_pool_transpose")


def pool_params(nd, window, stride=None, padding=0):
    """Normalizes the static parameters of the pooling family to tuples of ``nd`` ints;
    ``stride=None`` means ``stride = window`` (non-overlapping windows, torch's default)."""
    window = spatial_tuple(window, nd, "window", "pooling")
    stride = window if stride is None else spatial_tuple(stride, nd, "stride", "pooling")
    return dict(window=window, stride=stride, padding=spatial_tuple(padding, nd, "padding", "pooling"))


def _nd_of(x):
    return len(core.shape_of(x)) - 2


def max_pool(x, window, stride=None, padding=0):
    """Max pooling over the spatial dims of ``x`` ``(N, C, S...)``.

    Args:
      x: ``(N, C, S...)``, 1-3 spatial dims, floating point.
      window: the window size, an int or one per spatial dim.
      stride: an int or one per spatial dim; ``None`` means ``window``.
      padding: symmetric padding per spatial dim (at most ``window // 2``); padded
        positions count as ``−∞``.
    Returns:
      ``(N, C, out...)`` with ``out = ⌊(S + 2·padding − window) / stride⌋ + 1``.

    Example::

        y = max_pool(x, 2)          # (8, 16, 28, 28) -> (8, 16, 14, 14)
    """
    return max_pool_p.bind(x, **pool_params(_nd_of(x), window, stride, padding))


def _maxima(x, m, params):
    return max_pool_p.bind(x, **params) if m is None else m


def max_pool_gather(t, x, m=None, *, window, stride, padding):
    """``t`` at the selected position (the first maximum) of each window of ``x``: the JVP
    of :func:`max_pool` at ``x`` in the direction ``t`` (``t`` has ``x``'s shape).

    Args:
      t: the tangent, shaped as ``x``.
      x: ``(N, C, S...)``.
      m: the window maxima ``max_pool(x)`` when the caller has them (the forward's output);
        ``None`` computes them. The selected position of window ``y`` is its first tap equal
        to ``m[y]`` (see the module docstring).
    Returns:
      ``(N, C, out...)``.
    """
    params = dict(window=window, stride=stride, padding=padding)
    return max_pool_gather_p.bind(t, x, _maxima(x, m, params), **params)


def max_pool_scatter(g, x, m=None, *, window, stride, padding):
    """Sends each ``g[n, c, y]`` to the selected position (the first maximum) of window ``y``
    of ``x``, summing where windows overlap: the VJP of :func:`max_pool` at ``x``.

    Args:
      g: the cotangent, shaped as ``max_pool(x)``.
      x: ``(N, C, S...)``.
      m: the window maxima ``max_pool(x)`` (the forward's output), or ``None`` to compute
        them; as for :func:`max_pool_gather`.
    Returns:
      ``x``'s shape.
    """
    params = dict(window=window, stride=stride, padding=padding)
    return max_pool_scatter_p.bind(g, x, _maxima(x, m, params), **params)


def avg_pool(x, window, stride=None, padding=0, count_include_pad=True):
    """Average pooling over the spatial dims of ``x`` ``(N, C, S...)``.

    Args:
      x, window, stride, padding: as for :func:`max_pool` (padded positions are zeros).
      count_include_pad: divide by the whole window size (torch's default) or, when False,
        by the number of window positions inside ``x``.
    Returns:
      ``(N, C, out...)``.
    """
    return avg_pool_p.bind(x, count_include_pad=bool(count_include_pad),
                           **pool_params(_nd_of(x), window, stride, padding))


def avg_pool_transpose(g, input_shape, *, window, stride, padding, count_include_pad):
    """The adjoint of :func:`avg_pool` for inputs of shape ``input_shape``: ``g[y] / D(y)``
    added onto every position of window ``y``."""
    return avg_pool_transpose_p.bind(
        g, input_shape=tuple(int(s) for s in input_shape), window=window, stride=stride, padding=padding,
        count_include_pad=count_include_pad)


# ---------------------------------------------------------------------------------------
# Shape rules
# ---------------------------------------------------------------------------------------


def pool_output_shape(input_shape, *, window, stride, padding):
    """Shape of a pooling output; raises :class:`ShapeError` naming the shapes."""
    input_shape = tuple(input_shape)
    nd = len(input_shape) - 2
    if nd not in (1, 2, 3):
        raise ShapeError(f"input of shape {input_shape} must be (N, C, spatial...) with 1, 2 or 3 spatial dims")
    if not len(window) == len(stride) == len(padding) == nd:
        raise ShapeError(
            f"window {window}, stride {stride} and padding {padding} need one entry per spatial dim ({nd}) "
            f"of the input {input_shape}")
    if any(k < 1 for k in window) or any(s < 1 for s in stride):
        raise ShapeError(f"window {window} and stride {stride} must be positive")
    if any(p < 0 or 2 * p > k for p, k in zip(padding, window)):
        raise ShapeError(f"padding {padding} must be between 0 and half the window {window}")
    out = output_spatial(input_shape[2:], window, stride, padding)
    if any(s + 2 * p < k for s, k, p in zip(input_shape[2:], window, padding)) or any(o < 1 for o in out):
        raise ShapeError(f"window {window} is larger than the padded input {input_shape} (padding {padding})")
    return input_shape[:2] + out


def _pool_shape_rule(x, *, window, stride, padding, **_):
    shape = pool_output_shape(x.shape, window=window, stride=stride, padding=padding)
    return ShapedArray(shape, core.common_float_dtype(x))


def _check_same_shape(a, b, what):
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{what} of shape {tuple(a.shape)} must have the shape of x {tuple(b.shape)}")


def _check_pooled(g, x, params):
    expected = pool_output_shape(x.shape, **params)
    if tuple(g.shape) != expected:
        raise ShapeError(f"cotangent of shape {tuple(g.shape)} must have the pooled shape {expected} of x "
                         f"{tuple(x.shape)}")


def _check_maxima(m, x, params):
    expected = pool_output_shape(x.shape, **params)
    if tuple(m.shape) != expected:
        raise ShapeError(f"window maxima of shape {tuple(m.shape)} must have the pooled shape {expected} of x "
                         f"{tuple(x.shape)}")


def _max_pool_gather_shape_rule(t, x, m, **params):
    _check_same_shape(t, x, "tangent")
    _check_maxima(m, x, params)
    return ShapedArray(pool_output_shape(x.shape, **params), core.common_float_dtype(t, x))


def _max_pool_scatter_shape_rule(g, x, m, **params):
    _check_pooled(g, x, params)
    _check_maxima(m, x, params)
    return ShapedArray(x.shape, core.common_float_dtype(g, x))


def _avg_pool_transpose_shape_rule(g, *, input_shape, window, stride, padding, count_include_pad):
    expected = pool_output_shape(input_shape, window=window, stride=stride, padding=padding)
    if tuple(g.shape) != expected:
        raise ShapeError(f"cotangent of shape {tuple(g.shape)} must have the pooled shape {expected} of an input "
                         f"{tuple(input_shape)}")
    return ShapedArray(input_shape, core.common_float_dtype(g))


max_pool_p.shape_rule = _pool_shape_rule
max_pool_gather_p.shape_rule = _max_pool_gather_shape_rule
max_pool_scatter_p.shape_rule = _max_pool_scatter_shape_rule
avg_pool_p.shape_rule = _pool_shape_rule
avg_pool_transpose_p.shape_rule = _avg_pool_transpose_shape_rule


# ---------------------------------------------------------------------------------------
# Impls: one strided slice per window tap
# ---------------------------------------------------------------------------------------


_NC = (slice(None), slice(None))


def _tap_indices(window, stride, out_sp):
    """For each window tap ``t`` (row-major order): the index of the strided slice of the
    padded input that tap ``t`` of every window reads, ``x̃[n, c, y·s + t]`` for all output
    positions ``y``."""
    for tap in taps(window):
        yield _NC + tap_slices(tap, out_sp, stride)


def _crop(x, padding, spatial):
    """The input's positions of a padded ``(N, C, S + 2p...)`` array."""
    return x[_NC + interior(padding, spatial)]


def _max_pool_impl(x, *, window, stride, padding):
    out_sp = max_pool_p.check(x, window=window, stride=stride, padding=padding).shape[2:]
    xp = backend.xp_of(x)
    x_pad = pad_spatial(xp, x, padding, -np.inf)
    out = None
    for sl in _tap_indices(window, stride, out_sp):
        if out is None:
            out = x_pad[sl].copy()
        else:
            xp.maximum(out, x_pad[sl], out=out)  # maximum propagates NaN
    return out


# NOTE [max pool ties]
# Where several positions of a window attain its maximum, the derivative goes to one of
# them: the first in row-major tap order, as torch's max_pool does (its CPU kernels keep
# the first index with ``val > maxval``), so per-example gradients match torch's. JAX's
# reduce_window max also sends it to a single position. (cuvmap's reduce_max splits it
# evenly among ties instead; for pooling the single winner is what the frameworks do and
# what the gather/scatter pair below can express.) A NaN is selected over numbers (the
# first NaN wins; torch's kernels move on to the last one), matching the NaN that max_pool
# outputs. Since the padding value is −∞ and every window holds an element of x, padding
# is never selected — except in a window whose elements are all −∞ themselves, where the
# first tap wins and the derivative of a padded tap is dropped.


# NOTE [the maxima as a residual]
# The selection of a max window is the first tap equal to the window's maximum, and the
# forward pass has just computed every maximum: max_pool's output. So the JVP and VJP rules
# hand that output to the gather and the scatter as their third operand, and the masks
# below compare each tap with it instead of reducing x over the window again (Π k passes
# over the pooled shape and a copy saved per call). The tape keeps max_pool's output for
# the backward pass beside x (reads=(0, "out")): 1/Π(stride) of x's size. Everything that
# derives a rule from the gather or the scatter — their own JVP and VJP rules, batching —
# passes x and m through unchanged, so second-order derivatives and vmap reuse the same
# maxima.


def _first_max_masks(xp, x_pad, m, window, stride, out_sp):
    """Yields ``(sl, selected)`` for each tap in row-major order: ``sl`` the strided slice
    the tap reads, ``selected`` a boolean ``(N, C, out...)`` mask of the windows whose
    selected position is this tap — the first tap equal to the window's maximum ``m``, or
    the first NaN where ``m`` is NaN (NOTE [max pool ties]). The mask is reused between taps:
    consume it at once."""
    indices = list(_tap_indices(window, stride, out_sp))
    # on the GPU the NaN test would cost a device synchronisation; always take it there
    has_nan = xp is not np or bool(np.isnan(m).any())
    unclaimed = xp.ones(m.shape, dtype=bool)
    selected = xp.empty(m.shape, dtype=bool)
    last = len(indices) - 1
    for i, sl in enumerate(indices):
        s = x_pad[sl]
        xp.equal(s, m, out=selected)
        if has_nan:  # NaN != NaN: a NaN window selects its first NaN
            selected |= xp.isnan(s) & xp.isnan(m)
        if i:
            selected &= unclaimed
        if i < last:
            unclaimed ^= selected
        yield sl, selected


def _check_gather_scatter(prim, a, x, m, params):
    prim.check(a, x, m, **params)
    return backend.xp_of(a, x, m)


def _max_pool_gather_impl(t, x, m, *, window, stride, padding):
    params = dict(window=window, stride=stride, padding=padding)
    xp = _check_gather_scatter(max_pool_gather_p, t, x, m, params)
    out_sp = tuple(m.shape[2:])
    t_pad = pad_spatial(xp, t, padding, 0)
    out = xp.zeros(tuple(x.shape[:2]) + out_sp, dtype=t.dtype)   # zeros: a window may select nothing
    for sl, selected in _first_max_masks(xp, pad_spatial(xp, x, padding, -np.inf), m, window, stride, out_sp):
        xp.copyto(out, t_pad[sl], where=selected)
    return out


def _max_pool_scatter_impl(g, x, m, *, window, stride, padding):
    params = dict(window=window, stride=stride, padding=padding)
    xp = _check_gather_scatter(max_pool_scatter_p, g, x, m, params)
    x_pad = pad_spatial(xp, x, padding, -np.inf)
    out_sp = tuple(g.shape[2:])
    dtype = g.dtype
    disjoint = all(s >= k for s, k in zip(stride, window))
    if not disjoint:  # overlapping windows: a position may receive from several windows
        out = xp.zeros(x_pad.shape, dtype=dtype)
        for sl, selected in _first_max_masks(xp, x_pad, m, window, stride, out_sp):
            # the taps of one slice never overlap; NOTE [branch-free select] for the NumPy path
            out[sl] += select_impl(selected, g, 0)
        return xp.ascontiguousarray(_crop(out, padding, x.shape[2:]))
    # disjoint windows: each position belongs to at most one tap of one window, so each tap
    # writes its positions (g where selected, +0 elsewhere) instead of adding into zeros;
    # positions no window covers (stride > window, or a remainder) are zeroed first
    covered = all(s == k and o * s == n for s, k, o, n in zip(stride, window, out_sp, x_pad.shape[2:]))
    out = (xp.empty if covered else xp.zeros)(x_pad.shape, dtype=dtype)
    for sl, selected in _first_max_masks(xp, x_pad, m, window, stride, out_sp):
        target = out[sl]
        try:
            select_into(selected, g, 0, out=target)
        except TypeError:  # not NumPy floats: the plain select
            target[...] = select_impl(selected, g, 0)
    return out if not any(padding) else xp.ascontiguousarray(_crop(out, padding, x.shape[2:]))


# NOTE [the divisor of a padded average, made once]
# With count_include_pad=False each window's divisor is its number of taps inside the
# input: an array that depends only on the spatial shape, the window, stride, padding and
# dtype. Computed on the host and copied to the GPU at every call, it made every program
# with such a pool uncapturable as a CUDA graph (a host-to-device copy of host data inside
# the capture) and cost a copy per call. So the divisors are kept per key and device
# (_DIVISORS, a bounded LRU), made on the first call, which runs outside any capture (NOTE
# [graph replay] in cuvmap/cuda/graphs.py: the first call is eager), from the default pool
# (never a graph's private one), and only read afterwards.
_DIVISORS = LRU(256)


def _divisor(xp, input_shape, window, stride, padding, count_include_pad, dtype):
    """``D(y)``: the window size, or (``count_include_pad=False``) the number of taps of each
    window inside the input, an outer product of per-dim counts (shape ``out...``), made
    once per key and device (NOTE [the divisor of a padded average, made once])."""
    if count_include_pad:
        return np.dtype(dtype).type(np.prod(window))
    cp = backend.cupy_module() if xp is not np else None
    device = "cpu" if cp is None else cp.cuda.runtime.getDevice()
    key = (device, tuple(input_shape[2:]), tuple(window), tuple(stride), tuple(padding), np.dtype(dtype).str)
    divisor = _DIVISORS.get(key)
    if divisor is not None:
        return divisor
    out_sp = pool_output_shape(input_shape, window=window, stride=stride, padding=padding)[2:]
    count = np.ones((), dtype=np.float64)
    for s, k, st, p, o in zip(input_shape[2:], window, stride, padding, out_sp):
        start = np.arange(o) * st - p
        per_dim = np.minimum(start + k, s) - np.maximum(start, 0)
        count = np.multiply.outer(count, per_dim)
    count = count.astype(dtype)
    if cp is None:
        divisor = count
        divisor.flags.writeable = False  # (shared by every call of this key)
    else:
        with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            divisor = cp.asarray(count)
    return _DIVISORS.put(key, divisor)


def _avg_pool_impl(x, *, window, stride, padding, count_include_pad):
    params = dict(window=window, stride=stride, padding=padding)
    out_sp = avg_pool_p.check(x, count_include_pad=count_include_pad, **params).shape[2:]
    xp = backend.xp_of(x)
    x_pad = pad_spatial(xp, x, padding, 0)
    total = None
    for sl in _tap_indices(window, stride, out_sp):
        total = x_pad[sl].copy() if total is None else xp.add(total, x_pad[sl], out=total)
    return total / _divisor(xp, x.shape, window, stride, padding, count_include_pad, x.dtype)


def _avg_pool_transpose_impl(g, *, input_shape, window, stride, padding, count_include_pad):
    params = dict(window=window, stride=stride, padding=padding)
    avg_pool_transpose_p.check(g, input_shape=input_shape, count_include_pad=count_include_pad, **params)
    xp = backend.xp_of(g)
    out_sp = tuple(g.shape[2:])
    scaled = g / _divisor(xp, input_shape, window, stride, padding, count_include_pad, g.dtype)
    padded = tuple(input_shape[:2]) + padded_spatial(input_shape[2:], padding)
    out = xp.zeros(padded, dtype=g.dtype)
    for sl in _tap_indices(window, stride, out_sp):
        out[sl] += scaled                              # the taps of one slice never overlap
    return xp.ascontiguousarray(_crop(out, padding, input_shape[2:]))


max_pool_p.impl = _max_pool_impl
max_pool_gather_p.impl = _max_pool_gather_impl
max_pool_scatter_p.impl = _max_pool_scatter_impl
avg_pool_p.impl = _avg_pool_impl
avg_pool_transpose_p.impl = _avg_pool_transpose_impl


# ---------------------------------------------------------------------------------------
# Batching rules: fold the vmap dim into N
# ---------------------------------------------------------------------------------------

# NOTE [pooling batching]
# Pooling treats every (example, channel) pair on its own, so a vmap dim B can be merged
# into N: ``B N C S... -> (B N) C S...``, one pooling call, then ``(B N) -> B N``. (Merging
# into C would do as well; N keeps the channel count the kernels see unchanged.) For
# max_pool_gather/scatter an unbatched operand beside a batched one — x unbatched under
# ``jacrev``/``jacfwd``, which map over cotangents or tangents only — is broadcast to B
# first (x and its maxima m alike): the selection is recomputed for every b, which costs
# one pass over the taps per b, as the loop would, but in one vectorised call.


def _fold_into_n(x, bdim, size):
    """``x`` with its vmap dim (or a broadcast one, when ``bdim`` is ``not_mapped``) merged
    into ``N``: ``B N ... -> (B N) ...``."""
    return batching.fold_bdim_into(bdim_at_front(x, bdim, size), 0, 0)


def _unary_pool_batcher(primitive):
    def rule(axis_size, vals, dims, **params):
        (x,), (d,) = vals, dims
        n = x.shape[1 if d == 0 else 0]   # the logical N
        out = primitive.bind(_fold_into_n(x, d, axis_size), **params)
        return split_bdim_out_of(out, 0, axis_size, n), 0

    return rule


def _gather_scatter_batcher(primitive):
    def rule(axis_size, vals, dims, **params):
        x, x_b = vals[1], dims[1]
        n = x.shape[1 if x_b == 0 else 0]   # the logical N of x (every operand shares it)
        out = primitive.bind(*(_fold_into_n(v, d, axis_size) for v, d in zip(vals, dims)), **params)
        return split_bdim_out_of(out, 0, axis_size, n), 0

    return rule


def _avg_pool_transpose_batch(axis_size, vals, dims, *, input_shape, **params):
    (g,), (d,) = vals, dims
    out = avg_pool_transpose_p.bind(_fold_into_n(g, d, axis_size),
                                    input_shape=(axis_size * input_shape[0],) + input_shape[1:], **params)
    return split_bdim_out_of(out, 0, axis_size, input_shape[0]), 0


batching.primitive_batchers[max_pool_p] = _unary_pool_batcher(max_pool_p)
batching.primitive_batchers[max_pool_gather_p] = _gather_scatter_batcher(max_pool_gather_p)
batching.primitive_batchers[max_pool_scatter_p] = _gather_scatter_batcher(max_pool_scatter_p)
batching.primitive_batchers[avg_pool_p] = _unary_pool_batcher(avg_pool_p)
batching.primitive_batchers[avg_pool_transpose_p] = _avg_pool_transpose_batch


# ---------------------------------------------------------------------------------------
# JVP and VJP rules (see the module docstring): the gather and the scatter are linear in
# their first operand and each other's transpose; their derivative in x and in the maxima
# m is zero (None). max_pool's rules pass its own output as m (NOTE [the maxima as a
# residual]).
# ---------------------------------------------------------------------------------------


def _max_pool_jvp(t, out, x, **params):
    return max_pool_gather_p.bind(t, x, out, **params)


def _max_pool_vjp(ct, out, x, **params):
    return max_pool_scatter_p.bind(ct, x, out, **params)


def _max_pool_gather_jvp(t, out, t0, x, m, **params):
    return max_pool_gather_p.bind(t, x, m, **params)


def _max_pool_gather_vjp(ct, out, t0, x, m, **params):
    return max_pool_scatter_p.bind(ct, x, m, **params)


def _max_pool_scatter_jvp(t, out, g, x, m, **params):
    return max_pool_scatter_p.bind(t, x, m, **params)


def _max_pool_scatter_vjp(ct, out, g, x, m, **params):
    return max_pool_gather_p.bind(ct, x, m, **params)


def _avg_pool_transpose_rule(ct, x, **params):
    return avg_pool_transpose(ct, x.shape, **params)


def _avg_pool_transpose_transpose(ct, g, *, input_shape, **params):
    return avg_pool_p.bind(ct, **params)


jvp.defjvp(max_pool_p, _max_pool_jvp)
jvp.defjvp(max_pool_gather_p, _max_pool_gather_jvp, None, None)
jvp.defjvp(max_pool_scatter_p, _max_pool_scatter_jvp, None, None)
vjp.defvjp(max_pool_p, _max_pool_vjp, reads=(0, "out"))
vjp.defvjp(max_pool_gather_p, _max_pool_gather_vjp, None, None, reads=(1, 2))
vjp.defvjp(max_pool_scatter_p, _max_pool_scatter_vjp, None, None, reads=(1, 2))
vjp.deflinear(avg_pool_p, _avg_pool_transpose_rule)
vjp.deflinear(avg_pool_transpose_p, _avg_pool_transpose_transpose)
