"""float32 GEMMs on oneDNN's matmul, run on OpenMP's team where another library's team
spins (NOTE [GEMMs on the spinning team]): :func:`team_gemms` decides once per process,
:func:`matmul` computes ``a @ b`` for 2-d NumPy operands of any strides; and the stacks of
outer products that per-example gradients of dense layers are, on oneDNN's matmul in every
process (NOTE [outer products on the team]: :func:`outer`). The primitives are cached per
shapes and strides, as the convolutions' plans are (NOTE [plan cache] in
cuvmap/cpu/onednn.py, whose batch pieces the outer products share). This module imports
nothing of cuvmap but the CPU binding and :mod:`cuvmap.lru`.
"""
import ctypes
import os
import threading

import numpy as np

from cuvmap.cpu import libdnnl, onednn, openmp
from cuvmap.cpu import threads as cpu_threads
from cuvmap.cpu.threads import MIN_PARALLEL_MNK
from cuvmap.cpu.libdnnl import DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD, DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, ExecArg
from cuvmap.lru import LRU

# NOTE [GEMMs on the spinning team]
# Where another library loaded GNU OpenMP first (torch imported before cuvmap's first
# convolution) or the user set a spinning policy, OpenMP's idle workers spin for
# milliseconds after every region, and cuvmap keeps OpenBLAS's second thread off their
# cores: inside the spin window a GEMM runs on one OpenBLAS thread (NOTE [oneDNN beside
# another OpenMP user] in cuvmap/cpu/openmp.py). In a training step the window covers
# nearly every GEMM. torch runs its GEMMs on the spinning team itself, which takes the
# work at once. So in that mode cuvmap's float32 matrix products of two 2-d operands run
# on oneDNN's matmul (brgemm on AVX-512), on the same team: on the benchmark CNN's dense
# layer (128×12800 by 12800×10, and its two gradients) it measured faster than OpenBLAS
# on two threads, let alone one.
# Bits: oneDNN's matmul gives the same bits on one thread or two and for a row whatever
# the number of rows (tests/cpu/test_onednn_matmul.py checks both), but not OpenBLAS's
# bits. So the choice is made once per process, at its first float32 GEMM of at least
# threads.MIN_PARALLEL_MNK multiply-adds, from facts fixed by then: oneDNN available,
# the "openmp" threading mode, and a team that spins (libgomp.so.1 already loaded by
# another library, or OMP_WAIT_POLICY / GOMP_SPINCOUNT set so that it spins). libdnnl is
# loaded at that moment if the first convolution has not loaded it yet. Every product of
# the process then takes the same path, eager or planned, first call or later: the
# window's timing never shows in a result. The matmul runs on the team's threads as they
# are: the busy-machine rule (NOTE [threads under a busy machine] in cuvmap/cpu/threads.py)
# narrows the convolutions and OpenBLAS, not it, so that no load of the machine can change
# a product's kernel split. Where cuvmap loaded GNU OpenMP itself
# (PASSIVE: its workers sleep, and waking them for each GEMM costs more than OpenBLAS's
# own spinning pool) nothing changes. set_team_gemms() overrides the decision (tests).
_lock = threading.Lock()
_decision = {"team": None}       # None: not decided yet
CACHE_SIZE = 128
_primitives = LRU(CACHE_SIZE)


def set_team_gemms(flag):
    """Forces the decision (True, False) or lets the next GEMM make it again (None);
    returns the previous one."""
    with _lock:
        previous = _decision["team"]
        _decision["team"] = flag
        return previous


def _team_spins_once_loaded():
    """Whether OpenMP's team will spin after regions once libdnnl is loaded (or does)."""
    if libdnnl.loaded():
        return openmp.spin_seconds_in_force() > 0
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return openmp.spin_seconds(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")) > 0
    return openmp.libgomp_loaded()


def team_gemms():
    """Whether this process runs its float32 GEMMs on oneDNN's matmul (NOTE [GEMMs on the
    spinning team]); decided at the first call."""
    team = _decision["team"]
    if team is not None:
        return team
    with _lock:
        if _decision["team"] is None:
            decided = _team_spins_once_loaded() and libdnnl.available()
            _decision["team"] = bool(decided and openmp.mode() == "openmp" and openmp.spin_seconds_in_force() > 0)
        return _decision["team"]


class _Matmul:
    """A matmul primitive for operands of fixed shapes and element strides."""

    def __init__(self, a_layout, b_layout, c_layout):
        lib = libdnnl.lib
        f32 = np.dtype(np.float32)
        self.mds = [libdnnl.plain_md(shape, strides, f32) for shape, strides in (a_layout, b_layout, c_layout)]
        attr = libdnnl.user_attr()
        pd = ctypes.c_void_p()
        what = f"matmul {a_layout[0]} @ {b_layout[0]}"
        try:
            libdnnl.check(lib.dnnl_matmul_primitive_desc_create(
                ctypes.byref(pd), libdnnl.engine, self.mds[0], self.mds[1], None, self.mds[2], attr), what)
            self.primitive = libdnnl.Primitive(pd, what)
            pd = ctypes.c_void_p()     # owned by the primitive now
        finally:
            if pd:
                lib.dnnl_primitive_desc_destroy(pd)
            lib.dnnl_primitive_attr_destroy(attr)

    def run(self, a, b, c):
        lib = libdnnl.lib
        memories = []
        try:
            args = []
            for arg, md, array in ((DNNL_ARG_SRC, self.mds[0], a), (DNNL_ARG_WEIGHTS, self.mds[1], b),
                                   (DNNL_ARG_DST, self.mds[2], c)):
                m = ctypes.c_void_p()
                libdnnl.check(lib.dnnl_memory_create(ctypes.byref(m), md, libdnnl.engine,
                                                     ctypes.c_void_p(array.ctypes.data)), "dnnl_memory_create")
                memories.append(m)
                args.append((arg, m))
            if self.primitive.scratchpad:
                m = ctypes.c_void_p()
                libdnnl.check(lib.dnnl_memory_create(
                    ctypes.byref(m), self.primitive.scratchpad_md, libdnnl.engine,
                    ctypes.c_void_p(libdnnl.arena("scratchpad", self.primitive.scratchpad))), "dnnl_memory_create")
                memories.append(m)
                args.append((DNNL_ARG_SCRATCHPAD, m))
            packed = (ExecArg * len(args))(*[ExecArg(k, m) for k, m in args])
            stream = libdnnl.stream()
            libdnnl.check(lib.dnnl_primitive_execute(self.primitive.handle, stream, len(args), packed),
                          "dnnl_primitive_execute (matmul)")
            libdnnl.check(lib.dnnl_stream_wait(stream), "dnnl_stream_wait")
        finally:
            for m in memories:
                lib.dnnl_memory_destroy(m)

    def __del__(self):
        if libdnnl.lib is not None:
            for md in getattr(self, "mds", ()):
                libdnnl.lib.dnnl_memory_desc_destroy(md)


def _layout(a):
    return tuple(a.shape), tuple(s // a.itemsize for s in a.strides)


def matmul(a, b):
    """``a @ b`` for 2-d float32 NumPy arrays (any strides that are whole elements), on
    oneDNN's matmul and OpenMP's team; the result is C-contiguous."""
    c = np.empty((a.shape[0], b.shape[1]), np.float32)
    get_threads = openmp.functions()[0]
    # oneDNN sizes a primitive's work split for the team it is made with (as the
    # convolutions' plans are keyed: NOTE [plan cache] in cuvmap/cpu/onednn.py)
    key = (_layout(a), _layout(b), get_threads() if get_threads is not None else 0)
    plan = _primitives.get(key)
    if plan is None:
        plan = _primitives.put(key, _Matmul(key[0], key[1], _layout(c)))
    try:
        plan.run(a, b, c)
    finally:
        openmp.region_ended()     # (its workers spin now)
    return c


def usable(a, b):
    """Whether :func:`matmul` takes these operands: 2-d float32 NumPy arrays, non-empty,
    with strides of whole elements (NumPy's views of a float32 array have them)."""
    return (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == np.float32 and b.dtype == np.float32
            and a.ndim == 2 and b.ndim == 2 and a.size > 0 and b.size > 0
            and all(s > 0 and s % 4 == 0 for s in a.strides + b.strides))


def product(a, b):
    """``a @ b`` of two matrices on the CPU, as ``dot_general``'s layouts run it: on
    OpenBLAS (NumPy's ``@``), or on :func:`matmul` where this process runs its GEMMs on
    OpenMP's spinning team (NOTE [GEMMs on the spinning team]: float32, from
    MIN_PARALLEL_MNK multiply-adds; a rule of the shapes and the process, never of the
    timing)."""
    if a.shape[0] * a.shape[1] * b.shape[-1] >= MIN_PARALLEL_MNK and usable(a, b) and team_gemms():
        return matmul(a, b)
    return a @ b


# NOTE [outer products on the team]
# The per-example gradient of a dense layer is a stack of outer products,
# c[i] = a[i] ⊗ b[i] (dot_general with nothing contracted), B·n·m floats written from
# B·(n + m) read: a pass bound by the memory. NumPy's broadcast multiply writes it on one
# core, and once the result outgrows the caches (the benchmark CNN's 12800 × 10 per example,
# from about batch 16) one core's stores are the limit: on the project's Ice Lake machine
# two OpenMP threads of oneDNN's matmul, the same product as a batched matmul with K = 1
# ((B, n, 1) @ (B, 1, m)), wrote it in about half NumPy's time at batch 32, with torch
# imported first or not, and the 62.5 MiB of batch 128 (its pages faulted in afresh each
# call: NOTE [large results are mapped afresh] in cuvmap/transforms/executor/host_memory.py)
# a sixth to a third faster; below OUTER_MIN_ELEMENTS (a result that stays in the caches)
# NumPy was as fast or faster. ``python -m benchmarks eager`` times the two side by side (its
# dense layer's table). Each element is one product with nothing summed, so the bits are
# NumPy's whatever the threads or the split (tests/cpu/test_onednn_matmul.py checks it bit
# for bit), and unlike the GEMMs of NOTE [GEMMs on the spinning team] no decision per
# process is needed: every float32 stack that large takes it where oneDNN loads, under the
# busy-machine rule as the convolutions are (NOTE [threads under a busy machine] and NOTE
# [two thread pools] in cuvmap/cpu/threads.py). A primitive made for the exact batch costs
# about a millisecond at its first call, which Poisson batches (a new size nearly every
# step) would pay every step; running every batch in power-of-two pieces as the
# convolutions do (NOTE [batch buckets] in cuvmap/cpu/onednn.py) cost a fixed odd batch
# up to a third more on every call (7 pieces at 127). So a batch size met for the first
# time runs in pieces, a primitive each writing its slice, and from its second call on in
# one exact primitive: a fixed batch pays the pieces once, a Poisson batch only for the
# sizes it never meets again. The bits are the same either way.
OUTER_MIN_ELEMENTS = 1 << 21


def outer_usable(a, b):
    """Whether :func:`outer` takes ``a`` (B, n) and ``b`` (B, m): float32 NumPy arrays of
    strides that are positive whole elements, a result of at least OUTER_MIN_ELEMENTS
    elements, oneDNN loadable."""
    return (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == np.float32 and b.dtype == np.float32
            and a.ndim == 2 and b.ndim == 2 and a.shape[0] == b.shape[0]
            and a.shape[0] * a.shape[1] * b.shape[1] >= OUTER_MIN_ELEMENTS
            and all(s > 0 and s % 4 == 0 for s in a.strides + b.strides) and libdnnl.available())


def outer(a, b):
    """``c[i, j, k] = a[i, j] · b[i, k]`` for ``a`` (B, n) and ``b`` (B, m) that
    :func:`outer_usable` takes: a C-contiguous (B, n, m) float32 result written by oneDNN's
    matmul on OpenMP's team (NOTE [outer products on the team]), bit for bit NumPy's
    ``a[:, :, None] * b[:, None, :]``."""
    if not libdnnl.available():   # (loads it: outer_usable's check, for a direct call)
        raise RuntimeError(f"onednn_matmul.outer: oneDNN is not available ({libdnnl.load_error()})")
    (batch, n), m = a.shape, b.shape[1]
    (a0, a1), (b0, b1) = (s // 4 for s in a.strides), (s // 4 for s in b.strides)
    c = np.empty((batch, n, m), np.float32)
    cpu_threads.quiet_blas_pool()
    with cpu_threads.limited(cpu_threads.target(), openmp=True):
        get_threads = openmp.functions()[0]
        threads = get_threads() if get_threads is not None else 0

        def key_for(size):
            return "outer", ((size, n, 1), (a0, a1, 1)), ((size, 1, m), (b0, m * b1, b1)), threads

        # a batch size met for the first time runs in power-of-two pieces, from its second
        # call on in one piece (NOTE [outer products on the team])
        exact = key_for(batch)
        first_sight = _primitives.get(exact) is None and _outer_sizes_seen.get(exact) is None
        if first_sight:
            _outer_sizes_seen.put(exact, True)
        try:
            for start, size in (onednn._binary_pieces(batch) if first_sight else [(0, batch)]):
                key = key_for(size)
                plan = _primitives.get(key)
                if plan is None:
                    plan = _primitives.put(key, _Matmul(key[1], key[2], ((size, n, m), (n * m, m, 1))))
                end = start + size
                plan.run(a[start:end], b[start:end], c[start:end])
        finally:
            openmp.region_ended()     # (its workers spin now, where they do)
    return c


_outer_sizes_seen = LRU(4 * CACHE_SIZE)   # the outer products' layouts met once (NOTE [outer products on the team])
