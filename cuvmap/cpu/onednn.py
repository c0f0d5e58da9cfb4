"""oneDNN convolutions: the convolution plans on ``libdnnl.so.3``, the CPU binding's face.

The ctypes layer (the C API, loading the library, engine, streams, arenas) is
:mod:`cuvmap.cpu.libdnnl`, the OpenMP environment it loads in and the threading modes
:mod:`cuvmap.cpu.openmp`; this module re-exports their public names (:func:`available`,
:func:`describe`, :func:`set_threading`, ...). oneDNN's CPU convolutions are the kernels
torch runs on the CPU (through ideep). The design follows :mod:`cuvmap.cuda.cudnn` and
torch's ideep wrapper:

- one CPU engine per process (oneDNN engines may be shared by threads), one stream per
  thread (thread-local);
- the convolution chooses its own memory layouts (``dnnl_format_tag_any``: blocked
  layouts such as ``nChw16c``); reorders move the operands from and to NumPy's plain
  ``N C spatial...`` arrays, whose memory descriptors carry the arrays' own strides, so
  views need no copy. (A convolution on plain descriptors makes oneDNN fall back to its
  im2col + GEMM implementation, no faster than :mod:`cuvmap.lax.conv_gemm`.)
- the scratchpad is the caller's (``dnnl_scratchpad_mode_user``), from a per-thread arena
  that also holds the blocked copies of the operands: its pages are touched once and
  reused by every call in that thread, and two threads can run one primitive at once;
- a bounded LRU cache of created primitives (the convolution and its reorders) keyed on
  every parameter: operation, dtype, shapes, strides, stride, padding, dilation, groups
  and bias. Creating a convolution primitive costs milliseconds (NOTE [batch buckets]).

The kernels have the signatures of :mod:`cuvmap.lax.conv_gemm`'s (regular convolutions
with symmetric padding, layout ``N C spatial...``, weight ``O C/groups kernel...``; the
transposed ones are expressed through them by ``cuvmap/lax/convolution.py``), plus an optional
``bias`` of the forward, added inside the primitive:

    out[n, g·Og + o, y] = b[g·Og + o] + Σ_{c, k} x[n, g·Cg + c, y·s − p + k·d] · w[g·Og + o, c, k]

Only float32 runs here (:func:`supports` says which dtypes). This module never imports the
transforms or the primitives (only ``cuvmap/window.py``, ``cuvmap/lru.py`` and the CPU
binding's other modules).
"""
import ctypes
import threading

import numpy as np

from cuvmap.cpu import libdnnl, openmp
from cuvmap.cpu.libdnnl import (
    DNNL_ARG_BIAS, DNNL_ARG_DIFF_BIAS, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DST,
    DNNL_ARG_FROM, DNNL_ARG_SCRATCHPAD, DNNL_ARG_SRC, DNNL_ARG_TO, DNNL_ARG_WEIGHTS, DNNL_CONVOLUTION_DIRECT,
    DNNL_FORWARD_TRAINING, DNNL_QUERY_DIFF_DST_MD, DNNL_QUERY_DIFF_SRC_MD,
    DNNL_QUERY_DIFF_WEIGHTS_MD, DNNL_QUERY_DST_MD, DNNL_QUERY_SRC_MD, DNNL_QUERY_WEIGHTS_MD, ExecArg,
)
from cuvmap.cpu.libdnnl import (  # noqa: F401  (the binding's public names)
    OnednnError, arena_bytes, available, load_error, loaded, set_enabled, supports, version,
)
from cuvmap.cpu.openmp import functions as openmp_functions, set_threading  # noqa: F401
from cuvmap.lru import LRU
from cuvmap.window import output_spatial

FORWARD_TAKES_BIAS = True  # forward(..., bias=b) adds the bias inside the primitive
BACKWARD_IN_ONE_PASS = True  # backward(...) computes the asked gradients from one reorder of g
LAYOUTS = ("blocked", "channels_last")   # the activations' layouts a plan may run in (NOTE [activation layouts])
_lock = threading.Lock()


def threading_mode():
    """The mode in force (loads libdnnl): NOTE [oneDNN beside another OpenMP user]."""
    libdnnl.load()
    return openmp.mode()


def describe():
    """One line: the version and threading, or why oneDNN is unavailable (loads libdnnl)."""
    if not available():
        return "oneDNN unavailable: " + (load_error() or "disabled")
    threads = openmp.settings_description()
    mode = threading_mode()
    mode = ("OpenMP's threads" if mode == "openmp" else
            "cuvmap's threads, OpenMP single-threaded in each (NOTE [oneDNN beside another OpenMP user])")
    return f"oneDNN {version()} (GNU OpenMP; {threads}; convolutions on {mode})"


class _Operand:
    """One argument of a convolution: the user's plain descriptor, the primitive's (owned
    by the primitive descriptor) and the reorder between them when they differ."""

    def __init__(self, arg, name, output, user_md, conv_md, attr):
        self.arg, self.name, self.output = arg, name, output
        self.user_md = user_md
        self.conv_md = conv_md
        self.reorder = None
        self.exec_md = user_md     # the descriptor the user's array is run under
        self.size = int(libdnnl.lib.dnnl_memory_desc_get_size(conv_md))
        if not libdnnl.lib.dnnl_memory_desc_equal(user_md, conv_md):
            if libdnnl.same_memory(user_md, conv_md):   # NOTE [channels-last results]
                self.exec_md = conv_md
                return
            src, dst = (conv_md, user_md) if output else (user_md, conv_md)
            self.reorder = libdnnl.reorder(src, dst, attr, name)

    def __del__(self):
        if libdnnl.lib is not None and self.user_md:
            libdnnl.lib.dnnl_memory_desc_destroy(self.user_md)


def _padding_r(in_sp, out_sp, kernel, stride, padding, dilation):
    """oneDNN's right padding: what makes ``out = (in + p_l + p_r − d(k − 1) − 1)/s + 1``
    exact (it may be smaller than ``p_l``, even negative, when the last window ends early)."""
    return tuple((o - 1) * s + d * (k - 1) + 1 - i - p
                 for i, o, k, s, p, d in zip(in_sp, out_sp, kernel, stride, padding, dilation))


# NOTE [activation layouts]
# oneDNN runs a convolution in the layouts its primitive asks for. With ``any`` for the
# input and output (the layout "blocked") it picks ``nChw16c`` and its direct kernels
# (``jit:avx512_core``); with the channels-last layout (``nhwc``; "channels_last", torch's
# ``channels_last`` tensors) it picks others: brgemm kernels for the forward
# (``brgconv``), its channels-last direct kernel for backward-weights, backward-data
# through brgemm's forward. Neither wins every op: on the benchmark CNN's 16→32 layer on a
# 2-core Ice Lake (interleaved, reorders included), channels-last won the forward and
# backward-weights and lost backward-data, at batch 8 to 128; on the 1-channel layer the
# two were level; a grouped backward-weights with one channel per group (the per-example
# weight gradient of the first layer) ran several times faster channels-last. So the layout
# is a property of the plan (part of its key): the ``auto`` conv strategy times both for
# each key and keeps the faster (NOTE [conv strategy] in cuvmap/lax/conv_strategy.py), a
# forced ``onednn`` strategy and ``config.deterministic`` take "blocked". The user's arrays
# stay ``N C spatial...``: either layout reorders them in and out (one pass each, the same
# cost; a planned program keeps some channels-last and skips those: NOTE [channels-last
# results]), and the merged backward pass shares its reorder of ``g`` only between two
# passes of one layout. A channels-last plan that oneDNN could run only on its reference kernels
# (``ref:any``, seconds per call) is refused with an OnednnError at creation, so that
# ``auto`` never times it. ``python -m benchmarks eager`` lists, per convolution key, both
# layouts' times, the choice and oneDNN's implementation.


# NOTE [channels-last results]
# The user's arrays are ``N C spatial...`` in shape, and NumPy's strides may lay them out
# in any order: an array whose memory is ``N spatial... C`` (a channels-last view) is read
# in place by a channels-last plan, and by a blocked one whose blocks hold every channel
# (``nChw16c`` with 16 channels places each element where ``nhwc`` does:
# libdnnl.same_memory), with no reorder either way. Inside
# :func:`channels_last_results` the activations this module returns (the forward's
# output, backward-data's input gradient) are such views, so that the primitive writes
# them where it computes them instead of reordering them into ``N C spatial...``. A
# planned program asks for it where the result only flows, through elementwise steps, into
# other convolutions (NOTE [channels-last activations in a plan] in
# cuvmap/transforms/executor/layouts.py): on the benchmark CNN the first layer's
# activations (16 channels) then go from one convolution to the next with none of the
# five reorders they took at batch 128, forward and backward. The values are the same
# either way, only the strides differ; outside the request nothing changes.
_requests = threading.local()


class channels_last_results:
    """A context (per thread) in which :func:`forward`, :func:`backward_input` and
    :func:`backward` return their activations laid out channels-last (NOTE
    [channels-last results])."""

    def __enter__(self):
        self.previous = getattr(_requests, "channels_last", False)
        _requests.channels_last = True
        return self

    def __exit__(self, *exc):
        _requests.channels_last = self.previous
        return False


def _activation_result(shape, dtype):
    """A new activation of ``shape`` (``N C spatial...``), channels-last inside
    :class:`channels_last_results` (NOTE [channels-last results])."""
    if not getattr(_requests, "channels_last", False) or len(shape) < 3:
        return np.empty(shape, dtype)
    order = (0,) + tuple(range(2, len(shape))) + (1,)
    return np.empty([shape[axis] for axis in order], dtype).transpose(np.argsort(order))


def _activation_md(shape, dtype, layout):
    """The descriptor the primitive asks for an activation: oneDNN's choice (``any``) for
    "blocked", the channels-last strides (``N spatial... C``) for "channels_last"."""
    if layout == "blocked":
        return libdnnl.any_md(shape, dtype)
    order = (0,) + tuple(range(2, len(shape))) + (1,)      # N spatial... C, C innermost
    packed = _contiguous_strides([shape[axis] for axis in order])
    strides = [0] * len(shape)
    for axis, stride in zip(order, packed):
        strides[axis] = stride
    return libdnnl.plain_md(shape, strides, dtype)


class _Plan:
    """A convolution primitive (forward, backward-data or backward-weights) on fixed
    shapes, strides and parameters, with the reorders of its operands. ``operands`` is
    ``{name: (shape, element strides)}`` for ``x``, ``w`` (grouped: ``(G, Og, Cg, K...)``),
    ``y`` and, for a forward with bias, ``b``; ``layout`` is the activations' (NOTE
    [activation layouts])."""

    def __init__(self, op, dtype, operands, stride, padding, dilation, layout="blocked"):
        self.op, self.layout = op, layout
        lib, engine = libdnnl.lib, libdnnl.engine
        x_shape, w_shape, y_shape = (operands[k][0] for k in ("x", "w", "y"))
        kernel = w_shape[-len(stride):]
        strides = libdnnl.dims(stride)
        dilates = libdnnl.dims(d - 1 for d in dilation)  # oneDNN counts dilation from 0
        pad_l = libdnnl.dims(padding)
        pad_r = libdnnl.dims(_padding_r(x_shape[2:], y_shape[2:], kernel, stride, padding, dilation))
        attr = libdnnl.user_attr()
        if layout not in LAYOUTS:
            raise ValueError(f"oneDNN convolution layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
        anys = [_activation_md(operands["x"][0], dtype, layout), libdnnl.any_md(operands["w"][0], dtype),
                _activation_md(operands["y"][0], dtype, layout)]
        users = {k: libdnnl.plain_md(shape, st, dtype) for k, (shape, st) in operands.items()}
        bias_md = users.get("b")
        hint = pd = ctypes.c_void_p()
        what = (f"convolution {op}: input {tuple(x_shape)}, weight {tuple(w_shape)}, output {tuple(y_shape)}, "
                f"stride {tuple(stride)}, padding {tuple(padding)}, dilation {tuple(dilation)}")
        try:
            hint = ctypes.c_void_p()
            libdnnl.check(lib.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(hint), engine, DNNL_FORWARD_TRAINING, DNNL_CONVOLUTION_DIRECT, anys[0], anys[1],
                bias_md, anys[2], strides, dilates, pad_l, pad_r, attr), what)
            if op == "forward":
                pd, hint = hint, ctypes.c_void_p()
                roles = [(DNNL_ARG_SRC, "x", False, DNNL_QUERY_SRC_MD), (DNNL_ARG_WEIGHTS, "w", False, DNNL_QUERY_WEIGHTS_MD),
                         (DNNL_ARG_DST, "y", True, DNNL_QUERY_DST_MD)]
                if bias_md is not None:
                    roles.append((DNNL_ARG_BIAS, "b", False, None))
            elif op == "backward_input":
                pd = ctypes.c_void_p()
                libdnnl.check(lib.dnnl_convolution_backward_data_primitive_desc_create(
                    ctypes.byref(pd), engine, DNNL_CONVOLUTION_DIRECT, anys[0], anys[1], anys[2], strides, dilates,
                    pad_l, pad_r, hint, attr), what)
                roles = [(DNNL_ARG_DIFF_DST, "y", False, DNNL_QUERY_DIFF_DST_MD),
                         (DNNL_ARG_WEIGHTS, "w", False, DNNL_QUERY_WEIGHTS_MD),
                         (DNNL_ARG_DIFF_SRC, "x", True, DNNL_QUERY_DIFF_SRC_MD)]
            else:
                pd = ctypes.c_void_p()
                libdnnl.check(lib.dnnl_convolution_backward_weights_primitive_desc_create(
                    ctypes.byref(pd), engine, DNNL_CONVOLUTION_DIRECT, anys[0], anys[1], bias_md, anys[2],
                    strides, dilates, pad_l, pad_r, hint, attr), what)
                roles = [(DNNL_ARG_SRC, "x", False, DNNL_QUERY_SRC_MD),
                         (DNNL_ARG_DIFF_DST, "y", False, DNNL_QUERY_DIFF_DST_MD),
                         (DNNL_ARG_DIFF_WEIGHTS, "w", True, DNNL_QUERY_DIFF_WEIGHTS_MD)]
                if bias_md is not None:   # the bias gradient in the same pass over diff_dst
                    roles.append((DNNL_ARG_DIFF_BIAS, "b", True, None))
            self.conv = libdnnl.Primitive(pd, what)
            pd = ctypes.c_void_p()  # owned by self.conv now
            if layout != "blocked" and self.conv.impl().startswith("ref"):
                raise OnednnError(f"{what}: no {layout} kernel but the reference one ({self.conv.impl()})")
            self.operands = []
            for arg, name, output, query in roles:
                conv_md = users[name] if query is None else lib.dnnl_primitive_desc_query_md(self.conv.pd, query, 0)
                self.operands.append(_Operand(arg, name, output, users.pop(name), conv_md, attr))
        finally:
            for md in anys + list(users.values()):
                lib.dnnl_memory_desc_destroy(md)
            for p in (hint, pd):
                if p:
                    lib.dnnl_primitive_desc_destroy(p)
            lib.dnnl_primitive_attr_destroy(attr)
        self.scratchpad = max([self.conv.scratchpad] + [o.reorder.scratchpad for o in self.operands if o.reorder])

    def describe(self):
        """The implementation oneDNN chose (e.g. ``jit:avx512_core``) and the reorders."""
        reorders = [o.name for o in self.operands if o.reorder is not None]
        layout = "" if self.layout == "blocked" else f" ({self.layout})"
        return f"{self.conv.impl()}{layout}, reorders of {', '.join(reorders) or 'none'}"

    def run(self, arrays, reordered=None):
        """Runs the plan on ``arrays`` (``{name: ndarray}`` with this plan's shapes and
        strides; the output's is written). ``reordered`` (a dict shared by the calls of
        one kernel call) skips the reorder of an input that an earlier call already
        reordered into the same layout from the same array."""
        lib = libdnnl.lib
        stream = libdnnl.stream()
        scratch = libdnnl.arena("scratchpad", self.scratchpad) if self.scratchpad else None
        memories = []

        def memory(md, ptr):
            m = ctypes.c_void_p()
            libdnnl.check(lib.dnnl_memory_create(ctypes.byref(m), md, libdnnl.engine, ctypes.c_void_p(ptr)),
                          "dnnl_memory_create")
            memories.append(m)
            return m

        def execute(primitive, args):
            if primitive.scratchpad:
                args = args + [(DNNL_ARG_SCRATCHPAD, memory(primitive.scratchpad_md, scratch))]
            packed = (ExecArg * len(args))(*[ExecArg(a, m) for a, m in args])
            libdnnl.check(lib.dnnl_primitive_execute(primitive.handle, stream, len(args), packed),
                          f"dnnl_primitive_execute ({self.op})")

        try:
            conv_args, after = [], []
            for o in self.operands:
                a = arrays[o.name]
                user = memory(o.exec_md, a.ctypes.data)
                if o.reorder is None:
                    conv_args.append((o.arg, user))
                    continue
                inner = memory(o.conv_md, libdnnl.arena(o.name, o.size))
                conv_args.append((o.arg, inner))
                if o.output:
                    after.append((o.reorder, inner, user))
                    if reordered is not None:   # (the arena no longer holds an input's reorder)
                        reordered.pop(o.name, None)
                    continue
                if reordered is not None:
                    source = (a.ctypes.data, a.shape, a.strides)
                    seen = reordered.get(o.name)
                    if seen is not None and seen[0] == source and lib.dnnl_memory_desc_equal(seen[1], o.conv_md):
                        continue
                    reordered[o.name] = (source, o.conv_md, self)  # (self keeps the md alive)
                execute(o.reorder, [(DNNL_ARG_FROM, user), (DNNL_ARG_TO, inner)])
            execute(self.conv, conv_args)
            for reorder, inner, user in after:
                execute(reorder, [(DNNL_ARG_FROM, inner), (DNNL_ARG_TO, user)])
            libdnnl.check(lib.dnnl_stream_wait(stream), "dnnl_stream_wait")
        finally:
            for m in memories:
                lib.dnnl_memory_destroy(m)


# ---------------------------------------------------------------------------------------
# The plan cache
# ---------------------------------------------------------------------------------------

# NOTE [plan cache]
# A plan (a convolution primitive and up to four reorders) is made once per key and kept
# in an LRU of CACHE_SIZE plans (cuvmap/lru.py, shared with cuDNN's plan cache); an
# evicted plan's primitives are destroyed when the last call using it returns. oneDNN
# keeps a primitive cache of its own (1024 primitives by default), which would hold every
# evicted primitive again: ~20 KiB of JIT code and descriptors each, so the process grew
# without bound across many shapes. cuvmap sets its capacity to 0 when libdnnl loads
# (unless DNNL_PRIMITIVE_CACHE_CAPACITY is set), so this cache alone bounds them;
# tests/cpu/test_onednn.py checks the bound and the process's memory.
CACHE_SIZE = 256
_plans = LRU(CACHE_SIZE)
_stats = {"created": 0, "create_seconds": 0.0}


def cache_info():
    """``{"size", "bound", "created", "hits", "evicted", "create_seconds"}``."""
    info = _plans.info()
    with _lock:
        return dict(size=info["size"], bound=info["bound"], created=_stats["created"], hits=info["hits"],
                    evicted=info["evicted"], create_seconds=_stats["create_seconds"])


def clear_cache():
    """Drops every cached plan (a plan in use by another thread lives until it returns)."""
    _plans.clear()


def _plan(op, dtype, operands, stride, padding, dilation, layout="blocked"):
    get_threads = openmp.functions()[0]
    threads = get_threads() if get_threads is not None else 0    # oneDNN sizes a primitive for its creating team
    key = (op, dtype.str, tuple(sorted(operands.items())), tuple(stride), tuple(padding), tuple(dilation), threads,
           layout)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    import time

    t0 = time.perf_counter()
    plan = _Plan(op, dtype, operands, stride, padding, dilation, layout)
    with _lock:
        _stats["created"] += 1
        _stats["create_seconds"] += time.perf_counter() - t0
    return _plans.put(key, plan)


def cached_plans():
    """``[(op, {operand: shape}, description)]`` of the plans in the cache (the
    implementation oneDNN chose and the reorders: :meth:`_Plan.describe`), for
    diagnostics and the benchmarks' tables."""
    return [(key[0], {name: layout[0] for name, layout in key[2]}, plan.describe()) for key, plan in _plans.items()]


def plan_description(op, x, w, y, stride, padding, dilation, groups, layout="blocked"):
    """What oneDNN runs for one call of ``op`` (for diagnostics and benchmarks)."""
    ops = {"x": _layout(x), "w": _weight_layout(w, groups), "y": _layout(y)}
    return _plan(op, np.dtype(x.dtype), ops, stride, padding, dilation, layout).describe()


# ---------------------------------------------------------------------------------------
# Operand layouts and batch buckets
# ---------------------------------------------------------------------------------------


def _contiguous_strides(shape):
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


def _layout(a):
    """``(shape, element strides)`` of an array oneDNN can read in place: strides of
    size-1 dims normalised (they address nothing, and keeping them would make a new plan
    for every parent array)."""
    shape = tuple(map(int, a.shape))
    item = a.itemsize
    contiguous = _contiguous_strides(shape)
    strides = tuple([c if s == 1 else st // item for s, st, c in zip(shape, a.strides, contiguous)])
    return shape, strides


def _readable(a):
    """``a`` itself when oneDNN can describe its strides (positive multiples of the item
    size, no two elements overlapping), else a C-contiguous copy."""
    if a.flags.c_contiguous:
        return a
    item = a.itemsize
    dims = sorted((st, s) for s, st in zip(a.shape, a.strides) if s > 1)
    ok = all(st > 0 and st % item == 0 for st, _ in dims)
    for (inner, size), (outer, _) in zip(dims, dims[1:]):
        ok = ok and outer >= inner * size
    return a if ok else np.ascontiguousarray(a)


def _weight_layout(w, groups):
    """The weight ``(O, Cg, K...)`` as oneDNN's ``(G, Og, Cg, K...)`` when grouped."""
    shape, strides = _layout(w)
    if groups == 1:
        return shape, strides
    o = shape[0]
    return (groups, o // groups) + shape[1:], (strides[0] * (o // groups),) + strides


# NOTE [batch buckets]
# Poisson-sampled DP-SGD changes the batch size nearly every step, and under vmap the batch
# size B appears as N (the forward and the input gradient fold the examples into N) or in
# the group count (the per-example weight gradient folds them into groups·B with N = 1).
# A oneDNN primitive is made for fixed shapes, and making one costs more than running it
# on a small batch (`python -m benchmarks conv` prints the creation cost, "oneDNN plan ms",
# beside the kernels). So the kernels never make a primitive for the exact B: they split N
# into the powers of two of its binary digits (37 = 32 + 4 + 1, slices along N, which are
# views of N C S... arrays) and, when N = 1 and the conv is grouped, the group count the
# same way (a grouped convolution is exactly independent convolutions over contiguous
# group ranges: channel slices of the input, the output and the weight). Each piece runs
# its own cached plan; the weight gradient over N pieces sums their partial results; a
# weight reordered for one piece is reused by the next when its layout is the same. Any
# batch size up to 2^k then needs at most k + 1 plans per layer and op, made once, and a
# call runs at most popcount(B) pieces. The price against one exact primitive grows with
# the number of pieces (tens of percent at 3 to 7 pieces) and is larger with passive
# OpenMP workers (each piece wakes the pool; NOTE [OpenMP threads beside OpenBLAS]); a
# power of two is one piece and costs nothing extra. `python -m benchmarks conv --batch
# 32 37 127 128` shows it in its table 1, N = 37 (3 pieces) and 127 (7 pieces) beside the
# powers of two around them (its plot draws the ms per example). Padding to a bucket
# instead would copy the operands into a padded buffer (fresh pages) and compute up to 2x
# what is needed.


def _binary_pieces(n):
    """``[(start, size)]``: the powers of two of ``n``'s binary digits, largest first."""
    pieces, start = [], 0
    for bit in reversed(range(int(n).bit_length())):
        size = 1 << bit
        if n & size:
            pieces.append((start, size))
            start += size
    return pieces


def _pieces(n, groups):
    """Example slices × group slices (NOTE [batch buckets]): the groups are split only when
    there is one example (the per-example weight gradient's groups·B)."""
    ns = _binary_pieces(n)
    gs = _binary_pieces(groups) if n == 1 and groups > 1 else [(0, groups)]
    return [(slice(n0, n0 + nn), g0, gg) for n0, nn in ns for g0, gg in gs]


def _dtype_of(op, *arrays):
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) != 1 or not supports(next(iter(dtypes))):
        raise OnednnError(f"oneDNN {op}: operands of dtype {', '.join(sorted(d.name for d in dtypes))}; "
                          f"oneDNN runs float32 only")
    if libdnnl.load() is None:
        raise OnednnError(f"oneDNN {op}: libdnnl.so.3 is not available: {load_error()}")
    return dtypes.pop()


def _chunks(n, groups, parts):
    """``[(examples, g0, gg)]``: ``parts`` contiguous chunks of near-equal size of the
    examples, or of the groups when there is one example (NOTE [oneDNN beside another
    OpenMP user]); fewer when there is less to split."""
    if n == 1 and groups > 1:
        bounds = [groups * i // parts for i in range(parts + 1)]
        return [(slice(0, 1), a, b - a) for a, b in zip(bounds, bounds[1:]) if b > a]
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(slice(a, b), 0, groups) for a, b in zip(bounds, bounds[1:]) if b > a]


def _chunk_pieces(chunk):
    """The power-of-two pieces of one chunk (NOTE [batch buckets]), as :func:`_pieces`."""
    ns, g0, gg = chunk
    n = ns.stop - ns.start
    if n == 1 and gg > 1:
        return [(ns, g0 + a, size) for a, size in _binary_pieces(gg)]
    return [(slice(ns.start + a, ns.start + a + size), g0, gg) for a, size in _binary_pieces(n)]



def _run_pieces(passes, dtype, n, groups, cg, og, stride, padding, dilation):
    """Runs each pass ``(op, arrays, accumulated, layout)`` piece by piece. ``arrays``: ``{name:
    array}`` — each piece takes the examples ``ns`` of x and y, and the channels of its
    groups (per group ``cg`` for x, ``og`` for y, the weight's first dim and the bias);
    ``accumulated`` names the outputs summed over example pieces (the weight and bias
    gradients). The passes of a piece run one after the other and share the reorder of an
    input they both read (NOTE [one backward pass over the output gradient]). In the
    "threads" mode the pieces are grouped in chunks that run at once on cuvmap's threads
    (NOTE [oneDNN beside another OpenMP user])."""
    parts = openmp.split_parts()
    chunks = _chunks(n, groups, parts) if parts > 1 else []
    if len(chunks) < 2:
        try:
            _run_serial(passes, dtype, _pieces(n, groups), cg, og, stride, padding, dilation)
        finally:
            openmp.region_ended()   # (on OpenMP's team: its workers spin now, where they do)
        return
    jobs, partials = [], []
    for i, chunk in enumerate(chunks):
        chunk_passes = passes
        if i > 0 and chunk[0].start > 0:
            # a later chunk of examples: its own weight and bias gradients, summed below
            chunk_passes = []
            for op, arrays, accumulated, layout in passes:
                if accumulated:
                    arrays = dict(arrays)
                    for name in accumulated:
                        partial = np.empty(arrays[name].shape, dtype)
                        partials.append((arrays[name], partial))
                        arrays[name] = partial
                chunk_passes.append((op, arrays, accumulated, layout))
        jobs.append((_chunk_pieces(chunk), chunk_passes))
    pool = openmp.workers.get(len(jobs))
    futures = [pool.submit(_run_serial, chunk_passes, dtype, pieces, cg, og, stride, padding, dilation)
               for pieces, chunk_passes in jobs]
    for f in futures:
        f.result()
    for target, partial in partials:
        target += partial


def _run_serial(passes, dtype, pieces, cg, og, stride, padding, dilation):
    """Runs the ``pieces`` one after the other in this thread, each piece's passes in
    order (see :func:`_run_pieces`)."""
    reordered = {}
    per_group = {"x": cg, "y": og, "w": og, "b": og}
    partials = {}
    first_start = pieces[0][0].start if pieces else 0
    for ns, g0, gg in pieces:
        for op, arrays, accumulated, layout in passes:
            sliced, layouts = {}, {}
            for name, a in arrays.items():
                ch = slice(g0 * per_group[name], (g0 + gg) * per_group[name])
                sliced[name] = a[ch] if name in ("w", "b") else a[ns, ch]
            sums = []
            if ns.start > first_start:
                # a later example piece of an accumulated gradient: its partial sum, then added
                for name in accumulated:
                    target = sliced[name]
                    partial = partials.get((op, name))
                    if partial is None or partial.shape != target.shape:
                        partial = partials[op, name] = np.empty(target.shape, dtype)
                    sliced[name] = partial
                    sums.append((target, partial))
            layouts = {name: _weight_layout(s, gg) if name == "w" else _layout(s) for name, s in sliced.items()}
            _plan(op, dtype, layouts, stride, padding, dilation, layout).run(sliced, reordered)
            for target, partial in sums:
                target += partial


def forward(x, w, stride, padding, dilation, groups, bias=None, layout="blocked"):
    """Regular convolution ``(N, C, S...) ⊛ (O, C/G, K...) [+ bias (O,)] -> (N, O, out...)``;
    ``layout``: the activations' inside the primitive (NOTE [activation layouts])."""
    operands = (x, w) if bias is None else (x, w, bias)
    dtype = _dtype_of("forward", *operands)
    x = _readable(x)
    w = np.ascontiguousarray(w)
    n, c = x.shape[:2]
    o = w.shape[0]
    kernel = tuple(w.shape[2:])
    out_sp = output_spatial(x.shape[2:], kernel, stride, padding, dilation)
    y = _activation_result((n, o) + out_sp, dtype)
    arrays = {"x": x, "w": w, "y": y}
    if bias is not None:
        arrays["b"] = np.ascontiguousarray(bias)
    _run_pieces([("forward", arrays, (), layout)], dtype, n, groups, c // groups, o // groups, stride, padding, dilation)
    return y


def backward_input(g, w, input_shape, stride, padding, dilation, groups, layout="blocked"):
    """``∂⟨conv(x, w), g⟩/∂x`` for ``x`` of ``input_shape`` (oneDNN's backward-data)."""
    dtype = _dtype_of("backward_input", g, w)
    g = _readable(g)
    w = np.ascontiguousarray(w)
    n, c = input_shape[:2]
    o = w.shape[0]
    dx = _activation_result(tuple(input_shape), dtype)
    _run_pieces([("backward_input", {"x": dx, "w": w, "y": g}, (), layout)], dtype, n, groups, c // groups, o // groups,
                stride, padding, dilation)
    return dx


def backward_weight(g, x, weight_shape, stride, padding, dilation, groups, layout="blocked"):
    """``∂⟨conv(x, w), g⟩/∂w`` for ``w`` of ``weight_shape`` (oneDNN's backward-weights)."""
    dtype = _dtype_of("backward_weight", g, x)
    g = _readable(g)
    x = _readable(x)
    n, c = x.shape[:2]
    o = weight_shape[0]
    dw = np.empty(tuple(weight_shape), dtype)
    _run_pieces([("backward_weight", {"x": x, "w": dw, "y": g}, ("w",), layout)], dtype, n, groups, c // groups,
                o // groups, stride, padding, dilation)
    return dw


# NOTE [one backward pass over the output gradient]
# The backward pass of ``conv(x, w) + b`` reads the output gradient ``g`` three times: the
# input gradient (backward-data), the weight gradient (backward-weights) and the bias
# gradient (a sum over every dim but the channels). Run apart, each reads ``g`` in NumPy's
# plain layout, and the two oneDNN primitives each reorder it into their blocked layout
# (``nChw16c``), a pass over ``g`` as long as an elementwise op, and the bias sum is a
# pass of its own (``python -m benchmarks eager`` lists each convolution's reorders).
# :func:`backward` runs them as one: per piece (NOTE [batch buckets]) backward-data, then
# backward-weights on the same reorder of ``g`` (the pieces' shared reorders, keyed by the
# source array and the layout; an output written through an arena drops the entry of its
# name), with oneDNN's ``diff_bias`` computed by backward-weights in the pass it already
# makes over ``g`` (what torch's ``convolution_backward`` asks of oneDNN). The bias comes
# out summed in oneDNN's order, not NumPy's pairwise one: the two agree to float32
# rounding. A staged program computes its convolutions' gradients this way when it has
# them side by side (``conv_backward`` in cuvmap/lax/convolution_merged.py, NOTE [equations
# merged for the plan] in cuvmap/transforms/executor/merges.py).


def backward(g, *, x=None, w=None, input_shape=None, weight_shape=None, bias=False, stride, padding, dilation,
             groups, layouts=None):
    """The gradients of ``⟨conv(x, w) + b, g⟩`` that are asked for, from one pass over ``g``
    (NOTE [one backward pass over the output gradient]): ``(dx, dw, db)``, each None when
    not asked. ``dx`` (of ``input_shape``) is asked by passing the weight ``w``, ``dw``
    (of ``weight_shape``) by passing the input ``x``, ``db`` (``(O,)``) by ``bias=True``.
    ``layouts``: ``{"backward_input" | "backward_weight": layout}`` (NOTE [activation
    layouts]; "blocked" where not given); ``g``'s reorder is shared when both are one."""
    operands = [a for a in (g, x, w) if a is not None]
    dtype = _dtype_of("backward", *operands)
    layouts = layouts or {}
    g = _readable(g)
    n, o = g.shape[:2]
    c = (input_shape if w is not None else x.shape)[1]
    passes, dx, dw, db = [], None, None, None
    if w is not None:
        dx = _activation_result(tuple(input_shape), dtype)
        passes.append(("backward_input", {"x": dx, "w": np.ascontiguousarray(w), "y": g}, (),
                       layouts.get("backward_input", "blocked")))
    if x is not None or bias:
        if x is None:
            raise ValueError("oneDNN backward: the bias gradient comes with the weight gradient (pass x)")
        dw = np.empty(tuple(weight_shape), dtype)
        arrays, accumulated = {"x": _readable(x), "w": dw, "y": g}, ("w",)
        if bias:
            db = np.empty((o,), dtype)
            arrays["b"], accumulated = db, ("w", "b")
        passes.append(("backward_weight", arrays, accumulated, layouts.get("backward_weight", "blocked")))
    _run_pieces(passes, dtype, n, groups, c // groups, o // groups, stride, padding, dilation)
    return dx, dw, db
