"""A direct loop reference of XLA's general convolution (``conv_general_dilated``) in
NumPy float64, independent of cuvmap: dilate, pad or crop, then sum over the window of every
output position."""
import itertools

import numpy as np


def dilate(x, dilation):
    """``x`` (``N C S...``) with ``ℓ − 1`` zeros between neighbours along each spatial dim."""
    for i, ell in enumerate(dilation):
        axis = 2 + i
        n = x.shape[axis]
        shape = list(x.shape)
        shape[axis] = max(0, (n - 1) * ell + 1)
        out = np.zeros(shape, x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(None, None, ell)
        out[tuple(index)] = x
        x = out
    return x


def pad_or_crop(x, pairs):
    for i, (lo, hi) in enumerate(pairs):
        axis = 2 + i
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        x = np.pad(x, widths)
        index = [slice(None)] * x.ndim
        index[axis] = slice(max(-lo, 0), x.shape[axis] - max(-hi, 0))
        x = x[tuple(index)]
    return x


def conv_general_nchw(x, w, strides, pads, lhs_dilation, rhs_dilation, feature_group_count=1, batch_group_count=1):
    """XLA's convolution of ``x`` (``N C S...``) and ``w`` (``O I K...``), by loops."""
    dtype = np.result_type(np.asarray(x).dtype, np.asarray(w).dtype, np.float64)  # complex stays complex
    x = pad_or_crop(dilate(np.asarray(x, dtype), lhs_dilation), pads)
    w = np.asarray(w, dtype)
    n_in, c = x.shape[:2]
    o, i_per_group = w.shape[:2]
    kernel = w.shape[2:]
    out_sp = tuple((s - d * (k - 1) - 1) // st + 1 for s, k, st, d in zip(x.shape[2:], kernel, strides, rhs_dilation))
    groups = feature_group_count * batch_group_count
    o_per_group = o // groups
    n_out = n_in // batch_group_count
    out = np.zeros((n_out, o) + out_sp, dtype)
    for n, oc in itertools.product(range(n_out), range(o)):
        g = oc // o_per_group
        if batch_group_count > 1:
            xn = x[g * n_out + n]
        else:
            xn = x[n, g * i_per_group:(g + 1) * i_per_group]
        for y in itertools.product(*map(range, out_sp)):
            acc = 0.0
            for k in itertools.product(*map(range, kernel)):
                pos = tuple(yy * st + kk * d for yy, st, kk, d in zip(y, strides, k, rhs_dilation))
                acc += np.dot(xn[(slice(None),) + pos], w[(oc, slice(None)) + k])
            out[(n, oc) + y] = acc
    return out


def layout_perms(lhs_spec, rhs_spec, out_spec):
    """The permutations taking each operand from its layout to ``N C S...`` / ``O I S...``,
    spatial dims matched by letter in the rhs spec's order."""
    spatial = [ch for ch in rhs_spec if ch not in "OI"]

    def perm(spec, first, second):
        return [spec.index(first), spec.index(second)] + [spec.index(ch) for ch in spatial]

    return perm(lhs_spec, "N", "C"), perm(rhs_spec, "O", "I"), perm(out_spec, "N", "C")
