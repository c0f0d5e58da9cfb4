"""What the first GPU run depends on (issue 34, item 15), checked on the strict CuPy
stand-in here (gpu-marked: tools/gpu_checks.sh runs them on a device): a program with
``avg_pool(count_include_pad=False)`` is captured as a CUDA graph (its divisor is made
once, not copied from the host at each call); the device-side bounds check has a switch
back to the host-side check (``CUVMAP_DEVICE_BOUNDS_CHECK=0``) that works both ways; and
graph capture's mode is the thread-local one, for the reason its NOTE gives."""
import pathlib
import warnings

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend, lax

ROOT = pathlib.Path(__file__).resolve().parents[2]
needs_gpu = pytest.mark.skipif(not backend.gpu_available(), reason="no CUDA device (or CuPy) available")


def _strict():
    strict_cupy = pytest.importorskip("strict_cupy", reason="the strict CuPy stand-in (no GPU here)")
    if not hasattr(strict_cupy, "graphs"):
        pytest.skip("not the strict stand-in")
    return strict_cupy


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 6, 5), (1, 2, 4, 4, 3)])
def test_a_padded_average_without_the_padding_is_captured(shape):
    """(Before: the divisor was copied from the host at every call, which no capture
    takes: the program ran op by op, with a GraphCaptureWarning.)"""
    from cuvmap.cuda import graphs

    rank = len(shape) - 2
    window, stride, padding = (3, 2, 2)[:rank], (1, 2, 1)[:rank], (1, 1, 1)[:rank]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)

    def f(x):
        y = lax.avg_pool(x, window, stride, padding, count_include_pad=False)
        return y * 2.0, cv.grad(lambda x: cv.numpy.sum(lax.avg_pool(x, window, stride, padding,
                                                                      count_include_pad=False) ** 2))(x)

    want = f(x)
    jf, dx = cv.jit(f), cv.device_put(x, "gpu")
    captured = []
    capture = graphs.GraphRunner._capture

    def counting(self, cp, args):
        capture(self, cp, args)
        captured.append(self)

    graphs.GraphRunner._capture = counting
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", graphs.GraphCaptureWarning)
            for _ in range(3):
                got = cv.device_put(cv.block_until_ready(jf(dx)), "cpu")
    finally:
        graphs.GraphRunner._capture = capture
    assert len(captured) == 1 and captured[0].captured
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------
# The switch of the device-side bounds check
# ---------------------------------------------------------------------------------------

from cuvmap import config  # noqa: E402

_X = np.arange(12.0).reshape(4, 3)


def _take(x, i):
    return cv.numpy.take(x, i, axis=0).sum(axis=1)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("on_device", [True, False], ids=["on the device", "on the host"])
def test_the_bounds_check_both_ways(on_device):
    """On the device (the default): nothing is read back, a bad index is raised at the
    synchronisation, a jitted gather is captured. On the host (CUVMAP_DEVICE_BOUNDS_CHECK=0,
    for a sandbox where the pinned mapped word misbehaves): the IndexError at the gather,
    with the index, and the jitted gather is not captured (no GraphCaptureWarning: the
    check is a host synchronisation the executor knows)."""
    strict_cupy = _strict()
    from cuvmap.cuda import graphs

    x = cv.device_put(_X, "gpu")
    good, bad = cv.device_put(np.array([3, 0, -4]), "gpu"), cv.device_put(np.array([4, 0, 1]), "gpu")
    jitted = cv.jit(_take)
    with config.override(device_bounds_check=on_device):
        strict_cupy.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error", graphs.GraphCaptureWarning)
            outs = [jitted(x, good) for _ in range(3)]
        assert len(strict_cupy.graphs()) == (1 if on_device else 0)
        assert (strict_cupy.host_reads() == {}) is on_device
        for out in outs:
            np.testing.assert_array_equal(cv.device_put(cv.block_until_ready(out), "cpu"),
                                          _take(_X, np.array([3, 0, -4])))
        if on_device:
            out = _take(x, bad)                       # queued; the check's word is set
            with pytest.raises(IndexError, match=r"take: an index is out of bounds for the gathered axis with size "
                                                 r"4 \(found on the GPU"):
                cv.block_until_ready(out)
        else:
            with pytest.raises(IndexError, match=r"^take: index 4 is out of bounds for the gathered axis with size 4"):
                _take(x, bad)
            with pytest.raises(IndexError, match=r"^take: index 4 is out of bounds"):
                jitted(x, bad)
        cv.block_until_ready(_take(x, good))          # nothing left over


@pytest.mark.slow
def test_the_switch_is_read_from_the_environment():
    import os
    import subprocess
    import sys

    code = "from cuvmap import config; print(config.read('device_bounds_check'))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    for value, want in (("0", "False"), ("1", "True"), ("", "True")):
        out = subprocess.run([sys.executable, "-c", code], env=dict(env, CUVMAP_DEVICE_BOUNDS_CHECK=value),
                             capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        assert out == want, (value, out)


# ---------------------------------------------------------------------------------------
# The capture mode
# ---------------------------------------------------------------------------------------


def test_the_capture_mode_is_thread_local_for_the_reason_its_note_gives():
    """The runner captures in the thread-local mode (NOTE [the capture mode and the memory
    pool] says why that is safe with CuPy's pool, where the relaxed mode is not), and a
    pool that must grow during the capture (a cudaMalloc the mode refuses) makes the
    program run op by op, with a warning and the right results."""
    import contextlib
    import types

    from cuvmap.cuda import graphs

    text = (ROOT / "cuvmap" / "cuda" / "graphs.py").read_text()
    assert "# NOTE [the capture mode and the memory pool]" in text
    assert "NOTE\n# [the capture mode and the memory pool]" in text  # cited where the mode is chosen
    seen = {}

    class Refused(RuntimeError):
        pass

    class Stream:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def wait_event(self, e):
            pass

        def record(self):
            return None

        def is_capturing(self):
            return False

        def begin_capture(self, mode):
            seen["mode"], seen["capturing"] = mode, True

        def end_capture(self):
            seen["capturing"] = False
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")

    def malloc(size):  # the pool grows: refused while this thread captures (thread-local mode)
        if seen.get("capturing"):
            raise Refused("cudaErrorStreamCaptureUnsupported: cudaMalloc during capture")

    fake = types.SimpleNamespace(
        ndarray=np.ndarray, array=lambda a, copy=True: np.array(a, copy=True),
        cuda=types.SimpleNamespace(
            Stream=Stream, MemoryPool=lambda: types.SimpleNamespace(malloc=malloc), get_current_stream=Stream,
            using_allocator=lambda m: contextlib.nullcontext(),
            runtime=types.SimpleNamespace(streamCaptureModeThreadLocal=1, streamCaptureModeRelaxed=2)))

    def make_program():
        def program(inputs):
            malloc(8 * inputs[0].size)   # an intermediate the pool must find or make
            return [inputs[0] * 2.0]
        return program

    runner = graphs.GraphRunner(lambda args: [args[0] * 2.0], make_program, name="jit(f)", cp=fake)
    x = np.arange(3.0)
    np.testing.assert_array_equal(runner([x])[0], 2 * x)
    with pytest.warns(graphs.GraphCaptureWarning, match="cudaMalloc during capture"):
        np.testing.assert_array_equal(runner([x])[0], 2 * x)
    assert seen["mode"] == fake.cuda.runtime.streamCaptureModeThreadLocal and not runner.captured
    np.testing.assert_array_equal(runner([x + 1])[0], 2 * (x + 1))
