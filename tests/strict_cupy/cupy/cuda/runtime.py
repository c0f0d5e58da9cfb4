"""``cupy.cuda.runtime`` of the stand-in: one device (0), CUDA 13's version numbers, the
capture modes, and the calls cuvmap makes; a synchronisation during capture is refused.
Pinned host memory (``hostAlloc``) is a NumPy buffer at its address: the device reads and
writes it through ``ndarray(memptr=...)`` (as unified addressing lets a GPU), the host
through the address (NOTE [the stand-in's addresses] in cupy/_strict.py)."""
import numpy as _np

from cupy._strict import CUDARuntimeError, capture, forget_memory, refuse, register_memory

streamCaptureModeGlobal = 0
streamCaptureModeThreadLocal = 1
streamCaptureModeRelaxed = 2
is_hip = False
_is_hip_environment = False

_DEVICE_COUNT = 1


def getDeviceCount():
    return _DEVICE_COUNT


def getDevice():
    from cupy.cuda import _current_device
    return _current_device()


def setDevice(device):
    from cupy.cuda import Device
    Device(device).use()


def runtimeGetVersion():
    return 13000


def driverGetVersion():
    return 13000


def getDeviceProperties(device):
    _check_device(device)
    # a small L2 (a real device's is tens of MiB): the GPU timers flush twice its size before
    # each timed call (benchmarks/rounds/timers.py), which on NumPy is a CPU write, and 256 MiB
    # per call (their size when unknown) made the GPU suites' tests take half a minute
    return {"name": b"strict CuPy stand-in (NumPy on the CPU)", "totalGlobalMem": 16 * 2**30,
            "major": 9, "minor": 0, "multiProcessorCount": 1, "warpSize": 32, "l2CacheSize": 1 << 20}


def memGetInfo():
    return 16 * 2**30, 16 * 2**30


def deviceSynchronize():
    if capture() is not None:
        refuse("host read", "cudaDeviceSynchronize", CUDARuntimeError(
            "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"))


def streamIsCapturing(ptr):
    cap = capture()
    return cap is not None and cap.stream.ptr == ptr


def _check_device(device):
    if not 0 <= int(device) < _DEVICE_COUNT:
        raise CUDARuntimeError("cudaErrorInvalidDevice", "invalid device ordinal")


hostAllocPortable = 1
hostAllocMapped = 2
_pinned = {}


def hostAlloc(size, flags):
    if capture() is not None:
        refuse("allocation", "cudaHostAlloc", CUDARuntimeError(
            "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"))
    buf = _np.zeros(max(int(size), 1), _np.uint8)
    ptr = buf.__array_interface__["data"][0]
    _pinned[ptr] = buf
    register_memory(buf, keep=True)
    return ptr


def freeHost(ptr):
    if _pinned.pop(ptr, None) is None:
        raise CUDARuntimeError("cudaErrorInvalidValue", "invalid argument")
    forget_memory(ptr)
