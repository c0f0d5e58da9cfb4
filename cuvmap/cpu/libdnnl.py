"""The ctypes layer over oneDNN's ``libdnnl.so.3``: the C API's constants and signatures,
the library loaded once per process (in the OpenMP environment that
:mod:`cuvmap.cpu.openmp` prepares), the CPU engine, a stream and an arena per thread,
memory descriptors and primitives. The convolutions built on it are
:mod:`cuvmap.cpu.onednn`'s (as :mod:`cuvmap.cuda.libs` loads what :mod:`cuvmap.cuda.cudnn`
binds).

The library comes from the ``onednn-cpu-gomp`` wheel (oneDNN 3.2, built on GNU OpenMP),
which puts it in the environment's ``lib/``; ``CUVMAP_ONEDNN_LIBRARY`` names another file.
Only float32 runs here: oneDNN has no float64 convolution, and this CPU's float16 and
bfloat16 paths have no NumPy dtype worth adding (:func:`supports` says which dtypes).
This module imports nothing of cuvmap but :mod:`cuvmap.cpu.openmp`.
"""
import ctypes
import os
import sys
import threading

import numpy as np

from cuvmap.cpu import openmp
from cuvmap import config

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
DNNL_QUERY_STRIDES = 14              # a memory descriptor's (outer) strides, in elements
DNNL_QUERY_NDIMS_S32 = 256
DNNL_QUERY_DIMS = 257
DNNL_QUERY_DATA_TYPE = 258
DNNL_QUERY_SUBMEMORY_OFFSET_S64 = 259
DNNL_QUERY_PADDED_DIMS = 260
DNNL_QUERY_PADDED_OFFSETS = 261
DNNL_QUERY_FORMAT_KIND = 262
DNNL_QUERY_INNER_NBLKS_S32 = 263
DNNL_QUERY_INNER_BLKS = 264
DNNL_QUERY_INNER_IDXS = 265
DNNL_FORMAT_KIND_BLOCKED = 2         # dnnl_format_kind_t
DNNL_ARG_SRC = 1                     # DNNL_ARG_* (execution arguments)
DNNL_ARG_DST = 17
DNNL_ARG_WEIGHTS = 33
DNNL_ARG_BIAS = 41
DNNL_ARG_SCRATCHPAD = 80
DNNL_ARG_DIFF_SRC = 129
DNNL_ARG_DIFF_DST = 145
DNNL_ARG_DIFF_WEIGHTS = 161
DNNL_ARG_DIFF_BIAS = 169
DNNL_ARG_FROM, DNNL_ARG_TO = DNNL_ARG_SRC, DNNL_ARG_DST
DNNL_MAX_NDIMS = 12

_DATA_TYPES = {np.dtype(np.float32): DNNL_F32}
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
    "dnnl_memory_desc_query": (ctypes.c_int, [_P, ctypes.c_int, _P]),
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
    # (pd*, engine, src, weights, bias, dst, attr)
    "dnnl_matmul_primitive_desc_create": (ctypes.c_int, [_PP, _P, _P, _P, _P, _P, _P]),
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
lib = None                    # the loaded library (load() sets it)
engine = None                 # the CPU engine (load() sets it)
_load_error = None
_thread = threading.local()   # .stream, .arena
_settings = {"enabled": config.from_environment("CUVMAP_DISABLE_ONEDNN", "") == ""}


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


def load():
    global lib, _load_error, engine
    if lib is not None or _load_error is not None:
        return lib
    with _lock:
        if lib is not None or _load_error is not None:
            return lib
        env = openmp.prepare_environment()
        errors = []
        for path in _library_candidates():
            try:
                candidate = _dlopen(path, env)
            except OSError as err:
                errors.append(f"{path}: {err}")
                continue
            try:
                for name, (restype, argtypes) in _SIGNATURES.items():
                    fn = getattr(candidate, name)
                    fn.restype = restype
                    fn.argtypes = argtypes
            except AttributeError as err:
                errors.append(f"{path}: not oneDNN 3 ({err})")
                continue
            v = candidate.dnnl_version().contents
            if v.major != 3:
                errors.append(f"{path}: oneDNN {v.major}.{v.minor}.{v.patch}, cuvmap needs oneDNN 3")
                continue
            handle = ctypes.c_void_p()
            status = candidate.dnnl_engine_create(ctypes.byref(handle), DNNL_CPU, 0)
            if status != DNNL_SUCCESS:
                errors.append(f"{path}: dnnl_engine_create(cpu, 0) failed: {_STATUS.get(status, status)}")
                continue
            if "DNNL_PRIMITIVE_CACHE_CAPACITY" not in os.environ:
                # NOTE [plan cache]: cuvmap's cache is the one that bounds the primitives
                candidate.dnnl_set_primitive_cache_capacity(0)
            engine = handle
            openmp.bind(candidate)
            lib = candidate
            return lib
        _load_error = "; ".join(errors)
        return None


def available():
    """True when oneDNN is enabled (``CUVMAP_DISABLE_ONEDNN`` unset, :func:`set_enabled`)
    and ``libdnnl.so.3`` loads with a CPU engine."""
    return _settings["enabled"] and load() is not None


def set_enabled(flag):
    """Turns oneDNN off (the im2col + GEMM kernels run instead) or back on."""
    _settings["enabled"] = bool(flag)


def load_error():
    """Why ``libdnnl.so.3`` did not load (None when it did or was not tried yet)."""
    return _load_error


def version():
    """``"3.2.0"`` or None."""
    library = load()
    if library is None:
        return None
    v = library.dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def supports(dtype):
    """Whether oneDNN's kernels take this dtype (float32 only; float64 stays on NumPy)."""
    return np.dtype(dtype) in _DATA_TYPES


def loaded():
    """Whether libdnnl has been loaded (or its loading tried) in this process."""
    return lib is not None or _load_error is not None


def check(status, what):
    if status != DNNL_SUCCESS:
        raise OnednnError(f"oneDNN {what} failed: {_STATUS.get(status, 'status')} ({status})")


def stream():
    held = getattr(_thread, "stream", None)
    if held is None:
        held = _Stream()
        _thread.stream = held
    return held.handle


class _Stream:
    """A thread's stream, destroyed with the thread's locals."""

    def __init__(self):
        self.handle = ctypes.c_void_p()
        check(lib.dnnl_stream_create(ctypes.byref(self.handle), engine, DNNL_STREAM_DEFAULT_FLAGS),
              "dnnl_stream_create")

    def __del__(self):
        if lib is not None and self.handle:
            lib.dnnl_stream_destroy(self.handle)


def arena(slot, nbytes):
    """A per-thread buffer of at least ``nbytes`` for ``slot``, 64-byte aligned: its pages
    are touched once and reused by every later call in this thread."""
    buffers = getattr(_thread, "arena", None)
    if buffers is None:
        buffers = _thread.arena = {}
    buf = buffers.get(slot)
    if buf is None or buf[1] < nbytes:
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        offset = (-raw.ctypes.data) % 64
        buf = (raw, nbytes, raw.ctypes.data + offset)
        buffers[slot] = buf
    return buf[2]


def arena_bytes():
    """Bytes held by this thread's arena."""
    return sum(b[1] for b in getattr(_thread, "arena", {}).values())


# ---------------------------------------------------------------------------------------
# Memory descriptors and primitives
# ---------------------------------------------------------------------------------------


def dims(values):
    return _Dims(*[int(v) for v in values])


def plain_md(shape, strides, dtype):
    """A plain memory descriptor over an array of ``shape`` with element ``strides``."""
    md = ctypes.c_void_p()
    check(lib.dnnl_memory_desc_create_with_strides(ctypes.byref(md), len(shape), dims(shape),
                                                   _DATA_TYPES[dtype], dims(strides)),
          f"dnnl_memory_desc_create_with_strides{tuple(shape)}, strides {tuple(strides)}")
    return md


def any_md(shape, dtype):
    md = ctypes.c_void_p()
    check(lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(shape), dims(shape), _DATA_TYPES[dtype],
                                               DNNL_FORMAT_TAG_ANY),
          f"dnnl_memory_desc_create_with_tag{tuple(shape)}")
    return md


def _query_int(md, what, c_type=ctypes.c_int32):
    value = c_type(0)
    check(lib.dnnl_memory_desc_query(md, what, ctypes.byref(value)), "dnnl_memory_desc_query")
    return value.value


def _query_dims(md, what, n):
    values = ctypes.POINTER(ctypes.c_int64)()
    check(lib.dnnl_memory_desc_query(md, what, ctypes.byref(values)), "dnnl_memory_desc_query")
    return tuple(values[i] for i in range(n))


def element_strides(md):
    """``(dims, data type, strides)`` of a memory descriptor whose memory is a plain
    strided array (every element at ``Σ index · stride``), else None. A blocked layout is
    one when each blocked dim fits in one block: ``nChw16c`` with 16 channels is ``nhwc``
    (NOTE [channels-last results] in cuvmap/cpu/onednn.py)."""
    if _query_int(md, DNNL_QUERY_FORMAT_KIND) != DNNL_FORMAT_KIND_BLOCKED:
        return None
    n = _query_int(md, DNNL_QUERY_NDIMS_S32)
    dims = _query_dims(md, DNNL_QUERY_DIMS, n)
    if (_query_dims(md, DNNL_QUERY_PADDED_DIMS, n) != dims or any(_query_dims(md, DNNL_QUERY_PADDED_OFFSETS, n))
            or _query_int(md, DNNL_QUERY_SUBMEMORY_OFFSET_S64, ctypes.c_int64)):
        return None
    strides = list(_query_dims(md, DNNL_QUERY_STRIDES, n))
    blocks = _query_int(md, DNNL_QUERY_INNER_NBLKS_S32)
    if blocks:
        sizes, axes = _query_dims(md, DNNL_QUERY_INNER_BLKS, blocks), _query_dims(md, DNNL_QUERY_INNER_IDXS, blocks)
        if len(set(axes)) != blocks:
            return None
        inner = 1
        for size, axis in reversed(list(zip(sizes, axes))):
            if dims[axis] != size:      # the dim spans blocks: not a plain stride
                return None
            strides[axis] = inner
            inner *= size
    return dims, _query_int(md, DNNL_QUERY_DATA_TYPE), tuple(strides)


def same_memory(a, b):
    """Whether two memory descriptors place every element at the same offset (strides of
    size-1 dims aside): then one's memory is the other's, and no reorder is needed."""
    a, b = element_strides(a), element_strides(b)
    if a is None or b is None or a[:2] != b[:2]:
        return False
    return all(d == 1 or s == t for d, s, t in zip(a[0], a[2], b[2]))


def user_attr():
    attr = ctypes.c_void_p()
    check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "dnnl_primitive_attr_create")
    check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, DNNL_SCRATCHPAD_MODE_USER),
          "dnnl_primitive_attr_set_scratchpad_mode")
    return attr


class Primitive:
    """A primitive with its descriptor (kept: its memory descriptors are queried at every
    call) and scratchpad size."""

    def __init__(self, pd, what):
        """Takes ownership of ``pd`` once the primitive exists (the caller keeps it when
        creation fails)."""
        self.pd = self.handle = None
        handle = ctypes.c_void_p()
        check(lib.dnnl_primitive_create(ctypes.byref(handle), pd), f"dnnl_primitive_create ({what})")
        self.pd, self.handle = pd, handle
        self.scratchpad_md = lib.dnnl_primitive_desc_query_md(pd, DNNL_QUERY_SCRATCHPAD_MD, 0)
        self.scratchpad = int(lib.dnnl_memory_desc_get_size(self.scratchpad_md)) if self.scratchpad_md else 0

    def impl(self):
        name = ctypes.c_char_p()
        lib.dnnl_primitive_desc_query(self.pd, DNNL_QUERY_IMPL_INFO_STR, 0, ctypes.byref(name))
        return name.value.decode() if name.value else "?"

    def __del__(self):
        if lib is not None:
            if self.handle:
                lib.dnnl_primitive_destroy(self.handle)
            if self.pd:
                lib.dnnl_primitive_desc_destroy(self.pd)


def reorder(src_md, dst_md, attr, what):
    pd = ctypes.c_void_p()
    check(lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src_md, engine, dst_md, engine, attr),
          f"dnnl_reorder_primitive_desc_create ({what})")
    try:
        return Primitive(pd, f"reorder {what}")
    except OnednnError:
        lib.dnnl_primitive_desc_destroy(pd)
        raise

