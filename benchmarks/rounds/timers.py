"""How one call is timed: the timers (the wall clock on the CPU, CUDA events after an L2
flush on the GPU), CUDA-graph replay, and the waits of an injected slowdown.

**Timers.** On the CPU, ``time.perf_counter`` around the call. On the GPU, the device is
synchronised, the L2 cache is flushed by writing a buffer twice its size (not timed; as
triton's ``do_bench``), and CUDA events recorded before and after the call on the current
stream give the time (CuPy's events for cuvmap, torch's for torch; JAX exposes none and is
timed by the wall clock around ``block_until_ready``). With ``--cuda-graph`` a CuPy or torch
case is captured once as a CUDA graph (on a private memory pool, after one call outside
the capture) and its timed calls replay the graph: the kernels' time without Python's
and the launches' (triton's ``do_bench_cudagraph``); a case that cannot be captured (a
host synchronisation, an allocation the capture refuses) is timed as it is, with a note.

**Injected slowdown** (``--inject-slowdown CASE=FRACTION``, :mod:`benchmarks.rounds.runner`):
the timed calls of a case are followed by :func:`slowed`'s wait, a busy loop on the CPU, a
kernel that spins on the GPU's global timer on the GPU.
"""
import time

import numpy as np

# GPU timing for the timers made by timer_for / torch_event_timer; the CLI sets it from
# --l2-flush before a suite runs
GPU_TIMING = dict(l2_flush=True)


class Timer:
    """``time_one(fn)`` returns the seconds of one call of ``fn``; ``name`` says how;
    ``kind`` is ``cpu``, ``cupy`` or ``torch`` (whose device the call runs on; ``simulated``
    for a clock of the self-check's); ``module`` the CuPy or torch module; ``wait(seconds)``
    makes what this timer measures take that much longer (an injected slowdown; None where
    it cannot). Unpacks as ``name, time_one``."""

    def __init__(self, name, time_one, kind="cpu", module=None, wait=None):
        self.name, self.time_one, self.kind, self.module = name, time_one, kind, module
        self.wait = wait if wait is not None else (spin_cpu if kind == "cpu" else None)

    def __iter__(self):
        return iter((self.name, self.time_one))

    def __getitem__(self, i):
        return (self.name, self.time_one)[i]

    def __call__(self, fn):
        return self.time_one(fn)


def cpu_timer():
    """Wall-clock seconds of ``fn()`` (``time.perf_counter``)."""

    def time_one(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return Timer("perf_counter", time_one)


def _l2_bytes_cupy(cp):
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        return int(props.get("l2CacheSize", 0)) or None
    except Exception:  # noqa: BLE001 - a stand-in or an old CuPy: use the fixed size
        return None


def flush_bytes(l2_bytes):
    """Bytes written to flush an L2 cache of ``l2_bytes`` (twice it; 256 MiB when unknown,
    as triton's ``do_bench``)."""
    return 2 * l2_bytes if l2_bytes else 256 << 20


def cupy_event_timer(cp, l2_flush=None):
    """Seconds between CUDA events on CuPy's current stream, recorded around ``fn()`` after a
    device-wide synchronisation and (``l2_flush``, by default :data:`GPU_TIMING`'s) a write
    of twice the L2 cache's size, which runs before the first event."""
    flush = GPU_TIMING["l2_flush"] if l2_flush is None else l2_flush
    buffer = []

    def time_one(fn):
        cp.cuda.Device().synchronize()
        stream = cp.cuda.get_current_stream()
        if flush:
            if not buffer:
                buffer.append(cp.empty(flush_bytes(_l2_bytes_cupy(cp)) // 4, dtype=np.int32))
            buffer[0].fill(0)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3

    return Timer("CUDA events (CuPy)" + (", L2 flushed" if flush else ""), time_one, "cupy", cp,
                 wait=lambda seconds: spin_gpu(cp, seconds))


def torch_event_timer(torch, l2_flush=None):
    """Like :func:`cupy_event_timer`, with torch's events on torch's current stream."""
    flush = GPU_TIMING["l2_flush"] if l2_flush is None else l2_flush
    buffer = []

    def time_one(fn):
        torch.cuda.synchronize()
        if flush:
            if not buffer:
                try:
                    l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                                     "L2_cache_size", 0)) or None
                except Exception:  # noqa: BLE001
                    l2 = None
                buffer.append(torch.empty(flush_bytes(l2), dtype=torch.int8, device="cuda"))
            buffer[0].zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return Timer("CUDA events (torch)" + (", L2 flushed" if flush else ""), time_one, "torch", torch)


def timer_for(xp):
    """The timer for arrays of module ``xp``: CUDA events for CuPy, perf_counter for NumPy."""
    return cpu_timer() if xp is np else cupy_event_timer(xp)


def as_timer(timer):
    """A :class:`Timer` from a Timer or a ``(name, time_one)`` pair (the CPU kind)."""
    if timer is None:
        return cpu_timer()
    if isinstance(timer, Timer):
        return timer
    name, time_one = timer
    return Timer(name, time_one)


# ---------------------------------------------------------------------------------------
# Graph replay, injected slowdowns, device peak memory
# ---------------------------------------------------------------------------------------


def cupy_graph(fn, cp):
    """``(replay, note)``: ``replay()`` launches a CUDA graph of one call of ``fn`` on CuPy's
    current stream; ``replay`` is None and ``note`` says why when ``fn`` cannot be captured.
    The capture runs on a private stream and memory pool (kept alive with the graph), after
    one call outside the capture that fills the pool, so that no address the graph writes
    is ever handed to another array."""
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(cp.cuda.get_current_stream().record())
    try:
        with cp.cuda.using_allocator(pool.malloc), stream:
            fn()
            stream.begin_capture(cp.cuda.runtime.streamCaptureModeThreadLocal)
            try:
                fn()
            except BaseException:
                try:
                    stream.end_capture()
                except Exception:  # noqa: BLE001 - the capture was already invalidated
                    pass
                raise
            graph = stream.end_capture()
        stream.synchronize()
    except Exception as err:  # noqa: BLE001 - any failure: time the call as it is
        return None, f"not captured as a CUDA graph ({type(err).__name__}: {err}); timed as called"
    keep = (pool, stream)

    def replay():
        graph.launch(stream=cp.cuda.get_current_stream())
        return keep

    return replay, "timed as CUDA-graph replays"


def torch_graph(fn, torch):
    """Like :func:`cupy_graph` with ``torch.cuda.CUDAGraph`` (torch's private pool)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001
        return None, f"not captured as a CUDA graph ({type(err).__name__}: {err}); timed as called"
    return graph.replay, "timed as CUDA-graph replays"


def spin_cpu(seconds):
    """Busy-waits ``seconds`` of wall time (``perf_counter``)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


_SPIN_SOURCE = r"""
extern "C" __global__ void cuvmap_bench_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
_spin_kernels = {}


def spin_gpu(cp, seconds):
    """Enqueues on CuPy's current stream a one-thread kernel that spins ``seconds`` on the
    GPU's global timer."""
    kernel = _spin_kernels.get(id(cp))
    if kernel is None:
        kernel = _spin_kernels[id(cp)] = cp.RawKernel(_SPIN_SOURCE, "cuvmap_bench_spin")
    kernel((1,), (1,), (np.uint64(max(0, round(seconds * 1e9))),))


def slowed(fn, extra_seconds, timer):
    """``fn`` followed by ``timer.wait(extra_seconds)``: a busy loop on the CPU, a spinning
    kernel on CuPy's stream. Cases whose timer cannot wait (torch's GPU rows, JAX on the
    GPU) cannot be slowed (a ValueError)."""
    if timer.wait is None:
        raise ValueError(f"--inject-slowdown: cases timed by {timer.name} cannot be slowed (CPU and CuPy cases can)")
    wait = timer.wait

    def run():
        out = fn()
        wait(extra_seconds)
        return out

    return run
