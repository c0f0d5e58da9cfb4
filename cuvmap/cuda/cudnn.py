"""cuDNN convolutions through ctypes on ``libcudnn.so.9``.

The library comes from the ``nvidia-cudnn-cu12`` / ``nvidia-cudnn-cu13`` wheel (or the
system); the cuBLAS(Lt) and NVRTC it loads at its first handle come from the wheels too,
preloaded before it (:mod:`cuvmap.cuda.libs`). CuPy 14 has no cuDNN module; the design
follows CuPy v13's ``cupyx/cudnn.pyx``:

- one cuDNN handle per (device, thread), created lazily (NOTE [cuDNN handles]);
  :func:`available` creates the first one, which is when cuDNN loads its sub-libraries
  and cuBLASLt, so that a broken installation shows in :func:`load_error` instead of
  failing the first convolution;
- the current CuPy stream is set on the handle before every call;
- a plan cache keyed on every parameter (operation, device, dtype, shapes, stride,
  padding, dilation, groups, math mode, workspace cap) holding the descriptors, the
  algorithm and its workspace size: an LRU of ``CACHE_SIZE`` plans (:mod:`cuvmap.lru`,
  the helper oneDNN's plan cache uses too; NOTE [cuDNN plan cache]); the algorithm comes from cuDNN's heuristics
  (``*_v7``), or from timing every algorithm once (``set_benchmark(True)``, like
  ``torch.backends.cudnn.benchmark``), and never needs more workspace than the cap
  (8 MiB by default, as in CuPy v13: NOTE [cuDNN algorithm choice]);
- the workspace is allocated from CuPy's memory pool for each call;
- strict FP32 by default (``CUDNN_FMA_MATH``: no TF32 tensor cores); ``set_allow_tf32(True)``
  opts in;
- the operands are CuPy arrays of one dtype on the current device (a clear error
  otherwise), handed to cuDNN C-contiguous and 16-byte aligned, and empty operands never
  reach it (NOTE [cuDNN operands]).

The three functions have the signatures of :mod:`cuvmap.lax.conv_gemm`'s kernels (regular
convolutions; the transposed ones are expressed through them by ``cuvmap/lax/convolution.py``).
1-d convolutions run as 2-d ones with a unit height. This module never imports the
transforms or the primitives.
"""
import atexit
import ctypes
import os
import threading

import numpy as np

from cuvmap import backend, config
from cuvmap.lru import LRU
from cuvmap.window import output_spatial
from cuvmap.cuda import libs

CUDNN_STATUS_SUCCESS = 0
CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE, CUDNN_DATA_HALF = 0, 1, 2
CUDNN_TENSOR_NCHW = 0
CUDNN_CROSS_CORRELATION = 1
CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_FMA_MATH = 0, 1, 2, 3
CUDNN_NON_DETERMINISTIC, CUDNN_DETERMINISTIC = 0, 1
_MAX_ALGOS = 16
DEFAULT_MAX_WORKSPACE_BYTES = 8 * 1024 * 1024
ALIGNMENT = 16          # bytes (NOTE [cuDNN operands])

_DATA_TYPES = {
    np.dtype(np.float32): (CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, ctypes.c_float),
    np.dtype(np.float64): (CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, ctypes.c_double),
    np.dtype(np.float16): (CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, ctypes.c_float),
}
_OP_NAMES = {"fwd": "Forward", "bwd_data": "BackwardData", "bwd_filter": "BackwardFilter"}


class AlgoPerf(ctypes.Structure):
    """``cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t`` (one layout for the three)."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


class CudnnError(RuntimeError):
    pass


_lock = threading.Lock()
_lib = None                             # the loaded library (_load sets it)
_init = {"ok": None, "error": None}     # the first cudnnCreate (in available())
_local = threading.local()              # .handles: {device id: _Handle} of this thread
_exiting = [False]

# NOTE [cuDNN plan cache]
# A plan (four descriptors, the chosen algorithm and its workspace size) is made on the
# first call of its key and kept in an LRU of CACHE_SIZE plans, like oneDNN's (NOTE [plan
# cache] in cuvmap/cpu/onednn.py): a process that meets many shapes (DP-SGD's Poisson
# batches under vmap fold B into N or the groups, so every new batch size is a new key)
# keeps a bounded number of descriptors, and an evicted plan's descriptors are destroyed
# when the last call using it returns. Under set_benchmark(True) an evicted key is timed
# again when it comes back.
CACHE_SIZE = 256
_plans = LRU(CACHE_SIZE)
_settings = {"allow_tf32": False, "benchmark": False, "enabled": config.from_environment("CUVMAP_DISABLE_CUDNN", "") == "",
             "max_workspace": None}     # None: not read from CUVMAP_CUDNN_MAX_WORKSPACE_BYTES yet


def set_allow_tf32(flag):
    """Lets float32 convolutions use TF32 tensor cores (faster, ~10-bit mantissa)."""
    _settings["allow_tf32"] = bool(flag)


def set_benchmark(flag):
    """Chooses each shape's algorithm by timing all of them once (slower first call)."""
    _settings["benchmark"] = bool(flag)
    _plans.clear()


def set_enabled(flag):
    """Turns cuDNN off (the im2col + GEMM kernels run on CuPy instead) or back on."""
    _settings["enabled"] = bool(flag)


def _workspace_bytes(value, source):
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise ValueError(f"the cuDNN workspace cap must be a non-negative whole number of bytes; {source} is {value!r}")


def set_max_workspace_bytes(nbytes):
    """Caps the workspace a cuDNN algorithm may use, in bytes; the algorithms that need
    more are skipped (NOTE [cuDNN algorithm choice]). The default is 8 MiB (CuPy v13's),
    or ``CUVMAP_CUDNN_MAX_WORKSPACE_BYTES`` when set; 0 allows workspace-free algorithms
    only.

    Example::

        cudnn.set_max_workspace_bytes(64 * 2**20)
    """
    _settings["max_workspace"] = _workspace_bytes(nbytes, "set_max_workspace_bytes's argument")


def max_workspace_bytes():
    """The workspace cap in force: :func:`set_max_workspace_bytes`'s, else
    ``CUVMAP_CUDNN_MAX_WORKSPACE_BYTES``'s (read at the first convolution, so that a bad
    value fails there, never at import), else 8 MiB."""
    if _settings["max_workspace"] is None:
        raw = config.from_environment("CUVMAP_CUDNN_MAX_WORKSPACE_BYTES", "")
        _settings["max_workspace"] = (DEFAULT_MAX_WORKSPACE_BYTES if raw == "" else
                                      _workspace_bytes(raw, "CUVMAP_CUDNN_MAX_WORKSPACE_BYTES"))
    return _settings["max_workspace"]


def _library_candidates():
    """``libcudnn.so.9`` from the pip wheels (``nvidia-cudnn-cu12`` and ``-cu13`` put it in
    ``nvidia/cudnn/lib``; the paths torch searches, NOTE [preloading the CUDA wheels] in
    cuvmap/cuda/libs.py), then the system's."""
    found = []
    for major in libs.cuda_majors():
        for path in libs.candidate_paths("cudnn", "libcudnn.so.9", major):
            if path not in found and os.path.isfile(path):
                found.append(path)
    found.append("libcudnn.so.9")
    return found


_SIGNATURES = {
    "cudnnCreate": [ctypes.POINTER(ctypes.c_void_p)],
    "cudnnDestroy": [ctypes.c_void_p],
    "cudnnSetStream": [ctypes.c_void_p, ctypes.c_void_p],
    "cudnnCreateTensorDescriptor": [ctypes.POINTER(ctypes.c_void_p)],
    "cudnnSetTensorNdDescriptor": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
    "cudnnDestroyTensorDescriptor": [ctypes.c_void_p],
    "cudnnCreateFilterDescriptor": [ctypes.POINTER(ctypes.c_void_p)],
    "cudnnSetFilterNdDescriptor": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_int)],
    "cudnnDestroyFilterDescriptor": [ctypes.c_void_p],
    "cudnnCreateConvolutionDescriptor": [ctypes.POINTER(ctypes.c_void_p)],
    "cudnnSetConvolutionNdDescriptor": [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                        ctypes.c_int, ctypes.c_int],
    "cudnnSetConvolutionGroupCount": [ctypes.c_void_p, ctypes.c_int],
    "cudnnSetConvolutionMathType": [ctypes.c_void_p, ctypes.c_int],
    "cudnnDestroyConvolutionDescriptor": [ctypes.c_void_p],
    # (handle, xDesc, wDesc, convDesc, yDesc, requested, *returned, perf*)
    "cudnnGetConvolutionForwardAlgorithm_v7": [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(AlgoPerf)],
    # (handle, wDesc, dyDesc, convDesc, dxDesc, ...)
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(AlgoPerf)],
    # (handle, xDesc, dyDesc, convDesc, dwDesc, ...)
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(AlgoPerf)],
    # Find*Ex: (handle, aDesc, a, bDesc, b, convDesc, cDesc, c, requested, *returned, perf*, ws, wsSize)
    "cudnnFindConvolutionForwardAlgorithmEx": [ctypes.c_void_p] * 8 + [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(AlgoPerf), ctypes.c_void_p, ctypes.c_size_t],
    "cudnnFindConvolutionBackwardDataAlgorithmEx": [ctypes.c_void_p] * 8 + [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(AlgoPerf), ctypes.c_void_p, ctypes.c_size_t],
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": [ctypes.c_void_p] * 8 + [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(AlgoPerf), ctypes.c_void_p, ctypes.c_size_t],
    # (handle, d1, d2, convDesc, d3, algo, *size)
    "cudnnGetConvolutionForwardWorkspaceSize": [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)],
    "cudnnGetConvolutionBackwardDataWorkspaceSize": [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)],
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)],
    # (handle, alpha, aDesc, a, bDesc, b, convDesc, algo, ws, wsSize, beta, cDesc, c)
    "cudnnConvolutionForward": [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p],
    "cudnnConvolutionBackwardData": [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p],
    "cudnnConvolutionBackwardFilter": [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p],
}


def _bind(lib):
    lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
    lib.cudnnGetErrorString.restype = ctypes.c_char_p
    lib.cudnnGetVersion.argtypes = []
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    try:    # cuDNN 9's description of the latest error on this thread (optional)
        lib.cudnnGetLastErrorString.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.cudnnGetLastErrorString.restype = None
    except AttributeError:
        pass


# cuBLAS(Lt) and NVRTC from the wheels first: cuDNN loads them by soname (NOTE [preloading
# the CUDA wheels] in cuvmap/cuda/libs.py)
_library = libs.WheelLibrary("libcudnn.so.9", _library_candidates, _SIGNATURES, bind=_bind,
                             preload=libs.CUBLAS + libs.NVRTC)


def _load():
    global _lib
    _lib = _library.load()
    return _lib


def _preload_note():
    """What the wheel preload missed, for the error messages (empty when nothing)."""
    return _library.preload_note()


def _initialised():
    """Creates this thread's handle on the current device, once per process: cudnnCreate
    loads cuDNN's sub-libraries (``libcudnn_engines_*``, ``libcudnn_graph``...) and
    cuBLASLt and checks the driver, so their failure is reported here, by status."""
    if _init["ok"] is not None:
        return _init["ok"]
    with _lock:
        if _init["ok"] is None:
            try:
                _handle()
                _init["ok"] = True
            except Exception as err:  # noqa: BLE001 - any failure: cuDNN is unavailable, and says why
                _init["error"] = (f"cuDNN {version()} loaded, but creating a handle failed: {err}"
                                  + _preload_note())
                _init["ok"] = False
    return _init["ok"]


def available():
    """True when cuDNN is enabled, CuPy sees a GPU, ``libcudnn.so.9`` loads and a cuDNN
    handle can be created on the current device (:func:`load_error` says why not)."""
    if not _settings["enabled"] or not backend.gpu_available():
        return False
    return _load() is not None and _initialised()


def version():
    lib = _load()
    return None if lib is None else int(lib.cudnnGetVersion())


def load_error():
    """Why :func:`available` is False — cuDNN disabled, no GPU, ``libcudnn.so.9`` not
    loadable (each path tried, with its error), or the first ``cudnnCreate`` failing (its
    status and cuDNN's description); None when cuDNN is available."""
    if available():
        return None
    if not _settings["enabled"]:
        return "cuDNN is disabled (set_enabled(False) or CUVMAP_DISABLE_CUDNN)"
    if not backend.gpu_available():
        return "no CUDA device visible to CuPy (CuPy not installed, no driver or no device)"
    return _library.error or _init["error"]


def _last_error_string():
    buf = ctypes.create_string_buffer(1024)
    try:
        _lib.cudnnGetLastErrorString(buf, len(buf))
    except Exception:  # noqa: BLE001 - only a description
        return ""
    return buf.value.decode(errors="replace").strip()


def _check(status, what):
    if status != CUDNN_STATUS_SUCCESS:
        if _lib is None:
            raise CudnnError(f"cuDNN {what} failed: status {status}")
        detail = _last_error_string()
        raise CudnnError(f"cuDNN {what} failed: {_lib.cudnnGetErrorString(status).decode()} (status {status})"
                         + (f": {detail}" if detail else ""))


# NOTE [cuDNN handles]
# cuDNN is thread-safe as long as no two threads use one handle at the same time, and a
# handle belongs to the device that was current when it was made. So each thread gets
# its own handle per device (a threading.local dict keyed by device id), set to the
# current CuPy stream before every call; two threads then never race between setting the
# stream and calling, and no lock serialises their convolutions. A thread's handles are
# destroyed with it (under their device), except at interpreter exit, when CUDA may be
# torn down already. The plan cache is shared: a plan's descriptors are only read after
# it is made.
class _Handle:
    """One ``cudnnHandle_t`` made on device ``device_id`` by the calling thread."""

    def __init__(self, device_id):
        self.device = device_id
        self.ptr = ctypes.c_void_p()
        _check(_lib.cudnnCreate(ctypes.byref(self.ptr)), f"cudnnCreate on GPU {device_id}")

    def __del__(self):
        try:
            if _exiting[0] or _lib is None or not self.ptr.value:
                return
            import cupy

            with cupy.cuda.Device(self.device):
                _lib.cudnnDestroy(self.ptr)
        except Exception:  # noqa: BLE001 - nothing to report from a finaliser
            pass


@atexit.register
def _at_exit():
    _exiting[0] = True


def _handle():
    """This thread's handle on the current device, set to the current CuPy stream."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    h = handles.get(dev)
    if h is None:
        h = handles[dev] = _Handle(dev)
    _check(_lib.cudnnSetStream(h.ptr, ctypes.c_void_p(cupy.cuda.get_current_stream().ptr)), "cudnnSetStream")
    return h.ptr


def _ints(values):
    return (ctypes.c_int * len(values))(*[int(v) for v in values])


def _contiguous_strides(shape):
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


# NOTE [cuDNN algorithm choice]
# cuDNN returns its candidate algorithms as perf records (algo, status, time, memory,
# mathType...), fastest first: estimated by its heuristics (cudnnGet*Algorithm_v7), or
# measured (cudnnFind*AlgorithmEx, under set_benchmark(True), given a workspace of the cap
# itself, so that nothing larger can be measured). usable_algorithms keeps, in cuDNN's
# order, the records that succeeded, need at most the workspace cap (memory; CuPy v13
# skipped those above its 8 MiB default the same way, and the first successful one may
# want gigabytes), and, in strict FP32/FP64, use no tensor-op math. The plan takes the
# first whose exact workspace size (cudnnGet*WorkspaceSize with the math type set) fits
# the cap too. Under cv.config.deterministic (NOTE [reproducible runs]) the choice is
# cuDNN's heuristics even under set_benchmark(True), and only the records cuDNN marks
# CUDNN_DETERMINISTIC are kept (its backward algorithms with atomics give other bits from
# run to run). If none fits, the call fails with a CudnnError saying what the smallest
# would need, and cuvmap/lax/conv_strategy.py runs the unfold kernels instead, with one
# VendorKernelWarning for the key (NOTE [choosing conv kernels]).
def usable_algorithms(perfs, *, strict, max_workspace, deterministic=False):
    """The perf records cuvmap may run, in cuDNN's order (NOTE [cuDNN algorithm choice]).

    Args:
      perfs: records with ``algo``, ``status``, ``memory`` (bytes), ``determinism`` and
        ``mathType`` (:class:`AlgoPerf`, as cuDNN fills them).
      strict: True when tensor-op math (TF32, FP16 conversions) is not allowed.
      max_workspace: the workspace cap in bytes.
      deterministic: keep only the algorithms cuDNN marks deterministic.
    Returns:
      A list of the usable records.
    """
    return [p for p in perfs
            if p.status == CUDNN_STATUS_SUCCESS and p.memory <= max_workspace
            and not (strict and p.mathType in (CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
            and not (deterministic and p.determinism != CUDNN_DETERMINISTIC)]


def no_algorithm_message(name, perfs, *, strict, max_workspace):
    """Why :func:`usable_algorithms` found nothing, for the CudnnError."""
    ok = [p for p in perfs if p.status == CUDNN_STATUS_SUCCESS
          and not (strict and p.mathType in (CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))]
    if not ok:
        return (f"cuDNN found no usable {name} algorithm for this convolution ({len(perfs)} candidates, none "
                f"succeeded{' in strict FP32/FP64 math' if strict else ''})")
    least = min(p.memory for p in ok)
    return (f"cuDNN found no {name} algorithm within the workspace cap of {max_workspace} bytes: the smallest "
            f"of {len(ok)} usable ones needs {least} bytes (cudnn.set_max_workspace_bytes or "
            f"CUVMAP_CUDNN_MAX_WORKSPACE_BYTES raises the cap)")


class _Plan:
    """Descriptors, algorithm and workspace size for one parameter combination."""

    def __init__(self, op, dtype, x_shape, w_shape, y_shape, stride, padding, dilation, groups, max_workspace):
        data_type, compute_type, self.scalar = _DATA_TYPES[dtype]
        self.op = op
        self.max_workspace = max_workspace
        self.x = self.y = self.w = self.conv = None
        self.x = self._tensor(data_type, x_shape)
        self.y = self._tensor(data_type, y_shape)
        self.w = ctypes.c_void_p()
        _check(_lib.cudnnCreateFilterDescriptor(ctypes.byref(self.w)), "cudnnCreateFilterDescriptor")
        _check(_lib.cudnnSetFilterNdDescriptor(self.w, data_type, CUDNN_TENSOR_NCHW, len(w_shape), _ints(w_shape)),
               f"cudnnSetFilterNdDescriptor{tuple(w_shape)}")
        self.conv = ctypes.c_void_p()
        nd = len(stride)
        _check(_lib.cudnnCreateConvolutionDescriptor(ctypes.byref(self.conv)), "cudnnCreateConvolutionDescriptor")
        _check(_lib.cudnnSetConvolutionNdDescriptor(self.conv, nd, _ints(padding), _ints(stride), _ints(dilation),
                                                    CUDNN_CROSS_CORRELATION, compute_type),
               "cudnnSetConvolutionNdDescriptor")
        _check(_lib.cudnnSetConvolutionGroupCount(self.conv, int(groups)), "cudnnSetConvolutionGroupCount")
        if dtype == np.float64:
            self.math = CUDNN_DEFAULT_MATH
        elif dtype == np.float32 and not _settings["allow_tf32"]:
            self.math = CUDNN_FMA_MATH
        else:
            self.math = CUDNN_TENSOR_OP_MATH
        _check(_lib.cudnnSetConvolutionMathType(self.conv, self.math), "cudnnSetConvolutionMathType")
        self.algo = None
        self.workspace = 0

    @staticmethod
    def _tensor(data_type, shape):
        desc = ctypes.c_void_p()
        _check(_lib.cudnnCreateTensorDescriptor(ctypes.byref(desc)), "cudnnCreateTensorDescriptor")
        _check(_lib.cudnnSetTensorNdDescriptor(desc, data_type, len(shape), _ints(shape),
                                               _ints(_contiguous_strides(shape))),
               f"cudnnSetTensorNdDescriptor{tuple(shape)}")
        return desc

    def _descs(self):
        """The descriptor order cuDNN's functions take for this op."""
        if self.op == "fwd":
            return (self.x, self.w, self.conv, self.y)
        if self.op == "bwd_data":
            return (self.w, self.y, self.conv, self.x)
        return (self.x, self.y, self.conv, self.w)

    def choose(self, handle, buffers):
        """Picks the algorithm (NOTE [cuDNN algorithm choice]): heuristics, or timing all of
        them with ``buffers`` (data pointers in cuDNN's argument order) and a workspace of
        the cap."""
        perfs = (AlgoPerf * _MAX_ALGOS)()
        count = ctypes.c_int()
        a, b, conv, c = self._descs()
        name = _OP_NAMES[self.op]
        cap = self.max_workspace
        deterministic = config.read("deterministic")
        if _settings["benchmark"] and not deterministic:
            import cupy

            ws = cupy.empty((cap,), dtype=cupy.uint8) if cap else None
            pa, pb, pc = buffers
            _check(getattr(_lib, f"cudnnFindConvolution{name}AlgorithmEx")(
                handle, a, ctypes.c_void_p(pa), b, ctypes.c_void_p(pb), conv, c, ctypes.c_void_p(pc),
                _MAX_ALGOS, ctypes.byref(count), perfs, ctypes.c_void_p(ws.data.ptr if cap else 0), cap),
                f"cudnnFindConvolution{name}AlgorithmEx")
        else:
            _check(getattr(_lib, f"cudnnGetConvolution{name}Algorithm_v7")(
                handle, a, b, conv, c, _MAX_ALGOS, ctypes.byref(count), perfs),
                f"cudnnGetConvolution{name}Algorithm_v7")
        records = perfs[:count.value]
        strict = self.math in (CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH)
        for p in usable_algorithms(records, strict=strict, max_workspace=cap, deterministic=deterministic):
            _check(_lib.cudnnSetConvolutionMathType(conv, self.math if strict else p.mathType),
                   "cudnnSetConvolutionMathType")
            size = ctypes.c_size_t()
            _check(getattr(_lib, f"cudnnGetConvolution{name}WorkspaceSize")(handle, a, b, conv, c, p.algo,
                                                                             ctypes.byref(size)),
                   f"cudnnGetConvolution{name}WorkspaceSize")
            if size.value > cap:
                continue
            self.algo = p.algo
            self.workspace = int(size.value)
            return
        raise CudnnError(no_algorithm_message(name, records, strict=strict, max_workspace=cap))

    def __del__(self):
        if _lib is None:
            return
        try:
            if self.x is not None:
                _lib.cudnnDestroyTensorDescriptor(self.x)
            if self.y is not None:
                _lib.cudnnDestroyTensorDescriptor(self.y)
            if self.w is not None:
                _lib.cudnnDestroyFilterDescriptor(self.w)
            if self.conv is not None:
                _lib.cudnnDestroyConvolutionDescriptor(self.conv)
        except Exception:  # noqa: BLE001
            pass


def _cached_plan(key, make):
    """The plan of ``key`` from the LRU (NOTE [cuDNN plan cache]), made by ``make()`` on a
    miss (outside the cache's lock: choosing an algorithm may time them all)."""
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, make())
    return plan


def cache_info():
    """``{"size", "bound", "hits", "misses", "evicted"}`` of the plan cache."""
    return _plans.info()


def _as_2d(x_shape, w_shape, y_shape, stride, padding, dilation):
    """1-d convolutions as 2-d ones with a unit height (cuDNN wants 4-d tensors or more)."""
    if len(stride) != 1:
        return x_shape, w_shape, y_shape, stride, padding, dilation
    ins = lambda s: tuple(s[:2]) + (1,) + tuple(s[2:])  # noqa: E731
    return ins(x_shape), ins(w_shape), ins(y_shape), (1,) + tuple(stride), (0,) + tuple(padding), (1,) + tuple(dilation)


# NOTE [cuDNN operands]
# The tensor descriptors describe packed NCHW arrays, and cuDNN's kernels load their data
# with vector instructions: a pointer must be aligned to the element size at least, and
# several kernels want 16 bytes. CuPy's memory pool hands out 512-byte aligned blocks, but a
# view need not start at one (x[1:] of a float32 array starts 4 bytes in). So each operand
# goes to cuDNN as it is when it is C-contiguous and 16-byte aligned, and as a fresh
# contiguous copy otherwise (as_operand). Before that, the operands are checked: CuPy
# arrays, one dtype cuDNN runs (float16, float32, float64), all on the current device (an
# array on another GPU gives a ValueError naming the op and the devices; cuDNN would read
# another device's memory). Operands with a zero-size dim (an empty batch, no channels)
# never reach cuDNN, which rejects zero-size descriptors: the result is all zeros (empty
# for the forward and input gradient; zeros for a weight gradient over no examples).
# cuvmap/lax/conv_strategy.py already returns before any kernel for those and checks the device
# before choosing kernels (NOTE [choosing conv kernels]); the binding checks again for direct
# callers.
def data_pointer(a):
    """The address of ``a``'s first element (a NumPy or CuPy array)."""
    return a.data.ptr if backend.is_cupy_array(a) else a.ctypes.data


def as_operand(a, alignment=ALIGNMENT):
    """``a`` itself when it is C-contiguous and its data is ``alignment``-byte aligned,
    else a fresh C-contiguous copy (NOTE [cuDNN operands]); NumPy or CuPy alike."""
    if a.flags.c_contiguous and data_pointer(a) % alignment == 0:
        return a
    return a.copy(order="C")


def _operands(op, named):
    """The ``(name, array)`` operands of ``op``, checked and made contiguous and aligned
    (NOTE [cuDNN operands])."""
    for name, a in named:
        if not backend.is_cupy_array(a):
            raise TypeError(f"cuDNN convolution {op}: the {name} is a {type(a).__module__}.{type(a).__name__}; "
                            f"cuDNN takes CuPy arrays")
    dtypes = sorted({np.dtype(a.dtype).name for _, a in named})
    if len(dtypes) != 1 or np.dtype(dtypes[0]) not in _DATA_TYPES:
        raise CudnnError(f"cuDNN convolution {op}: operands of dtype {', '.join(dtypes)}; cuDNN runs one of "
                         f"float16, float32 and float64")
    if not available():
        raise CudnnError(f"cuDNN convolution {op}: cuDNN is not available: {load_error()}")
    backend.check_current_device(f"cuDNN convolution {op}", named)
    return [as_operand(a) for _, a in named]


def _run(op, x_shape, w_shape, y_shape, dtype, stride, padding, dilation, groups, a, b, out):
    """Runs ``op`` writing ``out``; ``a``, ``b`` are the inputs in cuDNN's argument order."""
    import cupy

    if 0 in tuple(x_shape) + tuple(w_shape) + tuple(y_shape):     # NOTE [cuDNN operands]
        out.fill(0)
        return out
    x_shape, w_shape, y_shape, stride, padding, dilation = _as_2d(x_shape, w_shape, y_shape, stride, padding, dilation)
    handle = _handle()
    cap = max_workspace_bytes()
    key = (op, cupy.cuda.runtime.getDevice(), dtype.str, tuple(x_shape), tuple(w_shape), tuple(y_shape),
           tuple(stride), tuple(padding), tuple(dilation), int(groups), _settings["allow_tf32"],
           _settings["benchmark"], cap, config.read("deterministic"))

    def make():
        plan = _Plan(op, dtype, x_shape, w_shape, y_shape, stride, padding, dilation, groups, cap)
        plan.choose(handle, (a.data.ptr, b.data.ptr, out.data.ptr))
        return plan

    plan = _cached_plan(key, make)
    ws = cupy.empty((plan.workspace,), dtype=cupy.uint8) if plan.workspace else None
    ws_ptr = ctypes.c_void_p(ws.data.ptr if ws is not None else 0)
    one, zero = plan.scalar(1.0), plan.scalar(0.0)
    d1, d2, conv, d3 = plan._descs()
    fn = {"fwd": _lib.cudnnConvolutionForward, "bwd_data": _lib.cudnnConvolutionBackwardData,
          "bwd_filter": _lib.cudnnConvolutionBackwardFilter}[op]
    _check(fn(handle, ctypes.byref(one), d1, ctypes.c_void_p(a.data.ptr), d2, ctypes.c_void_p(b.data.ptr), conv,
              plan.algo, ws_ptr, plan.workspace, ctypes.byref(zero), d3, ctypes.c_void_p(out.data.ptr)),
           f"convolution {op}")
    return out


def forward(x, w, stride, padding, dilation, groups):
    """Regular convolution ``(N, C, S...) ⊛ (O, C/G, K...) -> (N, O, out...)``."""
    x, w = _operands("forward", [("input", x), ("weight", w)])
    import cupy

    y_shape = (x.shape[0], w.shape[0]) + output_spatial(x.shape[2:], w.shape[2:], stride, padding, dilation)
    y = cupy.empty(y_shape, dtype=x.dtype)
    return _run("fwd", x.shape, w.shape, y_shape, x.dtype, stride, padding, dilation, groups, x, w, y)


def backward_input(g, w, input_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂x`` for ``x`` of ``input_shape``."""
    g, w = _operands("backward_input", [("grad_output", g), ("weight", w)])
    import cupy

    dx = cupy.empty(tuple(input_shape), dtype=g.dtype)
    return _run("bwd_data", tuple(input_shape), w.shape, g.shape, g.dtype, stride, padding, dilation, groups, w, g, dx)


def backward_weight(g, x, weight_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂w`` for ``w`` of ``weight_shape``."""
    g, x = _operands("backward_weight", [("grad_output", g), ("input", x)])
    import cupy

    dw = cupy.empty(tuple(weight_shape), dtype=g.dtype)
    return _run("bwd_filter", x.shape, tuple(weight_shape), g.shape, g.dtype, stride, padding, dilation, groups, x, g, dw)
