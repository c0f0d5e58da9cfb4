"""Matrix products on a cuBLAS handle of cuvmap's own (ctypes on ``libcublas``), so that
a CUDA graph can capture them (NOTE [cuBLAS in a capture]).

``matmul(a, b)`` is ``a @ b`` for CuPy arrays of 2 or 3 dims (a 2-d operand is broadcast
over the other's batch):

    out[p, i, j] = Σ_k a[p, i, k] · b[p, k, j]

Outside a graph's preparation or capture it is CuPy's ``matmul``; inside, one
``cublasGemmStridedBatchedEx`` on this thread's handle, bound to the capturing stream,
with the workspace set explicitly. The library is the one the ``nvidia-cublas`` wheels
ship (:mod:`cuvmap.cuda.libs`, as for cuDNN) or the system's. This module never imports the
transforms or the primitives.
"""
import ctypes
import os
import threading

import numpy as np

from cuvmap import backend
from cuvmap.cuda import graphs, libs

# NOTE [cuBLAS in a capture]
# CuPy refuses every cuBLAS call during a stream capture: each of its cuBLAS wrappers sets
# the current stream on its handle first, and cublas.setStream raises NotImplementedError
# ("calling cuBLAS API during stream capture is currently unsupported") when that stream
# is capturing (cupy_backends/cuda/libs/cublas.pyx). cuBLAS itself supports capture ("cuBLAS
# routines can be captured in CUDA Graph stream capture without restrictions in most
# situations", its docs: the exceptions are results written to host memory and
# allocations), so while a GraphRunner prepares or captures a graph (graphs.graph_resources()
# is a dict) or the current stream is capturing, float GEMMs run on a handle of cuvmap's own:
#
# - one handle per (thread, device), created outside any capture (the run before the
#   capture creates it: cublasCreate allocates);
# - before each call the current stream is set on the handle (cublasSetStream), and then
#   the workspace (setting the stream resets it to cuBLAS's own pool, whose allocations a
#   capture must not make): WORKSPACE_BYTES (32 MiB on Hopper and later, 4 MiB before:
#   cuBLAS's recommended sizes) from the graph's private pool, allocated in the run before
#   the capture and kept in the graph's resources, so it lives as long as the graph and no
#   other work shares it; a capture not made by a GraphRunner (the user's own) keeps one per
#   stream for the life of the process, made by prepare() before the capture begins;
# - the scalars alpha = 1 and beta = 0 are host values (CUBLAS_POINTER_MODE_HOST, the
#   default): a capture records them by value;
# - the compute type is CuPy's default (CUBLAS_COMPUTE_32F for float16/32 and complex64,
#   CUBLAS_COMPUTE_64F for float64 and complex128; no TF32), with CUBLAS_GEMM_DEFAULT.
#
# Row-major products are column-major products of the transposes (C^T = B^T A^T): the
# column-major m x n result C^T has m = N, n = M, and the first operand is b. An operand
# whose last two dims have a unit stride in one of them is passed as it is (op N or T,
# its leading dimension the other stride); any other is copied contiguous first.

WORKSPACE_BYTES = {True: 32 * 2**20, False: 4 * 2**20}    # Hopper (cc >= 9.0) and later / before

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_GEMM_DEFAULT = -1
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_C_32F, CUDA_C_64F = 0, 1, 2, 4, 5
_INT_MAX = 2**31 - 1

# dtype char -> (cudaDataType, compute type, the host scalars' NumPy type)
_TYPES = {
    "e": (CUDA_R_16F, CUBLAS_COMPUTE_32F, np.float32),
    "f": (CUDA_R_32F, CUBLAS_COMPUTE_32F, np.float32),
    "d": (CUDA_R_64F, CUBLAS_COMPUTE_64F, np.float64),
    "F": (CUDA_C_32F, CUBLAS_COMPUTE_32F, np.complex64),
    "D": (CUDA_C_64F, CUBLAS_COMPUTE_64F, np.complex128),
}
# alpha = 1, beta = 0 per scalar type, alive for the life of the process
_SCALARS = {t: (np.ones(1, t), np.zeros(1, t)) for t in (np.float32, np.float64, np.complex64, np.complex128)}

_p = ctypes.c_void_p
_i = ctypes.c_int
_ll = ctypes.c_longlong
_SIGNATURES = {
    "cublasCreate_v2": [ctypes.POINTER(ctypes.c_void_p)],
    "cublasDestroy_v2": [_p],
    "cublasSetStream_v2": [_p, _p],
    "cublasSetWorkspace_v2": [_p, _p, ctypes.c_size_t],
    # (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB,
    #  beta, C, Ctype, ldc, strideC, batchCount, computeType, algo)
    "cublasGemmStridedBatchedEx": [_p, _i, _i, _i, _i, _i, _p, _p, _i, _i, _ll, _p, _i, _i, _ll, _p, _p, _i, _i,
                                   _ll, _i, _i, _i],
}


class CublasError(RuntimeError):
    pass


_lib = None                     # the loaded library (_load sets it; use_library replaces it)
_local = threading.local()      # .handles: {device id: handle (int)} of this thread
_workspaces = {}                # (device, stream ptr) -> workspace, for captures made outside a GraphRunner


def _library_candidates():
    found = []
    for major in libs.cuda_majors():
        for path in libs.candidate_paths("cublas", f"libcublas.so.{major}", major):
            if path not in found and os.path.isfile(path):
                found.append(path)
        found.append(f"libcublas.so.{major}")
    return found


def _bind(lib):
    lib.cublasGetStatusString.argtypes = [ctypes.c_int]
    lib.cublasGetStatusString.restype = ctypes.c_char_p


# cuBLASLt from the wheels first (NOTE [preloading the CUDA wheels] in cuvmap/cuda/libs.py)
_library = libs.WheelLibrary("libcublas", _library_candidates, _SIGNATURES, bind=_bind, preload=libs.CUBLAS)


def _load():
    global _lib
    _lib = _library.load()
    return _lib


def use_library(lib):
    """Replaces libcublas by ``lib``, an object with the same C functions (the strict CuPy
    stand-in's emulation, tests/strict_cupy/cupy/_libcublas.py); None loads the real one
    again. Forgets the handles and workspaces made so far."""
    global _lib
    _library.use(lib)
    _lib = lib
    _local.__dict__.clear()
    _workspaces.clear()


def available():
    """Whether CuPy sees a GPU and libcublas loads (:func:`load_error` says why not)."""
    return backend.gpu_available() and _load() is not None


def load_error():
    """Why :func:`available` is False, or None."""
    if available():
        return None
    if not backend.gpu_available():
        return "no CUDA device visible to CuPy (CuPy not installed, no driver or no device)"
    return _library.error


def _check(status, what):
    if status != 0:
        try:
            text = _lib.cublasGetStatusString(status)
            text = text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # noqa: BLE001 - only a description
            text = "?"
        raise CublasError(f"cuBLAS {what} failed: {text} (status {status})")


def _handle(cp):
    """This thread's handle on the current device (NOTE [cuBLAS in a capture])."""
    dev = cp.cuda.runtime.getDevice()
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    h = handles.get(dev)
    if h is None:
        ptr = ctypes.c_void_p()
        _check(_lib.cublasCreate_v2(ctypes.byref(ptr)), f"cublasCreate on GPU {dev}")
        h = handles[dev] = ptr.value
    return h, dev


def _workspace(cp, dev, stream):
    """The workspace for ``stream``: the graph's own while a GraphRunner prepares or
    captures it, else one per stream (NOTE [cuBLAS in a capture])."""
    resources = graphs.graph_resources()
    key = ("cublas workspace", dev)
    table = resources if resources is not None else _workspaces
    if resources is None:
        key = (dev, stream.ptr)
    ws = table.get(key)
    if ws is None:
        major = int(str(cp.cuda.Device(dev).compute_capability)[:-1] or 0)
        ws = table[key] = cp.empty(WORKSPACE_BYTES[major >= 9], np.uint8)
    return ws


def prepare():
    """Creates this thread's handle on the current device and the workspace of the current
    stream, outside any capture: what a capture made outside a GraphRunner (the user's own
    ``stream.begin_capture()``) needs before its first GEMM (NOTE [cuBLAS in a capture])."""
    if not available():
        raise CublasError(f"cuvmap's cuBLAS binding is unavailable: {load_error()}")
    cp = backend.cupy_module()
    _, dev = _handle(cp)
    _workspace(cp, dev, cp.cuda.get_current_stream())


def in_graph_work(cp):
    """Whether this thread prepares or captures a graph, or its current stream is being
    captured: the GEMMs then run on cuvmap's own handle (NOTE [cuBLAS in a capture])."""
    if graphs.graph_resources() is not None:
        return True
    try:
        return bool(cp.cuda.get_current_stream().is_capturing())
    except Exception:  # noqa: BLE001 - a stream that cannot say is not capturing
        return False


def _layout(rows, cols, row_stride, col_stride):
    """``(op, ld)`` of a rows x cols operand whose element (r, c) lies at ``r * row_stride +
    c * col_stride`` (elements) as cuBLAS's column-major op(A), or None: op N stores it
    column-major (unit row stride), op T row-major (unit column stride)."""
    if (rows == 1 or row_stride == 1) and (cols == 1 or col_stride >= max(rows, 1)):
        return CUBLAS_OP_N, (col_stride if cols > 1 else max(rows, 1))
    if (cols == 1 or col_stride == 1) and (rows == 1 or row_stride >= max(cols, 1)):
        return CUBLAS_OP_T, (row_stride if rows > 1 else max(cols, 1))
    return None


def _operand(cp, x, batch):
    """``(x, op, ld, batch stride)`` for a 2-d or 3-d operand (elements), copying it
    contiguous when its strides do not fit cuBLAS."""
    for attempt in (0, 1):
        item = x.itemsize
        strides = [s // item for s in x.strides]
        if all(s >= 0 and s * item == bs for s, bs in zip(strides, x.strides)):
            rows, cols = x.shape[-2:]
            lay = _layout(rows, cols, strides[-2], strides[-1])
            if lay is not None:
                stride = 0 if x.ndim == 2 or batch == 1 else strides[0]
                if x.ndim == 3 and batch > 1 and stride < 0:
                    lay = None
                if lay is not None and lay[1] <= _INT_MAX:
                    return x, lay[0], lay[1], stride
        x = cp.ascontiguousarray(x)
    raise CublasError(f"cannot lay out an operand of shape {x.shape} and strides {x.strides} for cuBLAS")


def matmul(a, b):
    """``a @ b`` for CuPy arrays (NOTE [cuBLAS in a capture]): on cuvmap's own cuBLAS
    handle while a graph is prepared or captured and the product is of floats; CuPy's
    ``matmul`` otherwise."""
    cp = backend.cupy_module()
    dtype = np.result_type(a.dtype, b.dtype)
    if (dtype.char not in _TYPES or not 2 <= a.ndim <= 3 or not 2 <= b.ndim <= 3 or not in_graph_work(cp)
            or not available()):
        return cp.matmul(a, b)
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    batches = {x.shape[0] for x in (a, b) if x.ndim == 3}
    if k != k2 or len(batches) > 1:
        return cp.matmul(a, b)  # CuPy's own error
    batch = batches.pop() if batches else None
    count = 1 if batch is None else batch
    shape = (m, n) if batch is None else (batch, m, n)
    if max(m, n, k, count) > _INT_MAX:
        return cp.matmul(a, b)
    if a.dtype != dtype:
        a = a.astype(dtype)
    if b.dtype != dtype:
        b = b.astype(dtype)
    if 0 in (m, n, count):
        return cp.empty(shape, dtype)
    if k == 0:
        return cp.zeros(shape, dtype)
    out = cp.empty(shape, dtype)
    # C^T (n x m column-major, ldc = n) = op(b)^T-as-stored (n x k) . op(a) (k x m)
    bx, op_b, ld_b, stride_b = _operand(cp, b, count)
    ax, op_a, ld_a, stride_a = _operand(cp, a, count)
    # b as cuBLAS's first operand: its row-major k x n is the column-major n x k op(A):
    # element (j, p) of op(A) is b[p, j], i.e. b's layout with rows and cols swapped
    op_first = CUBLAS_OP_T if op_b == CUBLAS_OP_N else CUBLAS_OP_N
    op_second = CUBLAS_OP_T if op_a == CUBLAS_OP_N else CUBLAS_OP_N
    cuda_type, compute, scalar = _TYPES[dtype.char]
    one, zero = _SCALARS[np.dtype(scalar).type]
    handle, dev = _handle(cp)
    stream = cp.cuda.get_current_stream()
    ws = _workspace(cp, dev, stream)
    _check(_lib.cublasSetStream_v2(handle, stream.ptr), "cublasSetStream")
    _check(_lib.cublasSetWorkspace_v2(handle, ws.data.ptr, ws.nbytes), "cublasSetWorkspace")
    _check(_lib.cublasGemmStridedBatchedEx(
        handle, op_first, op_second, n, m, k, one.ctypes.data,
        bx.data.ptr, cuda_type, ld_b, stride_b,
        ax.data.ptr, cuda_type, ld_a, stride_a,
        zero.ctypes.data, out.data.ptr, cuda_type, n, m * n if count > 1 else 0,
        count, compute, CUBLAS_GEMM_DEFAULT), f"cublasGemmStridedBatchedEx ({dtype} {shape} from {a.shape} @ {b.shape})")
    return out
