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
See NOTE [conv strategy] in ``cuvmap/lax/conv.py`` for the alternative ``taps`` kernels
and how the choice is made.
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


def forward(x, w, stride, padding, dilation, groups):
    """Regular convolution ``(N, C, S...) ⊛ (O, C/G, K...) -> (N, O, out...)``."""
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


def backward_weight(g, x, weight_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂w``: ``(N, O, out...), (N, C, S...) -> (O, C/G, K...)``."""
    xp = _xp(x)
    kernel = tuple(weight_shape[2:])
    cols, _ = _columns(xp, x, kernel, stride, padding, dilation, groups)
    gm = _grad_as_gemm_operand(g, groups)
    gw = xp.matmul(gm, cols.transpose(0, 2, 1))  # (G, Og, Cg·K)
    return gw.reshape(weight_shape)


def backward_input(g, w, input_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂x`` (the transposed convolution): col2im of ``wᵀ g``."""
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
