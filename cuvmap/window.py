"""Window arithmetic shared by the convolution and pooling families and their kernels.

A convolution or a pooling over the spatial dims of an ``N C S...`` array slides a
window of ``k`` taps per spatial dim, with stride ``s``, symmetric padding ``p`` and
dilation ``d`` (1 for pooling). Output position ``y`` reads the input positions

    y·s − p + t·d,   0 ≤ t < k        (tap ``t``)

that is, positions ``y·s + t·d`` of the input padded by ``p`` on both sides, so that

    out = ⌊(S + 2p − d(k − 1) − 1) / s⌋ + 1

positions fit, and the transposed convolution (the adjoint of that map in its input) has
``(S − 1)·s − 2p + d(k − 1) + output_padding + 1``. The kernels work on the padded input
tap by tap: the positions one tap reads for every output position are one strided slice
of it (:func:`tap_slices`), so loops run over the ``Π k`` taps, never over pixels.

Used by the shape rules and impls of ``cuvmap/lax/convolution.py`` and ``cuvmap/lax/pooling.py``,
the im2col kernels of ``cuvmap/lax/conv_gemm.py`` and the vendor bindings in
``cuvmap/cpu/`` and ``cuvmap/cuda/``, and the layers of ``cuvmap/nn/``; it imports nothing of
cuvmap but its errors (``cuvmap/errors.py``), so the bindings can use it without loading
the primitives.
"""
import itertools

import numpy as np

from cuvmap.errors import ShapeError


def spatial_tuple(value, nd, name, op):
    """An int or a sequence as one int per spatial dim (``stride=2`` -> ``(2, 2)``);
    raises :class:`ShapeError` naming ``op`` and ``name`` when the length is wrong."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * nd
    value = tuple(map(int, value))
    if len(value) != nd:
        raise ShapeError(f"{op}: {name} {value} must have one entry per spatial dim ({nd})")
    return value


def output_spatial(spatial, kernel, stride, padding, dilation=None):
    """The output size per spatial dim, ``⌊(S + 2p − d(k − 1) − 1) / s⌋ + 1``
    (``dilation=None``: 1 in every dim, as for pooling)."""
    dilation = (1,) * len(kernel) if dilation is None else dilation
    return tuple(
        (s + 2 * p - d * (k - 1) - 1) // st + 1
        for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation)
    )


def transposed_output_spatial(spatial, kernel, stride, padding, dilation, output_padding):
    """The output size per spatial dim of a transposed convolution,
    ``(S − 1)·s − 2p + d(k − 1) + output_padding + 1``."""
    return tuple(
        (s - 1) * st - 2 * p + d * (k - 1) + op + 1
        for s, k, st, p, d, op in zip(spatial, kernel, stride, padding, dilation, output_padding)
    )


def padded_spatial(spatial, padding):
    """``S + 2p`` per spatial dim."""
    return tuple(s + 2 * p for s, p in zip(spatial, padding))


def taps(kernel):
    """Every tap ``t`` of a window (a tuple, one offset per spatial dim), in row-major order."""
    return itertools.product(*(range(k) for k in kernel))


def tap_slices(tap, out_sp, stride, dilation=None):
    """The positions ``y·s + t·d`` (in padded coordinates) that tap ``t`` reads for every
    output position ``y``: one strided slice per spatial dim."""
    dilation = (1,) * len(tap) if dilation is None else dilation
    return tuple(
        slice(t * d, t * d + st * (o - 1) + 1, st)
        for t, d, st, o in zip(tap, dilation, stride, out_sp)
    )


def interior(padding, spatial):
    """The slices of the padded spatial dims that hold the input (``p`` to ``p + S``)."""
    return tuple(slice(p, p + s) for p, s in zip(padding, spatial))


def pad_spatial(xp, x, padding, value=0):
    """``x`` ``(N, C, S...)`` padded by ``padding`` on both sides of each spatial dim with
    ``value``; ``x`` itself when there is no padding."""
    if not any(padding):
        return x
    return xp.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding), mode="constant",
                  constant_values=value)
