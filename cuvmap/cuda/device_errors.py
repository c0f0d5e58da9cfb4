"""Errors found on the GPU by bounds checks, reported to the host without synchronising
(NOTE [device-side bounds checks]). This module knows no primitive and no transform;
``cupy`` is the CuPy module (the strict stand-in in the tests).
"""
import ctypes
import threading

import numpy as np

from cuvmap import backend, config

# NOTE [device-side bounds checks]
# On the CPU a gather checks its indices on the host before it reads (two reductions read
# at once: ``cuvmap/lax/indexing.py``) and raises IndexError. On the GPU that read would
# synchronise the device at every gather (about 8 times a step in the main job) and no CUDA
# graph could capture the program. So on the GPU a check is three kernels: each index's
# code (0 in bounds, else the check's code: a number standing for its message), their
# maximum, and the maximum of that and the *error word*, a 32-bit integer in pinned host
# memory that the device writes through unified addressing (the address of pinned memory
# is the same on the host and on every device). A graph replays those kernels like any
# others. The gather goes on meanwhile (CuPy takes an index modulo the axis: NOTE [CuPy
# wraps integer-array indices] in tests/strict_cupy/cupy/_functions.py), so that call's
# results are wrong.
#
# The host reads the word -- a load from its own memory: no CUDA call, no copy, no
# synchronisation -- at the start of every later check, before every replay of a CUDA
# graph, and in :func:`check` (``cuvmap.block_until_ready``), which synchronises the device
# first: the explicit synchronisation point at which a user learns of every error of the
# work before it. A word found non-zero is cleared and raised as the IndexError its code
# stands for, saying that it was found on the device. (A kernel that traps would stop the
# bad gather, but leaves the CUDA context unusable for the rest of the process.)
#
# Without pinned mapped memory (a platform without unified addressing) the word is device
# memory that only :func:`check` reads: one counted synchronisation, where the user asked
# for one.
#
# The switch: config.device_bounds_check (CUVMAP_DEVICE_BOUNDS_CHECK=0 turns it off) puts
# the GPU's checks back on the host, as the CPU's are: the indices' minimum and maximum
# read at once (a synchronisation per check), an IndexError at the gather itself, and the
# check a host_sync primitive, so that no CUDA graph captures a program with one. For a
# machine where the pinned mapped word misbehaves (a sandbox that refuses or emulates
# mapped host memory): the checks stay exact at the cost of a synchronisation each.

_HOST_ALLOC_PORTABLE, _HOST_ALLOC_MAPPED = 1, 2   # cudaHostAllocPortable, cudaHostAllocMapped

_lock = threading.Lock()
_messages = [None]      # code -> message (code 0: no error)
_codes = {}             # message -> code
_state = {"ptr": None, "host": None, "fallback": False, "device": {}}

# out = the check's code where the index lies outside [-n, n) (unsigned: outside [0, n))
_SIGNED = "out = (idx < lo || idx >= n) ? code : 0;"
_UNSIGNED = "out = (idx >= (unsigned long long)n) ? code : 0;"
_kernels = {}


def on_device():
    """Whether the GPU's bounds checks run on the device (``config.device_bounds_check``;
    ``CUVMAP_DEVICE_BOUNDS_CHECK=0``: on the host, NOTE [device-side bounds checks])."""
    return config.read("device_bounds_check")


def code_for(message):
    """The code that stands for ``message`` in the error word (1, 2, ...)."""
    with _lock:
        code = _codes.get(message)
        if code is None:
            code = len(_messages)
            _messages.append(message)
            _codes[message] = code
        return code


def _word(cp):
    """The error word as a 0-d int32 CuPy array on the current device (NOTE [device-side
    bounds checks]): a view of the pinned host word, or device memory without one."""
    dev = cp.cuda.runtime.getDevice()
    word = _state["device"].get(dev)
    if word is not None:
        return word
    with _lock:
        word = _state["device"].get(dev)
        if word is not None:
            return word
        if _state["ptr"] is None and not _state["fallback"]:
            try:
                ptr = cp.cuda.runtime.hostAlloc(4, _HOST_ALLOC_PORTABLE | _HOST_ALLOC_MAPPED)
            except Exception:  # noqa: BLE001 - no pinned mapped memory: the device word below
                _state["fallback"] = True
            else:
                host = ctypes.c_int32.from_address(ptr)
                host.value = 0
                _state["ptr"], _state["host"] = ptr, host
        if _state["ptr"] is not None:
            mem = cp.cuda.UnownedMemory(_state["ptr"], 4, None, dev)
            word = cp.ndarray((), np.int32, cp.cuda.MemoryPointer(mem, 0))
        else:  # from the default pool, never a graph's private one
            with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
                word = cp.zeros((), np.int32)
        _state["device"][dev] = word
        return word


def _kernel(cp, dtype):
    unsigned = np.dtype(dtype).kind == "u"
    k = _kernels.get((cp, unsigned))
    if k is None:
        k = _kernels[(cp, unsigned)] = cp.ElementwiseKernel(
            "T idx, int64 lo, int64 n, int32 code", "int32 out", _UNSIGNED if unsigned else _SIGNED,
            "cuvmap_index_bounds_u" if unsigned else "cuvmap_index_bounds")
    return k


def check_on_device(idx, n, message, negative=True):
    """Checks on the device that the CuPy integer array ``idx`` lies in ``[-n, n)`` (in
    ``[0, n)`` where ``negative`` is False); an index outside makes a later call raise
    ``IndexError(message ...)`` (NOTE [device-side bounds checks]). Raises first the error
    an earlier check found, if the host sees one."""
    raise_pending()
    if idx.size == 0:
        return
    cp = backend.cupy_module()
    word = _word(cp)
    codes = _kernel(cp, idx.dtype)(idx, -int(n) if negative else 0, int(n), code_for(message))
    cp.maximum(word, codes.max(), out=word)


def pending():
    """The code the host sees in the error word now (0: none), without synchronising."""
    host = _state["host"]
    return 0 if host is None else int(host.value)


def _error(code):
    message = _messages[code] if 0 < code < len(_messages) else "an index is out of bounds"
    return IndexError(f"{message} (found on the GPU by a bounds check of work queued earlier; that gather read a "
                      "wrapped-around index, so what was computed from it is wrong)")


def raise_pending():
    """Raises the IndexError of the error word, if the host sees one (and clears it)."""
    host = _state["host"]
    if host is None or not host.value:
        return
    code = int(host.value)
    host.value = 0
    raise _error(code)


def check():
    """Synchronises the current device and raises the IndexError a device-side bounds
    check has found since the last report (the user's synchronisation point)."""
    cp = backend.cupy_module()
    if cp is None:
        return
    cp.cuda.Device().synchronize()
    if _state["fallback"]:
        word = _state["device"].get(cp.cuda.runtime.getDevice())
        if word is not None:
            code = int(word.get())
            if code:
                word.fill(0)
                raise _error(code)
        return
    raise_pending()
