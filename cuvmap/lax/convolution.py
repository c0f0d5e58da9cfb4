"""The convolution family: ``conv``, ``conv_backward_input``, ``conv_backward_weight``.

Semantics are aten's ``convolution``: N-d (1, 2 or 3 spatial dims), layout ``N C S...``,
weight ``O C/groups K...`` (transposed: ``C O/groups K...``), symmetric zero padding:

    conv(x, w)[n, g·Og + o, y] = Σ_{c,k} x[n, g·Cg + c, y·s − p + k·d] · w[g·Og + o, c, k]

and the transposed convolution is the adjoint of that map in ``x`` (with ``output_padding``
extra rows at the high end of each output dim). The two backward primitives are the
adjoints of ``conv`` in each operand, and take the shape of the operand they produce as
a static parameter (aten passes a dummy tensor instead)::

    ⟨conv(x, w), g⟩ = ⟨x, conv_backward_input(g, w, input_shape=x.shape)⟩
                    = ⟨w, conv_backward_weight(g, x, weight_shape=w.shape)⟩

The three are bilinear, so every JVP and VJP rule is another member of the family; that
makes second derivatives (hessian-vector products of a CNN loss) work unchanged.

Batching follows PyTorch functorch's ``BatchRulesConvolution.cpp`` case by case: the vmap
dim is folded into the batch dim ``N``, into the output or input channels, or into the
groups (``groups *= B``), so that every batched case is one grouped convolution. The
comments name the layouts as functorch's file does: ``B`` the vmap dim, ``G`` groups, ``(B O)``
a merged dim with ``B`` outermost.

Impls: on NumPy arrays oneDNN's convolutions (``cuvmap/cpu/onednn.py``, float32, when
``libdnnl`` loads), on CuPy arrays cuDNN's (``cuvmap/cuda/cudnn.py``, when ``libcudnn``
loads), and im2col + batched GEMM (``cuvmap/lax/conv_gemm.py``) on either; by default the
first call of each shape (its batch dims bucketed) times the vendor's kernels against
im2col and keeps the faster, and float64 on the CPU always runs im2col (NOTE [conv
strategy] in cuvmap/lax/conv_strategy.py, whose :func:`set_strategy`,
:func:`measured_choices` and :class:`VendorKernelWarning` this module re-exports).
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import conv_gemm
from cuvmap.lax import elementwise as ew
from cuvmap.lax.conv_strategy import channels_last_results
from cuvmap.lax.conv_strategy import (  # noqa: F401  (the strategy's public names, re-exported)
    VendorKernelWarning, add_bias, clear_measured_choices, get_strategy, measured_choices, run_kernel, set_strategy,
)
from cuvmap.lax.reduction import reduce_sum
from cuvmap.lax.shape import broadcast_in_dim, reshape, transpose
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.transforms.batching import move_bdim, not_mapped
from cuvmap.window import output_spatial, spatial_tuple, transposed_output_spatial

# ---------------------------------------------------------------------------------------
# Declarations and public wrappers
# ---------------------------------------------------------------------------------------



def _conv_workspace(in_avals, out_avals, params, strided):
    """What a convolution allocates besides its result (NOTE [planned peak memory] in
    cuvmap/transforms/executor/peak_memory.py): the unfolded columns of the unfold kernels,
    ``N · C_in · K · out`` elements (the input's channels, the kernel's size, the output's
    spatial size; on the CPU built in blocks of at most twice ``conv_gemm.BLOCK_BYTES``:
    NOTE [cache blocking]), and a second result while the ``auto`` strategy times both
    kernels on a shape's first call. The data operands: the input (``conv``), grad_output
    and the input (``conv_backward_weight``), grad_output and the input's shape
    (``conv_backward_input``); a transposed convolution counts the larger channel count
    and spatial size of input and output."""
    out = out_avals[0]
    first = in_avals[0]
    if first is None or len(first.shape) < 3:
        return 0
    weight_shape = params.get("weight_shape")
    if weight_shape is not None:  # conv_backward_weight(grad_output, lhs)
        lhs = in_avals[1] if in_avals[1] is not None else first
        inputs, outputs = lhs.shape, first.shape
    elif "input_shape" in params:  # conv_backward_input(grad_output, rhs)
        weight_shape = in_avals[1].shape if in_avals[1] is not None else None
        inputs, outputs = tuple(params["input_shape"]), first.shape
    else:  # conv(lhs, rhs, bias)
        weight_shape = in_avals[1].shape if in_avals[1] is not None else None
        inputs, outputs = first.shape, out.shape
    k = int(np.prod(weight_shape[2:], dtype=np.int64)) if weight_shape is not None else 1
    channels = inputs[1]
    spatial = int(np.prod(outputs[2:], dtype=np.int64))
    if params.get("transposed"):
        channels = max(inputs[1], outputs[1])
        spatial = max(spatial, int(np.prod(inputs[2:], dtype=np.int64)))
    itemsize = out.dtype.itemsize
    columns = inputs[0] * channels * k * spatial * itemsize  # (whatever the groups: C/G channels per group)
    if out.device is None or not str(out.device).startswith("gpu"):
        columns = min(columns, 2 * conv_gemm.BLOCK_BYTES)
    return columns + out.size * itemsize


conv_p = Primitive("conv", owns_output=True, workspace=_conv_workspace)
conv_backward_input_p = Primitive("conv_backward_input", owns_output=True, workspace=_conv_workspace)
conv_backward_weight_p = Primitive("conv_backward_weight", owns_output=True, workspace=_conv_workspace)


def conv_params(nd, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1):
    """Normalizes the static parameters of the conv family to hashable tuples."""
    return dict(
        stride=spatial_tuple(stride, nd, "stride", "conv"),
        padding=spatial_tuple(padding, nd, "padding", "conv"),
        dilation=spatial_tuple(dilation, nd, "dilation", "conv"),
        transposed=bool(transposed),
        output_padding=spatial_tuple(output_padding, nd, "output_padding", "conv"),
        groups=int(groups),
    )


def conv(lhs, rhs, bias=None, *, stride=1, padding=0, dilation=1, transposed=False, output_padding=0, groups=1):
    """aten's ``convolution``.

    Args:
      lhs: input ``(N, C, S...)`` with 1, 2 or 3 spatial dims.
      rhs: weight ``(O, C/groups, K...)``, or ``(C, O/groups, K...)`` when ``transposed``.
      bias: ``(O,)`` or None.
      stride, padding, dilation, output_padding: ints or one int per spatial dim; padding
        is symmetric zero padding (``output_padding`` only for transposed convs).
      transposed: the transposed convolution (the adjoint of the regular one in its input).
      groups: the channels split into ``groups`` independent convolutions.
    Returns:
      ``(N, O, out...)``.
    """
    nd = len(core.shape_of(lhs)) - 2
    params = conv_params(nd, stride, padding, dilation, transposed, output_padding, groups)
    operands = (lhs, rhs) if bias is None else (lhs, rhs, bias)
    return conv_p.bind(*operands, **params)


def conv_backward_input(grad_output, rhs, input_shape, *, stride, padding, dilation, transposed, output_padding, groups):
    """``∂⟨conv(x, rhs), grad_output⟩/∂x`` for ``x`` of shape ``input_shape``."""
    return conv_backward_input_p.bind(
        grad_output, rhs, input_shape=tuple(map(int, input_shape)), stride=stride, padding=padding,
        dilation=dilation, transposed=transposed, output_padding=output_padding, groups=groups,
    )


def conv_backward_weight(grad_output, lhs, weight_shape, *, stride, padding, dilation, transposed, output_padding, groups):
    """``∂⟨conv(lhs, w), grad_output⟩/∂w`` for ``w`` of shape ``weight_shape``."""
    return conv_backward_weight_p.bind(
        grad_output, lhs, weight_shape=tuple(map(int, weight_shape)), stride=stride, padding=padding,
        dilation=dilation, transposed=transposed, output_padding=output_padding, groups=groups,
    )


# ---------------------------------------------------------------------------------------
# Shape rules
# ---------------------------------------------------------------------------------------


def _check_common(lhs_shape, rhs_shape, stride, padding, dilation, transposed, output_padding, groups):
    nd = len(lhs_shape) - 2
    if nd not in (1, 2, 3):
        raise ShapeError(f"input of shape {tuple(lhs_shape)} must be (N, C, spatial...) with 1, 2 or 3 spatial dims")
    if len(rhs_shape) != len(lhs_shape):
        raise ShapeError(
            f"weight of shape {tuple(rhs_shape)} must have the rank of the input {tuple(lhs_shape)} "
            f"({'(C, O/groups, K...)' if transposed else '(O, C/groups, K...)'})"
        )
    if groups < 1:
        raise ShapeError(f"groups must be positive, got {groups}")
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        raise ShapeError(f"stride {stride} and dilation {dilation} must be positive")
    if any(p < 0 for p in padding):
        raise ShapeError(f"negative padding {padding}")
    if any(o < 0 for o in output_padding):
        raise ShapeError(f"negative output_padding {output_padding}")
    if not transposed and any(output_padding):
        raise ShapeError(f"output_padding {output_padding} is only for transposed convolutions")
    if transposed and any(o >= s and o >= d for o, s, d in zip(output_padding, stride, dilation)):
        raise ShapeError(
            f"output_padding {output_padding} must be smaller than either stride {stride} or dilation {dilation}"
        )


def conv_output_shape(lhs_shape, rhs_shape, *, stride, padding, dilation, transposed, output_padding, groups):
    """Shape of ``conv(lhs, rhs)``; raises :class:`ShapeError` naming the shapes."""
    _check_common(lhs_shape, rhs_shape, stride, padding, dilation, transposed, output_padding, groups)
    n, c = lhs_shape[:2]
    spatial = tuple(lhs_shape[2:])
    kernel = tuple(rhs_shape[2:])
    where = f"input {tuple(lhs_shape)}, weight {tuple(rhs_shape)}, groups={groups}"
    if c % groups:
        raise ShapeError(f"input channels {c} are not divisible by groups {groups} ({where})")
    if transposed:
        if rhs_shape[0] != c:
            raise ShapeError(f"transposed weight must be (C, O/groups, K...) with C = {c} input channels ({where})")
        out_ch = rhs_shape[1] * groups
        out_sp = transposed_output_spatial(spatial, kernel, stride, padding, dilation, output_padding)
    else:
        if rhs_shape[0] % groups:
            raise ShapeError(f"output channels {rhs_shape[0]} are not divisible by groups {groups} ({where})")
        if rhs_shape[1] * groups != c:
            raise ShapeError(
                f"weight expects {rhs_shape[1] * groups} input channels ({rhs_shape[1]} per group), "
                f"the input has {c} ({where})"
            )
        out_ch = rhs_shape[0]
        for s, k, p, d in zip(spatial, kernel, padding, dilation):
            if s + 2 * p < d * (k - 1) + 1:
                raise ShapeError(
                    f"kernel of extent {d * (k - 1) + 1} (size {k}, dilation {d}) is larger than the padded "
                    f"input ({s} + 2·{p}) ({where})"
                )
        out_sp = output_spatial(spatial, kernel, stride, padding, dilation)
    if any(o < 1 for o in out_sp):
        raise ShapeError(f"the output would be empty: spatial size {out_sp} ({where})")
    return (n, out_ch) + out_sp


def _conv_shape_rule(lhs, rhs, *maybe_bias, **params):
    shape = conv_output_shape(lhs.shape, rhs.shape, **params)
    dtype = core.common_float_dtype(lhs, rhs, *maybe_bias)
    if maybe_bias:
        (bias,) = maybe_bias
        if tuple(bias.shape) != (shape[1],):
            raise ShapeError(f"bias of shape {tuple(bias.shape)} must be ({shape[1]},) for {shape[1]} output channels")
    return ShapedArray(shape, dtype)


def _conv_backward_input_shape_rule(grad_output, rhs, *, input_shape, **params):
    expected = conv_output_shape(input_shape, rhs.shape, **params)
    if tuple(grad_output.shape) != expected:
        raise ShapeError(
            f"grad_output of shape {tuple(grad_output.shape)} does not match the conv output {expected} "
            f"of an input {tuple(input_shape)} and weight {tuple(rhs.shape)}"
        )
    return ShapedArray(input_shape, core.common_float_dtype(grad_output, rhs))


def _conv_backward_weight_shape_rule(grad_output, lhs, *, weight_shape, **params):
    expected = conv_output_shape(lhs.shape, weight_shape, **params)
    if tuple(grad_output.shape) != expected:
        raise ShapeError(
            f"grad_output of shape {tuple(grad_output.shape)} does not match the conv output {expected} "
            f"of an input {tuple(lhs.shape)} and weight {tuple(weight_shape)}"
        )
    return ShapedArray(weight_shape, core.common_float_dtype(grad_output, lhs))


conv_p.shape_rule = _conv_shape_rule
conv_backward_input_p.shape_rule = _conv_backward_input_shape_rule
conv_backward_weight_p.shape_rule = _conv_backward_weight_shape_rule


# ---------------------------------------------------------------------------------------
# Impls
# ---------------------------------------------------------------------------------------


def _conv_impl(lhs, rhs, *maybe_bias, stride, padding, dilation, transposed, output_padding, groups):
    params = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                  output_padding=output_padding, groups=groups)
    out_shape = conv_p.check(lhs, rhs, *maybe_bias, **params).shape
    bias = maybe_bias[0] if maybe_bias else None
    if not transposed:
        return run_kernel("forward", lhs, rhs, stride, padding, dilation, groups, bias=bias)
    # a transposed conv is the input-gradient of the regular conv from its output space;
    # its input plays that conv's grad_output, zero-padded to the regular conv's extent
    # (NOTE [output_padding in the transposed backward])
    lhs = _zero_pad_to(lhs, output_spatial(out_shape[2:], rhs.shape[2:], stride, padding, dilation))
    out = run_kernel("backward_input", lhs, rhs, out_shape, stride, padding, dilation, groups)
    return out if bias is None else add_bias(out, bias)


def _zero_pad_to(x, extent):
    """``x`` ``(N, C, S...)`` zero-padded at the high end of each spatial dim to ``extent``
    (NOTE [output_padding in the transposed backward]); ``x`` itself when it fits."""
    if tuple(extent) == tuple(x.shape[2:]):
        return x
    pads = ((0, 0), (0, 0)) + tuple((0, e - s) for e, s in zip(extent, x.shape[2:]))
    return backend.xp_of(x).pad(x, pads)


# NOTE [output_padding in the transposed backward]
# The transposed conv's output has S_out = (s − 1)·st − 2p + d(k − 1) + op + 1 positions.
# The regular conv over S_out positions yields ⌊(S_out + 2p − d(k − 1) − 1)/st⌋ + 1 =
# s + ⌊op/st⌋ positions: more than the input's s when output_padding ≥ stride (allowed
# when it is below the dilation). The extra positions lie past the input. So the
# transposed conv itself (a backward-data call) gets its input zero-padded to that extent,
# as cuDNN and oneDNN require consistent shapes; its input gradient (a regular conv) keeps
# the first s positions; and its weight gradient pads the input with zeros to the regular
# conv's extent (zero terms, so all three are exact).


def _conv_backward_input_impl(grad_output, rhs, *, input_shape, stride, padding, dilation, transposed,
                              output_padding, groups):
    conv_backward_input_p.check(grad_output, rhs, input_shape=input_shape, stride=stride, padding=padding,
                                dilation=dilation, transposed=transposed, output_padding=output_padding,
                                groups=groups)
    if transposed:
        # adjoint of the transposed conv in its input: the regular conv (NOTE [output_padding
        # in the transposed backward]: keep its first input_shape positions)
        out = run_kernel("forward", grad_output, rhs, stride, padding, dilation, groups)
        if tuple(out.shape[2:]) != tuple(input_shape[2:]):
            crop = (slice(None), slice(None)) + tuple(slice(0, s) for s in input_shape[2:])
            out = backend.xp_of(out).ascontiguousarray(out[crop])
        return out
    return run_kernel("backward_input", grad_output, rhs, input_shape, stride, padding, dilation, groups)


def _conv_backward_weight_impl(grad_output, lhs, *, weight_shape, stride, padding, dilation, transposed,
                               output_padding, groups):
    conv_backward_weight_p.check(grad_output, lhs, weight_shape=weight_shape, stride=stride, padding=padding,
                                 dilation=dilation, transposed=transposed, output_padding=output_padding,
                                 groups=groups)
    if transposed:
        # transposed conv T(x; w) = regular conv's input-gradient: ⟨T(x; w), g⟩ = ⟨x, conv(g; w)⟩,
        # so its weight-gradient is the regular one with the roles of x and g swapped; x
        # plays the regular conv's output, zero-padded to its extent (NOTE [output_padding
        # in the transposed backward]).
        lhs = _zero_pad_to(lhs, output_spatial(grad_output.shape[2:], weight_shape[2:], stride, padding, dilation))
        return run_kernel("backward_weight", lhs, grad_output, weight_shape, stride, padding, dilation, groups)
    return run_kernel("backward_weight", grad_output, lhs, weight_shape, stride, padding, dilation, groups)


conv_p.impl = _conv_impl
conv_backward_input_p.impl = _conv_backward_input_impl
conv_backward_weight_p.impl = _conv_backward_weight_impl


def channels_last_fact(primitive, reads, writes):
    """The ``channels_last`` fact of a regular convolution's ``primitive`` (NOTE
    [channels-last activations in a plan] in cuvmap/transforms/executor/layouts.py):
    ``reads(params)`` and ``writes(params)`` give the operands it reads and the results it
    writes in either layout, its impl run inside the vendor's channels-last request (NOTE
    [channels-last results] in cuvmap/cpu/onednn.py) writes them so; a transposed one
    states nothing."""
    def impl(*operands, **params):
        with channels_last_results():
            return primitive.impl(*operands, **params)

    def fact(params):
        return None if params.get("transposed") else (reads(params), writes(params), impl)
    return fact


conv_p.channels_last = channels_last_fact(conv_p, lambda params: (0,), lambda params: (0,))
conv_backward_input_p.channels_last = channels_last_fact(conv_backward_input_p, lambda params: (0,),
                                                         lambda params: (0,))
conv_backward_weight_p.channels_last = channels_last_fact(conv_backward_weight_p, lambda params: (0, 1),
                                                          lambda params: ())


# ---------------------------------------------------------------------------------------
# Batching rules (functorch's BatchRulesConvolution.cpp, case by case)
# ---------------------------------------------------------------------------------------


# The layouts are named as in functorch's file: ``B`` the vmap dim, ``G`` groups, ``(B O)``
# a merged dim with ``B`` outermost. ``fold_bdim_into(x, bdim, dst)`` is functorch's
# ``reshape_dim_into`` and ``split_bdim_out_of(x, axis, size, rest)`` its
# ``reshape_dim_outof``; the rules pass ``rest`` (the logical size of the split dim), which
# a batch of size 0 cannot reveal.
fold = batching.fold_bdim_into
split = batching.split_bdim_out_of


def _merge_dims(x, start, count):
    s = tuple(x.shape)
    merged = int(np.prod(s[start:start + count]))
    return reshape(x, s[:start] + (merged,) + s[start + count:])


def _regroup_channels(x, dim, groups, size, per_group):
    """``(G B C)`` at ``dim`` -> ``B (G C)`` at ``dim``, ``dim + 1``: the layout grouped
    convolutions produce when ``B`` was folded inside each group (``C = per_group``)."""
    x = split(x, dim, groups, x.shape[dim] // groups)   # G (B C)
    x = split(x, dim + 1, size, per_group)             # G B C
    perm = list(range(len(x.shape)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    x = transpose(x, tuple(perm))                       # B G C
    return _merge_dims(x, dim + 1, 2)                   # B (G C)


def _fold_inside_groups(x, bdim, dim, groups):
    """``B (G C)`` with the batch dim at ``bdim`` and ``(G C)`` at logical ``dim`` ->
    ``(G B C)`` at ``dim``: folds the vmap dim inside each group."""
    x = move_bdim(x, bdim, 0)                             # B ... (G C) ...
    x = split(x, dim + 1, groups, x.shape[dim + 1] // groups)   # B ... G C ...
    x = fold(x, 0, dim + 1)                               # ... G (B C) ...
    return _merge_dims(x, dim, 2)                         # ... (G B C) ...


def _logical_shape(x, bdim):
    s = tuple(core.shape_of(x))
    return s if bdim is not_mapped else s[:bdim] + s[bdim + 1:]


def _conv_batch(axis_size, vals, dims, *, stride, padding, dilation, transposed, output_padding, groups):
    params = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                  output_padding=output_padding, groups=groups)
    if axis_size == 0:
        return batching.empty_batch(conv_p, vals, dims, dict(params))
    lhs, rhs = vals[:2]
    lhs_b, rhs_b = dims[:2]
    size = axis_size
    has_bias = len(vals) == 3
    bias, bias_b = (vals[2], dims[2]) if has_bias else (None, not_mapped)
    # a batched bias, or a bias beside a batched weight, is added after the convolution
    separate_bias = has_bias and (rhs_b is not not_mapped or bias_b is not not_mapped)
    inline_bias = (bias,) if has_bias and not separate_bias else ()
    out_ch_dim = 1 if transposed else 0  # dim of the weight holding output channels
    n, out_ch = conv_output_shape(_logical_shape(lhs, lhs_b), _logical_shape(rhs, rhs_b), **params)[:2]

    if lhs_b is not not_mapped and rhs_b is not_mapped:
        # BN... -> (BN)...
        out = conv_p.bind(fold(lhs, lhs_b, 0), rhs, *inline_bias, **params)
        out, out_b = split(out, 0, size, n), 0
    elif lhs_b is not_mapped and rhs_b is not not_mapped:
        if groups == 1:
            # regular: BOI -> (BO)I;  transposed: BIO -> I(BO);  then N(BO) -> NBO
            out = conv_p.bind(lhs, fold(rhs, rhs_b, out_ch_dim), *inline_bias, **params)
            out, out_b = split(out, 1, size, out_ch), 1
        else:
            if transposed:
                # BIO -> I(BO): N(GI), (GI)(BO) -> N(GBO)
                w = fold(rhs, rhs_b, 1)
            else:
                # B(GO)I -> (GBO)I: N(GI), (GBO)I -> N(GBO)
                w = _fold_inside_groups(rhs, rhs_b, 0, groups)
            out = conv_p.bind(lhs, w, *inline_bias, **params)
            out, out_b = _regroup_channels(out, 1, groups, size, out_ch // groups), 1   # N(GBO) -> NB(GO)
    elif lhs_b is not not_mapped and rhs_b is not not_mapped:
        # BNC, BOI -> N(BC), (BO)I with groups·B -> N(BO) -> NBO   (transposed: (BI)O)
        out = conv_p.bind(fold(lhs, lhs_b, 1), fold(rhs, rhs_b, 0), *inline_bias,
                          **dict(params, groups=groups * size))
        out, out_b = split(out, 1, size, out_ch), 1
    else:
        out, out_b = conv_p.bind(lhs, rhs, *inline_bias, **params), not_mapped

    if not separate_bias:
        return out, out_b
    # out + bias[:, None, ...] with either or both batched: batch dims to the front, the
    # bias padded to the output's logical rank (functorch's maybePadToLogicalRank).
    nd = len(stride)
    if out_b is not not_mapped:
        out = move_bdim(out, out_b, 0)
    if bias_b is not_mapped:
        b = reshape(bias, tuple(bias.shape) + (1,) * nd)                    # O 1...
    else:
        b = move_bdim(bias, bias_b, 0)
        b = reshape(b, (b.shape[0], 1, b.shape[1]) + (1,) * nd)             # B 1 O 1...
    return ew.add(out, b), 0


def _conv_backward_input_batch(axis_size, vals, dims, *, input_shape, stride, padding, dilation, transposed,
                               output_padding, groups):
    params = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                  output_padding=output_padding, groups=groups)
    if axis_size == 0:
        return batching.empty_batch(conv_backward_input_p, vals, dims, dict(params, input_shape=input_shape))
    g, w = vals
    g_b, w_b = dims
    size = axis_size
    n, c = input_shape[:2]
    spatial = tuple(input_shape[2:])
    if g_b is not not_mapped and w_b is not not_mapped:
        # regular: BNO, BOI -> N(BO), (BO)I -> N(BI);  transposed: BNO, BIO -> N(BO), (BI)O -> N(BI)
        out = conv_backward_input_p.bind(
            fold(g, g_b, 1), fold(w, w_b, 0),
            input_shape=(n, size * c) + spatial, **dict(params, groups=groups * size))
        return split(out, 1, size, c), 1
    if g_b is not not_mapped:
        # BNO, OI -> (BN)O, OI -> (BN)I  (transposed alike)
        out = conv_backward_input_p.bind(fold(g, g_b, 0), w, input_shape=(size * n, c) + spatial, **params)
        return split(out, 0, size, n), 0
    if groups == 1:
        # regular: NO, BOI -> NO, O(BI) -> N(BI);  transposed: NO, BIO -> NO, (BI)O -> N(BI)
        in_ch_dim = 0 if transposed else 1
        out = conv_backward_input_p.bind(
            g, fold(w, w_b, in_ch_dim), input_shape=(n, size * c) + spatial, **params)
        return split(out, 1, size, c), 1
    if transposed:
        # N(GO), B(GI)O -> N(GO), (GBI)O -> N(GBI)
        w2 = _fold_inside_groups(w, w_b, 0, groups)
    else:
        # N(GO), B(GO)I -> N(GO), (GO)(BI) -> N(GBI)
        w2 = fold(w, w_b, 1)
    out = conv_backward_input_p.bind(g, w2, input_shape=(n, size * c) + spatial, **params)
    return _regroup_channels(out, 1, groups, size, c // groups), 1   # N(GBI) -> NB(GI)


def _conv_backward_weight_batch(axis_size, vals, dims, *, weight_shape, stride, padding, dilation, transposed,
                                output_padding, groups):
    params = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                  output_padding=output_padding, groups=groups)
    if axis_size == 0:
        return batching.empty_batch(conv_backward_weight_p, vals, dims, dict(params, weight_shape=weight_shape))
    g, x = vals
    g_b, x_b = dims
    size = axis_size
    w0, w1 = weight_shape[:2]
    kernel = tuple(weight_shape[2:])
    if g_b is not not_mapped and x_b is not not_mapped:
        # the per-example-gradient case: BNO, BNI -> N(BO), N(BI) with groups·B
        # -> (BO)I (regular) or (BI)O (transposed)
        out = conv_backward_weight_p.bind(
            fold(g, g_b, 1), fold(x, x_b, 1),
            weight_shape=(size * w0, w1) + kernel, **dict(params, groups=groups * size))
        return split(out, 0, size, w0), 0
    if g_b is not not_mapped:
        if groups == 1:
            # regular: BNO, NI -> N(BO), NI -> (BO)I;  transposed: BNO, NI -> N(BO), NI -> I(BO)
            out_ch_dim = 1 if transposed else 0
            ws = list(weight_shape)
            ws[out_ch_dim] *= size
            out = conv_backward_weight_p.bind(fold(g, g_b, 1), x, weight_shape=tuple(ws), **params)
            return split(out, out_ch_dim, size, weight_shape[out_ch_dim]), out_ch_dim
        g2 = _fold_inside_groups(g, g_b, 1, groups)    # BN(GO) -> N(GBO)
        if transposed:
            # N(GBO), N(GI) -> (GI)(BO)
            out = conv_backward_weight_p.bind(g2, x, weight_shape=(w0, size * w1) + kernel, **params)
            return split(out, 1, size, w1), 1
        # N(GBO), N(GI) -> (GBO)I -> B(GO)I
        out = conv_backward_weight_p.bind(g2, x, weight_shape=(size * w0, w1) + kernel, **params)
        return _regroup_channels(out, 0, groups, size, w0 // groups), 0
    if groups == 1:
        # regular: NO, BNI -> NO, N(BI) -> O(BI);  transposed: NO, BNI -> NO, N(BI) -> (BI)O
        in_ch_dim = 0 if transposed else 1
        ws = list(weight_shape)
        ws[in_ch_dim] *= size
        out = conv_backward_weight_p.bind(g, fold(x, x_b, 1), weight_shape=tuple(ws), **params)
        return split(out, in_ch_dim, size, weight_shape[in_ch_dim]), in_ch_dim
    x2 = _fold_inside_groups(x, x_b, 1, groups)        # BN(GI) -> N(GBI)
    if transposed:
        # N(GO), N(GBI) -> (GBI)O -> B(GI)O
        out = conv_backward_weight_p.bind(g, x2, weight_shape=(size * w0, w1) + kernel, **params)
        return _regroup_channels(out, 0, groups, size, w0 // groups), 0
    # N(GO), N(GBI) -> (GO)(BI)
    out = conv_backward_weight_p.bind(g, x2, weight_shape=(w0, size * w1) + kernel, **params)
    return split(out, 1, size, w1), 1


batching.primitive_batchers[conv_p] = _conv_batch
batching.primitive_batchers[conv_backward_input_p] = _conv_backward_input_batch
batching.primitive_batchers[conv_backward_weight_p] = _conv_backward_weight_batch


# ---------------------------------------------------------------------------------------
# JVP and VJP rules: each member of the family is bilinear, and its partial maps are the
# other members (see the module docstring for the adjoint identities).
# ---------------------------------------------------------------------------------------


def _bias_as_output(b, out):
    """``b`` of shape (O,) broadcast to the shape of ``out`` (N, O, S...)."""
    return broadcast_in_dim(b, core.shape_of(out), (1,))


def _bias_ct(ct):
    """The bias's cotangent: ``ct`` summed over every dim but the channels."""
    return reduce_sum(ct, (0,) + tuple(range(2, len(core.shape_of(ct)))))


# conv(lhs, rhs, bias): linear in each operand
jvp.defjvp(
    conv_p,
    lambda t, out, lhs, rhs, *b, **params: conv_p.bind(t, rhs, **params),
    lambda t, out, lhs, rhs, *b, **params: conv_p.bind(lhs, t, **params),
    lambda t, out, lhs, rhs, *b, **params: _bias_as_output(t, out),
)
vjp.defvjp(
    conv_p,
    lambda ct, out, lhs, rhs, *b, **params: conv_backward_input(ct, rhs, core.shape_of(lhs), **params),
    lambda ct, out, lhs, rhs, *b, **params: conv_backward_weight(ct, lhs, core.shape_of(rhs), **params),
    lambda ct, out, lhs, rhs, *b, **params: _bias_ct(ct),
    reads=(0, 1),
)

# conv_backward_input(g, rhs):  ⟨bwd_in(g, w), c⟩ = ⟨g, conv(c, w)⟩ = ⟨w, bwd_w(g, c)⟩
jvp.defjvp(
    conv_backward_input_p,
    lambda t, out, g, rhs, *, input_shape, **params: conv_backward_input(t, rhs, input_shape, **params),
    lambda t, out, g, rhs, *, input_shape, **params: conv_backward_input(g, t, input_shape, **params),
)
vjp.defvjp(
    conv_backward_input_p,
    lambda ct, out, g, rhs, *, input_shape, **params: conv_p.bind(ct, rhs, **params),
    lambda ct, out, g, rhs, *, input_shape, **params: conv_backward_weight(g, ct, core.shape_of(rhs), **params),
    reads=(0, 1),
)

# conv_backward_weight(g, lhs):  ⟨bwd_w(g, x), c⟩ = ⟨g, conv(x, c)⟩ = ⟨x, bwd_in(g, c)⟩
jvp.defjvp(
    conv_backward_weight_p,
    lambda t, out, g, lhs, *, weight_shape, **params: conv_backward_weight(t, lhs, weight_shape, **params),
    lambda t, out, g, lhs, *, weight_shape, **params: conv_backward_weight(g, t, weight_shape, **params),
)
vjp.defvjp(
    conv_backward_weight_p,
    lambda ct, out, g, lhs, *, weight_shape, **params: conv_p.bind(lhs, ct, **params),
    lambda ct, out, g, lhs, *, weight_shape, **params: conv_backward_input(g, ct, core.shape_of(lhs), **params),
    reads=(0, 1),
)
