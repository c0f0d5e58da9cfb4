"""JAX's convolution names as front ends of the one conv primitive: ``conv_general_dilated``,
``conv_with_general_padding``, ``conv``, ``conv_transpose``, ``conv_dimension_numbers``,
``ConvDimensionNumbers``, ``padtype_to_pads`` (and the ``Precision`` names they accept).

``conv_general_dilated`` computes XLA's convolution. With the operands brought to the
layouts ``lhs: N C S...`` and ``rhs: O I S...`` by ``dimension_numbers``, the input dilated
by ``lhs_dilation`` (``ℓ − 1`` zeros between neighbours) and padded by ``padding`` (a
``(low, high)`` pair per spatial dim, negative entries crop), feature groups ``G`` and batch
groups ``B``::

    out[n, g·Og + o, y] = Σ_{c,k} x̃[b·N' + n, g'·Cg + c, y·s + k·d] · rhs[g·Og + o, c, k]

where ``x̃`` is the dilated, padded input, ``s`` the window strides, ``d`` the rhs dilation,
``Og = O / (G·B)``, ``Cg = C / G``; with feature groups ``g' = g`` and ``b = 0``, with batch groups
(``B > 1``, the weight gradient of a grouped convolution) ``g' = 0`` and ``b = g``, ``N' = N / B``.
The output is laid out as ``dimension_numbers``' third spec says.

None of these is a primitive: every layout is a ``transpose`` around
:func:`cuvmap.lax.convolution.conv` (aten's ``convolution``, NCHW), so batching, JVP and
VJP rules stay in that one place (functorch's ``BatchRulesConvolution.cpp`` cases) and
reach every layout (NOTE [conv_general_dilated on the conv primitive]).
"""
import collections
import enum

import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.lax import convolution
from cuvmap.lax.elementwise import add, convert_element_type, imag, real, sub
from cuvmap.lax.elementwise import complex as make_complex
from cuvmap.lax.indexing import normalize_slice, slice_p
from cuvmap.lax.jax_shapes import Precision  # noqa: F401 - the one Precision, re-exported with the conv names
from cuvmap.lax.shape import broadcast_in_dim, expand_dims, pad_p, reshape, squeeze, transpose

# NOTE [conv_general_dilated on the conv primitive]
# XLA's convolution is more general than aten's in four ways, each reduced to the
# primitive with operations that are themselves primitives (so every transform applies):
# - layouts: the operands are transposed to N C S... / O I S... and the result back;
# - padding: a (low, high) pair per dim; the symmetric non-negative part min(low, high)
#   is the primitive's own padding, the rest an explicit zero pad (a crop where negative);
# - lhs_dilation: an interior pad of ℓ − 1 zeros between neighbours (x reshaped to
#   (..., S, 1), padded to (..., S, ℓ), flattened and cut to (S − 1)·ℓ + 1), then a regular
#   conv: the multiplications by the zeros are wasted work, the result exact;
# - batch_group_count B: the input's batch N = B·N' is split as (B, N') — batch group
#   outermost, as XLA — and B moved into the channels, C → (B C); the conv with
#   groups = B then pairs batch group g with output-feature group g, which is XLA's rule.
# 0 spatial dims (a grouped matmul) gets a spatial dim of size 1.


ConvDimensionNumbers = collections.namedtuple("ConvDimensionNumbers", ["lhs_spec", "rhs_spec", "out_spec"])
ConvDimensionNumbers.__doc__ = """JAX's ``lax.ConvDimensionNumbers``: for each of lhs, rhs and out the dims
in the order (batch, feature, spatial...), i.e. the permutation bringing that operand to
``N C S...`` (lhs, out) or ``O I S...`` (rhs)."""


def _spec_error(msg):
    return ShapeError(f"conv_general_dilated: dimension_numbers: {msg}")


def conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers):
    """JAX's ``lax.conv_dimension_numbers``: ``dimension_numbers`` (None, a
    :class:`ConvDimensionNumbers` or three strings such as ``("NHWC", "HWIO", "NHWC")``) as a
    :class:`ConvDimensionNumbers` of permutations. ``None`` means ``NC...``, ``OI...``,
    ``NC...``. With strings the spatial dims are matched by letter, in the order the rhs
    spec lists them (that order is the order of strides, padding and dilations)."""
    lhs_shape, rhs_shape = tuple(lhs_shape), tuple(rhs_shape)
    if len(lhs_shape) != len(rhs_shape):
        raise ShapeError(
            f"conv_general_dilated: lhs of shape {lhs_shape} and rhs of shape {rhs_shape} must have the same rank"
        )
    nd = len(lhs_shape)
    if nd < 2:
        raise ShapeError(f"conv_general_dilated: lhs of shape {lhs_shape} needs at least a batch and a feature dim")
    if isinstance(dimension_numbers, ConvDimensionNumbers):
        specs = tuple(tuple(int(i) for i in s) for s in dimension_numbers)
        for name, spec in zip(("lhs_spec", "rhs_spec", "out_spec"), specs):
            if sorted(spec) != list(range(nd)):
                raise _spec_error(f"{name} {spec} is not a permutation of the {nd} dims of {lhs_shape}")
        return ConvDimensionNumbers(*specs)
    if dimension_numbers is None:
        iota = tuple(range(nd))
        return ConvDimensionNumbers(iota, iota, iota)
    try:
        lhs_str, rhs_str, out_str = dimension_numbers
    except (TypeError, ValueError):
        raise _spec_error(f"expected None, ConvDimensionNumbers or three strings, got {dimension_numbers!r}") from None
    return _specs_from_strings(lhs_str, rhs_str, out_str, nd)


def _specs_from_strings(lhs_str, rhs_str, out_str, nd):
    for name, s, pair in (("lhs", lhs_str, "NC"), ("rhs", rhs_str, "OI"), ("out", out_str, "NC")):
        if not isinstance(s, str) or len(s) != nd or len(set(s)) != nd or not set(pair) <= set(s):
            raise _spec_error(f"the {name} spec {s!r} must be {nd} distinct letters including {pair[0]!r} and {pair[1]!r}")
    spatial = [c for c in rhs_str if c not in "OI"]
    for name, s in (("lhs", lhs_str), ("out", out_str)):
        if sorted(c for c in s if c not in "NC") != sorted(spatial):
            raise _spec_error(f"the {name} spec {s!r} must have the rhs spec's spatial letters {''.join(spatial)!r}")

    def perm(s, first, second):
        rest = sorted((i for i, c in enumerate(s) if c not in (first, second)), key=lambda i: spatial.index(s[i]))
        return (s.index(first), s.index(second)) + tuple(rest)

    return ConvDimensionNumbers(perm(lhs_str, "N", "C"), perm(rhs_str, "O", "I"), perm(out_str, "N", "C"))


def padtype_to_pads(in_shape, window_shape, window_strides, padding):
    """JAX's ``lax.padtype_to_pads``: the ``(low, high)`` pairs of a padding name for
    windows of ``window_shape`` sliding with ``window_strides`` over ``in_shape``.
    ``"VALID"``: none; ``"SAME"``: ``out = ⌈in / stride⌉`` positions, the total
    ``max(0, (out − 1)·stride + window − in)`` split with the smaller half low;
    ``"SAME_LOWER"``: the same with the larger half low."""
    if isinstance(padding, str):
        name = padding.upper()
    else:
        name = getattr(padding, "name", None)
    if name == "VALID":
        return [(0, 0)] * len(in_shape)
    if name in ("SAME", "SAME_LOWER"):
        pads = []
        for n, k, s in zip(in_shape, window_shape, window_strides):
            out = -(-int(n) // int(s))
            total = max(0, (out - 1) * int(s) + int(k) - int(n))
            low = total // 2 if name == "SAME" else total - total // 2
            pads.append((low, total - low))
        return pads
    raise ShapeError(f"padtype_to_pads: unknown padding {padding!r}; expected 'SAME', 'SAME_LOWER' or 'VALID'")


def _dilate_dim(k, d):
    return 0 if k == 0 else 1 + d * (k - 1)


def _spatial(value, nd, name, default=1):
    if value is None:
        return (default,) * nd
    value = tuple(int(v) for v in value)
    if len(value) != nd:
        raise ShapeError(f"conv_general_dilated: {name} {value} must have one entry per spatial dim ({nd})")
    if any(v < 1 for v in value):
        raise ShapeError(f"conv_general_dilated: {name} {value} must be positive")
    return value


def _interior_dilate(x, dilation):
    """``x`` (``N C S...``) with ``ℓ − 1`` zeros between neighbours along each spatial dim
    (NOTE [conv_general_dilated on the conv primitive])."""
    for i, ell in enumerate(dilation):
        if ell == 1:
            continue
        axis = 2 + i
        shape = core.shape_of(x)
        n = shape[axis]
        if n == 0:
            continue
        y = expand_dims(x, (axis + 1,))
        pads = [(0, 0)] * (len(shape) + 1)
        pads[axis + 1] = (0, ell - 1)
        y = _zero_pad(y, pads)
        y = reshape(y, shape[:axis] + (n * ell,) + shape[axis + 1:])
        x = _slice_axis(y, 0, (n - 1) * ell + 1, axis)
    return x


def _zero_pad(x, pads):
    """Zero padding by non-negative ``(low, high)`` pairs, one per dim (the primitive's
    params, so that the public ``pad``'s signature may follow JAX's)."""
    return pad_p.bind(x, pads=tuple((int(lo), int(hi)) for lo, hi in pads), value=0)


def _slice_axis(x, start, stop, axis, step=1):
    """``x[..., start:stop:step, ...]`` along ``axis`` (the primitive, as :func:`_zero_pad`)."""
    shape = core.shape_of(x)
    slices = [(0, n, 1) for n in shape]
    slices[axis] = normalize_slice(slice(start, stop, step), shape[axis])
    return slice_p.bind(x, slices=tuple(slices))


def _pad_or_crop(x, pairs):
    """The spatial dims of ``x`` padded by ``(low, high)`` zeros, cropped where negative."""
    for i, (lo, hi) in enumerate(pairs):
        axis = 2 + i
        n = core.shape_of(x)[axis]
        start, stop = max(0, -lo), n - max(0, -hi)
        if stop < start:
            raise ShapeError(f"conv_general_dilated: padding {tuple(pairs)} crops away the whole spatial dim {i} of size {n}")
        if (start, stop) != (0, n):
            x = _slice_axis(x, start, stop, axis)
    grow = [(0, 0), (0, 0)] + [(max(0, lo), max(0, hi)) for lo, hi in pairs]
    if any(lo or hi for lo, hi in grow):
        x = _zero_pad(x, grow)
    return x


def _normalize_padding(padding, in_spatial, kernel, strides, rhs_dilation):
    nd = len(in_spatial)
    if isinstance(padding, str) or isinstance(padding, enum.Enum):
        effective = [_dilate_dim(k, d) for k, d in zip(kernel, rhs_dilation)]
        return [tuple(p) for p in padtype_to_pads(in_spatial, effective, strides, padding)]
    try:
        pairs = [(int(lo), int(hi)) for lo, hi in padding]
    except (TypeError, ValueError):
        raise ShapeError(
            f"conv_general_dilated: padding {padding!r} must be 'SAME', 'SAME_LOWER', 'VALID' or (low, high) pairs"
        ) from None
    if len(pairs) != nd:
        raise ShapeError(f"conv_general_dilated: padding {padding!r} must have one (low, high) pair per spatial dim ({nd})")
    return pairs


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None):
    """JAX's ``lax.conv_general_dilated``: XLA's general convolution (the module docstring
    states the sum), on the one conv primitive.

    Args:
      lhs: the input, ``N C S...`` in the layout of ``dimension_numbers[0]``; 0 to 3 spatial dims.
      rhs: the kernel, ``O I S...`` in the layout of ``dimension_numbers[1]`` with
        ``I = C / feature_group_count`` and ``O`` divisible by both group counts.
      window_strides: one stride per spatial dim (in the rhs spec's order).
      padding: ``"SAME"``, ``"SAME_LOWER"``, ``"VALID"`` or one ``(low, high)`` pair per spatial
        dim (negative entries crop).
      lhs_dilation, rhs_dilation: dilation of the input (``ℓ − 1`` zeros between neighbours:
        the transposed convolution) and of the kernel; None means 1.
      dimension_numbers: None, a :class:`ConvDimensionNumbers` or three strings such as
        ``("NHWC", "HWIO", "NHWC")`` (see :func:`conv_dimension_numbers`).
      feature_group_count: the features split into this many independent convolutions.
      batch_group_count: the batch split into this many groups, group ``g`` convolved with
        output-feature group ``g`` (the weight gradient of a grouped convolution); at most
        one of the two group counts exceeds 1.
      precision: accepted for JAX's signature; unused (see :class:`Precision`).
      preferred_element_type: the result's dtype (the result is cast to it).
    Returns:
      the output in the layout of ``dimension_numbers[2]``.
    """
    del precision
    if _is_complex(lhs) or _is_complex(rhs):
        return _complex_conv(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                             feature_group_count, batch_group_count, preferred_element_type)
    lhs_shape, rhs_shape = core.shape_of(lhs), core.shape_of(rhs)
    dn = conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers)
    nd = len(lhs_shape) - 2
    if nd > 3:
        raise ShapeError(f"conv_general_dilated: {nd} spatial dims (lhs {tuple(lhs_shape)}); the conv primitive has 1 to 3")
    fg, bg = int(feature_group_count), int(batch_group_count)
    if fg < 1 or bg < 1:
        raise ShapeError(f"conv_general_dilated: feature_group_count {fg} and batch_group_count {bg} must be positive")
    if fg > 1 and bg > 1:
        raise ShapeError(
            f"conv_general_dilated: at most one of feature_group_count ({fg}) and batch_group_count ({bg}) may exceed 1"
        )
    strides = _spatial(window_strides, nd, "window_strides")
    lhs_dil = _spatial(lhs_dilation, nd, "lhs_dilation")
    rhs_dil = _spatial(rhs_dilation, nd, "rhs_dilation")
    x = transpose(lhs, dn.lhs_spec)
    w = transpose(rhs, dn.rhs_spec)
    x_shape, w_shape = core.shape_of(x), core.shape_of(w)
    pairs = _normalize_padding(padding, x_shape[2:], w_shape[2:], strides, rhs_dil)
    where = f"lhs {tuple(lhs_shape)}, rhs {tuple(rhs_shape)}"
    if w_shape[0] % (fg * bg):
        raise ShapeError(
            f"conv_general_dilated: rhs output features {w_shape[0]} are not divisible by "
            f"feature_group_count·batch_group_count = {fg * bg} ({where})"
        )
    if bg > 1:
        n = x_shape[0]
        if n % bg:
            raise ShapeError(f"conv_general_dilated: lhs batch {n} is not divisible by batch_group_count {bg} ({where})")
        if w_shape[1] != x_shape[1]:
            raise ShapeError(
                f"conv_general_dilated: rhs input features {w_shape[1]} must equal lhs features {x_shape[1]} ({where})"
            )
        # (B N') C S -> N' (B C) S  (NOTE [conv_general_dilated on the conv primitive])
        x = reshape(x, (bg, n // bg) + tuple(x_shape[1:]))
        x = transpose(x, (1, 0) + tuple(range(2, nd + 3)))
        x = reshape(x, (n // bg, bg * x_shape[1]) + tuple(x_shape[2:]))
    elif w_shape[1] * fg != x_shape[1]:
        raise ShapeError(
            f"conv_general_dilated: rhs expects {w_shape[1] * fg} lhs features ({w_shape[1]} per group, "
            f"feature_group_count={fg}), lhs has {x_shape[1]} ({where})"
        )
    out_spatial = _output_spatial(core.shape_of(x)[2:], w_shape[2:], strides, pairs, lhs_dil, rhs_dil)
    if nd and out_spatial is not None and min(out_spatial) == 0:
        # XLA's output size is clamped at 0 (JAX's): an empty result, which reads no input
        dtype = np.result_type(core.dtype_of(lhs), core.dtype_of(rhs))
        out = broadcast_in_dim(np.zeros((), dtype), (core.shape_of(x)[0], w_shape[0]) + out_spatial, ())
        out = transpose(out, tuple(int(i) for i in np.argsort(dn.out_spec)))
        if preferred_element_type is not None and np.dtype(preferred_element_type) != dtype:
            out = convert_element_type(out, np.dtype(preferred_element_type))
        return out
    squeeze_spatial = nd == 0
    if squeeze_spatial:  # a grouped matmul: one spatial position
        x, w = expand_dims(x, (2,)), expand_dims(w, (2,))
        nd, strides, lhs_dil, rhs_dil, pairs = 1, (1,), (1,), (1,), [(0, 0)]
    x = _interior_dilate(x, lhs_dil)
    symmetric = tuple(max(0, min(lo, hi)) for lo, hi in pairs)
    x = _pad_or_crop(x, [(lo - p, hi - p) for (lo, hi), p in zip(pairs, symmetric)])
    out = convolution.conv(x, w, stride=strides, padding=symmetric, dilation=rhs_dil, groups=fg * bg)
    if squeeze_spatial:
        out = squeeze(out, (2,))
    out = transpose(out, tuple(int(i) for i in np.argsort(dn.out_spec)))
    if preferred_element_type is not None and np.dtype(preferred_element_type) != core.dtype_of(out):
        out = convert_element_type(out, np.dtype(preferred_element_type))
    return out


def _output_spatial(in_sizes, kernel_sizes, strides, pairs, lhs_dilation, rhs_dilation):
    """The output's spatial sizes, XLA's: ``⌊(padded input − dilated kernel) / stride⌋ + 1``,
    clamped at 0 (an input smaller than the kernel gives an empty result); None where the
    padding crops more than the input."""
    sizes = []
    for n, k, s, (lo, hi), ld, rd in zip(in_sizes, kernel_sizes, strides, pairs, lhs_dilation, rhs_dilation):
        padded = ((n - 1) * ld + 1 if n else 0) + lo + hi
        extent = (k - 1) * rd + 1
        if padded < 0:
            return None  # padding that crops more than the input: the pad's own error (JAX's too)
        sizes.append(max(0, (padded - extent) // s + 1) if padded >= extent else 0)
    return tuple(sizes)


def _is_complex(x):
    return core.dtype_of(x).kind == "c"


# NOTE [complex convolutions from real ones]
# A convolution is bilinear, so with x = a + ib and w = c + id, x ⋆ w = (a⋆c − b⋆d) +
# i(a⋆d + b⋆c): four real convolutions of the parts, each on the one conv primitive (with
# every option: layouts, dilations, groups), so the batching rules stay the real ones.
# A real operand contributes only its part (two convolutions). The derivatives follow
# from the real convolutions' and the complex parts' rules (NOTE [complex convention] in
# cuvmap/transforms/complex_rules.py): the transpose of x ↦ x ⋆ w is the correlation with
# w itself, not with its conjugate, as in JAX.
def _complex_conv(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                  feature_group_count, batch_group_count, preferred_element_type):
    """conv_general_dilated of complex operands (NOTE [complex convolutions from real ones])."""
    def conv(x, w):
        return conv_general_dilated(x, w, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                                    feature_group_count, batch_group_count)

    def parts(x):
        return (real(x), imag(x)) if _is_complex(x) else (x, None)

    (a, b), (c, d) = parts(lhs), parts(rhs)
    re_part = conv(a, c)
    im_part = None
    if b is not None and d is not None:
        re_part = sub(re_part, conv(b, d))
    for x, w in ((a, d), (b, c)):
        if x is not None and w is not None:
            im_part = conv(x, w) if im_part is None else add(im_part, conv(x, w))
    out = make_complex(re_part, im_part)
    if preferred_element_type is not None and np.dtype(preferred_element_type) != core.dtype_of(out):
        out = convert_element_type(out, np.dtype(preferred_element_type))
    return out


def conv_with_general_padding(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, precision=None,
                              preferred_element_type=None):
    """JAX's ``lax.conv_with_general_padding``: :func:`conv_general_dilated` with the
    layouts ``NC...`` / ``OI...`` / ``NC...``."""
    return conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                precision=precision, preferred_element_type=preferred_element_type)


def conv(lhs, rhs, *args, **kwargs):
    """JAX's ``lax.conv(lhs, rhs, window_strides, padding, precision=None,
    preferred_element_type=None)`` — :func:`conv_general_dilated` with the layouts
    ``NC...`` / ``OI...`` / ``NC...`` and no dilation — and cuvmap's own
    ``conv(lhs, rhs, bias=None, *, stride, padding, dilation, transposed, output_padding,
    groups)`` (aten's ``convolution``, :func:`cuvmap.lax.convolution.conv`).

    A call is JAX's when ``window_strides`` is given (the third positional argument, a
    sequence of ints, or by keyword) or ``padding`` is a string or a sequence of pairs;
    otherwise aten's (whose third argument, the bias, is an array or None).
    """
    if _is_jax_conv_call(args, kwargs):
        return _jax_conv(lhs, rhs, *args, **kwargs)
    return convolution.conv(lhs, rhs, *args, **kwargs)


def _is_jax_conv_call(args, kwargs):
    if "window_strides" in kwargs or "precision" in kwargs or "preferred_element_type" in kwargs:
        return True
    if args and isinstance(args[0], (tuple, list)) and all(isinstance(s, (int, np.integer)) for s in args[0]):
        return True
    padding = args[1] if len(args) > 1 else kwargs.get("padding")
    return isinstance(padding, str) or (isinstance(padding, (tuple, list)) and any(isinstance(p, (tuple, list)) for p in padding))


def _jax_conv(lhs, rhs, window_strides, padding, precision=None, preferred_element_type=None):
    return conv_general_dilated(lhs, rhs, window_strides, padding, precision=precision,
                                preferred_element_type=preferred_element_type)


def _conv_transpose_padding(k, s, padding):
    """The ``(low, high)`` pair of a transposed convolution (the gradient of a strided
    conv) for a padding name, as JAX's ``conv_transpose`` computes it."""
    if padding == "SAME":
        total = k + s - 2
        low = k - 1 if s > k - 1 else -(-total // 2)
    elif padding == "VALID":
        total = k + s - 2 + max(k - s, 0)
        low = k - 1
    elif isinstance(padding, (tuple, list)) and len(padding) == 2:  # a forward conv's (low, high)
        return k - int(padding[0]) - 1, k - int(padding[1]) - 1
    else:
        raise ShapeError(f"conv_transpose: padding {padding!r} must be 'SAME', 'VALID' or (low, high) pairs")
    return low, total - low


_TRANSPOSE_DEFAULT_SPECS = {
    2: ("NC", "IO", "NC"),
    3: ("NHC", "HIO", "NHC"),
    4: ("NHWC", "HWIO", "NHWC"),
    5: ("NHWDC", "HWDIO", "NHWDC"),
}


def conv_transpose(lhs, rhs, strides, padding, rhs_dilation=None, dimension_numbers=None, transpose_kernel=False,
                   precision=None, preferred_element_type=None, use_consistent_padding=False):
    """JAX's ``lax.conv_transpose``: the transposed convolution (the gradient of a conv
    with ``strides`` in its input), as :func:`conv_general_dilated` with ``lhs_dilation =
    strides`` and unit window strides. ``padding`` is ``"SAME"``, ``"VALID"`` or pairs;
    ``"SAME"`` gives ``in · stride`` outputs. ``dimension_numbers`` defaults to ``NC``,
    ``NHC``/``HIO``, ``NHWC``/``HWIO``, ``NHWDC``/``HWDIO`` by rank; ``transpose_kernel``
    flips the kernel's spatial dims and swaps its ``I`` and ``O`` (the exact adjoint of
    ``conv_general_dilated`` with that kernel). With ``use_consistent_padding=True``
    (JAX's, torch's convention) pairs are the forward conv's padding too, each becoming
    ``(k_eff − 1 − low, k_eff − 1 − high)``; by default pairs pad the transposed conv."""
    lhs_shape, rhs_shape = core.shape_of(lhs), core.shape_of(rhs)
    ndims = len(lhs_shape)
    if len(rhs_shape) != ndims or ndims < 2:
        raise ShapeError(f"conv_transpose: lhs {tuple(lhs_shape)} and rhs {tuple(rhs_shape)} must have one rank ≥ 2")
    if dimension_numbers is None:
        if ndims not in _TRANSPOSE_DEFAULT_SPECS:
            raise ShapeError(f"conv_transpose: no default dimension_numbers for rank {ndims}")
        dimension_numbers = _TRANSPOSE_DEFAULT_SPECS[ndims]
    dn = conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers)
    nd = ndims - 2
    strides = _spatial(strides, nd, "strides")
    rhs_dil = _spatial(rhs_dilation, nd, "rhs_dilation")
    kernel = [rhs_shape[i] for i in dn.rhs_spec[2:]]
    if isinstance(padding, str) or use_consistent_padding:
        effective = [_dilate_dim(k, d) for k, d in zip(kernel, rhs_dil)]
        per_dim = [padding] * nd if isinstance(padding, str) else [tuple(p) for p in padding]
        if len(per_dim) != nd:
            raise ShapeError(f"conv_transpose: padding {padding!r} needs {nd} (low, high) pairs")
        padding = [_conv_transpose_padding(k, s, p) for k, s, p in zip(effective, strides, per_dim)]
    if transpose_kernel:
        rhs = _flip(rhs, dn.rhs_spec[2:])
        perm = list(range(ndims))
        perm[dn.rhs_spec[0]], perm[dn.rhs_spec[1]] = perm[dn.rhs_spec[1]], perm[dn.rhs_spec[0]]
        rhs = transpose(rhs, tuple(perm))
    return conv_general_dilated(lhs, rhs, (1,) * nd, padding, strides, rhs_dil, dn, precision=precision,
                                preferred_element_type=preferred_element_type)


def _flip(x, axes):
    """``x`` reversed along ``axes``."""
    for axis in axes:
        x = _slice_axis(x, None, None, axis, -1)
    return x
