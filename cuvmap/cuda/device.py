"""Device probing: is there a GPU CuPy can use, and what is it (with the cuDNN that
:mod:`cuvmap.cuda.cudnn` loaded), and timing on it."""
import statistics

from cuvmap import backend
from cuvmap.cuda import cudnn


def gpu_available():
    """True when CuPy is importable and sees at least one CUDA device."""
    return backend.gpu_available()


def describe():
    """A one-line description of the current GPU (name, memory, CUDA and cuDNN versions),
    or ``"no GPU"``."""
    cp = backend.cupy_module()
    if cp is None:
        return "no GPU"
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    mem = props["totalGlobalMem"] / 2**30
    if cudnn.available():
        cudnn_text = f"{cudnn.version()} (workspace cap {cudnn.max_workspace_bytes() / 2**20:g} MiB)"
    else:
        cudnn_text = f"unavailable ({cudnn.load_error()})"
    return (f"{name}, {mem:.0f} GiB, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, "
            f"CuPy {cp.__version__}, cuDNN {cudnn_text}")


def preflight():
    """Prints :func:`describe` and whether cuDNN loaded; returns 0 when it did and 1 with a
    banner naming :func:`cuvmap.cuda.cudnn.load_error` otherwise (``tools/gpu_checks.sh``
    fails on it)."""
    print(describe())
    if cudnn.available():
        print(f"cuDNN {cudnn.version()} loaded; a handle was created on the current device")
        return 0
    bar = "!" * 78
    print(f"{bar}\n!! cuDNN IS UNAVAILABLE: {cudnn.load_error()}\n!! The cuDNN GPU tests skip and the benchmarks "
          f"run the unfold kernels only.\n{bar}")
    return 1


def time_gpu(fn, repeats=3):
    """Median milliseconds of ``repeats`` calls of ``fn()`` on the current stream, timed
    with CUDA events after one warm-up call: the middle time of an odd count, the mean of
    the two middle ones of an even count (``repeats=2``: the mean of both)."""
    cp = backend.cupy_module()
    fn()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)
