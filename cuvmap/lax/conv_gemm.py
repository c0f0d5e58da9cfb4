"""Convolution kernels by im2col + batched GEMM, written once against the array module
``xp`` (NumPy on the CPU, CuPy on the GPU when cuDNN is missing).

All three kernels are for the *regular* (non-transposed) convolution with symmetric
zero padding, in the layout ``N C spatial...`` with weight ``O C/groups kernel...``:

    out[n, g·Og + o, y] = Σ_{c, k} x[n, g·Cg + c, y·s − p + k·d] · w[g·Og + o, c, k]

- :func:`forward` computes ``out``;
- :func:`backward_input` computes ``∂⟨out, g⟩/∂x`` (the transposed convolution);
- :func:`backward_weight` computes ``∂⟨out, g⟩/∂w``.

``im2col`` is a strided *view* of the padded input of shape ``(N, C, out..., kernel...)``
(no copy until the GEMM needs its columns); ``col2im`` accumulates the kernel taps with
strided slices, one vectorised add per tap (never a loop over examples or pixels).
See NOTE [conv strategy] in ``cuvmap/lax/conv.py`` for how these kernels and cuDNN's are
chosen, and NOTE [cache blocking] below for how the CPU keeps the columns in cache.
"""
import itertools

import numpy as np


def _xp(x):
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _as_strided(xp, x, shape, strides):
    if xp is np:
        return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


def output_spatial(spatial, kernel, stride, padding, dilation):
    """``⌊(S + 2p − d(k − 1) − 1) / s⌋ + 1`` per spatial dim."""
    return tuple(
        (s + 2 * p - d * (k - 1) - 1) // st + 1
        for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation)
    )


def _pad(xp, x, padding):
    if not any(padding):
        return x
    return xp.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding))


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
    win = _windows(xp, _pad(xp, x, padding), out_sp, kernel, stride, dilation)
    cg = c // groups
    win = win.reshape((n, groups, cg) + out_sp + tuple(kernel))
    # (N, G, Cg, out..., K...) -> (G, Cg, K..., N, out...)
    perm = (1, 2) + tuple(range(3 + nd, 3 + 2 * nd)) + (0,) + tuple(range(3, 3 + nd))
    k_size = int(np.prod(kernel))
    o_size = int(np.prod(out_sp))
    return win.transpose(perm).reshape(groups, cg * k_size, n * o_size), out_sp


def _grad_as_gemm_operand(g, groups):
    """``(N, O, out...)`` -> ``(G, Og, N·out)``."""
    n, o = g.shape[:2]
    out_sp = g.shape[2:]
    o_size = int(np.prod(out_sp))
    gm = g.reshape(n, groups, o // groups, o_size)
    if n == 1:
        return gm.reshape(groups, o // groups, o_size)
    return gm.transpose(1, 2, 0, 3).reshape(groups, o // groups, n * o_size)


def _forward_block(x, w, stride, padding, dilation, groups):
    xp = _xp(x)
    n = x.shape[0]
    o = w.shape[0]
    kernel = tuple(w.shape[2:])
    cols, out_sp = _columns(xp, x, kernel, stride, padding, dilation, groups)
    wm = w.reshape(groups, o // groups, -1)
    out = xp.matmul(wm, cols)  # (G, Og, N·out)
    out = out.reshape((groups, o // groups, n) + out_sp)
    if n == 1:
        return out.reshape((1, o) + out_sp)
    perm = (2, 0, 1) + tuple(range(3, 3 + len(out_sp)))
    return xp.ascontiguousarray(out.transpose(perm)).reshape((n, o) + out_sp)


def _backward_weight_block(g, x, weight_shape, stride, padding, dilation, groups):
    xp = _xp(x)
    kernel = tuple(weight_shape[2:])
    cols, _ = _columns(xp, x, kernel, stride, padding, dilation, groups)
    gm = _grad_as_gemm_operand(g, groups)
    gw = xp.matmul(gm, cols.transpose(0, 2, 1))  # (G, Og, Cg·K)
    return gw.reshape(weight_shape)


def _backward_input_block(g, w, input_shape, stride, padding, dilation, groups):
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
    cols = xp.matmul(wm.transpose(0, 2, 1), gm)  # (G, Cg·K, N·out)
    cols = cols.reshape((groups, cg) + kernel + (n,) + out_sp)
    padded = tuple(s + 2 * p for s, p in zip(spatial, padding))
    gx = xp.zeros((n, groups, cg) + padded, dtype=cols.dtype)
    # (G, Cg, N, out...) -> (N, G, Cg, out...) for each tap
    tap_perm = (2, 0, 1) + tuple(range(3, 3 + nd))
    for tap in itertools.product(*(range(k) for k in kernel)):
        src = cols[(slice(None), slice(None)) + tap].transpose(tap_perm)
        dst = (slice(None),) * 3 + tuple(
            slice(t * d, t * d + st * (os - 1) + 1, st)
            for t, d, st, os in zip(tap, dilation, stride, out_sp)
        )
        gx[dst] += src
    crop = (slice(None),) * 3 + tuple(slice(p, p + s) for p, s in zip(padding, spatial))
    gx = gx[crop]
    if any(padding):
        gx = xp.ascontiguousarray(gx)
    return gx.reshape(input_shape)


# NOTE [cache blocking]
# The unfolded columns are K times the size of the input (25x for a 5x5 kernel). Built in
# one piece for a whole batch they are a large fresh allocation every call, and fresh pages
# are slow to touch: on the README CNN's second layer (batch 128) the one-piece forward took
# 31 ms against 20 ms when the columns are built in blocks of about 4 MiB, each block's
# GEMM writing its slice of the output. So on the CPU the kernels split the work into
# blocks of examples (or, for a single example with many groups — the folded per-example
# cases — blocks of groups) when the columns would exceed BLOCK_BYTES. The loop runs over
# memory-sized blocks, not over examples: small problems are one block. On the GPU
# (CuPy) the kernels always run in one piece.
BLOCK_BYTES = 4 << 20


def _blocks(x, n, groups, columns_bytes_per_example_group):
    """``("n", size)`` or ``("g", size)``: how to split a problem whose columns take
    ``columns_bytes_per_example_group`` per (example, group); ``None`` for one piece."""
    if _xp(x) is not np:
        return None
    total = n * groups * columns_bytes_per_example_group
    if total <= 2 * BLOCK_BYTES:
        return None
    if n > 1:
        nb = max(1, BLOCK_BYTES // (groups * columns_bytes_per_example_group))
        return ("n", nb) if nb < n else None
    gb = max(1, BLOCK_BYTES // columns_bytes_per_example_group)
    return ("g", gb) if gb < groups else None


def _column_bytes(c, groups, kernel, out_sp, dtype):
    return (c // groups) * int(np.prod(kernel)) * int(np.prod(out_sp)) * np.dtype(dtype).itemsize


def forward(x, w, stride, padding, dilation, groups):
    """Regular convolution ``(N, C, S...) ⊛ (O, C/G, K...) -> (N, O, out...)``."""
    n, c = x.shape[:2]
    o = w.shape[0]
    kernel = tuple(w.shape[2:])
    out_sp = output_spatial(x.shape[2:], kernel, stride, padding, dilation)
    plan = _blocks(x, n, groups, _column_bytes(c, groups, kernel, out_sp, x.dtype))
    if plan is None:
        return _forward_block(x, w, stride, padding, dilation, groups)
    out = np.empty((n, o) + out_sp, dtype=np.result_type(x.dtype, w.dtype))
    axis, size = plan
    if axis == "n":
        for s in range(0, n, size):
            out[s:s + size] = _forward_block(x[s:s + size], w, stride, padding, dilation, groups)
    else:
        cg, og = c // groups, o // groups
        for s in range(0, groups, size):
            e = min(groups, s + size)
            out[:, s * og:e * og] = _forward_block(x[:, s * cg:e * cg], w[s * og:e * og], stride, padding,
                                                   dilation, e - s)
    return out


def backward_weight(g, x, weight_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂w``: ``(N, O, out...), (N, C, S...) -> (O, C/G, K...)``."""
    n, c = x.shape[:2]
    kernel = tuple(weight_shape[2:])
    out_sp = tuple(g.shape[2:])
    plan = _blocks(x, n, groups, _column_bytes(c, groups, kernel, out_sp, x.dtype))
    if plan is None:
        return _backward_weight_block(g, x, weight_shape, stride, padding, dilation, groups)
    axis, size = plan
    if axis == "n":
        gw = None
        for s in range(0, n, size):
            part = _backward_weight_block(g[s:s + size], x[s:s + size], weight_shape, stride, padding, dilation, groups)
            if gw is None:
                gw = part
            else:
                gw += part
        return gw
    o = weight_shape[0]
    cg, og = c // groups, o // groups
    gw = np.empty(tuple(weight_shape), dtype=np.result_type(g.dtype, x.dtype))
    for s in range(0, groups, size):
        e = min(groups, s + size)
        gw[s * og:e * og] = _backward_weight_block(g[:, s * og:e * og], x[:, s * cg:e * cg],
                                                   ((e - s) * og,) + tuple(weight_shape[1:]), stride, padding,
                                                   dilation, e - s)
    return gw


def backward_input(g, w, input_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂x`` (the transposed convolution): col2im of ``wᵀ g``."""
    n, c = input_shape[:2]
    kernel = tuple(w.shape[2:])
    out_sp = tuple(g.shape[2:])
    plan = _blocks(g, n, groups, _column_bytes(c, groups, kernel, out_sp, g.dtype))
    if plan is None:
        return _backward_input_block(g, w, input_shape, stride, padding, dilation, groups)
    gx = np.empty(tuple(input_shape), dtype=np.result_type(g.dtype, w.dtype))
    axis, size = plan
    rest = tuple(input_shape[2:])
    if axis == "n":
        for s in range(0, n, size):
            e = min(n, s + size)
            gx[s:e] = _backward_input_block(g[s:e], w, (e - s, c) + rest, stride, padding, dilation, groups)
        return gx
    o = w.shape[0]
    cg, og = c // groups, o // groups
    for s in range(0, groups, size):
        e = min(groups, s + size)
        gx[:, s * cg:e * cg] = _backward_input_block(g[:, s * og:e * og], w[s * og:e * og], (n, (e - s) * cg) + rest,
                                                     stride, padding, dilation, e - s)
    return gx
