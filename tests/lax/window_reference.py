"""A direct loop reference of XLA's ReduceWindow in NumPy, independent of cuvmap: dilate
the operand with ``init`` in the holes, pad (or crop) with ``init``, then fold every
window's taps in row-major order from ``init``."""
import itertools

import numpy as np


def reduce_window_reference(x, init, op, window, strides, pads, base_dilation, window_dilation):
    x = np.asarray(x)
    for axis, b in enumerate(base_dilation):
        shape = list(x.shape)
        shape[axis] = max(0, (x.shape[axis] - 1) * b + 1)
        y = np.full(shape, init, x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(None, None, b)
        y[tuple(index)] = x
        x = y
    for axis, (lo, hi) in enumerate(pads):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        x = np.pad(x, widths, constant_values=init)
        index = [slice(None)] * x.ndim
        index[axis] = slice(max(-lo, 0), x.shape[axis] - max(-hi, 0))
        x = x[tuple(index)]
    out_shape = tuple(max(0, (p - d * (k - 1) - 1) // s + 1) if p >= d * (k - 1) + 1 else 0
                      for p, k, s, d in zip(x.shape, window, strides, window_dilation))
    out = np.empty(out_shape, x.dtype)
    for y in itertools.product(*map(range, out_shape)):
        acc = np.asarray(init, x.dtype)
        for t in itertools.product(*map(range, window)):
            acc = op(acc, x[tuple(yy * s + tt * d for yy, s, tt, d in zip(y, strides, t, window_dilation))])
        out[y] = acc
    return out
