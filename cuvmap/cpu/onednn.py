"""oneDNN convolutions through ctypes on ``libdnnl.so.3``.

The library comes from the ``onednn-cpu-gomp`` wheel (oneDNN 3.2, built on GNU OpenMP),
which puts it in the environment's ``lib/``; ``CUVMAP_ONEDNN_LIBRARY`` names another file.
oneDNN's CPU convolutions are the kernels torch runs on the CPU (through ideep). The
design follows :mod:`cuvmap.cuda.cudnn` and torch's ideep wrapper:

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

Only float32 runs here: oneDNN has no float64 convolution, and this CPU's float16 and
bfloat16 paths have no NumPy dtype worth adding (:func:`supports` says which dtypes).
This module never imports the transforms or the primitives (only ``cuvmap/window.py`` and ``cuvmap/lru.py``).
"""
import ctypes
import os
import sys
import threading

import numpy as np

from cuvmap import config
from cuvmap.lru import LRU
from cuvmap.window import output_spatial

# ---------------------------------------------------------------------------------------
# The C API's constants (oneDNN 3.2: dnnl_common_types.h, dnnl_types.h)
# ---------------------------------------------------------------------------------------

DNNL_SUCCESS = 0
_STATUS = {1: "out_of_memory", 2: "invalid_arguments", 3: "unimplemented", 4: "last_impl_reached",
           5: "runtime_error", 6: "not_required"}
DNNL_CPU = 1                         # dnnl_engine_kind_t
DNNL_STREAM_DEFAULT_FLAGS = 0x1      # dnnl_stream_in_order
DNNL_F32 = 3                         # dnnl_data_type_t
DNNL_FORMAT_TAG_ANY = 1              # dnnl_format_tag_t
DNNL_FORWARD_TRAINING = 64           # dnnl_prop_kind_t
DNNL_CONVOLUTION_DIRECT = 0x1        # dnnl_alg_kind_t
DNNL_SCRATCHPAD_MODE_USER = 1        # dnnl_scratchpad_mode_t
DNNL_QUERY_IMPL_INFO_STR = 8         # dnnl_query_t
DNNL_QUERY_SRC_MD = 129
DNNL_QUERY_DIFF_SRC_MD = 130
DNNL_QUERY_WEIGHTS_MD = 131
DNNL_QUERY_DIFF_WEIGHTS_MD = 132
DNNL_QUERY_DST_MD = 133
DNNL_QUERY_DIFF_DST_MD = 134
DNNL_QUERY_SCRATCHPAD_MD = 136
DNNL_ARG_SRC = 1                     # DNNL_ARG_* (execution arguments)
DNNL_ARG_DST = 17
DNNL_ARG_WEIGHTS = 33
DNNL_ARG_BIAS = 41
DNNL_ARG_SCRATCHPAD = 80
DNNL_ARG_DIFF_SRC = 129
DNNL_ARG_DIFF_DST = 145
DNNL_ARG_DIFF_WEIGHTS = 161
DNNL_ARG_FROM, DNNL_ARG_TO = DNNL_ARG_SRC, DNNL_ARG_DST
DNNL_MAX_NDIMS = 12

_DATA_TYPES = {np.dtype(np.float32): DNNL_F32}
FORWARD_TAKES_BIAS = True  # forward(..., bias=b) adds the bias inside the primitive
_Dims = ctypes.c_int64 * DNNL_MAX_NDIMS


class ExecArg(ctypes.Structure):
    """``dnnl_exec_arg_t``."""

    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


class Version(ctypes.Structure):
    """``dnnl_version_t``."""

    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


class OnednnError(RuntimeError):
    pass


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_DIMS = ctypes.POINTER(ctypes.c_int64)
_SIGNATURES = {  # name: (restype, argtypes)
    "dnnl_engine_create": (ctypes.c_int, [_PP, ctypes.c_int, ctypes.c_size_t]),
    "dnnl_stream_create": (ctypes.c_int, [_PP, _P, ctypes.c_uint]),
    "dnnl_stream_wait": (ctypes.c_int, [_P]),
    "dnnl_stream_destroy": (ctypes.c_int, [_P]),
    "dnnl_memory_desc_create_with_strides": (ctypes.c_int, [_PP, ctypes.c_int, _DIMS, ctypes.c_int, _DIMS]),
    "dnnl_memory_desc_create_with_tag": (ctypes.c_int, [_PP, ctypes.c_int, _DIMS, ctypes.c_int, ctypes.c_int]),
    "dnnl_memory_desc_destroy": (ctypes.c_int, [_P]),
    "dnnl_memory_desc_equal": (ctypes.c_int, [_P, _P]),
    "dnnl_memory_desc_get_size": (ctypes.c_size_t, [_P]),
    "dnnl_memory_create": (ctypes.c_int, [_PP, _P, _P, _P]),
    "dnnl_memory_destroy": (ctypes.c_int, [_P]),
    "dnnl_primitive_attr_create": (ctypes.c_int, [_PP]),
    "dnnl_primitive_attr_set_scratchpad_mode": (ctypes.c_int, [_P, ctypes.c_int]),
    "dnnl_primitive_attr_destroy": (ctypes.c_int, [_P]),
    # (pd*, engine, prop_kind, alg_kind, src, weights, bias, dst, strides, dilates, pad_l, pad_r, attr)
    "dnnl_convolution_forward_primitive_desc_create": (
        ctypes.c_int, [_PP, _P, ctypes.c_int, ctypes.c_int, _P, _P, _P, _P, _DIMS, _DIMS, _DIMS, _DIMS, _P]),
    # (pd*, engine, alg_kind, diff_src, weights, diff_dst, strides, dilates, pad_l, pad_r, hint, attr)
    "dnnl_convolution_backward_data_primitive_desc_create": (
        ctypes.c_int, [_PP, _P, ctypes.c_int, _P, _P, _P, _DIMS, _DIMS, _DIMS, _DIMS, _P, _P]),
    # (pd*, engine, alg_kind, src, diff_weights, diff_bias, diff_dst, strides, dilates, pad_l, pad_r, hint, attr)
    "dnnl_convolution_backward_weights_primitive_desc_create": (
        ctypes.c_int, [_PP, _P, ctypes.c_int, _P, _P, _P, _P, _DIMS, _DIMS, _DIMS, _DIMS, _P, _P]),
    # (pd*, src_md, src_engine, dst_md, dst_engine, attr)
    "dnnl_reorder_primitive_desc_create": (ctypes.c_int, [_PP, _P, _P, _P, _P, _P]),
    "dnnl_primitive_desc_query_md": (_P, [_P, ctypes.c_int, ctypes.c_int]),
    "dnnl_primitive_desc_query": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int, _P]),
    "dnnl_primitive_desc_destroy": (ctypes.c_int, [_P]),
    "dnnl_primitive_create": (ctypes.c_int, [_PP, _P]),
    "dnnl_primitive_execute": (ctypes.c_int, [_P, _P, ctypes.c_int, ctypes.POINTER(ExecArg)]),
    "dnnl_primitive_destroy": (ctypes.c_int, [_P]),
    "dnnl_version": (ctypes.POINTER(Version), []),
    "dnnl_set_primitive_cache_capacity": (ctypes.c_int, [ctypes.c_int]),
}

# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------

_lock = threading.RLock()
_lib = None
_load_error = None
_engine = None
_thread = threading.local()   # .stream, .arena
_settings = {"enabled": config.from_environment("CUVMAP_DISABLE_ONEDNN", "") == "",
             "threading": None}   # "openmp" or "threads" (NOTE [oneDNN beside another OpenMP user])
_thread_settings = {}         # what _prepare_openmp set (for describe())
_omp = {}                     # omp_get_max_threads / omp_set_num_threads of libdnnl's libgomp


def _library_candidates():
    """``CUVMAP_ONEDNN_LIBRARY`` alone when set; else the wheel's ``<prefix>/lib/libdnnl.so.3``,
    then the loader's search path."""
    override = config.from_environment("CUVMAP_ONEDNN_LIBRARY", None)
    if override:
        return [override]
    found = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = os.path.join(prefix, "lib", "libdnnl.so.3")
        if os.path.exists(path):
            found.append(path)
    found.append("libdnnl.so.3")
    return found


def _libgomp_loaded():
    """Whether the system's GNU OpenMP (``libgomp.so.1``, the one libdnnl links) is already
    in this process: its settings are then fixed. (Wheels such as torch's bring their own
    copies under other names, ``libgomp-<hash>.so.1``, which libdnnl does not use.)"""
    try:
        with open("/proc/self/maps") as fh:
            return any(os.path.basename(line.split()[-1]).startswith("libgomp.so") for line in fh if "/" in line)
    except OSError:
        return False


# NOTE [OpenMP threads beside OpenBLAS]
# oneDNN runs its convolutions on GNU OpenMP's thread pool; NumPy's GEMMs and element-wise
# work run on OpenBLAS's pthreads pool and the calling thread, on the same cores. What
# matters is what OpenMP's workers do between convolutions: by default (OMP_WAIT_POLICY
# unset) an idle worker spins for GOMP_SPINCOUNT iterations before it sleeps, and
# OMP_WAIT_POLICY=ACTIVE spins for good. A spinning worker holds a core that the OpenBLAS
# GEMM or the NumPy op right after a convolution wants. On the benchmark CNN's vmap(grad),
# spinning workers make the step several times slower than passive ones, and its times
# far more spread out (`OMP_WAIT_POLICY=ACTIVE python -m benchmarks per_example` against
# `OMP_WAIT_POLICY=PASSIVE python -m benchmarks per_example`, each setting in its own
# process; the policy in force is printed with the figures). A lone small convolution is
# slower with PASSIVE (a sleeping worker takes a fraction of a millisecond to wake), but
# a training step is many operations in a row, and there PASSIVE wins. Matching the
# thread counts changes nothing here: both pools default to one thread per core.
# So cuvmap loads libdnnl (whose libgomp reads its environment once, when it loads) with
# OMP_WAIT_POLICY=PASSIVE, and restores the environment right after, so that neither the
# user's subprocesses nor other libraries see the change. It does nothing when the user set
# OMP_WAIT_POLICY or GOMP_SPINCOUNT (theirs wins), or when libgomp.so.1 is already loaded
# (its settings are fixed then: NOTE [oneDNN beside another OpenMP user] says what cuvmap
# does instead). describe() says which applied.


def _prepare_openmp():
    """The environment variables to set while libdnnl loads (NOTE [OpenMP threads beside
    OpenBLAS]), and the threading mode (NOTE [oneDNN beside another OpenMP user])."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        _thread_settings["OMP_WAIT_POLICY"] = f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')} (the user's)"
        _default_threading("openmp")
        return {}
    if _libgomp_loaded():
        _thread_settings["OMP_WAIT_POLICY"] = "(libgomp.so.1 was already loaded: its own setting)"
        _default_threading("threads")
        return {}
    _thread_settings["OMP_WAIT_POLICY"] = "PASSIVE (set by cuvmap while libdnnl loaded)"
    _default_threading("openmp")
    return {"OMP_WAIT_POLICY": "PASSIVE"}


# NOTE [oneDNN beside another OpenMP user]
# When libgomp.so.1 is already in the process as libdnnl loads — torch imported first
# brings its own copy under that soname, and the loader hands it to libdnnl — its wait
# policy was read from the environment when it loaded, before cuvmap could set PASSIVE:
# by default its threads spin at every barrier and after every parallel region. GNU
# OpenMP has no call that changes the policy afterwards (omp_set_dynamic and the thread
# counts do not touch it; GOMP_SPINCOUNT is read once), so cuvmap's own calls stop using
# OpenMP's thread team instead: in the "threads" mode each convolution is split into
# contiguous chunks — of the examples N, or of the groups when N = 1 (the per-example
# weight gradient's groups·B) — one per thread that OpenMP would have used
# (omp_get_max_threads() of the calling thread: OMP_NUM_THREADS, torch.set_num_threads),
# and the chunks run at once on cuvmap's own worker threads, each of which has set
# omp_set_num_threads(1) for itself, so that oneDNN runs them without a parallel region:
# no OpenMP thread of anyone's spins for cuvmap, and the caller waits on a condition
# variable. A weight gradient over several chunks of N sums their partial gradients.
# The other threads' OpenMP settings (torch's included) are never changed. The mode is
# "threads" only where libgomp was loaded first and the user set neither OMP_WAIT_POLICY
# nor GOMP_SPINCOUNT (their policy wins: OpenMP runs as they asked); it is "openmp" where
# cuvmap loaded libgomp itself (PASSIVE). CUVMAP_ONEDNN_THREADING=openmp|threads or
# set_threading() chooses it. Plans are keyed on the creating thread's OpenMP thread count
# too, since oneDNN sizes a primitive's work split and scratchpad for the threads it is
# made with. `python -m benchmarks per_example --torch-first` measures the mode.
_THREADING = ("openmp", "threads")


def _default_threading(mode):
    if _settings["threading"] is None:
        env = config.from_environment("CUVMAP_ONEDNN_THREADING", "")
        _settings["threading"] = _validate_threading(env, "CUVMAP_ONEDNN_THREADING") if env else mode


def _validate_threading(mode, source):
    if mode not in _THREADING:
        raise ValueError(f"oneDNN threading must be one of {', '.join(_THREADING)}; {source} is {mode!r}")
    return mode


def set_threading(mode):
    """How oneDNN's convolutions use threads: ``"openmp"`` (oneDNN's own OpenMP team) or
    ``"threads"`` (chunks on cuvmap's threads, OpenMP single-threaded in each: NOTE [oneDNN
    beside another OpenMP user]). Returns the previous mode (None before libdnnl loads)."""
    previous = _settings["threading"]
    _settings["threading"] = _validate_threading(mode, "set_threading's argument")
    return previous


def threading_mode():
    """The mode in force (loads libdnnl)."""
    _load()
    return _settings["threading"] or "openmp"


def _dlopen(path, env):
    """``ctypes.CDLL(path)`` with ``env`` set in the environment during the load only."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return ctypes.CDLL(path)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _load():
    global _lib, _load_error, _engine
    if _lib is not None or _load_error is not None:
        return _lib
    with _lock:
        if _lib is not None or _load_error is not None:
            return _lib
        env = _prepare_openmp()
        errors = []
        for path in _library_candidates():
            try:
                lib = _dlopen(path, env)
            except OSError as err:
                errors.append(f"{path}: {err}")
                continue
            try:
                for name, (restype, argtypes) in _SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
            except AttributeError as err:
                errors.append(f"{path}: not oneDNN 3 ({err})")
                continue
            v = lib.dnnl_version().contents
            if v.major != 3:
                errors.append(f"{path}: oneDNN {v.major}.{v.minor}.{v.patch}, cuvmap needs oneDNN 3")
                continue
            engine = ctypes.c_void_p()
            status = lib.dnnl_engine_create(ctypes.byref(engine), DNNL_CPU, 0)
            if status != DNNL_SUCCESS:
                errors.append(f"{path}: dnnl_engine_create(cpu, 0) failed: {_STATUS.get(status, status)}")
                continue
            if "DNNL_PRIMITIVE_CACHE_CAPACITY" not in os.environ:
                # NOTE [plan cache]: cuvmap's cache is the one that bounds the primitives
                lib.dnnl_set_primitive_cache_capacity(0)
            _engine = engine
            _bind_openmp(lib)
            _lib = lib
            return _lib
        _load_error = "; ".join(errors)
        return None


def _bind_openmp(lib):
    """omp_get_max_threads and omp_set_num_threads of the libgomp libdnnl uses (found
    through libdnnl's dependencies); without them only the "openmp" mode runs."""
    try:
        get, set_ = lib.omp_get_max_threads, lib.omp_set_num_threads
    except AttributeError:
        _settings["threading"] = "openmp"
        return
    get.argtypes, get.restype = [], ctypes.c_int
    set_.argtypes, set_.restype = [ctypes.c_int], None
    _omp.update(get=get, set=set_)


def openmp_functions():
    """``(omp_get_max_threads, omp_set_num_threads)`` of the libgomp libdnnl uses (the
    calling thread's count), ``(None, None)`` where not found or libdnnl is not loaded."""
    return _omp.get("get"), _omp.get("set")


def available():
    """True when oneDNN is enabled (``CUVMAP_DISABLE_ONEDNN`` unset, :func:`set_enabled`)
    and ``libdnnl.so.3`` loads with a CPU engine."""
    return _settings["enabled"] and _load() is not None


def set_enabled(flag):
    """Turns oneDNN off (the im2col + GEMM kernels run instead) or back on."""
    _settings["enabled"] = bool(flag)


def load_error():
    """Why ``libdnnl.so.3`` did not load (None when it did or was not tried yet)."""
    return _load_error


def version():
    """``"3.2.0"`` or None."""
    lib = _load()
    if lib is None:
        return None
    v = lib.dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def supports(dtype):
    """Whether oneDNN's kernels take this dtype (float32 only; float64 stays on NumPy)."""
    return np.dtype(dtype) in _DATA_TYPES


def loaded():
    """Whether libdnnl has been loaded (or its loading tried) in this process."""
    return _lib is not None or _load_error is not None


def describe():
    """One line: the version and threading, or why oneDNN is unavailable (loads libdnnl)."""
    if not available():
        return "oneDNN unavailable: " + (load_error() or "disabled")
    threads = ", ".join(f"{k}={v}" for k, v in _thread_settings.items())
    mode = threading_mode()
    mode = ("OpenMP's threads" if mode == "openmp" else
            "cuvmap's threads, OpenMP single-threaded in each (NOTE [oneDNN beside another OpenMP user])")
    return f"oneDNN {version()} (GNU OpenMP; {threads}; convolutions on {mode})"


def _check(status, what):
    if status != DNNL_SUCCESS:
        raise OnednnError(f"oneDNN {what} failed: {_STATUS.get(status, 'status')} ({status})")


def _stream():
    stream = getattr(_thread, "stream", None)
    if stream is None:
        stream = _Stream()
        _thread.stream = stream
    return stream.handle


class _Stream:
    """A thread's stream, destroyed with the thread's locals."""

    def __init__(self):
        self.handle = ctypes.c_void_p()
        _check(_lib.dnnl_stream_create(ctypes.byref(self.handle), _engine, DNNL_STREAM_DEFAULT_FLAGS),
               "dnnl_stream_create")

    def __del__(self):
        if _lib is not None and self.handle:
            _lib.dnnl_stream_destroy(self.handle)


def _arena(slot, nbytes):
    """A per-thread buffer of at least ``nbytes`` for ``slot``, 64-byte aligned: its pages
    are touched once and reused by every later call in this thread."""
    arena = getattr(_thread, "arena", None)
    if arena is None:
        arena = _thread.arena = {}
    buf = arena.get(slot)
    if buf is None or buf[1] < nbytes:
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        offset = (-raw.ctypes.data) % 64
        buf = (raw, nbytes, raw.ctypes.data + offset)
        arena[slot] = buf
    return buf[2]


def arena_bytes():
    """Bytes held by this thread's arena."""
    return sum(b[1] for b in getattr(_thread, "arena", {}).values())


# ---------------------------------------------------------------------------------------
# Memory descriptors and primitives
# ---------------------------------------------------------------------------------------


def _dims(values):
    return _Dims(*[int(v) for v in values])


def _plain_md(shape, strides, dtype):
    """A plain memory descriptor over an array of ``shape`` with element ``strides``."""
    md = ctypes.c_void_p()
    _check(_lib.dnnl_memory_desc_create_with_strides(ctypes.byref(md), len(shape), _dims(shape),
                                                     _DATA_TYPES[dtype], _dims(strides)),
           f"dnnl_memory_desc_create_with_strides{tuple(shape)}, strides {tuple(strides)}")
    return md


def _any_md(shape, dtype):
    md = ctypes.c_void_p()
    _check(_lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(shape), _dims(shape), _DATA_TYPES[dtype],
                                                 DNNL_FORMAT_TAG_ANY),
           f"dnnl_memory_desc_create_with_tag{tuple(shape)}")
    return md


def _user_attr():
    attr = ctypes.c_void_p()
    _check(_lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "dnnl_primitive_attr_create")
    _check(_lib.dnnl_primitive_attr_set_scratchpad_mode(attr, DNNL_SCRATCHPAD_MODE_USER),
           "dnnl_primitive_attr_set_scratchpad_mode")
    return attr


class _Primitive:
    """A primitive with its descriptor (kept: its memory descriptors are queried at every
    call) and scratchpad size."""

    def __init__(self, pd, what):
        """Takes ownership of ``pd`` once the primitive exists (the caller keeps it when
        creation fails)."""
        self.pd = self.handle = None
        handle = ctypes.c_void_p()
        _check(_lib.dnnl_primitive_create(ctypes.byref(handle), pd), f"dnnl_primitive_create ({what})")
        self.pd, self.handle = pd, handle
        self.scratchpad_md = _lib.dnnl_primitive_desc_query_md(pd, DNNL_QUERY_SCRATCHPAD_MD, 0)
        self.scratchpad = int(_lib.dnnl_memory_desc_get_size(self.scratchpad_md)) if self.scratchpad_md else 0

    def impl(self):
        name = ctypes.c_char_p()
        _lib.dnnl_primitive_desc_query(self.pd, DNNL_QUERY_IMPL_INFO_STR, 0, ctypes.byref(name))
        return name.value.decode() if name.value else "?"

    def __del__(self):
        if _lib is not None:
            if self.handle:
                _lib.dnnl_primitive_destroy(self.handle)
            if self.pd:
                _lib.dnnl_primitive_desc_destroy(self.pd)


def _reorder(src_md, dst_md, attr, what):
    pd = ctypes.c_void_p()
    _check(_lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src_md, _engine, dst_md, _engine, attr),
           f"dnnl_reorder_primitive_desc_create ({what})")
    try:
        return _Primitive(pd, f"reorder {what}")
    except OnednnError:
        _lib.dnnl_primitive_desc_destroy(pd)
        raise


class _Operand:
    """One argument of a convolution: the user's plain descriptor, the primitive's (owned
    by the primitive descriptor) and the reorder between them when they differ."""

    def __init__(self, arg, name, output, user_md, conv_md, attr):
        self.arg, self.name, self.output = arg, name, output
        self.user_md = user_md
        self.conv_md = conv_md
        self.reorder = None
        self.size = int(_lib.dnnl_memory_desc_get_size(conv_md))
        if not _lib.dnnl_memory_desc_equal(user_md, conv_md):
            src, dst = (conv_md, user_md) if output else (user_md, conv_md)
            self.reorder = _reorder(src, dst, attr, name)

    def __del__(self):
        if _lib is not None and self.user_md:
            _lib.dnnl_memory_desc_destroy(self.user_md)


def _padding_r(in_sp, out_sp, kernel, stride, padding, dilation):
    """oneDNN's right padding: what makes ``out = (in + p_l + p_r − d(k − 1) − 1)/s + 1``
    exact (it may be smaller than ``p_l``, even negative, when the last window ends early)."""
    return tuple((o - 1) * s + d * (k - 1) + 1 - i - p
                 for i, o, k, s, p, d in zip(in_sp, out_sp, kernel, stride, padding, dilation))


class _Plan:
    """A convolution primitive (forward, backward-data or backward-weights) on fixed
    shapes, strides and parameters, with the reorders of its operands. ``operands`` is
    ``{name: (shape, element strides)}`` for ``x``, ``w`` (grouped: ``(G, Og, Cg, K...)``),
    ``y`` and, for a forward with bias, ``b``."""

    def __init__(self, op, dtype, operands, stride, padding, dilation):
        self.op = op
        x_shape, w_shape, y_shape = (operands[k][0] for k in ("x", "w", "y"))
        kernel = w_shape[-len(stride):]
        strides = _dims(stride)
        dilates = _dims(d - 1 for d in dilation)  # oneDNN counts dilation from 0
        pad_l = _dims(padding)
        pad_r = _dims(_padding_r(x_shape[2:], y_shape[2:], kernel, stride, padding, dilation))
        attr = _user_attr()
        anys = [_any_md(operands[k][0], dtype) for k in ("x", "w", "y")]
        users = {k: _plain_md(shape, st, dtype) for k, (shape, st) in operands.items()}
        bias_md = users.get("b")
        hint = pd = ctypes.c_void_p()
        what = (f"convolution {op}: input {tuple(x_shape)}, weight {tuple(w_shape)}, output {tuple(y_shape)}, "
                f"stride {tuple(stride)}, padding {tuple(padding)}, dilation {tuple(dilation)}")
        try:
            hint = ctypes.c_void_p()
            _check(_lib.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(hint), _engine, DNNL_FORWARD_TRAINING, DNNL_CONVOLUTION_DIRECT, anys[0], anys[1],
                bias_md, anys[2], strides, dilates, pad_l, pad_r, attr), what)
            if op == "forward":
                pd, hint = hint, ctypes.c_void_p()
                roles = [(DNNL_ARG_SRC, "x", False, DNNL_QUERY_SRC_MD), (DNNL_ARG_WEIGHTS, "w", False, DNNL_QUERY_WEIGHTS_MD),
                         (DNNL_ARG_DST, "y", True, DNNL_QUERY_DST_MD)]
                if bias_md is not None:
                    roles.append((DNNL_ARG_BIAS, "b", False, None))
            elif op == "backward_input":
                pd = ctypes.c_void_p()
                _check(_lib.dnnl_convolution_backward_data_primitive_desc_create(
                    ctypes.byref(pd), _engine, DNNL_CONVOLUTION_DIRECT, anys[0], anys[1], anys[2], strides, dilates,
                    pad_l, pad_r, hint, attr), what)
                roles = [(DNNL_ARG_DIFF_DST, "y", False, DNNL_QUERY_DIFF_DST_MD),
                         (DNNL_ARG_WEIGHTS, "w", False, DNNL_QUERY_WEIGHTS_MD),
                         (DNNL_ARG_DIFF_SRC, "x", True, DNNL_QUERY_DIFF_SRC_MD)]
            else:
                pd = ctypes.c_void_p()
                _check(_lib.dnnl_convolution_backward_weights_primitive_desc_create(
                    ctypes.byref(pd), _engine, DNNL_CONVOLUTION_DIRECT, anys[0], anys[1], None, anys[2], strides,
                    dilates, pad_l, pad_r, hint, attr), what)
                roles = [(DNNL_ARG_SRC, "x", False, DNNL_QUERY_SRC_MD),
                         (DNNL_ARG_DIFF_DST, "y", False, DNNL_QUERY_DIFF_DST_MD),
                         (DNNL_ARG_DIFF_WEIGHTS, "w", True, DNNL_QUERY_DIFF_WEIGHTS_MD)]
            self.conv = _Primitive(pd, what)
            pd = ctypes.c_void_p()  # owned by self.conv now
            self.operands = []
            for arg, name, output, query in roles:
                conv_md = users[name] if query is None else _lib.dnnl_primitive_desc_query_md(self.conv.pd, query, 0)
                self.operands.append(_Operand(arg, name, output, users.pop(name), conv_md, attr))
        finally:
            for md in anys + list(users.values()):
                _lib.dnnl_memory_desc_destroy(md)
            for p in (hint, pd):
                if p:
                    _lib.dnnl_primitive_desc_destroy(p)
            _lib.dnnl_primitive_attr_destroy(attr)
        self.scratchpad = max([self.conv.scratchpad] + [o.reorder.scratchpad for o in self.operands if o.reorder])

    def describe(self):
        """The implementation oneDNN chose (e.g. ``jit:avx512_core``) and the reorders."""
        reorders = [o.name for o in self.operands if o.reorder is not None]
        return f"{self.conv.impl()}, reorders of {', '.join(reorders) or 'none'}"

    def run(self, arrays, reordered=None):
        """Runs the plan on ``arrays`` (``{name: ndarray}`` with this plan's shapes and
        strides; the output's is written). ``reordered`` (a dict shared by the calls of
        one kernel call) skips the reorder of an input that an earlier call already
        reordered into the same layout from the same array."""
        lib = _lib
        stream = _stream()
        scratch = _arena("scratchpad", self.scratchpad) if self.scratchpad else None
        memories = []

        def memory(md, ptr):
            m = ctypes.c_void_p()
            _check(lib.dnnl_memory_create(ctypes.byref(m), md, _engine, ctypes.c_void_p(ptr)), "dnnl_memory_create")
            memories.append(m)
            return m

        def execute(primitive, args):
            if primitive.scratchpad:
                args = args + [(DNNL_ARG_SCRATCHPAD, memory(primitive.scratchpad_md, scratch))]
            packed = (ExecArg * len(args))(*[ExecArg(a, m) for a, m in args])
            _check(lib.dnnl_primitive_execute(primitive.handle, stream, len(args), packed),
                   f"dnnl_primitive_execute ({self.op})")

        try:
            conv_args, after = [], []
            for o in self.operands:
                a = arrays[o.name]
                user = memory(o.user_md, a.ctypes.data)
                if o.reorder is None:
                    conv_args.append((o.arg, user))
                    continue
                inner = memory(o.conv_md, _arena(o.name, o.size))
                conv_args.append((o.arg, inner))
                if o.output:
                    after.append((o.reorder, inner, user))
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
            _check(lib.dnnl_stream_wait(stream), "dnnl_stream_wait")
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
# tests/test_onednn.py checks the bound and the process's memory.
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


def _plan(op, dtype, operands, stride, padding, dilation):
    threads = _omp["get"]() if _omp else 0    # oneDNN sizes a primitive for its creating thread's team
    key = (op, dtype.str, tuple(sorted(operands.items())), tuple(stride), tuple(padding), tuple(dilation), threads)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    import time

    t0 = time.perf_counter()
    plan = _Plan(op, dtype, operands, stride, padding, dilation)
    with _lock:
        _stats["created"] += 1
        _stats["create_seconds"] += time.perf_counter() - t0
    return _plans.put(key, plan)


def plan_description(op, x, w, y, stride, padding, dilation, groups):
    """What oneDNN runs for one call of ``op`` (for diagnostics and benchmarks)."""
    ops = {"x": _layout(x), "w": _weight_layout(w, groups), "y": _layout(y)}
    return _plan(op, np.dtype(x.dtype), ops, stride, padding, dilation).describe()


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
    shape = tuple(int(s) for s in a.shape)
    item = a.itemsize
    contiguous = _contiguous_strides(shape)
    strides = tuple(c if s == 1 else st // item for s, st, c in zip(shape, a.strides, contiguous))
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


def bucket(size):
    """The power of two at or above ``size`` (1 for 0): the size class of a batch-like dim
    in strategy keys (NOTE [batch buckets])."""
    return 1 << max(0, int(size) - 1).bit_length()


def _dtype_of(op, *arrays):
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) != 1 or not supports(next(iter(dtypes))):
        raise OnednnError(f"oneDNN {op}: operands of dtype {', '.join(sorted(d.name for d in dtypes))}; "
                          f"oneDNN runs float32 only")
    if _load() is None:
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


class _Workers:
    """cuvmap's worker threads for the "threads" mode, each with OpenMP single-threaded
    (omp_set_num_threads(1) in the thread itself)."""

    def __init__(self):
        self.pool = None
        self.size = 0
        self.pid = None

    def get(self, size):
        with _lock:
            forked = self.pid != os.getpid()     # a fork's child has none of the parent's threads
            if self.pool is None or self.size < size or forked:
                import concurrent.futures

                old = None if forked else self.pool
                self.pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=size, thread_name_prefix="cuvmap-onednn", initializer=_omp["set"],
                    initargs=(1,))
                self.size = size
                self.pid = os.getpid()
                if old is not None:
                    old.shutdown(wait=False)
            return self.pool


_workers = _Workers()


def _split_parts():
    """How many chunks a call runs as (1: oneDNN's own OpenMP team runs it whole)."""
    if _settings["threading"] != "threads" or not _omp:
        return 1
    return max(1, int(_omp["get"]()))


def _run_pieces(op, dtype, n, groups, cg, og, arrays, stride, padding, dilation, accumulate=None):
    """Runs ``op`` piece by piece. ``arrays``: ``{name: array}`` — each piece takes the
    examples ``ns`` of x and y, and the channels of its groups (per group ``cg`` for x,
    ``og`` for y and the weight's first dim). ``accumulate`` names the output summed over
    example pieces (the weight gradient). In the "threads" mode the pieces are grouped in
    chunks that run at once on cuvmap's threads (NOTE [oneDNN beside another OpenMP user])."""
    parts = _split_parts()
    chunks = _chunks(n, groups, parts) if parts > 1 else []
    if len(chunks) < 2:
        _run_serial(op, dtype, _pieces(n, groups), cg, og, arrays, stride, padding, dilation, accumulate)
        return
    jobs, partials = [], []
    for i, chunk in enumerate(chunks):
        chunk_arrays = arrays
        if accumulate is not None and i > 0 and chunk[0].start > 0:
            # a later chunk of examples: its own weight gradient, summed below
            chunk_arrays = dict(arrays)
            chunk_arrays[accumulate] = np.empty(arrays[accumulate].shape, dtype)
            partials.append(chunk_arrays[accumulate])
        jobs.append((_chunk_pieces(chunk), chunk_arrays))
    pool = _workers.get(len(jobs))
    futures = [pool.submit(_run_serial, op, dtype, pieces, cg, og, a, stride, padding, dilation, accumulate)
               for pieces, a in jobs]
    for f in futures:
        f.result()
    for partial in partials:
        arrays[accumulate] += partial


def _run_serial(op, dtype, pieces, cg, og, arrays, stride, padding, dilation, accumulate=None):
    """Runs the ``pieces`` one after the other in this thread (see :func:`_run_pieces`)."""
    reordered = {}
    per_group = {"x": cg, "y": og, "w": og, "b": og}
    partial = None
    first_start = pieces[0][0].start if pieces else 0
    for ns, g0, gg in pieces:
        sliced, layouts = {}, {}
        for name, a in arrays.items():
            ch = slice(g0 * per_group[name], (g0 + gg) * per_group[name])
            if name in ("w", "b"):
                s = a[ch]
            else:
                s = a[ns, ch]
            sliced[name] = s
            layouts[name] = _weight_layout(s, gg) if name == "w" else _layout(s)
        if accumulate is not None and ns.start > first_start:
            # a later example piece of the weight gradient: its partial sum, then added
            target = sliced[accumulate]
            if partial is None or partial.shape != target.shape:
                partial = np.empty(target.shape, dtype)
            sliced[accumulate] = partial
            layouts[accumulate] = (_weight_layout(partial, gg) if accumulate == "w" else _layout(partial))
            _plan(op, dtype, layouts, stride, padding, dilation).run(sliced, reordered)
            target += partial
            continue
        _plan(op, dtype, layouts, stride, padding, dilation).run(sliced, reordered)


def forward(x, w, stride, padding, dilation, groups, bias=None):
    """Regular convolution ``(N, C, S...) ⊛ (O, C/G, K...) [+ bias (O,)] -> (N, O, out...)``."""
    operands = (x, w) if bias is None else (x, w, bias)
    dtype = _dtype_of("forward", *operands)
    x = _readable(x)
    w = np.ascontiguousarray(w)
    n, c = x.shape[:2]
    o = w.shape[0]
    kernel = tuple(w.shape[2:])
    out_sp = output_spatial(x.shape[2:], kernel, stride, padding, dilation)
    y = np.empty((n, o) + out_sp, dtype)
    arrays = {"x": x, "w": w, "y": y}
    if bias is not None:
        arrays["b"] = np.ascontiguousarray(bias)
    _run_pieces("forward", dtype, n, groups, c // groups, o // groups, arrays, stride, padding, dilation)
    return y


def backward_input(g, w, input_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂x`` for ``x`` of ``input_shape`` (oneDNN's backward-data)."""
    dtype = _dtype_of("backward_input", g, w)
    g = _readable(g)
    w = np.ascontiguousarray(w)
    n, c = input_shape[:2]
    o = w.shape[0]
    dx = np.empty(tuple(input_shape), dtype)
    _run_pieces("backward_input", dtype, n, groups, c // groups, o // groups, {"x": dx, "w": w, "y": g},
                stride, padding, dilation)
    return dx


def backward_weight(g, x, weight_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂w`` for ``w`` of ``weight_shape`` (oneDNN's backward-weights)."""
    dtype = _dtype_of("backward_weight", g, x)
    g = _readable(g)
    x = _readable(x)
    n, c = x.shape[:2]
    o = weight_shape[0]
    dw = np.empty(tuple(weight_shape), dtype)
    _run_pieces("backward_weight", dtype, n, groups, c // groups, o // groups, {"x": x, "w": dw, "y": g},
                stride, padding, dilation, accumulate="w")
    return dw
