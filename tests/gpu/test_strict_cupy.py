"""The strict CuPy stand-in (tests/strict_cupy) refuses what CuPy 14 refuses, evaluates
``ElementwiseKernel`` bodies as C, records captures and replays them, and counts
device->host reads; and, through it, the device discipline of cuvmap's jitted programs:
what a step reads back and whether it is captured as a graph.

The references are CuPy's documented behaviour (its messages, quoted) and closed forms of
C's arithmetic. Every test here needs the stand-in (the module skips on a real GPU, where
tools/gpu_checks.sh runs the gpu tests on CuPy itself).
"""
import ctypes
import importlib.util
import os
import re
import warnings

import numpy as np
import pytest

import conftest

if not conftest.STRICT_CUPY:
    pytest.skip("the strict CuPy stand-in is not installed (a real GPU, or CUVMAP_STRICT_CUPY=0)",
                allow_module_level=True)

import cupy  # noqa: E402  (the stand-in: conftest put it first on sys.path)
import cupyx  # noqa: E402
import strict_cupy  # noqa: E402

import cuvmap as cv  # noqa: E402
from cuvmap import dp, nn  # noqa: E402
from cuvmap.cuda import cublas, cudnn, graphs as cuda_graphs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file


def _dev(a):
    return cupy.asarray(np.asarray(a))


# ---------------------------------------------------------------------------------------
# What it is, and what is unavailable under it
# ---------------------------------------------------------------------------------------


def test_it_is_the_cupy_cuvmap_sees_and_it_has_no_cudnn_or_nccl():
    assert strict_cupy.active() and cupy.__file__.startswith(strict_cupy.HERE)
    assert cv.gpu_available() and cv.backend.xp_for("gpu") is cupy
    assert not cudnn.available()
    with pytest.raises(ImportError):
        importlib.import_module("cupy.cuda.nccl")
    with pytest.raises(AttributeError, match="stand-in"):
        cupy.testing  # noqa: B018 - not a surface cuvmap calls (cupy.fft is, since lax.fft)
    # cuFFT's n-d complex-to-real plan is refused: lax.fft decomposes it (tests/strict_cupy/cupy/fft.py)
    with pytest.raises(NotImplementedError, match="Hermitian symmetry along every axis"):
        cupy.fft.irfftn(cupy.zeros((2, 3), cupy.complex128), axes=(0, 1))


# ---------------------------------------------------------------------------------------
# What it refuses (CuPy's messages)
# ---------------------------------------------------------------------------------------

IMPLICIT = "Implicit conversion to a NumPy array is not allowed"
UNSUPPORTED = "Unsupported type <class 'numpy.ndarray'>"
A = np.arange(6.0).reshape(2, 3)

REFUSED = [  # (what, function of a device array, exception, message)
    ("numpy.asarray", lambda a: np.asarray(a), TypeError, IMPLICIT),
    ("numpy.array", lambda a: np.array(a), TypeError, IMPLICIT),
    ("a NumPy function CuPy lacks", lambda a: np.nanargmax(a), TypeError, "no implementation found"),
    ("np.testing on a device array", lambda a: np.testing.assert_allclose(a, A), TypeError, IMPLICIT),
    ("device + host", lambda a: a + A, TypeError, UNSUPPORTED),
    ("host + device", lambda a: A + a, TypeError, UNSUPPORTED),
    ("device + host 0-d", lambda a: a + np.asarray(1.0), TypeError, UNSUPPORTED),
    ("numpy ufunc, host operand", lambda a: np.multiply(a, A), TypeError, UNSUPPORTED),
    ("cupy ufunc, host operand", lambda a: cupy.maximum(a, A), TypeError, UNSUPPORTED),
    ("concatenate with a host array", lambda a: cupy.concatenate([a, A]), TypeError, UNSUPPORTED),
    ("where with a host operand", lambda a: cupy.where(a > 1, a, A), TypeError, UNSUPPORTED),
    ("a list mixing device arrays and numbers", lambda a: cupy.asarray([a[0, 0], 1.0]), TypeError, IMPLICIT),
    ("fill from a host array", lambda a: a.__setitem__(slice(None), A), ValueError, "non-scalar numpy.ndarray"),
    ("copyto from a host array", lambda a: cupy.copyto(a, A), ValueError, "non-scalar numpy.ndarray"),
    ("ascontiguousarray of a host array", lambda a: cupy.ascontiguousarray(A), TypeError, "incorrect type"),
    ("an object dtype", lambda a: cupy.asarray(np.array([None])), ValueError, "Unsupported dtype"),
    ("the array interface", lambda a: a.__array_interface__, AttributeError, "__array_interface__"),
    ("the buffer protocol", lambda a: memoryview(a), TypeError, "bytes-like object"),
    ("an index", lambda a: [1, 2, 3][a[0, 1].astype(int)], TypeError, "indices"),
]


@pytest.mark.parametrize("what, fn, exc, message", REFUSED, ids=[r[0] for r in REFUSED])
def test_refuses_what_cupy_refuses(what, fn, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        fn(_dev(A))


ALLOWED = [  # (what, function of a device array, its value on the host) -- CuPy allows these
    ("NumPy scalars", lambda a: a * np.float32(2), A * 2),
    ("Python scalars", lambda a: 2.0 - a, 2.0 - A),
    ("a comparison with a host 0-d array (CuPy's workaround)", lambda a: a > np.asarray(2.0), A > 2),
    ("NumPy functions CuPy has", lambda a: np.sum(np.exp(a), axis=0), np.exp(A).sum(0)),
    ("host index arrays", lambda a: a[np.array([1, 0])], A[[1, 0]]),
    ("take with host indices", lambda a: cupy.take(a, np.array([2, 0]), axis=1), A[:, [2, 0]]),
    ("a list of device arrays", lambda a: cupy.asarray([a[0], a[1]]), A),
    ("assigning a host array through an index array", lambda a: _assign(a, [1], A[:1]), A[[0, 0]]),
    # CuPy wraps integer index arrays around the axis where NumPy raises (NOTE [CuPy wraps
    # integer-array indices] in tests/strict_cupy/cupy/_functions.py)
    ("an index array wraps", lambda a: a[:, _dev(np.array([3, -4, 7]))], A[:, [0, 2, 1]]),
    ("take wraps", lambda a: cupy.take(a, _dev(np.array([5, -1])), axis=1), A[:, [2, 2]]),
    ("scatter_add wraps", lambda a: _scatter(a, [4, -3]), A + np.array([[1.0, 1, 0], [0, 0, 0]])),
]


def _scatter(a, idx):
    cupyx.scatter_add(a, (_dev(np.zeros(2, np.int64)), _dev(np.array(idx))), 1.0)
    return a


def _assign(a, idx, value):
    a[cupy.asarray(np.array(idx))] = value
    return a


@pytest.mark.parametrize("what, fn, want", ALLOWED, ids=[r[0] for r in ALLOWED])
def test_allows_what_cupy_allows(what, fn, want):
    got = fn(_dev(A))
    assert type(got) is cupy.ndarray
    np.testing.assert_array_equal(got.get(), want)


def test_results_are_device_arrays_never_numpy_scalars():
    a = _dev(A)
    for got in (a.sum(), a[0, 1], np.max(a), cupy.linalg.norm(a), a.mean(axis=None)):
        assert type(got) is cupy.ndarray and got.shape == ()
    view = a[1, 2]
    a[1, 2] = 7.0
    assert float(view) == 7.0  # a 0-d view, as CuPy's


class _Deferring:
    """An operand with a higher ``__array_priority__`` (and no ``__array_ufunc__``)."""
    __array_priority__ = 1000

    def __radd__(self, other):
        return "deferred"


class _OptedOut:
    __array_ufunc__ = None

    def __rmul__(self, other):
        return "opted out"


def test_binary_operators_defer_as_cupy_does():
    a = _dev(A)
    assert a + _Deferring() == "deferred"
    assert a * _OptedOut() == "opted out"


def test_sorts_are_stable():
    keys = _dev([1.0, 0.0, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(cupy.argsort(keys).get(), [1, 3, 0, 2, 4])


# ---------------------------------------------------------------------------------------
# ElementwiseKernel: the body evaluated as C, with the declared dtypes
# ---------------------------------------------------------------------------------------

C_CASES = [  # (in params, body, inputs, out dtype, expected by C's rules)
    ("int32 a, int32 b", "out0 = a / b;", ([-7, 7, -8], [2, -2, 3]), np.int32, [-3, -3, -2]),  # truncation
    ("int32 a, int32 b", "out0 = a % b;", ([-7, 7], [2, -2]), np.int32, [-1, 1]),
    ("uint8 a, uint8 b", "out0 = a + b;", ([200], [100]), np.int32, [300]),  # promoted to int
    ("uint8 a, uint8 b", "unsigned char v = a + b; out0 = v;", ([200], [100]), np.int32, [44]),
    ("float32 a", "out0 = a * 0.1;", ([3.0],), np.float64, [np.float64(np.float32(3.0)) * 0.1]),  # a double literal
    ("float32 a", "out0 = a * 0.1f;", ([3.0],), np.float64, [np.float64(np.float32(3.0) * np.float32(0.1))]),
    ("float32 a, float32 b", "float v = a * b + a; out0 = v;", ([1.1], [2.3]), np.float32,
     [np.float32(1.1) * np.float32(2.3) + np.float32(1.1)]),
    ("int32 a", "out0 = (a > 1 || a < -1) ? a : -a;", ([0, 2, -3, 1],), np.int32, [0, 2, -3, -1]),
    ("float64 a", "out0 = ((double)(long long)a);", ([-2.7, 2.7],), np.float64, [-2.0, 2.0]),
    ("int32 a", "out0 = __int_as_float(0x7f800000) * a;", ([1, -1],), np.float32, [np.inf, -np.inf]),
    ("float64 a", "out0 = pow(a, ((double)3));", ([2.0],), np.float64, [8.0]),
    ("uint32 a", "out0 = a - 1;", ([0],), np.uint32, [4294967295]),  # unsigned arithmetic wraps
    ("int32 a", "bool v = a; out0 = !v;", ([0, 5],), np.bool_, [True, False]),
]


@pytest.mark.parametrize("in_params, body, inputs, out_dtype, want", C_CASES, ids=[c[1] for c in C_CASES])
def test_elementwise_kernel_bodies_follow_c(in_params, body, inputs, out_dtype, want):
    dtypes = [p.split()[0] for p in in_params.split(",")]
    args = [_dev(np.asarray(x, dtype=d)) for x, d in zip(inputs, dtypes)]
    kernel = cupy.ElementwiseKernel(in_params, f"{np.dtype(out_dtype).name} out0", body, "k")
    out = kernel(*args)
    assert out.dtype == out_dtype
    np.testing.assert_array_equal(out.get(), np.asarray(want, dtype=out_dtype))


def test_elementwise_kernel_enforces_the_declared_dtypes():
    kernel = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2;", "k")
    with pytest.raises(TypeError, match="Type is mismatched"):
        kernel(_dev(np.ones(3)))  # float64
    with pytest.raises(TypeError, match=re.escape(UNSUPPORTED)):
        kernel(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="Type is mismatched"):
        kernel(_dev(np.ones(3, np.float32)), cupy.empty(3, np.float64))
    np.testing.assert_array_equal(kernel(2.5).get(), 5.0)  # a Python scalar takes the declared type


def test_a_body_outside_c_does_not_compile():
    kernel = cupy.ElementwiseKernel("float32 x", "float32 y", "y = undefined_function(x);", "k")
    with pytest.raises(cupy.cuda.compiler.CompileException):
        kernel(_dev(np.ones(2, np.float32)))


# ---------------------------------------------------------------------------------------
# Device->host reads, stream capture and graphs
# ---------------------------------------------------------------------------------------


def test_pinned_host_memory_is_shared_by_the_device_and_the_host():
    """Pinned memory wrapped as a device array (unified addressing: one address for both):
    a kernel's writes are the host's reads, and no device->host read is counted."""
    ptr = cupy.cuda.runtime.hostAlloc(16, cupy.cuda.runtime.hostAllocPortable | cupy.cuda.runtime.hostAllocMapped)
    try:
        mem = cupy.cuda.UnownedMemory(ptr, 16, None, 0)
        dev = cupy.ndarray((4,), np.int32, cupy.cuda.MemoryPointer(mem, 0))
        host = np.ctypeslib.as_array((ctypes.c_int32 * 4).from_address(ptr))
        strict_cupy.reset()
        cupy.maximum(dev, _dev(np.array([0, 7, 0, -1], np.int32)), out=dev)
        np.testing.assert_array_equal(host, [0, 7, 0, 0])
        host[0] = 3
        assert int(dev.sum()) == 10 and sum(strict_cupy.host_reads().values()) == 1  # the int() only
    finally:
        cupy.cuda.runtime.freeHost(ptr)


def test_an_address_outside_every_buffer_is_an_illegal_access():
    a = _dev(np.zeros(4))
    ptr = a.data.ptr
    cupy.ndarray((4,), np.float64, cupy.cuda.MemoryPointer(ptr))  # the same buffer: fine
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        cupy.ndarray((5,), np.float64, cupy.cuda.MemoryPointer(ptr))


def test_host_reads_are_counted_per_call_site():
    a = _dev(A)
    with strict_cupy.recording() as log:
        for _ in range(3):
            float(a.sum())
        a.get()
    sites = sorted(log["host_reads"].items())
    assert [count for _, count in sites] == [3, 1]
    assert all(site.startswith("tests/gpu/test_strict_cupy.py:") for site, _ in sites)


CAPTURE_REFUSED = [  # (what, function of a float32 device array, exception, kind recorded)
    ("a device->host read", lambda a: a.get(), cupy.cuda.runtime.CUDARuntimeError, "host read"),
    ("a Python bool of a device value", lambda a: bool(a[0] > 0), cupy.cuda.runtime.CUDARuntimeError, "host read"),
    ("a boolean mask (a data-dependent shape)", lambda a: a[a > 0], cupy.cuda.runtime.CUDARuntimeError, "host read"),
    ("a host->device copy", lambda a: a + cupy.asarray(np.ones(4, np.float32)), cupy.cuda.runtime.CUDARuntimeError,
     "host->device copy"),
    ("a float matmul (cuBLAS)", lambda a: a[:, None] @ a[None], NotImplementedError, "cuBLAS"),
    ("an SVD (cuSOLVER)", lambda a: cupy.linalg.svd(a.reshape(2, 2)), NotImplementedError, "cuSOLVER"),
    ("a legacy random draw (cuRAND)", lambda a: cupy.random.standard_normal(4), NotImplementedError, "cuRAND"),
]


@pytest.mark.parametrize("what, fn, exc, kind", CAPTURE_REFUSED, ids=[r[0] for r in CAPTURE_REFUSED])
def test_a_capture_refuses_reads_copies_and_libraries(what, fn, exc, kind):
    a = _dev(np.arange(4, dtype=np.float32))
    stream = cupy.cuda.Stream(non_blocking=True)
    strict_cupy.reset()
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(exc):
                fn(a)
        finally:
            with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
                stream.end_capture()
    assert [r["kind"] for r in strict_cupy.refusals()] == [kind]


def test_a_capture_allows_kernels_integer_matmuls_and_generator_draws():
    a = _dev(np.arange(4, dtype=np.int64))
    rng = cupy.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    strict_cupy.reset()
    with stream:
        stream.begin_capture()
        a[:, None] @ a[None]
        rng.standard_normal(3)
        cupy.sort(a * 2)
        graph = stream.end_capture()
    assert graph.names() == ["getitem", "getitem", "matmul", "Generator.standard_normal", "multiply", "sort"]
    assert not strict_cupy.refusals()


def test_a_graph_replays_its_launches_on_the_captured_buffers():
    """Captured work does not run until the graph is launched (the outputs hold garbage),
    and each launch recomputes from the current contents of the captured inputs."""
    x = _dev(np.arange(4.0))
    stream = cupy.cuda.Stream(non_blocking=True)
    strict_cupy.reset()
    with stream:
        stream.begin_capture()
        y = cupy.sin(x) * 2.0 + x[::-1]
        graph = stream.end_capture()
    assert np.isnan(y.get()).all()
    for values in (np.arange(4.0), np.full(4, -1.5)):
        cupy.copyto(x, _dev(values))
        graph.launch(stream=stream)
        np.testing.assert_array_equal(y.get(), np.sin(values) * 2.0 + values[::-1])
    assert strict_cupy.graphs() == [graph] and graph.launches == 2


def test_scatter_add_and_setitem_are_replayed():
    x = _dev(np.zeros(3))
    idx = _dev(np.array([0, 2, 0]))
    v = _dev(np.ones(3))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        cupyx.scatter_add(x, idx, v)
        x[1] = 5.0
        graph = stream.end_capture()
    x[...] = 0.0
    graph.launch()
    graph.launch()
    np.testing.assert_array_equal(x.get(), [4.0, 5.0, 2.0])


def test_a_jitted_elementwise_program_is_captured_and_reads_nothing():
    f = cv.jit(lambda x, y: cv.numpy.sin(x) * y + 1.0)
    x, y = _dev(np.linspace(0, 1, 64)), _dev(np.full(64, 0.5))
    strict_cupy.reset()
    for k in range(3):
        got = f(x, y + k)
        np.testing.assert_allclose(got.get(), np.sin(np.linspace(0, 1, 64)) * (0.5 + k) + 1.0, rtol=1e-15)
    reads = strict_cupy.host_reads()
    assert set(reads) == {next(iter(reads))} and sum(reads.values()) == 3  # the test's own .get() only
    assert len(strict_cupy.graphs()) == 1 and not strict_cupy.refusals()


STATIC_LOOPS = [  # (what, a jitted function of a float64 vector, its reference by a Python loop)
    ("fori_loop with static bounds (an int64 counter carry)",
     lambda x: cv.lax.fori_loop(1, 4, lambda i, v: v * 0.5 + i, x), lambda x: ((x * 0.5 + 1) * 0.5 + 2) * 0.5 + 3),
    ("scan with stacked outputs", lambda x: cv.lax.scan(lambda c, y: (c + y, c * y), x[0], x[1:])[1],
     lambda x: np.array([sum(x[:i + 1]) * x[i + 1] for i in range(len(x) - 1)])),
    ("map", lambda x: cv.lax.map(lambda r: cv.numpy.sin(r) * r, x.reshape(2, -1)).reshape(-1),
     lambda x: np.sin(x) * x),
]


@pytest.mark.parametrize("what, f, ref", STATIC_LOOPS, ids=[c[0] for c in STATIC_LOOPS])
def test_a_loop_with_a_static_length_is_captured_and_replays_its_steps(what, f, ref):
    """A loop of a static length unrolls into the graph; every replay computes the current
    arguments' values (not those of the capture)."""
    jitted = cv.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(4):
            x = np.linspace(-1.0, 1.0, 6) + k
            strict_cupy.reset()
            got = jitted(_dev(x))
            assert len(strict_cupy.graphs()) == (k == 1) and not strict_cupy.refusals()
            np.testing.assert_allclose(got.get(), ref(x), rtol=1e-14)


def test_a_donated_argument_is_copied_into_the_graphs_input_buffer():
    """NOTE [graph replay]: a donated argument is copied like the others; a step that
    writes its result over the donated buffer replays correctly, call after call."""
    step = cv.jit(lambda w, g: (w - 0.5 * g, (w * w).sum()), donate_argnums=0)
    w, g = np.linspace(-1.0, 1.0, 8), np.linspace(0.0, 1.0, 8)
    dw = _dev(w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(4):
            strict_cupy.reset()
            dw, norm = step(dw, _dev(g))
            assert len(strict_cupy.graphs()) == (k == 1)
            np.testing.assert_allclose(float(norm), (w * w).sum(), rtol=1e-15)
            w = w - 0.5 * g
            np.testing.assert_allclose(dw.get(), w, rtol=1e-15)


def _reads_back_impl(x):
    return x * float(x.sum())


# primitives that claim to be capturable (the default) but read a value back, or call
# CuPy's matmul (its cuBLAS handle, which CuPy refuses to use in a capture)
_reads_back_p = cv.core.Primitive("strict_cupy_test_reads_back", impl=_reads_back_impl,
                                  shape_rule=lambda x: cv.core.ShapedArray(x.shape, x.dtype))
_cupy_matmul_p = cv.core.Primitive("strict_cupy_test_cupy_matmul", impl=lambda x: x @ x.T,
                                   shape_rule=lambda x: cv.core.ShapedArray(x.shape[:1] * 2, x.dtype))

CAPTURE_FAILURES = [  # (what, a jitted function of a float32 matrix, its reference, what the warning names)
    ("a host read where none was declared", lambda x: _reads_back_p.bind(x * 2.0), lambda x: x * 2.0 * (x * 2.0).sum(),
     "operation not permitted when stream is capturing"),
    ("cuBLAS on CuPy's handle", lambda x: _cupy_matmul_p.bind(x), lambda x: x @ x.T, "calling cuBLAS API"),
]


@pytest.mark.parametrize("what, f, ref, cause", CAPTURE_FAILURES, ids=[c[0] for c in CAPTURE_FAILURES])
def test_a_failed_capture_warns_with_its_cause_and_runs_op_by_op(what, f, ref, cause):
    jitted = cv.jit(f)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    jitted(_dev(x))
    with pytest.warns(cuda_graphs.GraphCaptureWarning, match=re.escape(cause)):
        got = jitted(_dev(x))
    np.testing.assert_allclose(jitted(_dev(x)).get(), ref(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.get(), ref(x), rtol=1e-5, atol=1e-6)


NOT_CAPTURABLE = [  # (what, a jitted function of a float32 matrix, its reference): a primitive not ``capturable``
    ("an SVD (cuSOLVER)", lambda x: cv.numpy.linalg.svd(x * 2.0, compute_uv=False),
     lambda x: np.linalg.svd(x * 2.0, compute_uv=False)),
    ("a while_loop (its predicate is read on the host)",
     lambda x: cv.lax.while_loop(lambda v: v.sum() < 100.0, lambda v: v * 2.0 + 1.0, x),
     lambda x: _while(lambda v: v.sum() < 100.0, lambda v: v * 2.0 + 1.0, x)),
    ("a cond on a traced predicate", lambda x: cv.lax.cond(x.sum() > 0, lambda v: v + 1.0, lambda v: v - 1.0, x),
     lambda x: x + 1.0 if x.sum() > 0 else x - 1.0),
]


def _while(cond, body, v):
    while cond(v):
        v = body(v)
    return v


@pytest.mark.parametrize("what, f, ref", NOT_CAPTURABLE, ids=[c[0] for c in NOT_CAPTURABLE])
def test_a_program_with_a_primitive_that_is_not_capturable_runs_op_by_op_without_trying(what, f, ref):
    jitted = cv.jit(f)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            strict_cupy.reset()
            got = jitted(_dev(x))
            assert strict_cupy.graphs() == [] and not strict_cupy.refusals()
    np.testing.assert_allclose(got.get(), ref(x), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------
# GEMMs in a capture: cuvmap's own cuBLAS handle (NOTE [cuBLAS in a capture])
# ---------------------------------------------------------------------------------------


def _captured(f, *args):
    """``f(*args)`` captured on a stream of its own, then replayed: the outputs as the
    graph computes them."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cublas.prepare()  # the handle and this stream's workspace, before the capture
        stream.begin_capture()
        try:
            out = f(*args)
        finally:
            graph = stream.end_capture()
    graph.launch(stream=stream)
    return out


_SAME = lambda v: v  # noqa: E731
GEMM_OPERANDS = [  # (what, a's shape, its view, b's shape, its view): a @ b with every layout the binding meets
    ("row-major", (3, 5), _SAME, (5, 4), _SAME),
    ("transposed views (column-major)", (5, 3), lambda v: v.T, (4, 5), lambda v: v.T),
    ("a row and a column", (1, 5), _SAME, (5, 1), _SAME),
    ("an outer product (k = 1)", (4, 1), _SAME, (1, 3), _SAME),
    ("batched", (2, 3, 5), _SAME, (2, 5, 4), _SAME),
    ("batched, transposed", (2, 5, 3), lambda v: v.transpose(0, 2, 1), (2, 4, 5), lambda v: v.swapaxes(1, 2)),
    ("batched times one matrix (stride 0)", (3, 2, 5), _SAME, (5, 4), _SAME),
    ("one matrix times a batch", (2, 5), _SAME, (3, 5, 4), _SAME),
    ("strided rows (a larger leading dimension)", (3, 8), lambda v: v[:, :5], (5, 9), lambda v: v[:, 2:6]),
    ("neither layout (copied first)", (3, 10), lambda v: v[:, ::2], (5, 4, 2), lambda v: v[..., 0]),
    ("a batch of one", (1, 3, 5), _SAME, (1, 5, 4), _SAME),
    ("k = 0", (3, 0), _SAME, (0, 4), _SAME),
    ("m = 0", (0, 5), _SAME, (5, 4), _SAME),
]
GEMM_DTYPES = [(np.float64, 1e-14), (np.float32, 1e-6), (np.complex128, 1e-14), (np.complex64, 1e-6),
               (np.float16, 2e-3)]


@pytest.mark.parametrize("dtype, rtol", GEMM_DTYPES, ids=[np.dtype(d).name for d, _ in GEMM_DTYPES])
@pytest.mark.parametrize("what, a_shape, a_view, b_shape, b_view", GEMM_OPERANDS, ids=[g[0] for g in GEMM_OPERANDS])
def test_a_gemm_is_captured_on_cuvmaps_own_cublas_handle(what, a_shape, a_view, b_shape, b_view, dtype, rtol):
    """The emulated libcublas computes column-major on the bytes at the addresses it is
    given, so a wrong operation, leading dimension or stride in the binding is a wrong
    product (or an illegal address) here."""
    r = np.random.default_rng(3)

    def host(shape):
        v = r.standard_normal(shape)
        return (v + 0.5j * r.standard_normal(shape) if np.iscomplexobj(np.zeros((), dtype)) else v).astype(dtype)

    a, b = host(a_shape), host(b_shape)
    want = np.matmul(a_view(a).astype(np.complex128), b_view(b))
    da, db = a_view(_dev(a)), b_view(_dev(b))
    strict_cupy.reset()
    got = _captured(cublas.matmul, da, db)
    gemms = [n.name for n in strict_cupy.graphs()[0].nodes].count("cublasGemmStridedBatchedEx")
    assert gemms == (want.size > 0 and a_view(a).shape[-1] > 0) and not strict_cupy.refusals()
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got.get(), want if np.iscomplexobj(a) else want.real, rtol=rtol, atol=rtol * 10)


def test_outside_a_capture_a_gemm_is_cupys():
    a = _dev(np.ones((2, 3), np.float32))
    strict_cupy.reset()
    cublas.matmul(a, a.T)
    assert "libcublas.cublasGemmStridedBatchedEx" not in _surface_delta(lambda: cublas.matmul(a, a.T))


def _surface_delta(fn):
    before = strict_cupy.surface()
    fn()
    after = strict_cupy.surface()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def test_without_libcublas_a_gemm_fails_the_capture_with_cupys_cause(monkeypatch):
    from cupy import _libcublas
    monkeypatch.setattr(cublas._library, "candidates", lambda: ["/nonexistent/libcublas.so.13"])
    cublas.use_library(None)
    try:
        assert not cublas.available() and "/nonexistent/libcublas.so.13" in cublas.load_error()
        jitted = cv.jit(lambda x: cv.numpy.sin(x) @ x.T)
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        jitted(_dev(x))
        with pytest.warns(cuda_graphs.GraphCaptureWarning, match="calling cuBLAS API during stream capture"):
            got = jitted(_dev(x))
        np.testing.assert_allclose(got.get(), np.sin(x) @ x.T, rtol=1e-6)
    finally:
        cublas.use_library(_libcublas.LIBRARY)


def test_the_emulated_cublas_checks_what_cublas_checks():
    from cupy import _libcublas as lib
    a = _dev(np.ones((3, 4), np.float32))
    h = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(h)) == lib.SUCCESS
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)

    def gemm(lda, ptr=None, compute=lib.COMPUTE_32F):
        return lib.cublasGemmStridedBatchedEx(h.value, 0, 0, 3, 3, 4, one.ctypes.data, a.data.ptr if ptr is None else ptr,
                                              0, lda, 0, a.data.ptr, 0, 4, 0, zero.ctypes.data, a.data.ptr, 0, 3, 0, 1,
                                              compute, -1)
    assert gemm(lda=2) == lib.INVALID_VALUE  # lda < m
    assert gemm(lda=3, compute=lib.COMPUTE_64F) == lib.NOT_SUPPORTED  # float32 with a float64 compute type
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorIllegalAddress"):
        gemm(lda=3, ptr=a.data.ptr + 8)  # past the end of a's buffer
    stream = cupy.cuda.Stream(non_blocking=True)
    strict_cupy.reset()
    with stream:
        stream.begin_capture()
        with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="not the capturing stream"):
            gemm(lda=3)  # the handle is bound to the null stream
        with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
            stream.end_capture()
    assert [r["kind"] for r in strict_cupy.refusals()] == ["cuBLAS on a stream that is not captured"]
    assert lib.cublasDestroy_v2(h.value) == lib.SUCCESS


# ---------------------------------------------------------------------------------------
# Bounds checks on the device (NOTE [device-side bounds checks] in cuvmap/cuda/device_errors.py)
# ---------------------------------------------------------------------------------------

GATHERS = [  # (what, a function of a float matrix and integer indices, good indices, bad ones, the message)
    ("take_along_axis", lambda x, i: cv.numpy.take_along_axis(x[:3], i[:, None], 1)[:, 0], [2, 0, 1], [2, 3, 1],
     "take_along_axis: an index is out of bounds for axis 1 with size 3"),
    # a label of -1 is out of bounds too (torch's rule; NOTE [class labels are checked])
    ("cross_entropy's labels", lambda x, i: nn.cross_entropy(x[:3], i), [2, 0, 1], [0, -1, 1],
     "cross_entropy: an index is out of bounds for the classes (integer labels lie in [0, 3), as torch's) "
     "with size 3"),
    ("take", lambda x, i: cv.numpy.take(x, i, axis=0), [3, 0, -4], [4, 0, 1],
     "take: an index is out of bounds for the gathered axis with size 4"),
    ("per-example take under vmap", lambda x, i: cv.vmap(lambda r, j: r[j])(x[:3], i), [2, 0, -1], [0, 1, 3],
     "take: an index is out of bounds for the gathered axis with size 3"),
]
_X = np.arange(12.0).reshape(4, 3)


@pytest.mark.parametrize("what, f, good, bad, message", GATHERS, ids=[g[0] for g in GATHERS])
def test_a_gathers_bounds_check_reads_nothing_and_a_later_check_raises(what, f, good, bad, message):
    """On the GPU a bounds check reads nothing back: it sets the error word, which the next
    check (of this call or a later one) or cuvmap.block_until_ready raises as an IndexError
    and clears."""
    x, ok, wrong = _dev(_X), _dev(np.array(good)), _dev(np.array(bad))
    strict_cupy.reset()
    cv.block_until_ready(f(x, ok))
    with pytest.raises(IndexError, match=re.escape(message) + r" \(found on the GPU"):
        cv.block_until_ready(f(x, wrong))
    assert strict_cupy.host_reads() == {}
    np.testing.assert_allclose(cv.block_until_ready(f(x, ok)).get(), f(_X, np.array(good)))  # cleared


def test_a_captured_gather_checks_its_indices_at_every_replay():
    jitted = cv.jit(lambda x, i: cv.numpy.take_along_axis(x, i[:, None], 1).sum())
    x = _dev(_X[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k, labels in enumerate(([0, 1, 2], [2, 2, 2], [1, 0, 2], [0, 3, 1])):
            strict_cupy.reset()
            got = jitted(x, _dev(np.array(labels)))
            assert strict_cupy.host_reads() == {} and len(strict_cupy.graphs()) == (k == 1)
            if k < 3:
                assert float(got) == sum(_X[r, c] for r, c in enumerate(labels))
    with pytest.raises(IndexError, match="take_along_axis: an index is out of bounds for axis 1 with size 3"):
        jitted(x, _dev(np.array([0, 1, 2])))  # the replay before set the word
    cv.block_until_ready(jitted(x, _dev(np.array([0, 1, 2]))))


def test_the_cpu_keeps_its_immediate_index_error():
    with pytest.raises(IndexError, match=r"^take_along_axis: index 3 is out of bounds for axis 1 with size 3\n"):
        cv.numpy.take_along_axis(_X, np.array([[0], [3], [1], [2]]), 1)


# ---------------------------------------------------------------------------------------
# The main job's step (examples/dp_sgd_digits.py: DP-SGD with ghost clipping, under jit)
# ---------------------------------------------------------------------------------------


def _main_job():
    spec = importlib.util.spec_from_file_location("example_dp_sgd_digits",
                                                  os.path.join(ROOT, "examples", "dp_sgd_digits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_main_jobs_jitted_step_reads_nothing_and_is_captured():
    """The step of examples/dp_sgd_digits.py (ghost-clipped per-example gradients of the
    CNN, the masked sum, noise, Adam) under jit on the GPU: from its second call it is one
    CUDA graph, and no call reads anything back from the device."""
    job = _main_job()
    rng = cupy.random.default_rng(0)
    _, params = job.MODEL.init(rng, (-1, 1, 8, 8))
    opt = nn.optim.adam(1e-3)
    state = opt.init(params)
    clipped_grad = dp.clipped_grad(job.loss, 1.0)

    def dp_step(params, state, x, y, mask, noise):
        clipped = clipped_grad(params, x, y, mask=mask)
        grads = dp.private_gradient(clipped, 1.0, 1.0, mask=mask, noise=noise, expected_batch_size=16.0)
        return opt.update(grads, state, params)

    step = cv.jit(dp_step)
    r = np.random.default_rng(1)
    x = _dev(r.standard_normal((16, 1, 8, 8)).astype(np.float32))
    y = _dev(r.integers(0, 10, 16))
    mask = _dev((r.random(16) < 0.8).astype(np.float32))
    reads, graphs, noises = [], [], []
    host_params, host_state = cv.device_put((params, state), "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a capture that fails warns: fail instead
        for _ in range(3):
            noise = dp.standard_normal_like(params, rng)
            noises.append(cv.device_put(noise, "cpu"))
            strict_cupy.reset()
            params, state = step(params, state, x, y, mask, noise)
            reads.append(strict_cupy.host_reads())
            graphs.append(len(strict_cupy.graphs()))
    assert reads == [{}, {}, {}]
    assert graphs == [0, 1, 0] and not strict_cupy.refusals()
    # the graph computes what the step computes op by op on the CPU
    hx, hy, hmask = cv.device_put((x, y, mask), "cpu")
    for noise in noises:
        host_params, host_state = dp_step(host_params, host_state, hx, hy, hmask, noise)
    for got, want in zip(cv.tree.leaves(cv.device_put(params, "cpu")), cv.tree.leaves(host_params)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
