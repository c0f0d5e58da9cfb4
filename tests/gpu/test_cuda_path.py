"""The GPU path's own logic: the cuDNN binding's checks and settings, the algorithm choice
over cuDNN's perf records, the CUDA wheels' preload, the plan cache, the GPU timer,
operand alignment, device errors, ``check_batching``'s device
consistency and ``tools/gpu_checks.sh``.

What needs no device runs everywhere, on the real functions with NumPy arrays or with perf
records filled in as cuDNN fills them; a few pieces of bookkeeping are tested with
stand-ins for what only a GPU machine has (a fake site-packages tree and loader for the
wheel preload, a plan factory for the plan cache, CuPy's event API for ``time_gpu``). The tests marked
``gpu`` need CuPy, a CUDA device and (most) a loadable cuDNN, and skip otherwise, with the
reason, so that ``tools/gpu_checks.sh`` lists them. Convolution results are checked
against the naive float64 loops of tests/lax/test_conv.py.
"""
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend, core
from cuvmap.cuda import cudnn
from cuvmap.cuda import device as cuda_device
from cuvmap.cuda import libs
from cuvmap.lru import LRU
from cuvmap.test_util import check_batching

from conv_references import naive_backward_weight, naive_conv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file

needs_gpu = pytest.mark.skipif(not backend.gpu_available(), reason="no CUDA device visible to CuPy")


def _needs_cudnn():
    if not cudnn.available():
        pytest.skip(f"cuDNN not loadable: {cudnn.load_error()}")


def _perfs(*records):
    """``AlgoPerf`` records as cuDNN fills them: ``(algo, status, memory, mathType)``."""
    perfs = (cudnn.AlgoPerf * len(records))()
    for p, (algo, status, memory, math) in zip(perfs, records):
        p.algo, p.status, p.memory, p.mathType, p.time = algo, status, memory, math, 0.1 * algo
    return perfs[:len(records)]


MiB = 2**20
FAILED = 3000   # CUDNN_STATUS_NOT_SUPPORTED in cuDNN 9's numbering: anything but success


# ---------------------------------------------------------------------------------------
# The algorithm choice (NOTE [cuDNN algorithm choice])
# ---------------------------------------------------------------------------------------


def test_algorithms_above_the_workspace_cap_are_skipped():
    perfs = _perfs(
        (1, cudnn.CUDNN_STATUS_SUCCESS, 64 * MiB, cudnn.CUDNN_FMA_MATH),      # fastest, too large
        (2, cudnn.CUDNN_STATUS_SUCCESS, 1 * MiB, cudnn.CUDNN_TENSOR_OP_MATH),  # TF32
        (3, FAILED, 0, cudnn.CUDNN_DEFAULT_MATH),
        (4, cudnn.CUDNN_STATUS_SUCCESS, 4 * MiB, cudnn.CUDNN_DEFAULT_MATH),
        (5, cudnn.CUDNN_STATUS_SUCCESS, 8 * MiB, cudnn.CUDNN_FMA_MATH),        # exactly the cap
        (6, cudnn.CUDNN_STATUS_SUCCESS, 0, cudnn.CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION),
    )
    algos = lambda **kw: [p.algo for p in cudnn.usable_algorithms(perfs, **kw)]  # noqa: E731
    assert algos(strict=True, max_workspace=8 * MiB) == [4, 5]
    assert algos(strict=False, max_workspace=8 * MiB) == [2, 4, 5, 6]
    assert algos(strict=False, max_workspace=2**40) == [1, 2, 4, 5, 6]
    assert algos(strict=True, max_workspace=0) == []
    assert algos(strict=False, max_workspace=0) == [6]


def test_deterministic_keeps_the_algorithms_cudnn_marks_deterministic():
    """NOTE [reproducible runs]: under cv.config.deterministic only the records cuDNN marks
    CUDNN_DETERMINISTIC are usable (its backward algorithms with atomics are not)."""
    perfs = _perfs((1, cudnn.CUDNN_STATUS_SUCCESS, 0, cudnn.CUDNN_FMA_MATH),
                   (2, cudnn.CUDNN_STATUS_SUCCESS, 0, cudnn.CUDNN_FMA_MATH),
                   (3, cudnn.CUDNN_STATUS_SUCCESS, 0, cudnn.CUDNN_DEFAULT_MATH))
    perfs[0].determinism = cudnn.CUDNN_NON_DETERMINISTIC
    perfs[1].determinism = perfs[2].determinism = cudnn.CUDNN_DETERMINISTIC
    algos = lambda **kw: [p.algo for p in cudnn.usable_algorithms(perfs, strict=True, max_workspace=MiB, **kw)]  # noqa: E731
    assert algos() == [1, 2, 3]
    assert algos(deterministic=True) == [2, 3]


def test_no_algorithm_within_the_cap_says_what_it_would_need():
    perfs = _perfs((1, cudnn.CUDNN_STATUS_SUCCESS, 64 * MiB, cudnn.CUDNN_FMA_MATH),
                   (2, cudnn.CUDNN_STATUS_SUCCESS, 12 * MiB, cudnn.CUDNN_DEFAULT_MATH),
                   (3, cudnn.CUDNN_STATUS_SUCCESS, 1 * MiB, cudnn.CUDNN_TENSOR_OP_MATH),
                   (4, FAILED, 0, cudnn.CUDNN_DEFAULT_MATH))
    assert cudnn.usable_algorithms(perfs, strict=True, max_workspace=8 * MiB) == []
    msg = cudnn.no_algorithm_message("Forward", perfs, strict=True, max_workspace=8 * MiB)
    assert msg == ("cuDNN found no Forward algorithm within the workspace cap of 8388608 bytes: the smallest of 2 "
                   "usable ones needs 12582912 bytes (cudnn.set_max_workspace_bytes or "
                   "CUVMAP_CUDNN_MAX_WORKSPACE_BYTES raises the cap)")
    none_ok = cudnn.no_algorithm_message("BackwardData", perfs[3:], strict=True, max_workspace=8 * MiB)
    assert none_ok == ("cuDNN found no usable BackwardData algorithm for this convolution (1 candidates, none "
                       "succeeded in strict FP32/FP64 math)")


def test_the_workspace_cap_setting(monkeypatch):
    monkeypatch.setitem(cudnn._settings, "max_workspace", None)
    monkeypatch.delenv("CUVMAP_CUDNN_MAX_WORKSPACE_BYTES", raising=False)
    assert cudnn.max_workspace_bytes() == 8 * MiB == cudnn.DEFAULT_MAX_WORKSPACE_BYTES
    cudnn.set_max_workspace_bytes(0)
    assert cudnn.max_workspace_bytes() == 0
    cudnn.set_max_workspace_bytes(np.int64(3 * MiB))
    assert cudnn.max_workspace_bytes() == 3 * MiB
    for bad in (-1, 1.5, "8MiB", True, None):
        with pytest.raises(ValueError, match=r"^the cuDNN workspace cap must be a non-negative whole number of "
                                             r"bytes; set_max_workspace_bytes's argument is "):
            cudnn.set_max_workspace_bytes(bad)
    assert cudnn.max_workspace_bytes() == 3 * MiB
    # the environment: read at the first use, a bad value rejected there
    monkeypatch.setitem(cudnn._settings, "max_workspace", None)
    monkeypatch.setenv("CUVMAP_CUDNN_MAX_WORKSPACE_BYTES", "1048576")
    assert cudnn.max_workspace_bytes() == MiB
    monkeypatch.setitem(cudnn._settings, "max_workspace", None)
    monkeypatch.setenv("CUVMAP_CUDNN_MAX_WORKSPACE_BYTES", "lots")
    with pytest.raises(ValueError, match="CUVMAP_CUDNN_MAX_WORKSPACE_BYTES is 'lots'"):
        cudnn.max_workspace_bytes()


# ---------------------------------------------------------------------------------------
# Operands (NOTE [cuDNN operands]) and devices
# ---------------------------------------------------------------------------------------


def test_as_operand_copies_misaligned_and_strided_arrays_only():
    base = np.arange(1 + 2 * 3 * 5 * 5, dtype=np.float32)
    aligned = base[:-1].reshape(2, 3, 5, 5)
    assert cudnn.data_pointer(aligned) % cudnn.ALIGNMENT == 0   # NumPy's allocations are
    assert cudnn.as_operand(aligned) is aligned
    misaligned = base[1:].reshape(2, 3, 5, 5)                   # contiguous, 4 bytes in
    assert misaligned.flags.c_contiguous and cudnn.data_pointer(misaligned) % cudnn.ALIGNMENT == 4
    strided = aligned[:, :, ::2]
    for view in (misaligned, strided):
        op = cudnn.as_operand(view)
        assert op is not view and not np.shares_memory(op, base)
        assert op.flags.c_contiguous and cudnn.data_pointer(op) % cudnn.ALIGNMENT == 0
        np.testing.assert_array_equal(op, view)
    # element-aligned but not 8-byte aligned float64
    b64 = np.zeros(9)[1:]
    assert cudnn.as_operand(b64, alignment=8) is b64 and cudnn.as_operand(b64) is not b64


def test_device_mismatch_names_the_op_the_operands_and_the_devices():
    what = "conv forward"
    assert backend.device_mismatch(what, [("input", (2, 3, 5, 5), 0), ("weight", (4, 3, 3, 3), 0)], 0) is None
    assert backend.device_mismatch(what, [], 1) is None
    assert backend.device_mismatch(what, [("input", (2, 3, 5, 5), 1), ("weight", (4, 3, 3, 3), 1)], 0) == (
        "conv forward: operands on another GPU than the current one (GPU 0): the input [2, 3, 5, 5] on GPU 1, "
        "the weight [4, 3, 3, 3] on GPU 1; call it under `with cupy.cuda.Device(1):`, or move the operands to "
        "GPU 0")
    assert backend.device_mismatch(what, [("input", (2, 3, 5, 5), 0), ("weight", (4, 3, 3, 3), 1)], 0) == (
        "conv forward: operands on another GPU than the current one (GPU 0): the input [2, 3, 5, 5] on GPU 0, "
        "the weight [4, 3, 3, 3] on GPU 1; move them to one GPU (cupy.asarray under `with cupy.cuda.Device(i):`) "
        "and call it under that device")


def test_the_binding_takes_cupy_arrays_only():
    x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 2, 2), np.float32)
    with pytest.raises(TypeError, match=r"^cuDNN convolution forward: the input is a numpy.ndarray; cuDNN takes "
                                        r"CuPy arrays$"):
        cudnn.forward(x, w, (1, 1), (0, 0), (1, 1), 1)
    with pytest.raises(TypeError, match="cuDNN convolution backward_weight: the grad_output is a numpy.ndarray"):
        cudnn.backward_weight(np.ones((1, 1, 3, 3), np.float32), x, w.shape, (1, 1), (0, 0), (1, 1), 1)


def test_load_error_says_why_cudnn_is_unavailable(monkeypatch):
    monkeypatch.setitem(cudnn._settings, "enabled", False)
    assert not cudnn.available()
    assert cudnn.load_error() == "cuDNN is disabled (set_enabled(False) or CUVMAP_DISABLE_CUDNN)"
    monkeypatch.setitem(cudnn._settings, "enabled", True)
    if not backend.gpu_available():
        assert not cudnn.available()
        assert cudnn.load_error() == "no CUDA device visible to CuPy (CuPy not installed, no driver or no device)"
    elif cudnn.available():
        assert cudnn.load_error() is None
    else:   # a GPU, and cuDNN failed: the error says where (the library, or cudnnCreate)
        assert cudnn.load_error().startswith(("libcudnn.so.9 did not load: ", "cuDNN ")), cudnn.load_error()


def test_preflight_is_loud_when_cudnn_is_unavailable(monkeypatch, capsys):
    monkeypatch.setitem(cudnn._settings, "enabled", False)
    assert cuda_device.preflight() == 1
    out = capsys.readouterr().out
    assert "!! cuDNN IS UNAVAILABLE: cuDNN is disabled (set_enabled(False) or CUVMAP_DISABLE_CUDNN)" in out
    assert out.splitlines()[0] == cuda_device.describe()


# ---------------------------------------------------------------------------------------
# The CUDA wheels' libraries, loaded before cuDNN (NOTE [preloading the CUDA wheels])
# ---------------------------------------------------------------------------------------


def _fake_site_packages(root, files):
    """A site-packages tree with empty files at the given relative paths."""
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return str(root)


WHEELS_CU12 = ["nvidia/cublas/lib/libcublasLt.so.12", "nvidia/cublas/lib/libcublas.so.12",
               "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cudnn/lib/libcudnn.so.9"]
WHEELS_CU13 = ["nvidia/cu13/lib/libcublasLt.so.13", "nvidia/cu13/lib/libcublas.so.13",
               "nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cudnn/lib/libcudnn.so.9"]


def test_wheel_libraries_are_found_where_the_wheels_put_them(tmp_path):
    """nvidia-cublas-cu12 & co. use nvidia/<folder>/lib, the CUDA 13 wheels nvidia/cu13/lib;
    the first sys.path entry that has a file wins, and a missing one is None."""
    first = _fake_site_packages(tmp_path / "a", WHEELS_CU12[:1])
    second = _fake_site_packages(tmp_path / "b", WHEELS_CU12 + WHEELS_CU13)
    path = [str(tmp_path / "empty"), first, second]
    assert libs.find("cublas", "libcublasLt.so.12", 12, path) == os.path.join(first, WHEELS_CU12[0])
    assert libs.find("cublas", "libcublas.so.12", 12, path) == os.path.join(second, WHEELS_CU12[1])
    assert libs.find("cublas", "libcublasLt.so.13", 13, path) == os.path.join(second, WHEELS_CU13[0])
    assert libs.find("cuda_nvrtc", "libnvrtc.so.13", 13, path) == os.path.join(second, WHEELS_CU13[2])
    assert libs.find("cublas", "libcublasLt.so.12", 12, [first[:-1] + "x"]) is None
    assert libs.candidate_paths("cublas", "libcublas.so.12", 12, ["/sp"]) == [
        "/sp/nvidia/cublas/lib/libcublas.so.12", "/sp/nvidia/cu12/lib/libcublas.so.12", "/sp/cublas/lib/libcublas.so.12"]


@pytest.mark.parametrize("major, files", [(12, WHEELS_CU12), (13, WHEELS_CU13)], ids=["cu12", "cu13"])
def test_cudnn_loads_after_cublaslt_cublas_and_nvrtc(tmp_path, monkeypatch, major, files):
    """cudnn._load (libs.WheelLibrary) on a fake site-packages with a stand-in loader: cuBLASLt, cuBLAS and
    NVRTC load from the wheels, in that order and with RTLD_GLOBAL, before libcudnn.so.9
    (whose stand-in fails here, so the error names what was tried)."""
    site = _fake_site_packages(tmp_path, files)
    monkeypatch.setattr(sys, "path", [site] + [p for p in sys.path if "site-packages" not in p])
    monkeypatch.setattr(libs, "_done", {})
    monkeypatch.setattr(libs, "cuda_majors", lambda: (major,))
    opened = []

    def stand_in_global_loader(path):
        opened.append(path)

    def stand_in_cudnn_loader(path):
        opened.append(path)
        raise OSError(f"{path}: stand-in, no cuDNN here")

    monkeypatch.setattr(libs, "_dlopen_global", stand_in_global_loader)
    monkeypatch.setattr(cudnn._library, "opener", stand_in_cudnn_loader)
    monkeypatch.setattr(cudnn._library, "lib", None)
    monkeypatch.setattr(cudnn._library, "error", None)
    monkeypatch.setattr(cudnn._library, "preloaded", [])
    monkeypatch.setattr(cudnn, "_lib", None)
    assert cudnn._load() is None
    wheel = [os.path.join(site, f) for f in files]
    assert opened == wheel + ["libcudnn.so.9"]
    assert cudnn._library.error.startswith(f"libcudnn.so.9 did not load: {wheel[3]}: ")
    assert [(r["name"], r["loaded"]) for r in cudnn._library.preloaded] == [
        (f"libcublasLt.so.{major}", True), (f"libcublas.so.{major}", True), (f"libnvrtc.so.{major}", True)]
    # once per process: a second load attempt does not load the wheels again
    monkeypatch.setattr(cudnn._library, "error", None)
    del opened[:]
    cudnn._load()
    assert opened == [wheel[3], "libcudnn.so.9"]


def test_preload_reports_what_is_missing_or_broken(tmp_path):
    site = _fake_site_packages(tmp_path, WHEELS_CU12[:2])

    def loader(path):
        if path.endswith("libcublas.so.12"):
            raise OSError("undefined symbol: cublasLtStub")

    records = libs.preload(libs.CUBLAS + libs.NVRTC, majors=(12,), search_path=[site], loader=loader)
    assert [(r["name"], r["loaded"], r["path"] is not None) for r in records] == [
        ("libcublasLt.so.12", True, True), ("libcublas.so.12", False, True), ("libnvrtc.so.12", False, False)]
    assert libs.describe(records) == (f"failed to load libcublas.so.12 ({site}/nvidia/cublas/lib/libcublas.so.12: "
                                      f"undefined symbol: cublasLtStub); not in any NVIDIA wheel on sys.path: "
                                      f"libnvrtc.so.12")
    # NVRTC alone, for the fused kernels
    assert [r["name"] for r in libs.preload(libs.NVRTC, majors=(12, 13), search_path=[site],
                                            loader=loader)] == ["libnvrtc.so.12", "libnvrtc.so.13"]


def test_the_gpu_extras_install_the_libraries_cudnn_loads():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    extras = cfg["options.extras_require"]
    gpu = extras["gpu"].split()
    cuda13 = extras["gpu-cuda13"].split()
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-nvrtc-cu12"} <= set(gpu)
    assert {"nvidia-cudnn-cu13", "nvidia-cublas>=13,<14", "nvidia-cuda-nvrtc>=13,<14"} <= set(cuda13)


# ---------------------------------------------------------------------------------------
# The plan cache and the GPU timer
# ---------------------------------------------------------------------------------------


def test_cudnn_plan_cache_is_a_bounded_lru(monkeypatch):
    """NOTE [cuDNN plan cache], with a stand-in plan factory: the cache stays at its bound,
    a hit makes a plan the most recently used, and an evicted key is made again."""
    monkeypatch.setattr(cudnn, "_plans", LRU(4))
    made = []

    def plan_for(key):
        return cudnn._cached_plan(key, lambda: made.append(key) or ("plan", key))

    for k in range(10):
        assert plan_for(k) == ("plan", k)
        assert len(cudnn._plans) <= 4
    assert made == list(range(10)) and cudnn._plans.keys() == [6, 7, 8, 9]
    assert plan_for(6) == ("plan", 6) and made == list(range(10))     # a hit: nothing made
    plan_for(10)                                                        # evicts 7, the least recent
    assert cudnn._plans.keys() == [8, 9, 6, 10]
    plan_for(7)
    assert made[-1] == 7 and len(made) == 12
    assert cudnn.cache_info() == dict(size=4, bound=4, hits=1, misses=12, evicted=8)
    assert cudnn.CACHE_SIZE == 256 and isinstance(cudnn._plans, LRU)


def test_the_default_plan_cache_is_bounded():
    from cuvmap.cpu import onednn

    for mod in (cudnn, onednn):
        assert isinstance(mod._plans, LRU) and mod._plans.bound == mod.CACHE_SIZE


class _FakeEvent:
    def __init__(self, clock):
        self.clock = clock
        self.at = None

    def record(self, stream=None):
        self.at = self.clock["now"]

    def synchronize(self):
        pass


def _fake_cupy(durations):
    """A stand-in for CuPy's event API: each call of the timed function advances a clock
    by the next of ``durations`` (ms)."""
    import types

    clock = {"now": 0.0}
    cuda = types.SimpleNamespace(Event=lambda: _FakeEvent(clock),
                                 get_elapsed_time=lambda start, end: end.at - start.at)
    it = iter(durations)

    def fn():
        clock["now"] += next(it)

    return types.SimpleNamespace(cuda=cuda), fn


@pytest.mark.parametrize("durations, repeats, median", [
    ((99.0, 1.0, 3.0), 2, 2.0),                 # the warm-up call is not timed; even: the mean of the middle
    ((99.0, 5.0, 1.0, 3.0), 3, 3.0),
    ((99.0, 4.0, 1.0, 8.0, 2.0), 4, 3.0),
    ((99.0, 7.0), 1, 7.0),
])
def test_time_gpu_returns_the_median(monkeypatch, durations, repeats, median):
    cp, fn = _fake_cupy(durations)
    monkeypatch.setattr(backend, "cupy_module", lambda: cp)
    assert cuda_device.time_gpu(fn, repeats=repeats) == median


# ---------------------------------------------------------------------------------------
# check_batching keeps every leaf on its own device
# ---------------------------------------------------------------------------------------


def _recording(seen):
    def f(x, p, w):
        if not any(isinstance(a, core.Tracer) for a in (x, p["a"], p["b"], w)):   # the loop's calls
            seen.append((x, p, w))
        return x * p["a"] + (p["b"] * w).sum()

    return f


def test_check_batching_gives_the_loop_the_arrays_it_was_given():
    """Mapped leaves reach the loop as arrays of their own kind — a 0-d example included,
    not as a NumPy scalar — and unmapped leaves as the very objects given."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(3)                   # each example is 0-d
    p = {"a": rng.standard_normal((3, 2)), "b": rng.standard_normal((4,))}
    w = rng.standard_normal(4)
    seen = []
    check_batching(_recording(seen), (xs, p, w), in_axes=(0, None, None))
    assert len(seen) == 3
    for b, (x, q, w_seen) in enumerate(seen):
        assert type(x) is np.ndarray and x.shape == () and x == xs[b]
        assert q is p and w_seen is w
    seen.clear()
    check_batching(_recording(seen), (xs[:0], {"a": p["a"][:0], "b": np.zeros((0, 4))}, w), in_axes=(0, 0, None))
    ((x, q, w_seen),) = seen                      # size 0: one all-zeros example for the template
    assert type(x) is type(q["a"]) is type(q["b"]) is np.ndarray and w_seen is w
    assert x.shape == () and q["a"].shape == (2,) and q["b"].shape == (4,)


def test_check_batching_with_an_unmapped_output():
    xs, w = np.arange(6.0).reshape(3, 2), np.arange(4.0)
    check_batching(lambda x, w: (x * 2, w + 1), (xs, w), in_axes=(0, None), out_axes=(0, None))


# ---------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------


def _operands(rng, n=3):
    x = rng.standard_normal((n, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    return x, w, dict(stride=(2, 1), padding=(1, 1), dilation=(1, 1), groups=2)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def _conv_args(p):
    return p["stride"], p["padding"], p["dilation"], p["groups"]


_PROBE = """
import json
import cupy
from cuvmap.cuda import cudnn
ok = cudnn.available()
handles = dict(getattr(cudnn._local, "handles", {}))
print(json.dumps(dict(available=ok, error=cudnn.load_error(), device=cupy.cuda.runtime.getDevice(),
                      handles=sorted(handles), plans=len(cudnn._plans))))
"""


@needs_gpu
@pytest.mark.gpu
def test_available_creates_a_handle_on_the_current_device():
    """In a fresh process, available() alone — before any convolution — creates the
    thread's handle on the current device (cudnnCreate loads the sub-libraries)."""
    import json

    _needs_cudnn()
    # the checkout first, and whatever PYTHONPATH already holds (tools/gpu_checks.sh puts the wheels of .whl/ there)
    path = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["available"] is True and info["error"] is None, info
    assert info["handles"] == [info["device"]] and info["plans"] == 0, info


@needs_gpu
@pytest.mark.gpu
def test_one_cudnn_handle_per_thread_on_its_own_stream():
    import cupy

    _needs_cudnn()
    rng = np.random.default_rng(1)
    x, w, p = _operands(rng, n=5)
    want = naive_conv(x.astype(np.float64), w.astype(np.float64), **p)
    barrier = threading.Barrier(3)
    results, handles, errors = {}, {}, []

    def work(i):
        try:
            with cupy.cuda.Stream(non_blocking=True) as stream:
                xd, wd = cupy.asarray(x), cupy.asarray(w)
                barrier.wait()
                outs = [cudnn.forward(xd, wd, *_conv_args(p)) for _ in range(20)]
                stream.synchronize()
                results[i] = [cupy.asnumpy(o) for o in outs]
                handles[i] = cudnn._local.handles[cupy.cuda.runtime.getDevice()].ptr.value
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(set(handles.values())) == 3
    for outs in results.values():
        for o in outs:
            _close(o, want)


@needs_gpu
@pytest.mark.gpu
def test_empty_operands_never_reach_cudnn():
    """cuDNN rejects zero-size descriptors: the binding returns the empty results and the
    zero weight gradient itself."""
    import cupy

    _needs_cudnn()
    x = cupy.zeros((0, 4, 7, 6), cupy.float32)
    w = cupy.ones((6, 2, 3, 3), cupy.float32)
    args = _conv_args(_operands(np.random.default_rng(2))[2])
    y = cudnn.forward(x, w, *args)
    assert y.shape == (0, 6, 4, 6) and y.dtype == cupy.float32
    assert cudnn.backward_input(y, w, x.shape, *args).shape == x.shape
    dw = cudnn.backward_weight(y, x, w.shape, *args)
    assert dw.shape == w.shape and not bool(dw.any())


@needs_gpu
@pytest.mark.gpu
def test_misaligned_and_strided_views_are_copied():
    import cupy

    _needs_cudnn()
    rng = np.random.default_rng(3)
    x, w, p = _operands(rng)
    flat = cupy.asarray(np.concatenate([[0.0], x.ravel()]).astype(np.float32))
    xd = flat[1:].reshape(x.shape)                       # contiguous, 4 bytes past a pool block
    assert xd.flags.c_contiguous and cudnn.data_pointer(xd) % cudnn.ALIGNMENT != 0
    wide = cupy.zeros((6, 2, 3, 6), cupy.float32)
    wide[..., ::2] = cupy.asarray(w)
    wd = wide[..., ::2]                                  # strided
    _close(cupy.asnumpy(cudnn.forward(xd, wd, *_conv_args(p))),
           naive_conv(x.astype(np.float64), w.astype(np.float64), **p))
    y = naive_conv(x.astype(np.float64), w.astype(np.float64), **p)
    g = rng.standard_normal(y.shape)
    gflat = cupy.asarray(np.concatenate([[0.0], g.ravel()]).astype(np.float32))
    gd = gflat[1:].reshape(g.shape)
    _close(cupy.asnumpy(cudnn.backward_weight(gd, xd, w.shape, *_conv_args(p))),
           naive_backward_weight(g, x.astype(np.float64), w.shape, **p))


@needs_gpu
@pytest.mark.gpu
def test_operands_on_another_gpu_give_a_clear_error():
    import cupy

    from cuvmap import lax

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    x, w, p = _operands(np.random.default_rng(4))
    with cupy.cuda.Device(1):
        xd, wd = cupy.asarray(x), cupy.asarray(w)
    with cupy.cuda.Device(0):
        with pytest.raises(ValueError, match=r"^conv forward: operands on another GPU than the current one "
                                             r"\(GPU 0\): the input \[3, 4, 7, 6\] on GPU 1, the weight "
                                             r"\[6, 2, 3, 3\] on GPU 1"):
            lax.conv(xd, wd, **p)
        if cudnn.available():
            with pytest.raises(ValueError, match=r"^cuDNN convolution forward: operands on another GPU"):
                cudnn.forward(xd, wd, *_conv_args(p))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("benchmark, cap", [(False, 0), (True, 1 << 20)])
def test_plans_respect_the_workspace_cap(monkeypatch, benchmark, cap):
    """A layer whose fastest algorithms (FFT, Winograd) want workspace: with the cap at 0
    (heuristics) or 1 MiB (timed), every plan stays within it, and the results agree with
    the im2col kernels in float64 (themselves checked against the loops in test_conv)."""
    import cupy

    from cuvmap.lax import conv_gemm

    _needs_cudnn()
    monkeypatch.setitem(cudnn._settings, "max_workspace", cap)
    monkeypatch.setitem(cudnn._settings, "benchmark", benchmark)
    monkeypatch.setattr(cudnn, "_plans", LRU(cudnn.CACHE_SIZE))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 16, 20, 20)).astype(np.float32)
    w = rng.standard_normal((32, 16, 5, 5)).astype(np.float32)
    args = ((1, 1), (2, 2), (1, 1), 1)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = cudnn.forward(cupy.asarray(x), cupy.asarray(w), *args)
    _close(cupy.asnumpy(y), conv_gemm.forward(x64, w64, *args))
    g = rng.standard_normal(y.shape)
    gd = cupy.asarray(g.astype(np.float32))
    _close(cupy.asnumpy(cudnn.backward_input(gd, cupy.asarray(w), x.shape, *args)),
           conv_gemm.backward_input(g, w64, x.shape, *args))
    _close(cupy.asnumpy(cudnn.backward_weight(gd, cupy.asarray(x), w.shape, *args)),
           conv_gemm.backward_weight(g, x64, w.shape, *args))
    assert len(cudnn._plans) == 3
    for key, plan in cudnn._plans.items():
        assert key[-1] == cap and plan.workspace <= cap, (key, plan.workspace)


@needs_gpu
@pytest.mark.gpu
def test_check_batching_keeps_every_leaf_on_the_gpu():
    """On the GPU the loop computes on the GPU: mapped examples are CuPy arrays, unmapped
    leaves the CuPy arrays given (the old check_batching gave NumPy examples beside CuPy
    unmapped leaves, and the ops failed on the mix)."""
    import cupy

    rng = np.random.default_rng(6)
    xs = cupy.asarray(rng.standard_normal(3))
    p = {"a": cupy.asarray(rng.standard_normal((3, 2))), "b": cupy.asarray(rng.standard_normal(4))}
    w = cupy.asarray(rng.standard_normal(4))
    seen = []
    check_batching(_recording(seen), (xs, p, w), in_axes=(0, None, None))
    assert len(seen) == 3
    for x, q, w_seen in seen:
        assert type(x) is cupy.ndarray and x.shape == () and q is p and w_seen is w
    seen.clear()
    pm = {"a": p["a"], "b": cupy.asarray(rng.standard_normal((3, 4)))}
    check_batching(_recording(seen), (xs, pm, w), in_axes=(0, 0, None))
    assert len(seen) == 3
    for x, q, w_seen in seen:
        assert all(type(a) is cupy.ndarray for a in (x, q["a"], q["b"])) and w_seen is w


# ---------------------------------------------------------------------------------------
# What a CUDA graph captures: GEMMs on cuvmap's own cuBLAS handle (NOTE [cuBLAS in a
# capture]) and bounds checks on the device (NOTE [device-side bounds checks]). These run on
# a real device (tools/gpu_checks.sh) and on the strict stand-in; tests/gpu/test_strict_cupy.py
# covers every operand layout against the emulated libcublas.
# ---------------------------------------------------------------------------------------

GEMM_CASES = [  # (a's shape, its view, b's shape, its view, dtype)
    ((64, 48), lambda v: v, (48, 33), lambda v: v, np.float32),
    ((48, 64), lambda v: v.T, (33, 48), lambda v: v.T, np.float64),
    ((5, 17, 9), lambda v: v, (9, 12), lambda v: v, np.float32),
    ((5, 9, 17), lambda v: v.transpose(0, 2, 1), (5, 9, 12), lambda v: v, np.complex64),
]


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("a_shape, a_view, b_shape, b_view, dtype", GEMM_CASES)
def test_a_captured_gemm_on_cuvmaps_cublas_handle_equals_cupys(a_shape, a_view, b_shape, b_view, dtype):
    import cupy

    from cuvmap.cuda import cublas

    if not cublas.available():
        pytest.skip(f"cuvmap's cuBLAS binding is unavailable: {cublas.load_error()}")
    rng = np.random.default_rng(7)
    a = cupy.asarray(rng.standard_normal(a_shape).astype(dtype))
    b = cupy.asarray(rng.standard_normal(b_shape).astype(dtype))
    want = cupy.asnumpy(cupy.matmul(a_view(a), b_view(b)))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cublas.prepare()
        stream.begin_capture()
        try:
            out = cublas.matmul(a_view(a), b_view(b))
        finally:
            graph = stream.end_capture()
        for _ in range(2):
            graph.launch(stream=stream)
        stream.synchronize()
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(cupy.asnumpy(out), want, rtol=tol, atol=tol)


@needs_gpu
@pytest.mark.gpu
def test_an_out_of_range_index_on_the_gpu_raises_at_block_until_ready():
    import cupy

    import cuvmap as cv

    x = cupy.arange(12.0).reshape(4, 3)
    with pytest.raises(IndexError, match=r"take_along_axis: an index is out of bounds for axis 1 with size 3 "
                                         r"\(found on the GPU"):  # by take's own check, or at the synchronisation
        cv.block_until_ready(cv.numpy.take_along_axis(x, cupy.asarray([[0], [3], [1], [2]]), 1))
    good = cv.block_until_ready(cv.numpy.take_along_axis(x, cupy.asarray([[0], [2], [1], [2]]), 1))
    np.testing.assert_array_equal(cupy.asnumpy(good)[:, 0], [0.0, 5.0, 7.0, 11.0])


# NOTE [host arrays meet device arrays] in cuvmap/backend.py: NumPy arrays made or closed
# over inside a transformed function meet the GPU operands. name: (f of GPU operands, the
# operands as NumPy arrays); the reference is the same call on the CPU.
_X = np.arange(6.0).reshape(2, 3)
_W = np.ones((1, 1, 3, 3)) * 0.5
_IMG = np.arange(50.0).reshape(2, 1, 5, 5)
HOST_ARRAYS_IN_DEVICE_PROGRAMS = {
    "vmap, a NumPy constant": (lambda x: cv.vmap(lambda r: r * np.arange(3.0))(x), (_X,)),
    "grad, cnp.zeros": (lambda x: cv.grad(lambda x: cnp.sum(x + cnp.zeros(3)) * 2)(x), (_X,)),
    "vmap(grad), cnp.arange": (lambda x: cv.vmap(cv.grad(lambda r: cnp.sum(r * cnp.arange(3) ** 2)))(x), (_X,)),
    "grad of a conv, NumPy weights": (lambda img: cv.grad(lambda i: cnp.sum(cv.nn.conv(i, _W) ** 2))(img), (_IMG,)),
    "jit, a NumPy constant first": (lambda x: cv.jit(lambda x: np.ones(3) * 2 + x)(x), (_X,)),
    "jit(grad), eye @ x": (lambda x: cv.jit(cv.grad(lambda x: cnp.sum(cnp.eye(2) @ x)))(x), (_X,)),
}


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", HOST_ARRAYS_IN_DEVICE_PROGRAMS)
def test_host_arrays_go_to_the_device_of_the_computation(name):
    import cupy

    f, args = HOST_ARRAYS_IN_DEVICE_PROGRAMS[name]
    want = f(*args)
    got = f(*[cupy.asarray(a) for a in args])
    assert isinstance(got, cupy.ndarray), type(got)
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-12)


@needs_gpu
@pytest.mark.gpu
def test_a_jitted_gpu_program_takes_numpy_arguments_to_its_device():
    import cupy

    f = cv.jit(lambda a, b: cnp.sum(a * b) + a)
    a, b = np.arange(3.0), np.arange(3.0) + 1
    for _ in range(2):  # the first call stages, the second takes the fast path
        out = f(a, cupy.asarray(b))
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(out), np.sum(a * b) + a, rtol=1e-12)
    assert isinstance(a, np.ndarray)  # the caller's array stays where it was


@needs_gpu
@pytest.mark.gpu
def test_a_constant_the_program_only_returns_stays_on_the_host():
    import cupy

    doubled, index = cv.jit(lambda x: (x * 2, np.arange(3)))(cupy.ones(3))
    assert isinstance(doubled, cupy.ndarray) and isinstance(index, np.ndarray)


@needs_gpu
@pytest.mark.gpu
def test_a_jitted_step_with_gemms_and_gathers_becomes_one_graph(monkeypatch):
    """A dense network's SGD step (matmuls, cross_entropy's gather, their gradients) is
    captured on its second call without a warning and computes what the CPU computes."""
    import warnings

    import cuvmap as cv
    from cuvmap import nn
    from cuvmap.cuda import graphs

    def loss(p, x, y):
        h = nn.relu(x @ p["w1"] + p["b1"])
        return nn.cross_entropy(h @ p["w2"], y).mean()

    def step(p, x, y):
        g = cv.grad(loss)(p, x, y)
        return {k: p[k] - 0.1 * g[k] for k in p}

    rng = np.random.default_rng(8)
    p = {"w1": rng.standard_normal((10, 16)).astype(np.float32) * 0.3, "b1": np.zeros(16, np.float32),
         "w2": rng.standard_normal((16, 5)).astype(np.float32) * 0.3}
    x, y = rng.standard_normal((32, 10)).astype(np.float32), rng.integers(0, 5, 32)
    captured = []
    capture = graphs.GraphRunner._capture

    def counting(self, cp, args):
        capture(self, cp, args)
        captured.append(self)

    monkeypatch.setattr(graphs.GraphRunner, "_capture", counting)
    jstep = cv.jit(step)
    dp, dx, dy = cv.device_put((p, x, y), "gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        for _ in range(3):
            dp = jstep(dp, dx, dy)
            p = step(p, x, y)
    got = cv.device_put(cv.block_until_ready(dp), "cpu")
    for k in p:
        np.testing.assert_allclose(got[k], p[k], rtol=1e-4, atol=1e-5)
    assert len(captured) == 1 and captured[0].captured
