"""Convolution kernels by im2col + batched GEMM, written once against the array module
``xp`` (NumPy on the CPU, CuPy on the GPU): the "unfold" kernels of NOTE [conv strategy]
in ``cuvmap/lax/conv_strategy.py``.

All three kernels are for the *regular* (non-transposed) convolution with symmetric
zero padding, in the layout ``N C spatial...`` with weight ``O C/groups kernel...``:

    out[n, g·Og + o, y] = Σ_{c, k} x[n, g·Cg + c, y·s − p + k·d] · w[g·Og + o, c, k]

- :func:`forward` computes ``out``;
- :func:`backward_input` computes ``∂⟨out, g⟩/∂x`` (the transposed convolution);
- :func:`backward_weight` computes ``∂⟨out, g⟩/∂w``.

The unfolded columns come in two layouts (NOTE [column layouts]): *channel-major*
``(G, Cg·K, N·out)``, built from the ``N C spatial...`` input as it is, and *pixel-major*
``(G, N·out, K·Cg)``, built from a channels-last copy of it. Either way ``im2col`` starts
from a strided *view* of the padded input (no copy until the GEMM needs its columns), and
the input gradient accumulates the kernel taps with strided slices (``cuvmap/window.py``),
one vectorised add per tap (never a loop over examples or pixels). See NOTE [conv
strategy] for how these kernels and the vendors' (oneDNN's, cuDNN's) are chosen, and NOTE
[cache blocking] below for how the CPU keeps the columns in cache.
"""
import numpy as np

from cuvmap.cuda import cublas
from cuvmap.window import interior, output_spatial, pad_spatial, padded_spatial, tap_slices, taps


def _xp(x):
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _matmul(xp, a, b):
    """``a @ b``; on CuPy through :func:`cuvmap.cuda.cublas.matmul`, which a CUDA graph can
    capture (NOTE [cuBLAS in a capture])."""
    return np.matmul(a, b) if xp is np else cublas.matmul(a, b)


def _as_strided(xp, x, shape, strides):
    if xp is np:
        return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


# NOTE [column layouts]
# im2col copies every kernel window of the input into a column of a GEMM operand, and on
# the CPU that copy costs about as much as the GEMM itself: NumPy copies a strided view one
# contiguous run at a time, so what matters is how long the runs are.
#   channel-major (G, Cg·K, N·out): row (c, k), column (n, y). Built from x as it is
#       (N C spatial...); a run is one row of output pixels, out[-1] values when the last
#       stride is 1 (else single values).
#   pixel-major (G, N·out, K·Cg): row (n, y), column (k, c). Built from a channels-last
#       copy of x (G, N, spatial..., Cg), one copy of the input's size; a run is the last
#       kernel dim's taps times the channels, k[-1]·Cg values when the last dilation is 1
#       (else Cg values).
# The kernels pick the layout with the longer runs. On the benchmark CNN's second layer
# (16→32 channels, 5×5 kernel, 20×20 output) the runs are 80 against 20 values and
# pixel-major is the faster for every op (forward, input gradient, weight gradient, the
# per-example weight gradient and the ensembling forward); on its first layer (1 channel)
# they are 5 against 24 and channel-major is the faster. Pixel-major pays elsewhere: its
# GEMM yields the forward's output as (N·out, Og), which it transposes back to N O out one
# element at a time, where channel-major moves whole rows of out values; so with Og at
# least the K·Cg of a column (a conv folding 32 batched weights into 1024 output
# channels) the forward and the input gradient (whose grad_output it transposes) stay
# channel-major. For the input gradient, channel-major multiplies wᵀ·g into whole columns
# and accumulates the taps from them; pixel-major runs one small GEMM per tap,
# g (N·out, Og) · w_k (Og, Cg), added straight into a channels-last input gradient, so
# both sides of each add are contiguous runs of out[-1]·Cg values when the last stride
# is 1 (else Cg). CuPy always uses channel-major (one piece, NOTE [cache blocking]); on
# NumPy, COLUMN_LAYOUT = "channel" or "pixel" forces a layout (the tests run both).
# `python -m benchmarks conv --im2col-variants` times the three ops (its table 1) and the
# per-example weight gradient (table 3) with each layout forced, beside the kernels' own
# choice.
COLUMN_LAYOUT = "auto"


def _pixel_major(xp, cg, kernel, stride, dilation, out_sp, og=None):
    """Whether to use the pixel-major layout of NOTE [column layouts]. ``og``: the
    channels per group of the (N, O, out...) operand the pixel-major kernel transposes
    element by element (the forward's output, the input gradient's grad_output)."""
    if xp is not np:
        return False
    if COLUMN_LAYOUT not in ("auto", "channel", "pixel"):
        raise ValueError(f"conv_gemm.COLUMN_LAYOUT must be 'auto', 'channel' or 'pixel', got {COLUMN_LAYOUT!r}")
    if COLUMN_LAYOUT != "auto":
        return COLUMN_LAYOUT == "pixel"
    pixel_run = cg * (kernel[-1] if dilation[-1] == 1 else 1)
    channel_run = out_sp[-1] if stride[-1] == 1 else 1
    if og is not None and og >= cg * _size(kernel):
        return False  # that transpose would cost more than the columns
    return pixel_run > channel_run


# ---------------------------------------------------------------------------------------
# Channel-major columns
# ---------------------------------------------------------------------------------------


def _windows(xp, x_pad, out_sp, kernel, stride, dilation):
    """The im2col view ``(N, C, out..., kernel...)`` of a padded input."""
    nd = len(kernel)
    st = x_pad.strides
    shape = tuple(x_pad.shape[:2]) + tuple(out_sp) + tuple(kernel)
    strides = (
        tuple(st[:2])
        + tuple(st[2 + i] * stride[i] for i in range(nd))
        + tuple(st[2 + i] * dilation[i] for i in range(nd))
    )
    return _as_strided(xp, x_pad, shape, strides)


def _columns(xp, x, kernel, stride, padding, dilation, groups):
    """im2col as a GEMM operand: ``(G, Cg·K, N·out)`` (one copy of the windows)."""
    n, c = x.shape[:2]
    nd = len(kernel)
    out_sp = output_spatial(x.shape[2:], kernel, stride, padding, dilation)
    win = _windows(xp, pad_spatial(xp, x, padding), out_sp, kernel, stride, dilation)
    cg = c // groups
    win = win.reshape((n, groups, cg) + out_sp + tuple(kernel))
    # (N, G, Cg, out..., K...) -> (G, Cg, K..., N, out...)
    perm = (1, 2) + tuple(range(3 + nd, 3 + 2 * nd)) + (0,) + tuple(range(3, 3 + nd))
    return win.transpose(perm).reshape(groups, cg * _size(kernel), n * _size(out_sp)), out_sp


def _grad_as_gemm_operand(g, groups):
    """``(N, O, out...)`` -> ``(G, Og, N·out)``."""
    n, o = g.shape[:2]
    o_size = _size(g.shape[2:])
    gm = g.reshape(n, groups, o // groups, o_size)
    if n == 1:
        return gm.reshape(groups, o // groups, o_size)
    return gm.transpose(1, 2, 0, 3).reshape(groups, o // groups, n * o_size)


def _forward_channel_major(x, w, stride, padding, dilation, groups):
    """``(N, O, out...)``, possibly a transposed view."""
    xp = _xp(x)
    n = x.shape[0]
    o = w.shape[0]
    kernel = tuple(w.shape[2:])
    cols, out_sp = _columns(xp, x, kernel, stride, padding, dilation, groups)
    wm = w.reshape(groups, o // groups, -1)
    out = _matmul(xp, wm, cols)  # (G, Og, N·out)
    out = out.reshape((groups, o // groups, n) + out_sp)
    perm = (2, 0, 1) + tuple(range(3, 3 + len(out_sp)))
    return out.transpose(perm).reshape((n, o) + out_sp)


def _backward_weight_channel_major(g, x, weight_shape, stride, padding, dilation, groups):
    """``(G, Og, Cg·K)``: the weight gradient as a matrix per group, in the weight's order."""
    xp = _xp(x)
    kernel = tuple(weight_shape[2:])
    cols, _ = _columns(xp, x, kernel, stride, padding, dilation, groups)
    return _matmul(xp, _grad_as_gemm_operand(g, groups), cols.transpose(0, 2, 1))


def _backward_input_channel_major(g, w, input_shape, stride, padding, dilation, groups):
    """``(N, G, Cg, S...)``, possibly a view of a larger (padded) array."""
    xp = _xp(g)
    n, c = input_shape[:2]
    spatial = tuple(input_shape[2:])
    nd = len(spatial)
    o = w.shape[0]
    cg = c // groups
    kernel = tuple(w.shape[2:])
    out_sp = tuple(g.shape[2:])
    gm = _grad_as_gemm_operand(g, groups)  # (G, Og, N·out)
    wm = w.reshape(groups, o // groups, -1)
    cols = _matmul(xp, wm.transpose(0, 2, 1), gm)  # (G, Cg·K, N·out)
    cols = cols.reshape((groups, cg) + kernel + (n,) + out_sp)
    padded = padded_spatial(spatial, padding)
    gx = xp.zeros((n, groups, cg) + padded, dtype=cols.dtype)
    # (G, Cg, N, out...) -> (N, G, Cg, out...) for each tap
    tap_perm = (2, 0, 1) + tuple(range(3, 3 + nd))
    for tap in taps(kernel):
        src = cols[(slice(None), slice(None)) + tap].transpose(tap_perm)
        gx[(slice(None),) * 3 + tap_slices(tap, out_sp, stride, dilation)] += src
    return gx[(slice(None),) * 3 + interior(padding, spatial)]


# ---------------------------------------------------------------------------------------
# Pixel-major columns (NumPy only)
# ---------------------------------------------------------------------------------------


def _channels_last(x, groups, padding):
    """``(N, G·Cg, S...)`` -> zero-padded ``(G, N, S + 2p..., Cg)``, one copy."""
    n, c = x.shape[:2]
    spatial = tuple(x.shape[2:])
    nd = len(spatial)
    cg = c // groups
    view = x.reshape((n, groups, cg) + spatial).transpose((1, 0) + tuple(range(3, 3 + nd)) + (2,))
    if not any(padding):
        return np.ascontiguousarray(view)
    padded = padded_spatial(spatial, padding)
    out = np.zeros((groups, n) + padded + (cg,), dtype=x.dtype)
    out[(slice(None),) * 2 + interior(padding, spatial)] = view
    return out


def _pixel_columns(x, kernel, stride, padding, dilation, groups):
    """im2col as ``(G, N·out, K·Cg)``: row ``(n, y)``, column ``(k, c)`` holds
    ``x[n, g·Cg + c, y·s − p + k·d]``."""
    x_cl = _channels_last(x, groups, padding)
    n, cg = x.shape[0], x_cl.shape[-1]
    nd = len(kernel)
    out_sp = output_spatial(x.shape[2:], kernel, stride, padding, dilation)
    st = x_cl.strides
    shape = (groups, n) + out_sp + tuple(kernel) + (cg,)
    strides = (
        st[:2]
        + tuple(st[2 + i] * stride[i] for i in range(nd))
        + tuple(st[2 + i] * dilation[i] for i in range(nd))
        + (st[-1],)
    )
    win = _as_strided(np, x_cl, shape, strides)
    return win.reshape(groups, n * _size(out_sp), _size(kernel) * cg), out_sp


def _forward_pixel_major(x, w, stride, padding, dilation, groups):
    """``(N, O, out...)``, from the GEMM's ``(G, N·out, Og)`` (a transposed view of it when
    G == 1)."""
    n = x.shape[0]
    o, cg = w.shape[:2]
    og = o // groups
    kernel = tuple(w.shape[2:])
    cols, out_sp = _pixel_columns(x, kernel, stride, padding, dilation, groups)
    # (G·Og, Cg, K...) -> (G, K·Cg, Og)
    wm = w.reshape(groups, og, cg, _size(kernel)).transpose(0, 3, 2, 1).reshape(groups, -1, og)
    out = np.matmul(cols, wm).reshape(groups, n, _size(out_sp), og)
    return out.transpose(1, 0, 3, 2).reshape((n, o) + out_sp)


def _backward_weight_pixel_major(g, x, weight_shape, stride, padding, dilation, groups):
    """``(G, Og, K·Cg)``: the weight gradient as a matrix per group, taps before channels."""
    kernel = tuple(weight_shape[2:])
    cols, _ = _pixel_columns(x, kernel, stride, padding, dilation, groups)
    return np.matmul(_grad_as_gemm_operand(g, groups), cols)


def _backward_input_pixel_major(g, w, input_shape, stride, padding, dilation, groups):
    """``(N, G, Cg, S...)``, a transposed view of a channels-last ``(G, N, S..., Cg)``."""
    n, c = input_shape[:2]
    spatial = tuple(input_shape[2:])
    nd = len(spatial)
    o, cg = w.shape[:2]
    og = o // groups
    kernel = tuple(w.shape[2:])
    out_sp = tuple(g.shape[2:])
    o_size = _size(out_sp)
    # g as (G, N·out, Og) and w as one (G, Og, Cg) matrix per tap
    gt = np.ascontiguousarray(g.reshape(n, groups, og, o_size).transpose(1, 0, 3, 2)).reshape(groups, n * o_size, og)
    w_taps = np.ascontiguousarray(w.reshape(groups, og, cg, _size(kernel)).transpose(3, 0, 1, 2))
    padded = padded_spatial(spatial, padding)
    dtype = np.result_type(g.dtype, w.dtype)
    gx = np.zeros((groups, n) + padded + (cg,), dtype=dtype)
    term = np.empty((groups, n * o_size, cg), dtype=dtype)
    term_as_input = term.reshape((groups, n) + out_sp + (cg,))
    for w_tap, tap in zip(w_taps, taps(kernel)):
        np.matmul(gt, w_tap, out=term)
        gx[(slice(None),) * 2 + tap_slices(tap, out_sp, stride, dilation)] += term_as_input
    gx = gx[(slice(None),) * 2 + interior(padding, spatial)]
    return gx.transpose((1, 0, nd + 2) + tuple(range(2, nd + 2)))


# NOTE [cache blocking]
# The unfolded columns are K times the size of the input (25x for a 5x5 kernel). Built in
# one piece for a whole batch they are a large fresh allocation every call, and fresh pages
# are slow to touch: on the benchmark CNN's second layer at batch 128 the forward is faster
# when the columns are built in blocks of about 4 MiB, each block's GEMM writing its slice
# of the output. So on the CPU the kernels split the work into blocks of examples (or, for
# a single example with many groups — the folded per-example cases — blocks of groups)
# when the columns would exceed BLOCK_BYTES (the pixel-major input gradient, which builds
# no columns, counts its per-tap working set instead: the grad_output and one tap's term).
# The loop runs over memory-sized blocks, not over examples: small problems are one block.
# On the GPU (CuPy) the kernels always run in one piece. `python -m benchmarks conv --batch
# 128 --im2col-variants` times the kernels in one piece ("im2col one piece") beside the
# blocked ones.
BLOCK_BYTES = 4 << 20


def _blocks(x, n, groups, bytes_per_example_group):
    """``("n", size)`` or ``("g", size)``: how to split a problem whose working set takes
    ``bytes_per_example_group`` per (example, group); ``None`` for one piece."""
    if _xp(x) is not np:
        return None
    total = n * groups * bytes_per_example_group
    if total <= 2 * BLOCK_BYTES:
        return None
    if n > 1:
        nb = max(1, BLOCK_BYTES // (groups * bytes_per_example_group))
        return ("n", nb) if nb < n else None
    gb = max(1, BLOCK_BYTES // bytes_per_example_group)
    return ("g", gb) if gb < groups else None


def _block_ranges(plan, n, groups):
    """``(examples, groups)`` slice pairs covering the problem, following ``plan``."""
    if plan is None:
        return [(slice(0, n), slice(0, groups))]
    axis, size = plan
    if axis == "n":
        return [(slice(s, min(n, s + size)), slice(0, groups)) for s in range(0, n, size)]
    return [(slice(0, n), slice(s, min(groups, s + size))) for s in range(0, groups, size)]


def _channels(gs, per_group):
    """The channel slice of the group slice ``gs``."""
    return slice(gs.start * per_group, gs.stop * per_group)


def _column_bytes(cg, kernel, out_sp, dtype):
    return cg * _size(kernel) * _size(out_sp) * np.dtype(dtype).itemsize


def forward(x, w, stride, padding, dilation, groups):
    """Regular convolution ``(N, C, S...) ⊛ (O, C/G, K...) -> (N, O, out...)``."""
    xp = _xp(x)
    n, c = x.shape[:2]
    o = w.shape[0]
    cg, og = c // groups, o // groups
    kernel = tuple(w.shape[2:])
    out_sp = output_spatial(x.shape[2:], kernel, stride, padding, dilation)
    block = (_forward_pixel_major if _pixel_major(xp, cg, kernel, stride, dilation, out_sp, og)
             else _forward_channel_major)
    plan = _blocks(x, n, groups, _column_bytes(cg, kernel, out_sp, x.dtype))
    if plan is None:
        return xp.ascontiguousarray(block(x, w, stride, padding, dilation, groups))
    out = np.empty((n, o) + out_sp, dtype=np.result_type(x.dtype, w.dtype))
    for ns, gs in _block_ranges(plan, n, groups):
        out[ns, _channels(gs, og)] = block(x[ns, _channels(gs, cg)], w[_channels(gs, og)], stride, padding,
                                           dilation, gs.stop - gs.start)
    return out


def backward_weight(g, x, weight_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂w``: ``(N, O, out...), (N, C, S...) -> (O, C/G, K...)``."""
    xp = _xp(x)
    n, c = x.shape[:2]
    o, cg = weight_shape[:2]
    og = o // groups
    kernel = tuple(weight_shape[2:])
    k_size = _size(kernel)
    out_sp = tuple(g.shape[2:])
    pixel = _pixel_major(xp, cg, kernel, stride, dilation, out_sp)
    block = _backward_weight_pixel_major if pixel else _backward_weight_channel_major
    plan = _blocks(x, n, groups, _column_bytes(cg, kernel, out_sp, x.dtype))
    gw = None  # (G, Og, K·Cg) pixel-major, (G, Og, Cg·K) channel-major
    for ns, gs in _block_ranges(plan, n, groups):
        part = block(g[ns, _channels(gs, og)], x[ns, _channels(gs, cg)],
                     (og * (gs.stop - gs.start),) + tuple(weight_shape[1:]), stride, padding, dilation,
                     gs.stop - gs.start)
        if gs.stop - gs.start < groups:  # a block of groups: its slice of the result
            if gw is None:
                gw = np.empty((groups,) + part.shape[1:], dtype=part.dtype)
            gw[gs] = part
        elif gw is None:
            gw = part
        else:  # a block of examples: a term of the sum over examples
            gw += part
    if pixel:
        gw = gw.reshape(groups, og, k_size, cg).transpose(0, 1, 3, 2)
    return xp.ascontiguousarray(gw).reshape(tuple(weight_shape))


def backward_input(g, w, input_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂x`` (the transposed convolution): the taps of ``wᵀ g``,
    accumulated into the input's positions."""
    xp = _xp(g)
    n, c = input_shape[:2]
    spatial = tuple(input_shape[2:])
    o, cg = w.shape[:2]
    og = o // groups
    kernel = tuple(w.shape[2:])
    out_sp = tuple(g.shape[2:])
    if _pixel_major(xp, cg, kernel, stride, dilation, out_sp, og):
        # the working set of a tap: g (out·Og) and the tap's term (out·Cg)
        block = _backward_input_pixel_major
        per_example_group = _size(out_sp) * (og + cg) * np.dtype(g.dtype).itemsize
    else:
        block = _backward_input_channel_major
        per_example_group = _column_bytes(cg, kernel, out_sp, g.dtype)
    plan = _blocks(g, n, groups, per_example_group)
    if plan is None:
        gx = block(g, w, input_shape, stride, padding, dilation, groups)
        return xp.ascontiguousarray(gx).reshape(tuple(input_shape))
    gx = np.empty(tuple(input_shape), dtype=np.result_type(g.dtype, w.dtype))
    gx_groups = gx.reshape((n, groups, cg) + spatial)
    for ns, gs in _block_ranges(plan, n, groups):
        shape = (ns.stop - ns.start, cg * (gs.stop - gs.start)) + spatial
        gx_groups[ns, gs] = block(g[ns, _channels(gs, og)], w[_channels(gs, og)], shape, stride, padding,
                                  dilation, gs.stop - gs.start)
    return gx
