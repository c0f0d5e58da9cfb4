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
strategy]).
"""
import time
import warnings

import numpy as np

from cuvmap import backend, config, core
from cuvmap.cpu import threads as cpu_threads
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import conv_gemm
from cuvmap.lax import elementwise as ew
from cuvmap.lax.reduction import reduce_sum
from cuvmap.lax.shape import broadcast_in_dim, reshape, transpose
from cuvmap.measured_choices import MeasuredChoices
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.transforms.batching import move_bdim, not_mapped
from cuvmap.window import output_spatial, transposed_output_spatial

# ---------------------------------------------------------------------------------------
# Declarations and public wrappers
# ---------------------------------------------------------------------------------------



def _conv_workspace(in_avals, out_avals, params, strided):
    """What a convolution allocates besides its result (NOTE [planned peak memory] in
    cuvmap/transforms/executor.py): the unfolded columns of the unfold kernels,
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
        stride=core.spatial_tuple(stride, nd, "stride", "conv"),
        padding=core.spatial_tuple(padding, nd, "padding", "conv"),
        dilation=core.spatial_tuple(dilation, nd, "dilation", "conv"),
        transposed=bool(transposed),
        output_padding=core.spatial_tuple(output_padding, nd, "output_padding", "conv"),
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
        grad_output, rhs, input_shape=tuple(int(s) for s in input_shape), stride=stride, padding=padding,
        dilation=dilation, transposed=transposed, output_padding=output_padding, groups=groups,
    )


def conv_backward_weight(grad_output, lhs, weight_shape, *, stride, padding, dilation, transposed, output_padding, groups):
    """``∂⟨conv(lhs, w), grad_output⟩/∂w`` for ``w`` of shape ``weight_shape``."""
    return conv_backward_weight_p.bind(
        grad_output, lhs, weight_shape=tuple(int(s) for s in weight_shape), stride=stride, padding=padding,
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


# NOTE [conv strategy]
# functorch's BatchRulesConvolution.cpp leaves a TODO: "unfold + matmul is actually faster
# than group convolution in many cases". The batched cases fold the vmap dim into N or into
# the groups (groups·B), so which kernels run a given shape matters here. Strategies:
#   "unfold": im2col + batched GEMM (cuvmap/lax/conv_gemm.py) on NumPy or CuPy, a grouped
#             convolution as one batched matmul over the groups; on the CPU the columns
#             take the layout with the longer contiguous runs and are built in blocks
#             (NOTEs [column layouts] and [cache blocking] there). The only kernels for
#             float64 on the CPU.
#   "onednn": oneDNN's direct convolutions on the CPU (cuvmap/cpu/onednn.py; float32), the
#             kernels torch uses, in oneDNN's blocked layouts.
#   "cudnn":  cuDNN's grouped convolutions on the GPU (cuvmap/cuda/cudnn.py).
#   "auto":   the default. The first call of each key (below) runs the device's vendor
#             kernels and the unfold ones on its operands and times them — on the CPU
#             oneDNN against im2col (perf_counter: the faster of two calls after a
#             warm-up call), on the GPU cuDNN against the CuPy unfold kernels (CUDA
#             events: cuda.device.time_gpu of two calls after a warm-up call) — records
#             the faster for the key and returns its result; later calls of the key run
#             that kernel alone (measured_choices() lists the choices with both times;
#             two threads meeting a new key time it once: NOTE [measuring once per key]
#             in cuvmap/measured_choices.py). Where the vendor cannot run the operands
#             (below), unfold runs untimed. Under cv.config.deterministic, "auto" times
#             nothing and takes a fixed rule: the vendor's kernels wherever they can run
#             the operands, unfold elsewhere (NOTE [reproducible runs] in cuvmap/config.py).
# Neither kernel wins everywhere, which is why "auto" measures: on the benchmark CNN's layers
# on the CPU, oneDNN is the faster for the 16→32 layer's forward and input gradient, im2col
# for the 1-channel layer's gradients and for its folded per-example weight gradient
# (groups·B of one channel each). `python -m benchmarks conv` prints both kernels side by
# side and what "auto" picked.
# The key is (op, device, dtype, the per-group channels, the spatial and kernel sizes, the
# parameters, and the batch-like dims): N in power-of-two buckets, and the group count,
# bucketed too when N = 1 (the per-example weight gradient's groups·B; exact otherwise). A
# Poisson-sampled batch of a new size therefore reuses its bucket's measurement, and on the
# CPU oneDNN's primitives are made for power-of-two pieces of those dims, never for the
# exact size (NOTE [batch buckets] in cuvmap/cpu/onednn.py).
# Choosing: set_strategy(name) or CUVMAP_CONV_STRATEGY=auto|unfold|onednn|cudnn; anything
# else is rejected with a ValueError naming the valid settings (from the environment at
# the first convolution, so that importing cuvmap never fails). A vendor strategy applies
# to its own device — "onednn" to NumPy arrays, "cudnn" to CuPy arrays — and the unfold
# kernels run on the other device, and where the vendor cannot run the operands: float64
# (or float16) under oneDNN, a library that did not load (load_error() says why), or a
# vendor error. No setting makes a convolution fail that the unfold kernels can run: when
# a vendor call raises (under "auto", measuring or not, or a forced vendor strategy), the
# unfold kernels give the result and a VendorKernelWarning says so once per key, naming
# the error; that key stays on unfold. Operands with a zero-size dim (an empty batch)
# reach no kernel: the result is the zero (or empty) array of the right shape. CuPy operands
# on another GPU than the current one are a ValueError naming the op and the devices, before
# any kernel runs (so that it is not mistaken for a vendor failure).
_STRATEGIES = ("auto", "unfold", "onednn", "cudnn")
_VENDOR_OF_DEVICE = {"cpu": "onednn", "gpu": "cudnn"}
_strategy = [None]      # None: not read from CUVMAP_CONV_STRATEGY yet
_measured = MeasuredChoices("conv")   # key -> (choice, times_ms) ("auto"'s measurements)
_failed = MeasuredChoices()     # key -> the vendor error that put it on unfold (warned once)


class VendorKernelWarning(RuntimeWarning):
    """A cuDNN or oneDNN convolution failed and the unfold kernels ran instead."""


def _validate(strategy, source):
    if strategy not in _STRATEGIES:
        raise ValueError(f"conv strategy must be one of {', '.join(_STRATEGIES)}; {source} is {strategy!r}")
    return strategy


def set_strategy(strategy):
    """Chooses the convolution kernels: ``"auto"`` (default), ``"unfold"``, ``"onednn"``
    or ``"cudnn"`` (see NOTE [conv strategy]). Returns the previous setting."""
    _validate(strategy, "set_strategy's argument")
    previous = get_strategy()
    _strategy[0] = strategy
    return previous


def get_strategy():
    """The strategy in force: :func:`set_strategy`'s, else ``CUVMAP_CONV_STRATEGY``'s, else
    ``"auto"``."""
    if _strategy[0] is None:
        _strategy[0] = _validate(config.from_environment("CUVMAP_CONV_STRATEGY", "auto"), "CUVMAP_CONV_STRATEGY")
    return _strategy[0]


def measured_choices():
    """The per-key choices ``"auto"`` has measured so far: ``{key: (choice, times_ms)}``."""
    return _measured.snapshot()


def clear_measured_choices():
    """Forgets the measured choices and the keys put on unfold by a vendor error."""
    _measured.clear()
    _failed.clear()


def _vendor_for(device, dtype):
    """``(name, module)``: the vendor kernels of ``device`` for ``dtype``, the module None
    when they cannot run it (library missing, dtype unsupported)."""
    if device == "gpu":
        from cuvmap.cuda import cudnn  # a vendor binding: imported at its device's first convolution

        return "cudnn", (cudnn if cudnn.available() else None)
    from cuvmap.cpu import onednn  # a vendor binding: imported at its device's first convolution

    return "onednn", (onednn if onednn.supports(dtype) and onednn.available() else None)


def _strategy_key(op, device, args):
    """The strategy key of NOTE [conv strategy]: N, and the groups when N = 1, bucketed."""
    from cuvmap.cpu.onednn import bucket  # a vendor binding: imported at its device's first convolution

    groups = args[-1]
    params = tuple(tuple(p) for p in args[-4:-1])
    if op == "forward":
        x, w = args[:2]
        n, c, spatial, o = x.shape[0], x.shape[1], tuple(x.shape[2:]), w.shape[0]
    elif op == "backward_input":
        g, w, input_shape = args[:3]
        n, c, spatial, o = g.shape[0], input_shape[1], tuple(input_shape[2:]), w.shape[0]
    else:
        g, x, weight_shape = args[:3]
        n, c, spatial, o = x.shape[0], x.shape[1], tuple(x.shape[2:]), weight_shape[0]
    kernel = tuple(args[1].shape[2:]) if op != "backward_weight" else tuple(args[2][2:])
    g_key = bucket(groups) if n == 1 else groups
    return (op, device, args[0].dtype.str, bucket(n), g_key, c // groups, o // groups, spatial, kernel) + params


def _empty_result(op, args, xp):
    """The result of ``op`` when an operand has a zero-size dim: zeros of its shape."""
    if op == "forward":
        x, w, stride, padding, dilation, _ = args
        shape = (x.shape[0], w.shape[0]) + output_spatial(x.shape[2:], w.shape[2:], stride, padding, dilation)
    else:
        shape = tuple(args[2])
    return xp.zeros(shape, dtype=args[0].dtype)


def _call(module, op, args, bias):
    """``module.<op>(*args)``, the bias added inside oneDNN's forward or after the others'."""
    if bias is not None and getattr(module, "FORWARD_TAKES_BIAS", False):
        return module.forward(*args, bias=bias)
    if module is conv_gemm:
        cpu_threads.blas_pool_used()  # im2col + GEMM: OpenBLAS's threads (NOTE [two thread pools])
    out = getattr(module, op)(*args)
    return out if bias is None else _add_bias(out, bias)


def _add_bias(out, bias):
    """``out`` ``(N, O, S...)`` with ``bias`` ``(O,)`` added in place."""
    out += bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


def _time_kernel(module, op, args, bias, device):
    """``(milliseconds, result)`` of ``module``'s ``op`` after a warm-up call (the first
    call makes oneDNN's primitives and cuDNN's plans): the faster of two calls on the CPU,
    the median of two (their mean) by CUDA events on the GPU."""
    if device == "gpu":
        from cuvmap.cuda import device as cuda_device  # a vendor binding: imported at its device's first convolution

        result = []
        ms = cuda_device.time_gpu(lambda: result.append(_call(module, op, args, bias)), repeats=2)
        return ms, result[-1]
    out = _call(module, op, args, bias)
    best = None
    for _ in range(2):
        t0 = time.perf_counter()
        out = _call(module, op, args, bias)
        elapsed = (time.perf_counter() - t0) * 1e3
        best = elapsed if best is None else min(best, elapsed)
    return best, out


def _fall_back(key, name, err, op, args):
    """Records that ``name`` failed on ``key`` and warns once per key."""
    if _failed.record(key, f"{type(err).__name__}: {err}"):
        shapes = ", ".join(str(tuple(a.shape)) for a in args[:2])
        warnings.warn(f"conv {op} on {shapes}: {name} failed ({type(err).__name__}: {err}); the unfold kernels "
                      f"run this shape instead (NOTE [conv strategy])", VendorKernelWarning, stacklevel=4)


def _measure(key, name, vendor, op, args, bias, device):
    """Times the vendor's and the unfold kernels on ``args``; returns ``(choice, result)``,
    the choice ``(the faster, times)`` for ``key`` (recorded by the caller, NOTE [measuring
    once per key] in cuvmap/measured_choices.py)."""
    try:
        vendor_ms, out = _time_kernel(vendor, op, args, bias, device)
    except Exception as err:  # noqa: BLE001 - any vendor failure falls back (NOTE [conv strategy])
        _fall_back(key, name, err, op, args)
        return ("unfold", {name: None, "unfold": None}), _call(conv_gemm, op, args, bias)
    unfold_ms, unfold_out = _time_kernel(conv_gemm, op, args, bias, device)
    times = {name: vendor_ms, "unfold": unfold_ms}
    choice = (min(times, key=times.get), times)
    return choice, (out if choice[0] == name else unfold_out)


_OPERAND_NAMES = {"forward": ("input", "weight"), "backward_input": ("grad_output", "weight"),
                  "backward_weight": ("grad_output", "input")}


def _run_kernel(op, *args, bias=None):
    """Runs ``op`` (``forward``, ``backward_input`` or ``backward_weight``, the signatures
    of ``conv_gemm``'s) on the operands' device, on the kernels the strategy picks (NOTE
    [conv strategy]); ``bias`` (forward only) is added to the result."""
    device = "gpu" if any(backend.is_cupy_array(a) for a in args[:2]) else "cpu"
    if device == "gpu":
        named = list(zip(_OPERAND_NAMES[op], args[:2])) + ([("bias", bias)] if bias is not None else [])
        backend.check_current_device(f"conv {op}", named)
    if any(s == 0 for s in tuple(args[0].shape) + tuple(args[1].shape)):
        return _empty_result(op, args, backend.xp_of(args[0]))
    if device == "gpu":
        return _pick_and_run(op, device, args, bias)
    # NOTE [threads under a busy machine] and NOTE [two thread pools] in cuvmap/cpu/threads.py
    cpu_threads.quiet_blas_pool()
    with cpu_threads.limited(cpu_threads.target(), openmp=True):
        return _pick_and_run(op, device, args, bias)


def _pick_and_run(op, device, args, bias):
    """:func:`_run_kernel` past its checks: the strategy's kernels on ``args``."""
    strategy = get_strategy()
    if strategy == "unfold" or (strategy != "auto" and strategy != _VENDOR_OF_DEVICE[device]):
        return _call(conv_gemm, op, args, bias)
    name, vendor = _vendor_for(device, args[0].dtype)
    if vendor is None:
        return _call(conv_gemm, op, args, bias)
    key = _strategy_key(op, device, args)
    if key in _failed:
        return _call(conv_gemm, op, args, bias)
    if strategy == "auto" and not config.read("deterministic"):
        choice = _measured.get(key)
        if choice is None:
            choice, out = _measured.measure_once(key, lambda: _measure(key, name, vendor, op, args, bias, device))
            if out is not None:
                return out
        if choice[0] == "unfold":
            return _call(conv_gemm, op, args, bias)
    try:
        return _call(vendor, op, args, bias)
    except Exception as err:  # noqa: BLE001
        _fall_back(key, name, err, op, args)
        return _call(conv_gemm, op, args, bias)


def _conv_impl(lhs, rhs, *maybe_bias, stride, padding, dilation, transposed, output_padding, groups):
    params = dict(stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                  output_padding=output_padding, groups=groups)
    out_shape = conv_p.check(lhs, rhs, *maybe_bias, **params).shape
    bias = maybe_bias[0] if maybe_bias else None
    if not transposed:
        return _run_kernel("forward", lhs, rhs, stride, padding, dilation, groups, bias=bias)
    # a transposed conv is the input-gradient of the regular conv from its output space;
    # its input plays that conv's grad_output, zero-padded to the regular conv's extent
    # (NOTE [output_padding in the transposed backward])
    lhs = _zero_pad_to(lhs, output_spatial(out_shape[2:], rhs.shape[2:], stride, padding, dilation))
    out = _run_kernel("backward_input", lhs, rhs, out_shape, stride, padding, dilation, groups)
    return out if bias is None else _add_bias(out, bias)


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
        out = _run_kernel("forward", grad_output, rhs, stride, padding, dilation, groups)
        if tuple(out.shape[2:]) != tuple(input_shape[2:]):
            crop = (slice(None), slice(None)) + tuple(slice(0, s) for s in input_shape[2:])
            out = backend.xp_of(out).ascontiguousarray(out[crop])
        return out
    return _run_kernel("backward_input", grad_output, rhs, input_shape, stride, padding, dilation, groups)


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
        return _run_kernel("backward_weight", lhs, grad_output, weight_shape, stride, padding, dilation, groups)
    return _run_kernel("backward_weight", grad_output, lhs, weight_shape, stride, padding, dilation, groups)


conv_p.impl = _conv_impl
conv_backward_input_p.impl = _conv_backward_input_impl
conv_backward_weight_p.impl = _conv_backward_weight_impl


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
