"""Host memory: the C allocator asked to keep what programs free (NOTE [keeping freed host
memory]), and why a program's large results are mapped afresh (NOTE [large results are
mapped afresh]). The first CPU plan calls :func:`keep_host_memory`; ``jit`` calls
:func:`release_host_memory` after it dropped buffers it kept.
"""
import ctypes
import os
import sys
import threading


# NOTE [keeping freed host memory]
# The pool covers the buffers that the plan itself writes (out=). Everything else a step
# allocates — the outputs of non-elementwise primitives, the temporaries inside an impl
# (a convolution's columns) — comes from the C allocator and goes back to it, and glibc's
# malloc hands the top of its heap back to the system whenever more than its trim
# threshold is free there. A program that allocates more than that in one call and frees
# it by the end is trimmed after every call, so the next call faults all those pages in
# again (on the project's CPU machines a fault costs more than writing the page; the
# DP-SGD step of examples/dp_sgd_digits.py took about 2000 faults per call). glibc raises
# its thresholds by itself as large arrays come and go, but only to the size of the largest
# mmapped block freed so far (it ends at 32 MiB for mmap, twice that for trimming). When it
# first plans a CPU program the executor sets both to those ceilings (mallopt
# M_MMAP_THRESHOLD = 32 MiB, M_TRIM_THRESHOLD = 64 MiB), so that up to 64 MiB freed at the
# top of the heap stay mapped and a steady state reuses its pages. It is process-wide, as
# glibc's own adjustment is, and eager code later in the process keeps its pages too. It
# does nothing where the user chose (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
# MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_ or a glibc.malloc tunable in GLIBC_TUNABLES set: theirs
# wins), off Linux, or on a C library without mallopt (musl); host_memory_setting() says
# which applied.

# NOTE [large results are mapped afresh]
# glibc serves a block above its mmap threshold from the heap only when a free chunk there
# is large enough (at most the trim threshold, 64 MiB, stays free at the heap's top), else
# from a mapping of its own, unmapped when the block is freed; and the threshold cannot go
# above 32 MiB (mallopt refuses more: half of glibc's largest heap). So an array of more
# than 32 MiB may fault all its pages in again on every call that allocates it, depending
# on what else the heap holds. Buffer planning keeps the results that a writer puts into
# the plan's buffers; the rest are the results of primitives without a writer
# (dot_general, the convolutions) and the program's outputs. The per-example gradient of
# the benchmark CNN's dense layer is both: 62.5 MiB at batch 128, and every page fault of a
# jit(vmap(grad)) call is in the one dot_general step that writes it (inside a jitted DP
# step two copies of its transposed view, for the norms and the weighted sum, fault as
# well). It stays that way, for two reasons:
#
# - an output belongs to the caller. Writing a call's output into the buffer of an
#   earlier one once the caller has let go of it (its reference count) would trust every
#   caller never to keep the data through a raw pointer, and in a loop ``g = f(...)`` the
#   previous result is still alive during the call: the plan would keep two sets of
#   outputs between calls. JAX's answer, donation, lets an argument's buffer take an
#   output; cuvmap's ``donate_argnums`` only lets elementwise steps write over it;
# - glibc's M_MMAP_MAX = 0 (no mappings at all) would serve every large block of the
#   process from the heap, where a block freed below a live one never goes back to the
#   system: the process would keep its peak memory. That is the user's decision to make.
#
# What a user can do: keep each large array of a call at or below 32 MiB (the benchmark CNN
# at batch 64: its dense gradient is 31.25 MiB, which the heap keeps: no page faults), or
# set ``MALLOC_MMAP_MAX_=0`` and a ``MALLOC_TRIM_THRESHOLD_`` above the program's
# footprint in the environment (cuvmap then leaves malloc as it is: no page faults per
# call, and the peak stays mapped). ``python -m benchmarks per_example --batch 64 128``
# shows the page faults per call, with and without those variables.

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_host_memory = None
_host_memory_lock = threading.Lock()


def _set_host_memory():
    user = [k for k in _MALLOC_ENV if k in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        user.append("GLIBC_TUNABLES")
    if user:
        return f"the user's ({', '.join(user)} set)"
    if not sys.platform.startswith("linux"):
        return f"unchanged ({sys.platform}: no glibc)"
    try:
        libc = ctypes.CDLL(None)
        mallopt, version = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return "unchanged (a C library without glibc's mallopt)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    version.restype = ctypes.c_char_p
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        return "unchanged (mallopt refused)"
    return (f"glibc {version().decode()}: mmap threshold {MMAP_THRESHOLD_BYTES >> 20} MiB, trim threshold "
            f"{TRIM_THRESHOLD_BYTES >> 20} MiB (set by cuvmap's jit)")


def keep_host_memory():
    """Sets glibc's malloc to keep freed memory mapped (NOTE [keeping freed host memory]),
    once per process; the first CPU plan calls it. Returns :func:`host_memory_setting`."""
    global _host_memory
    with _host_memory_lock:
        if _host_memory is None:
            _host_memory = _set_host_memory()
    return _host_memory


def release_host_memory():
    """Hands the free memory at the top of glibc's heaps back to the operating system
    (``malloc_trim(0)``) after a jitted function dropped buffers it kept; returns whether
    the C library has ``malloc_trim`` (glibc on Linux)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim if sys.platform.startswith("linux") else False
        except (OSError, AttributeError):
            _malloc_trim = False
        if _malloc_trim:
            _malloc_trim.argtypes, _malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    if _malloc_trim:
        _malloc_trim(0)
    return bool(_malloc_trim)


_malloc_trim = None


def host_memory_setting():
    """What :func:`keep_host_memory` did (a sentence), or None before any CPU plan."""
    return _host_memory
