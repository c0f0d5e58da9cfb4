"""CUDA-graph replay of a jitted program.

A planned program launches its kernels from Python one by one; on a small problem the
launches, not the kernels, take the time. CUDA stream capture records every kernel a call
launches into a graph, which one ``cudaGraphLaunch`` replays. :class:`GraphRunner` wraps a
program function ``program(args) -> outputs`` (see :mod:`cuvmap.transforms.executor`) and
follows NOTE [graph replay]. It knows no transform and no primitive: what may be captured
is the executor's decision.
"""
import threading
import warnings

from cuvmap import backend
from cuvmap.cuda import device_errors

# NOTE [graph replay]
# A graph replays the kernels on the device addresses they had when captured, so:
#
# - the first call runs the program eagerly (it compiles the kernels, builds the cuDNN
#   plans, measures the conv strategies); the second call captures: on a private stream,
#   with a private CuPy memory pool, it copies the arguments into input buffers of its
#   own, runs the program once more outside the capture (so that the capture finds every
#   buffer it needs cached in the private pool) and then once under capture, keeping the
#   outputs as the graph's output buffers;
# - each replay copies the arguments into the input buffers, launches the graph and
#   copies the outputs out into fresh arrays (the caller owns them; the next replay
#   overwrites the graph's buffers), all on the caller's current stream, after waiting for
#   the previous replay's copies (an event), under a lock;
# - the private pool lives as long as the runner and is never used for anything else, so
#   no memory the graph writes is ever handed to another array; the program captured is
#   a fresh plan with its own buffer pool (the eager plan's pool could hand a buffer to a
#   caller);
# - a call whose arguments are not all CuPy arrays (a Python scalar would be baked into
#   the graph as a constant) runs eagerly; any failure while capturing (a host
#   synchronisation, an allocation the capture refuses, a library that cannot be captured)
#   makes the runner eager for good, with one GraphCaptureWarning that names the cause
#   (the error raised inside the capture, not the invalidated capture's own error).
#
# A program run from inside the captured one (a custom rule's body, a batched program a
# transform runs) is planned afresh for the capture (cuvmap.transforms.executor.run asks
# capturing_here()), so its buffers too come from the private pool: a plan of its own,
# kept across calls, would write the graph's intermediates into buffers it later hands
# out. Such programs never capture graphs of their own; a runner called while its
# stream is being captured runs eagerly, inside the outer graph.
#
# The capture uses the thread-local capture mode, not CuPy's default relaxed one: NOTE
# [the capture mode and the memory pool].
#
# What the captured work addresses besides the program's buffers lives in the runner's
# resources (graph_resources(), a dict set during the run before the capture and the
# capture itself): cuBLAS's workspace (NOTE [cuBLAS in a capture] in cuvmap/cuda/cublas.py);
# float GEMMs go to cuvmap's own cuBLAS handle during both runs, so that the first one
# makes the handle and the workspace outside the capture. The device's bounds checks write
# an error word the host reads before every call (NOTE [device-side bounds checks] in
# cuvmap/cuda/device_errors.py): a replay raises what an earlier one found.
#
# Donated arguments (jit's donate_argnums) are copied into the input buffers like the
# others. Using the caller's buffer as the graph's input would need the graph to read the
# address the caller's array has, which changes from call to call (a graph reads the
# addresses it was captured with); and handing the graph's own buffers out as results, so
# that a step's donated output comes back as the next call's input at the same address,
# would let the next replay overwrite an array the caller still holds whenever it does not
# pass that array back (or writes into it in between) -- nothing a runner can see without
# a synchronisation. The copies are device-to-device, on the caller's stream, and part of
# no graph.


# NOTE [the capture mode and the memory pool]
# CuPy captures in the relaxed mode by default because its memory pool may call cudaMalloc
# while a stream is captured (a pool that has to grow), which the stricter modes refuse.
# The runner captures in the thread-local mode all the same, and it is safe with the pool:
# - the capture allocates from the runner's private pool, which the run just before the
#   capture, on the same stream and in the same order, has filled with every block the
#   program asks for: the captured run is served from the pool's cache, with no cudaMalloc;
# - should the pool have to grow all the same (a fragmentation the first run did not
#   meet), or to release memory (CuPy's pool frees its cached blocks and retries when a
#   cudaMalloc fails for lack of memory), the thread-local mode refuses the cudaMalloc or
#   cudaFree: the capture fails, and the runner runs op by op with a GraphCaptureWarning.
#   In the relaxed mode the same cudaFree would go through and release a block that the
#   graph, captured so far, reads and writes at every replay (an intermediate freed back to
#   the pool): a replay would then write memory the pool has handed to someone else;
# - other threads are not this thread: their allocations (from the default pool, never the
#   private one) and their work go on during the capture (the global mode would refuse
#   them too, and break their programs);
# - and an unsafe call of this thread that is not the pool's (a synchronous copy, a host
#   read of a value the captured work has not computed) fails the capture instead of
#   reading garbage.
# So the worst case of the thread-local mode is a program that runs op by op (and says so);
# the relaxed mode's is a use after free.

_capture_state = threading.local()


def capturing_here():
    """Whether a :class:`GraphRunner` of this thread is capturing right now (programs run
    meanwhile, from inside the captured one, must take their buffers from its pool)."""
    return getattr(_capture_state, "active", False)


def graph_resources():
    """While a :class:`GraphRunner` of this thread prepares a capture (the run before it,
    on the capture's stream and pool) or captures: a dict that lives as long as the graph,
    where a library binding keeps what the captured work addresses (cuBLAS's workspace:
    NOTE [cuBLAS in a capture] in cuvmap/cuda/cublas.py); else None."""
    return getattr(_capture_state, "resources", None)


def _capturing(cp):
    """Whether the current stream is being captured (by an enclosing runner)."""
    try:
        return bool(cp.cuda.get_current_stream().is_capturing())
    except Exception:  # noqa: BLE001 - a stream that cannot say is treated as not capturing
        return False


class GraphCaptureWarning(RuntimeWarning):
    """A jitted program could not be captured as a CUDA graph; it runs op by op."""


class GraphRunner:
    """Runs ``eager(args)`` on the first call and a captured graph of ``make_program()``
    afterwards (NOTE [graph replay]). ``cp`` is the CuPy module (tests pass a stand-in)."""

    def __init__(self, eager, make_program, name="jit", cp=None):
        self.eager = eager
        self.make_program = make_program
        self.name = name
        self.cp = cp
        self.calls = 0
        self.graph = None
        self.failure = None
        self.lock = threading.Lock()
        self._pool = self._stream = self._inputs = self._outputs = self._program = None
        self._resources = None
        self._done = None

    @property
    def captured(self):
        return self.graph is not None

    def __call__(self, args):
        device_errors.raise_pending()  # NOTE [device-side bounds checks]: a graph's checks run no Python
        cp = self.cp if self.cp is not None else backend.cupy_module()
        if self.failure is not None or not all(type(a) is cp.ndarray for a in args):
            return self.eager(args)
        if _capturing(cp):  # called while an outer program is being captured: part of its graph
            return self.eager(args)
        with self.lock:
            if self.graph is None:
                self.calls += 1
                if self.calls == 1:
                    return self.eager(args)
                try:
                    self._capture(cp, args)
                except Exception as err:  # noqa: BLE001 - any failure means: do not capture
                    self.failure = err
                    self._pool = self._stream = self._inputs = self._outputs = self._program = self._resources = None
                    warnings.warn(f"{self.name}: the program could not be captured as a CUDA graph "
                                  f"({type(err).__name__}: {err}); it runs op by op", GraphCaptureWarning,
                                  stacklevel=3)
                    return self.eager(args)
            return self._replay(cp, args)

    def _capture(self, cp, args):
        pool = cp.cuda.MemoryPool()
        stream = cp.cuda.Stream(non_blocking=True)
        program = self.make_program()
        caller = cp.cuda.get_current_stream()
        stream.wait_event(caller.record())
        resources = {}
        _capture_state.resources = resources
        try:
            with cp.cuda.using_allocator(pool.malloc), stream:
                inputs = [cp.array(a, copy=True) for a in args]
                program(inputs)  # outside the capture: fills the private pool and the plan's buffers
                stream.begin_capture(cp.cuda.runtime.streamCaptureModeThreadLocal)
                _capture_state.active = True
                try:
                    outputs = program(inputs)
                except BaseException:
                    # the cause, not the cudaErrorStreamCaptureInvalidated that ending the
                    # broken capture raises (a host read or a refused library call inside)
                    _capture_state.active = False
                    try:
                        stream.end_capture()
                    except Exception:  # noqa: BLE001 - the capture is invalid: expected
                        pass
                    raise
                _capture_state.active = False
                graph = stream.end_capture()
        finally:
            _capture_state.resources = None
        stream.synchronize()
        self._resources = resources
        self._pool, self._stream, self._program = pool, stream, program
        self._inputs, self._outputs = inputs, list(outputs)
        self.graph = graph

    def _replay(self, cp, args):
        caller = cp.cuda.get_current_stream()
        if self._done is not None:
            caller.wait_event(self._done)
        for buffer, a in zip(self._inputs, args):
            cp.copyto(buffer, a)
        self.graph.launch(stream=caller)
        outs = [o.copy() if type(o) is cp.ndarray else o for o in self._outputs]
        self._done = caller.record()
        return outs
