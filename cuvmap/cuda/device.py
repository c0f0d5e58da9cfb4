"""Device probing: is there a GPU CuPy can use, and what is it."""
from cuvmap import backend


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
    from cuvmap.cuda import cudnn

    cudnn_version = cudnn.version() if cudnn.available() else f"unavailable ({cudnn.load_error()})"
    return (f"{name}, {mem:.0f} GiB, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, "
            f"CuPy {cp.__version__}, cuDNN {cudnn_version}")


def time_gpu(fn, repeats=3):
    """Median milliseconds of ``fn()`` on the current stream, timed with CUDA events after
    one warm-up call."""
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
    times.sort()
    return times[len(times) // 2]
