"""``libcublas`` emulated for the strict CuPy stand-in: the C functions cuvmap's own
cuBLAS binding calls (``cuvmap/cuda/cublas.py``: handles, streams, workspaces, and
``cublasGemmStridedBatchedEx``), taking what ctypes would pass them: addresses and integers.

It computes on the bytes at the addresses (NOTE [the stand-in's addresses] in
cupy/_strict.py), column-major as cuBLAS does, after cuBLAS's own argument checks (a leading
dimension too small, an unsupported type or compute type: its status codes), so a wrong
operation, leading dimension, stride or address in the binding gives a wrong result or an
error here; an access outside every device buffer is an illegal address. A call while a
stream of this thread is captured is recorded into the graph when the handle is bound to
the capturing stream; on another stream it is refused (the graph would lack it). CuPy's
own cuBLAS calls stay refused in a capture (cupy/_strict.py: ``library_call``)."""
import ctypes
import itertools

import numpy as np

from cupy._strict import CUDARuntimeError, capture, memory_at, refuse, used

SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 7, 15
_STATUS = {SUCCESS: b"the operation completed successfully", NOT_INITIALIZED: b"the library was not initialized",
           INVALID_VALUE: b"an unsupported value or parameter was passed to the function",
           NOT_SUPPORTED: b"the functionality requested is not supported"}
OP_N, OP_T, OP_C = 0, 1, 2
COMPUTE_32F, COMPUTE_64F = 68, 70
DATA_TYPES = {0: np.float32, 1: np.float64, 2: np.float16, 4: np.complex64, 5: np.complex128}
# (data type, compute type) pairs of cublasGemmEx's table that cuvmap uses, and the scalar type
COMPUTE = {(2, COMPUTE_32F): np.float32, (0, COMPUTE_32F): np.float32, (4, COMPUTE_32F): np.complex64,
           (1, COMPUTE_64F): np.float64, (5, COMPUTE_64F): np.complex128}

_handles = {}
_ids = itertools.count(0x1000)


class _Handle:
    def __init__(self):
        self.stream = 0
        self.workspace = None  # (address, bytes), or None: cuBLAS's own pool


class _Node:
    """A GEMM recorded in a graph: replayed on the same addresses."""

    allocated = ()

    def __init__(self, name, run):
        self.name, self.run = name, run

    def replay(self):
        self.run()

    def __repr__(self):
        return f"<node {self.name}>"


def _value(x):
    return x.value if hasattr(x, "value") else int(x)


def cublasCreate_v2(handle_out):
    used("libcublas.cublasCreate_v2")
    if capture() is not None:  # cublasCreate allocates
        refuse("allocation", "cublasCreate", CUDARuntimeError(
            "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing (cublasCreate)"))
    h = next(_ids)
    _handles[h] = _Handle()
    handle_out._obj.value = h
    return SUCCESS


def cublasDestroy_v2(handle):
    return SUCCESS if _handles.pop(_value(handle), None) is not None else NOT_INITIALIZED


def cublasSetStream_v2(handle, stream):
    h = _handles.get(_value(handle))
    if h is None:
        return NOT_INITIALIZED
    h.stream = _value(stream) or 0
    h.workspace = None  # cublasSetStream resets the workspace to cuBLAS's own pool
    return SUCCESS


def cublasSetWorkspace_v2(handle, workspace, nbytes):
    h = _handles.get(_value(handle))
    if h is None:
        return NOT_INITIALIZED
    ptr, nbytes = _value(workspace), int(nbytes)
    if nbytes:
        memory_at(ptr, nbytes)  # device memory, or an illegal address
    h.workspace = (ptr, nbytes)
    return SUCCESS


def cublasGetStatusString(status):
    return _STATUS.get(int(status), b"unknown status")


def _matrices(ptr, dtype, rows, cols, ld, stride, count):
    """The ``count`` column-major ``rows x cols`` matrices at ``ptr`` (leading dimension
    ``ld``, ``stride`` elements apart) as a NumPy view ``(count, rows, cols)``."""
    item = np.dtype(dtype).itemsize
    extent = ((count - 1) * stride + (cols - 1) * ld + rows) * item if rows and cols and count else 0
    root, offset = memory_at(ptr, extent)
    if offset % item:
        raise CUDARuntimeError("cudaErrorMisalignedAddress", f"misaligned address {ptr:#x} for {np.dtype(dtype)}")
    return np.ndarray((count, rows, cols), dtype=dtype, buffer=root, offset=offset,
                      strides=(stride * item, item, ld * item))


def cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                               strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
    """``C[p] = alpha op(A[p]) op(B[p]) + beta C[p]``, column-major, for p < batchCount."""
    used("libcublas.cublasGemmStridedBatchedEx")
    h = _handles.get(_value(handle))
    if h is None:
        return NOT_INITIALIZED
    transa, transb, m, n, k = int(transa), int(transb), int(m), int(n), int(k)
    lda, ldb, ldc, count = int(lda), int(ldb), int(ldc), int(batchCount)
    strideA, strideB, strideC = int(strideA), int(strideB), int(strideC)
    types = {int(Atype), int(Btype), int(Ctype)}
    if len(types) != 1 or (int(Ctype), int(computeType)) not in COMPUTE:
        return NOT_SUPPORTED
    if transa not in (OP_N, OP_T, OP_C) or transb not in (OP_N, OP_T, OP_C) or min(m, n, k, count) < 0:
        return INVALID_VALUE
    a_rows, a_cols = (m, k) if transa == OP_N else (k, m)
    b_rows, b_cols = (k, n) if transb == OP_N else (n, k)
    if lda < max(1, a_rows) or ldb < max(1, b_rows) or ldc < max(1, m):
        return INVALID_VALUE
    dtype = DATA_TYPES[int(Ctype)]
    scalar = COMPUTE[(int(Ctype), int(computeType))]
    alpha_v = np.ndarray((), scalar, buffer=(ctypes.c_char * np.dtype(scalar).itemsize).from_address(_value(alpha)))
    beta_v = np.ndarray((), scalar, buffer=(ctypes.c_char * np.dtype(scalar).itemsize).from_address(_value(beta)))
    alpha_v, beta_v = alpha_v.copy(), beta_v.copy()  # host pointer mode: the values at the call
    a_ptr, b_ptr, c_ptr = _value(A), _value(B), _value(C)

    def run():
        c = _matrices(c_ptr, dtype, m, n, ldc, strideC, count)
        if not (m and n and count):
            return
        a = _matrices(a_ptr, dtype, a_rows, a_cols, lda, strideA, count) if k else None
        b = _matrices(b_ptr, dtype, b_rows, b_cols, ldb, strideB, count) if k else None
        acc = np.zeros((count, m, n), scalar)
        if k:
            opa = a if transa == OP_N else (a.transpose(0, 2, 1) if transa == OP_T else a.transpose(0, 2, 1).conj())
            opb = b if transb == OP_N else (b.transpose(0, 2, 1) if transb == OP_T else b.transpose(0, 2, 1).conj())
            acc = alpha_v * np.matmul(opa.astype(scalar), opb.astype(scalar))
        if beta_v != 0:  # beta = 0: C is not read (it may hold NaN)
            acc = acc + beta_v * c.astype(scalar)
        c[...] = acc.astype(dtype)

    cap = capture()
    if cap is not None:
        if cap.stream.ptr != h.stream:
            refuse("cuBLAS on a stream that is not captured", "cublasGemmStridedBatchedEx", CUDARuntimeError(
                "cudaErrorStreamCaptureIsolation", "the handle's stream is not the capturing stream: the graph "
                "would not contain this GEMM"))
        cap.nodes.append(_Node("cublasGemmStridedBatchedEx", run))
    run()
    return SUCCESS


class Library:
    """The emulated library, as ``ctypes.CDLL`` would give it (cuvmap.cuda.cublas.use_library)."""

    cublasCreate_v2 = staticmethod(cublasCreate_v2)
    cublasDestroy_v2 = staticmethod(cublasDestroy_v2)
    cublasSetStream_v2 = staticmethod(cublasSetStream_v2)
    cublasSetWorkspace_v2 = staticmethod(cublasSetWorkspace_v2)
    cublasGetStatusString = staticmethod(cublasGetStatusString)
    cublasGemmStridedBatchedEx = staticmethod(cublasGemmStridedBatchedEx)


LIBRARY = Library()
