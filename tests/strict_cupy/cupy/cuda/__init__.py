"""``cupy.cuda`` of the stand-in: devices (one), streams with capture, events, memory
pools and allocators (bookkeeping only: the arrays are NumPy's), and the submodules
cuvmap uses. NCCL and cuDNN are not here: ``import cupy.cuda.nccl`` fails as it does on
a CuPy without NCCL."""
import contextlib
import itertools
import threading
import time

import numpy as np

from cupy import _strict
from cupy._strict import CUDARuntimeError, MemoryPointer, UnownedMemory, capture, refuse
from cupy.cuda import compiler, graph, runtime  # noqa: F401

_tls = threading.local()
_ptrs = itertools.count(0x7000_0000_0000, 0x100)


def _current_device():
    return getattr(_tls, "device", 0)


class Device:
    """``cupy.cuda.Device``: a context manager that makes the device current."""

    def __init__(self, device=None):
        self.id = _current_device() if device is None else int(device)
        self._prev = []

    def use(self):
        runtime._check_device(self.id)
        _tls.device = self.id

    def __enter__(self):
        runtime._check_device(self.id)
        self._prev.append(_current_device())
        _tls.device = self.id
        return self

    def __exit__(self, *exc):
        _tls.device = self._prev.pop()

    def synchronize(self):
        runtime.deviceSynchronize()

    @property
    def compute_capability(self):
        return "90"

    @property
    def mem_info(self):
        return runtime.memGetInfo()

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class _Capture:
    def __init__(self, stream, mode):
        self.stream, self.mode = stream, mode
        self.nodes = []
        self.invalidated = None
        self.keep = []  # the buffers whose addresses the capture took (NOTE [the stand-in's addresses])


class Event:
    """``cupy.cuda.Event``: the host time at which it was recorded (the stand-in's work
    is done when it is launched)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr = next(_ptrs)
        self.time = None
        self.disable_timing = disable_timing

    def record(self, stream=None):
        self.time = time.perf_counter()

    def synchronize(self):
        if capture() is not None:
            refuse("host read", "Event.synchronize", CUDARuntimeError(
                "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"))

    def query(self):
        return True

    @property
    def done(self):
        return True


def get_elapsed_time(start_event, end_event):
    if start_event.time is None or end_event.time is None:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle", "an event was not recorded")
    return (end_event.time - start_event.time) * 1e3


class Stream:
    """``cupy.cuda.Stream``: a context manager that makes it current; ``begin_capture`` and
    ``end_capture`` record this thread's launches into a :class:`graph.Graph`."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else next(_ptrs)
        self.non_blocking = non_blocking
        self._prev = []

    def __enter__(self):
        stack = _stack()
        stack.append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()

    def use(self):
        stack = _stack()
        stack[:] = [self]
        return self

    def synchronize(self):
        if capture() is not None:
            refuse("host read", "Stream.synchronize", CUDARuntimeError(
                "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"))

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        pass

    def add_callback(self, callback, arg):
        callback(self, None, arg)

    def launch_host_func(self, callback, arg):
        callback(arg)

    def is_capturing(self):
        cap = capture()
        return cap is not None and cap.stream is self

    def begin_capture(self, mode=None):
        if capture() is not None:
            raise CUDARuntimeError("cudaErrorIllegalState", "a capture is already in progress on this thread")
        if self.ptr == 0:
            raise RuntimeError("cannot capture the null stream")
        _strict._tls.capture = _Capture(self, runtime.streamCaptureModeGlobal if mode is None else mode)

    def end_capture(self):
        cap = capture()
        if cap is None or cap.stream is not self:
            raise CUDARuntimeError("cudaErrorIllegalState", "the stream is not being captured")
        _strict._tls.capture = None
        if cap.invalidated:
            raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated",
                                   "operation failed due to a previous error during capture")
        g = graph.Graph(cap.nodes, self, keep=cap.keep)
        _poison(cap.nodes)
        _strict._add_graph(g)
        return g

    def __eq__(self, other):
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self):
        return hash(self.ptr)

    def __repr__(self):
        return f"<Stream {self.ptr:#x}>"


def _poison(nodes):
    """A capture does not run the work it records: the buffers it allocated hold garbage
    until the graph is launched (here NaN, or 0x5a bytes for integers). (Buffers written in
    place were written during the capture, which a GPU would not do; a program that reads
    them back before writing them would be wrong in a graph anyway.)"""
    for node in nodes:
        for r in node.allocated:
            a = r._a
            if a.base is not None or not a.flags.writeable:
                continue
            if a.dtype.kind in "fc":
                a.fill(np.nan)
            else:
                a.reshape(-1).view(np.uint8).fill(0x5A)  # (a 0-d array has no byte view)


Stream.null = Stream(null=True)
ExternalStream = Stream


def _stack():
    stack = getattr(_tls, "streams", None)
    if stack is None:
        stack = _tls.streams = [Stream.null]
    return stack


def get_current_stream(device_id=None):
    return _stack()[-1]


# ---------------------------------------------------------------------------------------
# Memory: pools and allocators, bookkeeping only
# ---------------------------------------------------------------------------------------


class MemoryPool:
    def __init__(self, allocator=None):
        self._used = 0

    def malloc(self, size):
        self._used += size
        return MemoryPointer(next(_ptrs))

    def used_bytes(self):
        return self._used

    def total_bytes(self):
        return self._used

    def free_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass

    def n_free_blocks(self):
        return 0

    def set_limit(self, size=None, fraction=None):
        pass

    def get_limit(self):
        return 0


class PinnedMemoryPool(MemoryPool):
    pass


_default_pool = MemoryPool()
_default_pinned_pool = PinnedMemoryPool()


def get_allocator():
    return getattr(_tls, "allocator", _default_pool.malloc)


def set_allocator(allocator=None):
    _tls.allocator = allocator or _default_pool.malloc


@contextlib.contextmanager
def using_allocator(allocator=None):
    prev = get_allocator()
    _tls.allocator = allocator or _default_pool.malloc
    try:
        yield
    finally:
        _tls.allocator = prev


def is_available():
    return True


__all__ = ["Device", "Stream", "Event", "MemoryPool", "MemoryPointer", "UnownedMemory", "using_allocator", "get_current_stream",
           "get_elapsed_time", "runtime", "graph", "compiler", "CUDARuntimeError"]
