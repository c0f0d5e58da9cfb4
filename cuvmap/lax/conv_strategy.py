"""Which kernels run a convolution: the conv strategy (NOTE [conv strategy]), its key
(NOTE [conv strategy key]), and the fallback to the unfold kernels (NOTE [choosing conv
kernels]).

:func:`run_kernel` runs one of the three kernel signatures of ``cuvmap/lax/conv_gemm.py``
(``forward``, ``backward_input``, ``backward_weight``) on the operands' device: oneDNN's
(``cuvmap/cpu/onednn.py``) on NumPy arrays, cuDNN's (``cuvmap/cuda/cudnn.py``) on CuPy
arrays, or im2col + batched GEMM on either, as the strategy picks. The primitives of
``cuvmap/lax/convolution.py`` call it from their impls; :func:`set_strategy` and
:func:`measured_choices` are re-exported there.
"""
import functools
import time
import warnings

from cuvmap import backend, config
from cuvmap.cpu import threads as cpu_threads
from cuvmap.lax import conv_gemm
from cuvmap.measured_choices import MeasuredChoices
from cuvmap.window import output_spatial
from cuvmap import config

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
#   "onednn:channels_last": the same with the activations channels-last inside the
#             primitives (NOTE [activation layouts] in cuvmap/cpu/onednn.py); "auto" times
#             it as a candidate of its own.
#   "cudnn":  cuDNN's grouped convolutions on the GPU (cuvmap/cuda/cudnn.py).
#   "auto":   the default. The first call of each key (NOTE [conv strategy key]) runs the
#             device's vendor kernels and the unfold ones on its operands and times them —
#             on the CPU oneDNN against im2col (perf_counter: the faster of two calls after
#             a warm-up call; the close ones twice, NOTE [timing close candidates
#             twice]), on the GPU cuDNN against the CuPy unfold kernels (CUDA events:
#             cuda.device.time_gpu of two calls after a warm-up call) — records the
#             fastest for the key and returns its result (on the CPU oneDNN counts as two
#             candidates, one per activation layout: NOTE [activation layouts] in
#             cuvmap/cpu/onednn.py); later calls of the key run that kernel alone
#             (measured_choices() lists the choices with their times;
#             two threads meeting a new key time it once: NOTE [measuring once per key]
#             in cuvmap/measured_choices.py). Where the vendor cannot run the operands
#             (NOTE [choosing conv kernels]), unfold runs untimed. Under
#             cv.config.deterministic, "auto" times nothing and takes a fixed rule: the
#             vendor's kernels wherever they can run the operands, unfold elsewhere (NOTE
#             [reproducible runs] in cuvmap/config.py).
# Neither kernel wins everywhere, which is why "auto" measures: on the benchmark CNN's layers
# on the CPU, oneDNN is the faster for the 16→32 layer's forward and input gradient, im2col
# for the 1-channel layer's gradients and for its folded per-example weight gradient
# (groups·B of one channel each). `python -m benchmarks conv` prints both kernels side by
# side and what "auto" picked.


# NOTE [conv strategy key]
# What "auto" measures once and keeps (NOTE [conv strategy]) is keyed on (op, device,
# dtype, the per-group channels, the spatial and kernel sizes, the parameters, and the
# batch-like dims): N in power-of-two buckets, and the group count, bucketed too when N = 1
# (the per-example weight gradient's groups·B; exact otherwise). A Poisson-sampled batch
# of a new size therefore reuses its bucket's measurement, and on the CPU oneDNN's
# primitives are made for power-of-two pieces of those dims, never for the exact size
# (NOTE [batch buckets] in cuvmap/cpu/onednn.py).


# NOTE [choosing conv kernels]
# Choosing: set_strategy(name) or
# CUVMAP_CONV_STRATEGY=auto|unfold|onednn|onednn:channels_last|cudnn; anything else is
# rejected with a ValueError naming the valid settings (from the environment at the first
# convolution, so that importing cuvmap never fails). A vendor strategy applies to its own
# device — "onednn" and "onednn:channels_last" to NumPy arrays, "cudnn" to CuPy arrays — and the unfold
# kernels run on the other device, and where the vendor cannot run the operands: float64
# (or float16) under oneDNN, a library that did not load (load_error() says why), or a
# vendor error. No setting makes a convolution fail that the unfold kernels can run: when
# a vendor call raises (under "auto", measuring or not, or a forced vendor strategy), the
# unfold kernels give the result and a VendorKernelWarning says so once per key, naming
# the error; that key stays on unfold. Operands with a zero-size dim (an empty batch)
# reach no kernel: the result is the zero (or empty) array of the right shape. CuPy operands
# on another GPU than the current one are a ValueError naming the op and the devices, before
# any kernel runs (so that it is not mistaken for a vendor failure).


_STRATEGIES = ("auto", "unfold", "onednn", "onednn:channels_last", "cudnn")
_VENDOR_OF_DEVICE = {"cpu": "onednn", "gpu": "cudnn"}


def _vendor_of_strategy(strategy):
    """The vendor a forced strategy names (``"onednn:channels_last"`` → ``"onednn"``)."""
    return strategy.split(":", 1)[0]


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
    """Chooses the convolution kernels: ``"auto"`` (default), ``"unfold"``, ``"onednn"``,
    ``"onednn:channels_last"`` (NOTE [activation layouts] in cuvmap/cpu/onednn.py) or
    ``"cudnn"`` (see NOTE [choosing conv kernels]). Returns the previous setting."""
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
        import cuvmap.cuda.cudnn as cudnn  # a vendor binding: imported at its device's first convolution

        return "cudnn", (cudnn if cudnn.available() else None)
    import cuvmap.cpu.onednn as onednn  # a vendor binding: imported at its device's first convolution

    return "onednn", (onednn if onednn.supports(dtype) and onednn.available() else None)


def bucket(size):
    """The power of two at or above ``size`` (1 for 0): the size class of a batch-like dim
    in the strategy key (NOTE [conv strategy key]; oneDNN's primitives are made for the
    powers of two below it: NOTE [batch buckets] in cuvmap/cpu/onednn.py)."""
    return 1 << max(0, int(size) - 1).bit_length()


def _strategy_key(op, device, args):
    """The strategy key (NOTE [conv strategy key]): N, and the groups when N = 1, bucketed."""
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


@functools.lru_cache(maxsize=16)
def _vendor_candidates(name, vendor):
    """``{candidate: layout}``: the vendor's kernels as "auto" times them, one candidate per
    activation layout it offers (oneDNN's: NOTE [activation layouts] in
    cuvmap/cpu/onednn.py), the default layout named ``name`` (layout None: the vendor's
    default), the others ``name:layout``. Cached: every vendor call of run_kernel looks its
    layout up here (the dict is shared; callers only read it)."""
    layouts = getattr(vendor, "LAYOUTS", ())
    return {name: None, **{f"{name}:{layout}": layout for layout in layouts[1:]}}


def _call(module, op, args, bias, layout=None):
    """``module.<op>(*args)``, the bias added inside oneDNN's forward or after the others';
    ``layout``: the vendor's activation layout (None: its default)."""
    layout = {} if layout is None else {"layout": layout}
    if bias is not None and getattr(module, "FORWARD_TAKES_BIAS", False):
        return module.forward(*args, bias=bias, **layout)
    if module is conv_gemm:
        cpu_threads.blas_pool_used()  # im2col + GEMM: OpenBLAS's threads (NOTE [two thread pools])
    out = getattr(module, op)(*args, **layout)
    return out if bias is None else add_bias(out, bias)


def add_bias(out, bias):
    """``out`` ``(N, O, S...)`` with ``bias`` ``(O,)`` added in place."""
    out += bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


def _time_kernel(module, op, args, bias, device, layout=None, warm_up=True):
    """``(milliseconds, result)`` of ``module``'s ``op`` after a warm-up call (the first
    call makes oneDNN's primitives and cuDNN's plans; ``warm_up=False`` skips it for a
    kernel timed before): the faster of two calls on the CPU, the median of two (their
    mean) by CUDA events on the GPU."""
    if device == "gpu":
        from cuvmap.cuda import device as cuda_device  # a vendor binding: imported at its device's first convolution

        result = []
        ms = cuda_device.time_gpu(lambda: result.append(_call(module, op, args, bias, layout)), repeats=2)
        return ms, result[-1]
    out = _call(module, op, args, bias, layout) if warm_up else None
    best = None
    for _ in range(2):
        t0 = time.perf_counter()
        out = _call(module, op, args, bias, layout)
        elapsed = (time.perf_counter() - t0) * 1e3
        best = elapsed if best is None else min(best, elapsed)
    return best, out


def _fall_back(key, name, err, op, args):
    """Records that ``name`` failed on ``key`` and warns once per key."""
    if _failed.record(key, f"{type(err).__name__}: {err}"):
        shapes = ", ".join(str(tuple(a.shape)) for a in args[:2])
        warnings.warn(f"conv {op} on {shapes}: {name} failed ({type(err).__name__}: {err}); the unfold kernels "
                      f"run this shape instead (NOTE [choosing conv kernels])", VendorKernelWarning, stacklevel=4)


def _measure(key, name, vendor, op, args, bias, device):
    """Times the vendor's candidates (:func:`_vendor_candidates`) and the unfold kernels on
    ``args``; returns ``(choice, result)``, the choice ``(the fastest, times)`` for ``key``
    (recorded by the caller, NOTE [measuring once per key] in cuvmap/measured_choices.py).
    A vendor layout that raises is left out of the times (oneDNN refuses a layout it could
    run only on its reference kernels); the default one raising falls back to unfold."""
    layouts = _vendor_candidates(name, vendor)
    times, outs = {}, {}
    for i, (candidate, layout) in enumerate(layouts.items()):
        try:
            times[candidate], outs[candidate] = _time_kernel(vendor, op, args, bias, device, layout)
        except Exception as err:  # noqa: BLE001 - any vendor failure falls back (NOTE [choosing conv kernels])
            if i == 0:
                _fall_back(key, name, err, op, args)
                return ("unfold", {name: None, "unfold": None}), _call(conv_gemm, op, args, bias)
    times["unfold"], outs["unfold"] = _time_kernel(conv_gemm, op, args, bias, device)
    if device == "cpu":
        # a second pass, in reverse order, over the candidates close to the fastest (NOTE
        # [timing close candidates twice])
        best = min(times.values())
        close = [c for c, ms in times.items() if ms <= CLOSE * best]
        for candidate in (reversed(close) if len(close) > 1 else ()):
            module, layout = (conv_gemm, None) if candidate == "unfold" else (vendor, layouts[candidate])
            ms, outs[candidate] = _time_kernel(module, op, args, bias, device, layout, warm_up=False)
            times[candidate] = min(times[candidate], ms)
    choice = (min(times, key=times.get), times)
    return choice, outs[choice[0]]


# NOTE [timing close candidates twice]
# The CPU machines this runs on change speed for seconds at a time (other tenants, the
# host's frequency), and "auto" times its candidates one after the other, so a candidate
# timed in a slow moment loses to one timed in a fast one. Where two or more candidates
# are within CLOSE of the fastest after the first pass, they are timed again in reverse
# order (two calls each, without the warm-up call the first pass made) and each keeps its
# faster time: a drift that favoured the first ones now favours the last ones. Candidates
# far behind are not timed again (the unfold kernels, two to three times oneDNN's time on
# the benchmark CNN, usually are). The GPU's CUDA events time the kernels alone and need
# no second pass.
CLOSE = 1.25


_OPERAND_NAMES = {"forward": ("input", "weight"), "backward_input": ("grad_output", "weight"),
                  "backward_weight": ("grad_output", "input")}


def channels_last_results():
    """A context in which the CPU vendor's convolutions (oneDNN's) return their
    activations laid out channels-last (NOTE [channels-last results] in
    cuvmap/cpu/onednn.py); the other kernels return C order."""
    from cuvmap.cpu import onednn   # (the CPU vendor, imported where it is first asked for)
    return onednn.channels_last_results()


def run_kernel(op, *args, bias=None):
    """Runs ``op`` (``forward``, ``backward_input`` or ``backward_weight``, the signatures
    of ``conv_gemm``'s) on the operands' device, on the kernels the strategy picks (NOTE
    [conv strategy]; empty operands and another GPU's: NOTE [choosing conv kernels]);
    ``bias`` (forward only) is added to the result."""
    device = "gpu" if backend.is_cupy_array(args[0]) or backend.is_cupy_array(args[1]) else "cpu"
    if device == "gpu":
        named = list(zip(_OPERAND_NAMES[op], args[:2])) + ([("bias", bias)] if bias is not None else [])
        backend.check_current_device(f"conv {op}", named)
    if 0 in tuple(args[0].shape) or 0 in tuple(args[1].shape):
        return _empty_result(op, args, backend.xp_of(args[0]))
    if device == "gpu":
        return _pick_and_run(op, device, args, bias)
    # NOTE [threads under a busy machine] and NOTE [two thread pools] in cuvmap/cpu/threads.py
    cpu_threads.quiet_blas_pool()
    with cpu_threads.limited(cpu_threads.target(), openmp=True), cpu_threads.limited(cpu_threads.beside_team()):
        return _pick_and_run(op, device, args, bias)


# NOTE [the gradients of one output gradient in one call]
# A staged program that needs the input, weight and bias gradients of one convolution
# from the same output gradient ``g`` computes them in one call (``conv_backward`` in
# cuvmap/lax/convolution_merged.py, NOTE [equations merged for the plan] in
# cuvmap/transforms/executor/merges.py). :func:`run_backward` gives that call to the
# vendor's one-pass kernel (oneDNN's :func:`cuvmap.cpu.onednn.backward`: one reorder of
# ``g``, the bias summed by backward-weights, NOTE [one backward pass over the output
# gradient]) when the strategy runs every asked kernel on the vendor's (the choices of
# their keys as :func:`run_kernel` makes them: a key not measured yet is measured first,
# through run_kernel, and the call then goes on as later calls will, so that the first
# call's result is theirs). Otherwise, and for a vendor without such a kernel (cuDNN), each
# gradient is run_kernel's and the bias's is ``bias_sum(g)``, exactly the unmerged
# program's. A vendor error in the one-pass kernel falls back to the same separate calls.


def run_backward(g, *, x=None, w=None, input_shape=None, weight_shape=None, bias=False, bias_sum=None, stride,
                 padding, dilation, groups):
    """``(dx, dw, db)``, the gradients of ``conv(x, w) + b`` in its operands from the output
    gradient ``g``, each None when not asked: ``dx`` (of ``input_shape``) when the weight
    ``w`` is given, ``dw`` (of ``weight_shape``) when the input ``x`` is given, ``db`` when
    ``bias`` (``bias_sum(g)`` off the vendor's one-pass kernel). NOTE [the gradients of one
    output gradient in one call]."""
    conv = (stride, padding, dilation, groups)
    calls = ([("backward_input", (g, w, input_shape) + conv)] if w is not None else []) + \
            ([("backward_weight", (g, x, weight_shape) + conv)] if x is not None else [])
    outs = {}
    one_pass = _one_pass_vendor(g, x, bias, calls)
    if one_pass is None:
        unmeasured = [(op, args) for op, args in calls if _needs_measuring(op, args)]
        for op, args in unmeasured:
            outs[op] = run_kernel(op, *args)
        if unmeasured:
            one_pass = _one_pass_vendor(g, x, bias, calls)
    if one_pass is not None:
        vendor, layouts = one_pass
        layouts = {"layouts": layouts} if layouts else {}
        cpu_threads.quiet_blas_pool()
        try:
            with cpu_threads.limited(cpu_threads.target(), openmp=True), cpu_threads.limited(cpu_threads.beside_team()):
                return vendor.backward(g, x=x, w=w, input_shape=input_shape, weight_shape=weight_shape, bias=bias,
                                       stride=stride, padding=padding, dilation=dilation, groups=groups, **layouts)
        except Exception as err:  # noqa: BLE001 - each kernel then runs (and falls back) on its own
            key = _one_pass_key(calls, bias)
            if _failed.record(key, f"{type(err).__name__}: {err}"):
                warnings.warn(f"conv backward on {tuple(g.shape)}: the vendor's one-pass kernel failed "
                              f"({type(err).__name__}: {err}); each gradient runs on its own kernel instead (NOTE "
                              f"[the gradients of one output gradient in one call])", VendorKernelWarning, stacklevel=3)
            outs = {}
    for op, args in calls:
        if op not in outs:
            outs[op] = run_kernel(op, *args)
    return outs.get("backward_input"), outs.get("backward_weight"), (bias_sum(g) if bias else None)


def _one_pass_vendor(g, x, bias, calls):
    """``(vendor module, {op: layout})`` when the vendor runs ``calls`` in one pass (NOTE
    [the gradients of one output gradient in one call]; the layouts each call's key chose,
    the vendor's default left out), or None: NumPy operands, none empty, the weight gradient
    asked with the bias's, a vendor with such a kernel, and every call's key decided for it."""
    if backend.is_cupy_array(g) or (bias and x is None) or len(calls) + bool(bias) < 2:
        return None
    if any(0 in tuple(a.shape) for _, args in calls for a in args[:2]):
        return None
    decided = {op: _decided_vendor(op, args) for op, args in calls}
    if None in decided.values() or len({vendor for vendor, _ in decided.values()}) != 1:
        return None
    vendor = next(iter(decided.values()))[0]
    if not getattr(vendor, "BACKWARD_IN_ONE_PASS", False) or _one_pass_key(calls, bias) in _failed:
        return None
    return vendor, {op: layout for op, (_, layout) in decided.items() if layout is not None}


def _one_pass_key(calls, bias):
    """The key under which a failed one-pass call is remembered: its calls' strategy keys."""
    return ("backward", bool(bias)) + tuple(_strategy_key(op, "cpu", args) for op, args in calls)


def _decided_vendor(op, args):
    """``(vendor module, layout)`` when the strategy runs ``op`` on ``args`` (NumPy
    operands) on the vendor's kernels without measuring first (layout None: the vendor's
    default), else None."""
    strategy = get_strategy()
    if strategy != "auto" and _vendor_of_strategy(strategy) != "onednn":
        return None
    name, vendor = _vendor_for("cpu", args[0].dtype)
    if vendor is None:
        return None
    key = _strategy_key(op, "cpu", args)
    if key in _failed:
        return None
    if strategy == "auto" and not config.read("deterministic"):
        choice = _measured.get(key)
        candidates = _vendor_candidates(name, vendor)
        if choice is None or choice[0] not in candidates:
            return None
        return vendor, candidates[choice[0]]
    return vendor, (None if strategy == "auto" else _vendor_candidates(name, vendor).get(strategy))


def _needs_measuring(op, args):
    """Whether "auto" has yet to measure the key of ``op`` on ``args`` (NumPy operands)."""
    if get_strategy() != "auto" or config.read("deterministic") or _vendor_for("cpu", args[0].dtype)[1] is None:
        return False
    key = _strategy_key(op, "cpu", args)
    return key not in _failed and _measured.get(key) is None


def _pick_and_run(op, device, args, bias):
    """:func:`run_kernel` past its checks: the strategy's kernels on ``args``."""
    strategy = get_strategy()
    if strategy == "unfold" or (strategy != "auto" and _vendor_of_strategy(strategy) != _VENDOR_OF_DEVICE[device]):
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
        layout = _vendor_candidates(name, vendor).get(choice[0])
    else:
        layout = None if strategy == "auto" else _vendor_candidates(name, vendor).get(strategy)
    try:
        return _call(vendor, op, args, bias, layout)
    except Exception as err:  # noqa: BLE001
        _fall_back(key, name, err, op, args)
        return _call(conv_gemm, op, args, bias)
