"""``cupy.cuda.runtime`` of the stand-in: one device (0), CUDA 13's version numbers, the
capture modes, and the calls cuvmap makes; a synchronisation during capture is refused."""
from cupy._strict import CUDARuntimeError, capture, refuse

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
    return {"name": b"strict CuPy stand-in (NumPy on the CPU)", "totalGlobalMem": 16 * 2**30,
            "major": 9, "minor": 0, "multiProcessorCount": 1, "warpSize": 32}


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
