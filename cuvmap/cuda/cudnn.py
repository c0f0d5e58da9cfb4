"""cuDNN convolutions through ctypes on ``libcudnn.so.9``.

The library comes from the ``nvidia-cudnn-cu12`` / ``nvidia-cudnn-cu13`` wheel (or the
system). CuPy 14 has no cuDNN module; the design follows CuPy v13's ``cupyx/cudnn.pyx``:

- one cuDNN handle per device, created lazily;
- the current CuPy stream is set on the handle before every call;
- a plan cache keyed on every parameter (operation, device, dtype, shapes, stride,
  padding, dilation, groups, math mode) holding the descriptors, the algorithm and its
  workspace size; the algorithm comes from cuDNN's heuristics (``*_v7``), or from timing
  every algorithm once (``set_benchmark(True)``, like ``torch.backends.cudnn.benchmark``);
- the workspace is allocated from CuPy's memory pool for each call;
- strict FP32 by default (``CUDNN_FMA_MATH``: no TF32 tensor cores); ``set_allow_tf32(True)``
  opts in.

The three functions have the signatures of :mod:`cuvmap.lax.conv_gemm`'s kernels (regular
convolutions; the transposed ones are expressed through them by ``cuvmap/lax/conv.py``).
1-d convolutions run as 2-d ones with a unit height. This module never imports the
transforms.
"""
import ctypes
import importlib.util
import os
import threading

import numpy as np

from cuvmap.core import conv_output_spatial
from cuvmap.cuda import device

CUDNN_STATUS_SUCCESS = 0
CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE, CUDNN_DATA_HALF = 0, 1, 2
CUDNN_TENSOR_NCHW = 0
CUDNN_CROSS_CORRELATION = 1
CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_FMA_MATH = 0, 1, 2, 3
_MAX_ALGOS = 16

_DATA_TYPES = {
    np.dtype(np.float32): (CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, ctypes.c_float),
    np.dtype(np.float64): (CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, ctypes.c_double),
    np.dtype(np.float16): (CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, ctypes.c_float),
}


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
_lib = None
_load_error = None
_handles = {}
_plans = {}
_settings = {"allow_tf32": False, "benchmark": False, "enabled": os.environ.get("CUVMAP_DISABLE_CUDNN", "") == ""}


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


def _library_candidates():
    """``libcudnn.so.9`` from the pip wheels (``nvidia-cudnn-cu12`` puts it in
    ``nvidia/cudnn/lib``; the CUDA 13 wheels may use ``nvidia/cu13/lib``), then the system."""
    found = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for sub in ("cudnn/lib", "cu13/lib", "cu12/lib"):
                path = os.path.join(root, sub, "libcudnn.so.9")
                if os.path.exists(path):
                    found.append(path)
    found.append("libcudnn.so.9")
    return found


_SIGNATURES = {
    "cudnnCreate": [ctypes.POINTER(ctypes.c_void_p)],
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


def _load():
    global _lib, _load_error
    if _lib is not None or _load_error is not None:
        return _lib
    with _lock:
        if _lib is not None or _load_error is not None:
            return _lib
        errors = []
        for path in _library_candidates():
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as err:
                errors.append(f"{path}: {err}")
                continue
            try:
                for name, argtypes in _SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int
                lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
                lib.cudnnGetErrorString.restype = ctypes.c_char_p
                lib.cudnnGetVersion.argtypes = []
                lib.cudnnGetVersion.restype = ctypes.c_size_t
            except AttributeError as err:
                errors.append(f"{path}: {err}")
                continue
            _lib = lib
            return _lib
        _load_error = "; ".join(errors)
        return None


def available():
    """True when cuDNN is enabled, CuPy sees a GPU and ``libcudnn.so.9`` loads."""
    if not _settings["enabled"] or not device.gpu_available():
        return False
    return _load() is not None


def version():
    lib = _load()
    return None if lib is None else int(lib.cudnnGetVersion())


def load_error():
    """Why ``libcudnn.so.9`` did not load (None when it did or was not tried)."""
    return _load_error


def _check(status, what):
    if status != CUDNN_STATUS_SUCCESS:
        msg = _lib.cudnnGetErrorString(status).decode() if _lib is not None else str(status)
        raise CudnnError(f"cuDNN {what} failed: {msg} (status {status})")


def _handle():
    import cupy

    dev = cupy.cuda.Device().id
    h = _handles.get(dev)
    if h is None:
        h = ctypes.c_void_p()
        _check(_lib.cudnnCreate(ctypes.byref(h)), "cudnnCreate")
        _handles[dev] = h
    _check(_lib.cudnnSetStream(h, ctypes.c_void_p(cupy.cuda.get_current_stream().ptr)), "cudnnSetStream")
    return h


def _ints(values):
    return (ctypes.c_int * len(values))(*[int(v) for v in values])


def _contiguous_strides(shape):
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


class _Plan:
    """Descriptors, algorithm and workspace size for one parameter combination."""

    def __init__(self, op, dtype, x_shape, w_shape, y_shape, stride, padding, dilation, groups):
        data_type, compute_type, self.scalar = _DATA_TYPES[dtype]
        self.op = op
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
        """Picks the algorithm: heuristics, or timing all of them with ``buffers``."""
        perfs = (AlgoPerf * _MAX_ALGOS)()
        count = ctypes.c_int()
        a, b, conv, c = self._descs()
        name = {"fwd": "Forward", "bwd_data": "BackwardData", "bwd_filter": "BackwardFilter"}[self.op]
        if _settings["benchmark"]:
            import cupy

            ws_size = 256 * 1024 * 1024
            ws = cupy.empty((ws_size,), dtype=cupy.uint8)
            pa, pb, pc = buffers
            _check(getattr(_lib, f"cudnnFindConvolution{name}AlgorithmEx")(
                handle, a, ctypes.c_void_p(pa), b, ctypes.c_void_p(pb), conv, c, ctypes.c_void_p(pc),
                _MAX_ALGOS, ctypes.byref(count), perfs, ctypes.c_void_p(ws.data.ptr), ws_size),
                f"cudnnFindConvolution{name}AlgorithmEx")
        else:
            _check(getattr(_lib, f"cudnnGetConvolution{name}Algorithm_v7")(
                handle, a, b, conv, c, _MAX_ALGOS, ctypes.byref(count), perfs),
                f"cudnnGetConvolution{name}Algorithm_v7")
        strict = self.math in (CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH)
        for i in range(count.value):
            p = perfs[i]
            if p.status != CUDNN_STATUS_SUCCESS:
                continue
            if strict and p.mathType in (CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION):
                continue
            self.algo = p.algo
            _check(_lib.cudnnSetConvolutionMathType(conv, p.mathType if not strict else self.math),
                   "cudnnSetConvolutionMathType")
            size = ctypes.c_size_t()
            _check(getattr(_lib, f"cudnnGetConvolution{name}WorkspaceSize")(handle, a, b, conv, c, p.algo, ctypes.byref(size)),
                   f"cudnnGetConvolution{name}WorkspaceSize")
            self.workspace = int(size.value)
            return
        raise CudnnError(f"cuDNN found no usable {name} algorithm for this convolution")

    def __del__(self):
        if _lib is None:
            return
        try:
            _lib.cudnnDestroyTensorDescriptor(self.x)
            _lib.cudnnDestroyTensorDescriptor(self.y)
            _lib.cudnnDestroyFilterDescriptor(self.w)
            _lib.cudnnDestroyConvolutionDescriptor(self.conv)
        except Exception:
            pass


def _as_2d(x_shape, w_shape, y_shape, stride, padding, dilation):
    """1-d convolutions as 2-d ones with a unit height (cuDNN wants 4-d tensors or more)."""
    if len(stride) != 1:
        return x_shape, w_shape, y_shape, stride, padding, dilation
    ins = lambda s: tuple(s[:2]) + (1,) + tuple(s[2:])  # noqa: E731
    return ins(x_shape), ins(w_shape), ins(y_shape), (1,) + tuple(stride), (0,) + tuple(padding), (1,) + tuple(dilation)


def _run(op, x_shape, w_shape, y_shape, dtype, stride, padding, dilation, groups, a, b, out):
    """Runs ``op`` writing ``out``; ``a``, ``b`` are the inputs in cuDNN's argument order."""
    import cupy

    x_shape, w_shape, y_shape, stride, padding, dilation = _as_2d(x_shape, w_shape, y_shape, stride, padding, dilation)
    handle = _handle()
    key = (op, cupy.cuda.Device().id, dtype.str, tuple(x_shape), tuple(w_shape), tuple(y_shape), tuple(stride),
           tuple(padding), tuple(dilation), int(groups), _settings["allow_tf32"], _settings["benchmark"])
    plan = _plans.get(key)
    if plan is None:
        plan = _Plan(op, dtype, x_shape, w_shape, y_shape, stride, padding, dilation, groups)
        plan.choose(handle, (a.data.ptr, b.data.ptr, out.data.ptr))
        _plans[key] = plan
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
    import cupy

    x = cupy.ascontiguousarray(x)
    w = cupy.ascontiguousarray(w)
    y_shape = (x.shape[0], w.shape[0]) + conv_output_spatial(x.shape[2:], w.shape[2:], stride, padding, dilation)
    y = cupy.empty(y_shape, dtype=x.dtype)
    return _run("fwd", x.shape, w.shape, y_shape, x.dtype, stride, padding, dilation, groups, x, w, y)


def backward_input(g, w, input_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂x`` for ``x`` of ``input_shape``."""
    import cupy

    g = cupy.ascontiguousarray(g)
    w = cupy.ascontiguousarray(w)
    dx = cupy.empty(tuple(input_shape), dtype=g.dtype)
    return _run("bwd_data", tuple(input_shape), w.shape, g.shape, g.dtype, stride, padding, dilation, groups, w, g, dx)


def backward_weight(g, x, weight_shape, stride, padding, dilation, groups):
    """``∂⟨conv(x, w), g⟩/∂w`` for ``w`` of ``weight_shape``."""
    import cupy

    g = cupy.ascontiguousarray(g)
    x = cupy.ascontiguousarray(x)
    dw = cupy.empty(tuple(weight_shape), dtype=g.dtype)
    return _run("bwd_filter", x.shape, tuple(weight_shape), g.shape, g.dtype, stride, padding, dilation, groups, x, g, dw)
