"""The planned executor: runs a staged program without tracers.

A program is planned once (:func:`plan`): every value gets a slot, and each equation (or
fused group of them) becomes a :class:`Step`; the plan decides where each result is
written (NOTE [buffer planning]) and compiles the steps into one straight-line Python
function with no tracer objects, no rule lookups and no dictionaries (NOTE [a plan runs
as generated Python]). The first CPU plan asks the C allocator to keep the memory programs free (NOTE
[keeping freed host memory]).
"""
import ctypes
import dataclasses
import os
import sys
import threading

import numpy as np

from cuvmap import backend, config, lru
from cuvmap.cuda import graphs as cuda_graphs, kernels
from cuvmap.transforms import fusion, ir

# step kinds (FUSED: a fused elementwise kernel; MULTI: an equation with several results,
# NOTE [an equation with several results] in ir.py; the output of both is a tuple of slots)
PLAIN, IN_PLACE, POOLED, FUSED, MULTI = 0, 1, 2, 3, 4

# Buffers smaller than this are not reused: allocating them is cheaper than the pool.
MIN_REUSE_BYTES = 4096


# NOTE [buffer planning]
# On the CPU fresh arrays are slow to touch (every page faults on its first write), so a
# program should write into memory it already has. The plan follows each buffer through
# the program as a *group*: the slots that may share its memory (a reshape or a slice of
# it, anything a primitive might return as a view). What a result may share is a fact of
# its primitive (cuvmap.core.Primitive): a primitive with a writer (``impl_into``; a ufunc
# impl is its own) returns a new array that owns its memory, the *root* of a group of its
# own; an ``owns_output`` result (a reduction, a product, a convolution) starts a group
# without a root (it may be a view of a temporary of the impl's); any other result joins
# the groups of its operands. A fused kernel's outputs are roots of groups of their own,
# never pooled; the results of an equation with several results (a call) join their
# operands' groups. Then, for a step of a primitive with a writer, without params, whose
# output has at least MIN_REUSE_BYTES (and for which ``impl_into_when`` holds):
#
# - in place: when an operand is the only root of a group none of whose slots is used
#   later or returned, with the output's shape and dtype, the writer writes over it
#   (``out=``); the output carries on the group. Cotangent sums ``add(ct, ct_i)``
#   accumulate this way;
# - pooled (on the CPU): otherwise the output goes into a buffer of the plan's pool (a
#   list per shape and dtype) when one is free, else wherever the impl puts it (a writer
#   that is not the impl, select's blend, gets a fresh buffer instead, so that the pool
#   still receives one);
#
# and when a group dies (its last slot's last use), its roots go back to the pool. On the
# CPU the pool belongs to the plan and survives across calls, so a steady state allocates
# almost only the program's outputs, which are never pooled (they belong to the caller:
# NOTE [large results are mapped afresh]); a checkpointed region's plan empties its pool
# after each run (NOTE [a region's buffers die with its run] in remat.py). On the GPU a
# plan writes in place only and pools nothing across calls: a buffer kept from the
# previous call could still be read by one of its kernels on another stream, while CuPy's
# own pool, which a fresh result comes from, orders its blocks by stream (and a captured
# graph's buffers belong to the graph: NOTE [graph replay] in cuvmap/cuda/graphs.py).
# Arguments are never written, except the donated ones (``jit(donate_argnums=...)``),
# which may be written in place but are never pooled. At run time a root is reused only
# if it still is a base array of the plan's array type (a guard against an impl that
# returned a view or a scalar), and a writer may decline (TypeError, ValueError): the step
# then calls the impl.


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


def pool_bytes(p):
    """The bytes held by plan ``p``'s pool (NOTE [buffer planning])."""
    return sum(b.nbytes for buffers in list(p.pool.values()) for b in list(buffers))


def empty_pool(p):
    """Drops the buffers of plan ``p``'s pool; the lists stay (the plan's generated code
    holds them), so the next call refills them. Returns the bytes dropped."""
    dropped = 0
    for buffers in list(p.pool.values()):
        dropped += sum(b.nbytes for b in list(buffers))
        buffers.clear()
    return dropped


def host_memory_setting():
    """What :func:`keep_host_memory` did (a sentence), or None before any CPU plan."""
    return _host_memory


@dataclasses.dataclass(slots=True)
class Step:
    """One step of a plan: an equation, or a fused group of them. ``impl`` is what it
    calls (the primitive's impl, or the group's kernel) on the slots ``ins`` with
    ``params``.

    ``kind``: PLAIN (``out = impl(*ins, **params)``), IN_PLACE (written by ``writer`` over
    slot ``aux``), POOLED (written by ``writer`` into a buffer of the pool's list for key
    ``aux``, a ``(shape, dtype)``), FUSED (a fused kernel) or MULTI (an equation with
    several results); ``out`` is a slot, or a tuple of slots for FUSED and MULTI.
    ``release``: the ``(slot, pool key)`` pairs whose buffers go back to the pool after
    the step; ``clear``: the slots dropped after it (their last use). ``direct``: a writer
    that may put the result into any buffer of its aval, such as the row of a loop's
    stacked result (NOTE [a loop runs as generated Python] in loop_plans.py), or None."""

    kind: int
    impl: object
    ins: tuple
    out: object
    params: dict
    aux: object = None
    release: tuple = ()
    clear: tuple = ()
    writer: object = None
    direct: object = None

    @property
    def outs(self):
        """The output slots, as a tuple for every kind."""
        return self.out if self.kind in (FUSED, MULTI) else (self.out,)


class Plan:
    """A planned program: its steps (data), the initial slot values (constants and
    literals), the argument and output slots, the buffer pool, and the generated function
    that runs it (NOTE [a plan runs as generated Python])."""

    __slots__ = ("steps", "init", "in_slots", "out_slots", "pool", "array_types", "empty", "num_reused_steps",
                 "source", "program", "memory", "_peak", "out_is_scalar", "loops", "scopes")

    def __init__(self, steps, init, in_slots, out_slots, array_types, out_is_scalar, memory=None, scopes=None):
        self.steps = steps
        # each step's named scope (NOTE [named scopes] in core.py): its equation's name
        # stack, a fused group's the part its equations share; cuvmap.profiler reads them
        self.scopes = scopes if scopes is not None else [()] * len(steps)
        self.init = init
        self.in_slots = in_slots
        self.out_slots = out_slots
        self.out_is_scalar = out_is_scalar
        self.loops = {}  # the loops that run it: NOTE [a loop runs as generated Python] in loop_plans.py
        self.pool = {}
        self.array_types = array_types
        self.empty = backend.xp_for("gpu").empty if array_types[0] is not np.ndarray else np.empty
        self.num_reused_steps = sum(1 for s in steps if s.kind != PLAIN)
        self.memory = memory  # what planned_peak_bytes reads (NOTE [planned peak memory])
        self._peak = None
        self.source, namespace = _compile(self)
        exec(code_of(self.source, "<cuvmap plan>"), namespace)
        self.program = namespace["program"]


def _nbytes(aval):
    return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


def _gpu_device(closed):
    """The device (``"gpu:<id>"``) of a GPU program, or None for a CPU one."""
    avals = [v.aval for v in closed.jaxpr.constvars + closed.jaxpr.invars]
    avals += [v.aval for e in closed.jaxpr.eqns for v in e.outs]
    return next((a.device for a in avals if a.device and a.device.startswith("gpu")), None)


def _is_gpu_program(closed):
    return _gpu_device(closed) is not None


def host_arguments(closed):
    """``(indices, device)``: the arguments of a GPU program that are NumPy arrays, which
    ``jit`` puts on the program's device at each call (NOTE [host arrays meet device
    arrays] in cuvmap/backend.py), and that device; ``((), None)`` for other programs."""
    device = _gpu_device(closed)
    if device is None:
        return (), None
    return tuple(i for i, v in enumerate(closed.jaxpr.invars) if v.aval.device == "cpu"), device


def _constants_on_device(closed, units):
    """A GPU program's constants, each NumPy array that a step reads put on the program's
    device once (NOTE [host arrays meet device arrays] in cuvmap/backend.py); a constant
    that the program only returns stays where it is."""
    read = {v for u in units for v in u.inputs if not isinstance(v, ir.Literal)}
    cp = backend.xp_for("gpu")
    with cp.cuda.Device(int(_gpu_device(closed).split(":")[1])):
        return [cp.asarray(c) if type(c) is np.ndarray and v in read else c
                for v, c in zip(closed.jaxpr.constvars, closed.consts)]


def _capturable(p):
    """``Primitive.capturable``, whose default (None) is ``not host_sync``."""
    return (not p.host_sync) if p.capturable is None else bool(p.capturable)


def graph_capturable(closed):
    """Whether ``closed`` may be captured as a CUDA graph: it runs on the GPU and every
    equation, those of the programs it calls included, is ``capturable`` (a primitive
    fact: no host read, no library a capture refuses)."""
    def programs(value):
        if isinstance(value, ir.ClosedJaxpr):
            return [value]
        if isinstance(value, tuple):  # cond's branches
            return [v for v in value if isinstance(v, ir.ClosedJaxpr)]
        return []

    def syncs_in(jaxpr):  # the programs of calls (checkpointed regions, loops, ...) included
        for e in jaxpr.eqns:
            if not _capturable(e.primitive):  # NOTE [graph replay] in cuvmap/cuda/graphs.py
                return True
            if any(syncs_in(p.jaxpr) for v in e.params.values() for p in programs(v)):
                return True
        return False

    return _is_gpu_program(closed) and not syncs_in(closed.jaxpr)


def plan(closed, donated=(), fuse=None, fused_callable=None, graphs=None):
    """Plans ``closed`` (NOTE [buffer planning]); ``donated`` holds the indices of the
    arguments whose buffers may be overwritten.

    ``fuse``: whether chains of elementwise equations run as fused kernels
    (:mod:`cuvmap.transforms.fusion`); by default on the GPU when the ``jit_gpu_fusion``
    setting is on. ``fused_callable(group)`` makes the callable of a group: by default a
    CuPy kernel (``cuvmap/cuda/kernels.py``); the CPU tests pass the group's reference.
    ``graphs``: whether the plan's program replays as a CUDA graph after its first call
    (:func:`graph_capturable` programs only; by default the ``jit_cuda_graphs`` setting).

    The phases: the units (equations, or fused groups of them), a slot for every value
    and the last use of each (:class:`_Slots`), where each unit writes its result
    (:func:`_place_results`, over the buffers' groups of :class:`_Groups`), what is
    released to the pool and cleared after each step (:func:`_schedule_frees`), and the
    generated function (:class:`Plan`, :func:`_compile`).
    """
    j = closed.jaxpr
    gpu = _is_gpu_program(closed)
    if fuse is None:
        fuse = gpu and config.jit_gpu_fusion
    units = fusion.fuse(j.eqns, j.outvars) if fuse else list(j.eqns)
    slots = _Slots(closed, units, _constants_on_device(closed, units) if gpu else closed.consts)
    groups = _Groups(slots, donated)
    steps = _place_results(units, slots, groups, gpu, fused_callable or _cuda_fused_callable)
    _schedule_frees(steps, slots, groups, gpu)
    array_types = (backend.xp_for("gpu").ndarray,) if gpu else (np.ndarray,)
    if not gpu and _host_memory is None:
        keep_host_memory()
    out_is_scalar = [any(v.aval.shape == () for v in _unit_outputs(u)) for u in units]
    p = Plan(steps, slots.init, slots.in_slots, slots.out_slots, array_types, out_is_scalar,
             _MemoryFacts(units, steps, slots, groups), [_unit_scope(u) for u in units])
    if graphs is None:
        graphs = config.jit_cuda_graphs
    if graphs and graph_capturable(closed):
        def make_program():  # a plan of its own: its buffers belong to the graph
            return plan(closed, donated, fuse, fused_callable, graphs=False).program

        p.program = cuda_graphs.GraphRunner(p.program, make_program)
    return p


def _unit_scope(unit):
    """The name stack of a unit: its equation's, or the part its equations share."""
    if not isinstance(unit, fusion.FusedGroup):
        return unit.name_stack
    shared = unit.eqns[0].name_stack
    for eqn in unit.eqns[1:]:
        n = 0
        while n < min(len(shared), len(eqn.name_stack)) and shared[n] == eqn.name_stack[n]:
            n += 1
        shared = shared[:n]
    return shared


def _unit_outputs(unit):
    """The variables a unit (an equation or a fused group) computes."""
    return unit.outputs if isinstance(unit, fusion.FusedGroup) else unit.outs


class _Slots:
    """The plan's slots: one per constant, argument, literal and unit result, numbered in
    program order (``init`` holds the constants' and literals' values, None for the
    others), the slots each unit reads, the avals of the non-literal slots, and the
    index of the last unit that reads each slot (``never`` for the returned ones)."""

    __slots__ = ("init", "slot_of", "const_slots", "in_slots", "literal_slots", "unit_ins", "out_slots", "aval_of",
                 "last_use", "never")

    def __init__(self, closed, units, consts):
        j = closed.jaxpr
        self.init = []
        self.slot_of = {}
        self.literal_slots = set()
        for v, c in zip(j.constvars, consts):
            self.slot_of[v] = self._new(c)
        self.const_slots = [self.slot_of[v] for v in j.constvars]
        self.in_slots = []
        for v in j.invars:
            self.slot_of[v] = self._new()
            self.in_slots.append(self.slot_of[v])
        self.unit_ins = []
        for unit in units:
            self.unit_ins.append([self._read(x) for x in unit.inputs])
            for v in _unit_outputs(unit):
                self.slot_of[v] = self._new()
        self.out_slots = [self._read(v) for v in j.outvars]
        self.aval_of = {self.slot_of[v]: v.aval for v in list(j.constvars) + list(j.invars)}
        for unit in units:
            for v in _unit_outputs(unit):
                self.aval_of[self.slot_of[v]] = v.aval
        self.never = len(units)
        self.last_use = {}
        for k, ins in enumerate(self.unit_ins):
            for s in ins:
                self.last_use[s] = k
        for s in self.out_slots:
            self.last_use[s] = self.never

    def _new(self, value=None):
        self.init.append(value)
        return len(self.init) - 1

    def _read(self, x):
        """The slot of a variable, or a new slot holding a literal's value."""
        if isinstance(x, ir.Literal):
            s = self._new(x.val)
            self.literal_slots.add(s)
            return s
        return self.slot_of[x]


class _Groups:
    """The buffers' groups (NOTE [buffer planning]): ``groups[g] = [members, roots,
    poolable]`` for the group named by slot ``g``, ``group_of[s]`` the group of slot
    ``s``. The arguments (roots: the donated ones) and constants start groups of their
    own, never pooled."""

    __slots__ = ("groups", "group_of", "last_use")

    def __init__(self, slots, donated):
        self.groups = {}
        self.group_of = {}
        self.last_use = slots.last_use
        for i, s in enumerate(slots.in_slots):
            self.new(s, [s] if i in donated else [], False)
        for s in slots.const_slots:
            self.new(s, [], False)

    def new(self, s, roots, poolable):
        self.groups[s] = [{s}, list(roots), poolable]
        self.group_of[s] = s

    def join(self, slots, outs):
        """Merges the groups of ``slots`` into one, which ``outs`` join."""
        merged = {self.group_of[s] for s in slots}
        first = merged.pop()
        members, roots, poolable = self.groups[first]
        for g in merged:
            m2, r2, p2 = self.groups.pop(g)
            members |= m2
            roots.extend(r2)
            poolable = poolable and p2
            for t in m2:
                self.group_of[t] = first
        self.groups[first][2] = poolable
        for o in outs:
            members.add(o)
            self.group_of[o] = first

    def dead_after(self, g, k):
        """Whether no member of group ``g`` is read after unit ``k`` (nor returned)."""
        return all(self.last_use.get(m, -1) <= k for m in self.groups[g][0])


def _place_results(units, slots, groups, gpu, fused_callable):
    """The steps, each with the place of its result (NOTE [buffer planning]): written in
    place over a dead operand's buffer, into a pooled buffer, or wherever its impl puts
    it; each result joins or starts a group as it goes."""
    steps = []
    for k, unit in enumerate(units):
        ins = tuple(slots.unit_ins[k])
        if isinstance(unit, fusion.FusedGroup):
            # a kernel writes fresh arrays of its own: each output is a group of its own
            outs = tuple(slots.slot_of[v] for v in unit.outputs)
            for s in outs:
                groups.new(s, [s], False)
            steps.append(Step(FUSED, fused_callable(unit), ins, outs, {}))
            continue
        eqn = unit
        array_ins = [s for s in ins if s not in slots.literal_slots]
        if eqn.primitive.multiple_results:
            # a function of its own (a checkpointed region, a custom-derivative call): its
            # results may be views of its operands (an identity), so they join the
            # operands' groups
            outs = tuple(slots.slot_of[v] for v in eqn.outs)
            if array_ins:
                groups.join(array_ins, outs)
            else:
                for o in outs:
                    groups.new(o, [], False)
            steps.append(Step(MULTI, eqn.primitive.impl, ins, outs, eqn.params))
            continue
        steps.append(_place_result(k, eqn, ins, array_ins, slots, groups, gpu))
    return steps


def _place_result(k, eqn, ins, array_ins, slots, groups, gpu):
    """The step of equation ``k``, which has one result (NOTE [buffer planning])."""
    var = eqn.outs[0]
    out = slots.slot_of[var]
    aval = var.aval
    prim = eqn.primitive
    writes = prim.impl_into is not None
    reusable = (writes and not eqn.params and aval.shape and _nbytes(aval) >= MIN_REUSE_BYTES
                and (prim.impl_into_when is None or prim.impl_into_when(aval, gpu)))
    if reusable:
        for s in array_ins:
            g = groups.group_of[s]
            members, roots, _ = groups.groups[g]
            a = slots.aval_of[s]
            if (roots == [s] and a.shape == aval.shape and a.dtype == aval.dtype
                    and groups.dead_after(g, k) and all(groups.group_of[t] != g or t == s for t in array_ins)):
                members.add(out)
                groups.group_of[out] = g
                groups.groups[g][1] = [out]
                return Step(IN_PLACE, prim.impl, ins, out, eqn.params, aux=s, writer=prim.impl_into,
                            direct=_direct_writer(eqn, gpu))
        if not gpu:
            groups.new(out, [out], True)
            return Step(POOLED, prim.impl, ins, out, eqn.params, aux=(aval.shape, aval.dtype), writer=prim.impl_into,
                        direct=_direct_writer(eqn, gpu))
        # on the GPU only in place: a buffer pooled across calls could still be read by a
        # kernel of the previous call on another stream (CuPy's own pool, which a fresh
        # result comes from, orders its blocks by stream)
        groups.new(out, [out], False)
    elif writes or prim.owns_output or not array_ins:
        groups.new(out, [out] if writes else [], writes)
    else:
        groups.join(array_ins, (out,))
    impl, params = prim.impl, eqn.params
    if params and prim.impl_for is not None:
        specialized = prim.impl_for(*(x.aval for x in eqn.inputs), **params)
        if specialized is not None:
            impl, params = specialized, {}
    return Step(PLAIN, impl, ins, out, params, direct=_direct_writer(eqn, gpu))


def _direct_writer(eqn, gpu):
    """The writer of ``eqn``'s result into any buffer of its aval (``Step.direct``), or
    None: a primitive with a writer and without params whose operands have the result's
    dtype (or are Python numbers), so that NumPy picks the same loop with ``out=`` as
    without."""
    prim, aval = eqn.primitive, eqn.outs[0].aval
    if prim.impl_into is None or eqn.params or not (prim.impl_into_when is None or prim.impl_into_when(aval, gpu)):
        return None
    for x in eqn.inputs:
        if isinstance(x, ir.Literal) and not hasattr(x.val, "dtype"):
            continue
        if x.aval.dtype != aval.dtype:
            return None
    return prim.impl_into


def _schedule_frees(steps, slots, groups, gpu):
    """Sets each step's ``release`` and ``clear``: when a group dies (its last member's
    last use), its poolable roots go to the pool, and every slot is cleared after its
    last use (a group's roots after the group's, so that the pool gets them)."""
    clear_at = {k: [] for k in range(len(steps))}
    releases = {k: [] for k in range(len(steps))}
    never = slots.never
    for g, (members, roots, poolable) in groups.groups.items():
        death = max(slots.last_use.get(m, -1) for m in members)
        for m in members:
            lu = slots.last_use.get(m, -1)
            if m in roots:
                lu = death
            if 0 <= lu < never and m not in slots.in_slots and m not in slots.literal_slots:
                clear_at[lu].append(m)
        if 0 <= death < never and poolable and not gpu:  # (the GPU pools nothing across calls)
            for r in roots:
                if _nbytes(slots.aval_of[r]) >= MIN_REUSE_BYTES:
                    releases[death].append((r, (slots.aval_of[r].shape, slots.aval_of[r].dtype)))
    for k, step in enumerate(steps):
        released = {r for r, _ in releases[k]}
        step.release = tuple(releases[k])
        step.clear = tuple(s for s in clear_at[k] if s not in released) + tuple(released)


# NOTE [planned peak memory]
# A plan knows, before it runs, every buffer its steps allocate and when each dies, so it
# can say how much memory one run needs at its peak (``planned_peak_bytes``): the arrays
# the run itself allocates, its outputs included, over what already exists (its arguments
# and constants, the caller's). It follows the buffer groups of NOTE [buffer planning]: a
# result is a new allocation of its aval's size, unless it is written in place (over a
# dead operand's buffer), taken from a free buffer of the pool, or a view of an operand,
# which its primitive's ``layout`` fact says (``reshape``, ``transpose``, ``slice``, ...:
# a primitive without it is taken to allocate, the safe side for an estimate); a group's
# allocations are freed after its last member's last use, except the roots that go back
# to the pool, which stay allocated (the pool is memory the plan holds). Whether a value
# may be laid out other than in C order is followed too, because it decides copies: a
# reshape of a transposed view is a copy (its ``layout`` says so), and a product copies an
# operand that is not laid out as its GEMM needs (its ``workspace``). While a step runs it
# holds its operands, its new result, and what its impl allocates besides: for a call (a
# scan, a cond, a checkpointed region, a nested jit) the planned peak of its programs
# beyond their outputs, for a primitive with a ``workspace`` fact what that says (a
# convolution's columns, select's mask). The pool outlives the run, so a second run,
# which starts with the first one's pool, is followed too and the larger peak is the
# plan's. The figure is an estimate of the arrays, not of the process: a vendor library's
# own scratch memory (oneDNN's, cuDNN's workspace) and temporaries of impls that declare
# none are not in it, which is why a memory budget plans to a margin below it (NOTE
# [choosing a chunk] in cuvmap/memory_budget.py).

def _programs_in(params):
    """The programs in a call's params (a ClosedJaxpr, or a tuple of them: cond's branches)."""
    found = []
    for value in params.values():
        if isinstance(value, ir.ClosedJaxpr):
            found.append(value)
        elif isinstance(value, tuple):
            found.extend(v for v in value if isinstance(v, ir.ClosedJaxpr))
    return found


class _MemoryFacts:
    """What :func:`planned_peak_bytes` follows (NOTE [planned peak memory]): for each step,
    the ``(memory group, bytes, pool key or None)`` allocations of its results, its extra
    working memory (a workspace, or nested programs to ask later), the memory groups that
    die after it and the ``(memory group, bytes, pool key)`` of each root it releases to
    the pool. A memory group is one allocation and its views (the ``layout`` facts say
    which results are views), and dies when the executor has deleted every slot of it
    (the steps' ``clear``); each slot's layout (C order or maybe not) is followed along."""

    __slots__ = ("allocs", "workspace", "nested", "dies", "released")

    def __init__(self, units, steps, slots, groups):
        parent = {}

        def find(s):
            while parent.get(s, s) != s:
                s = parent[s]
            return s

        def join(slots_, outs):
            roots = {find(s) for s in slots_}
            if not roots:
                return
            first = roots.pop()
            for r in roots:
                parent[r] = first
            for o in outs:
                parent[o] = first

        strided = {}  # slot -> its layout may not be C order (arguments, constants: C order)
        allocs, self.workspace, self.nested, released = [], [], [], []
        for unit, step in zip(units, steps):
            outs = step.outs
            sizes = [_nbytes(slots.aval_of[o]) for o in outs]
            ins = [s for s in step.ins if s not in slots.literal_slots]
            in_strided = tuple(strided.get(s, False) for s in step.ins)
            nested, work, out_strided, fresh = (), 0, False, True
            key = None
            if step.kind == MULTI:  # new arrays (a call's may be views: counted as new)
                nested = tuple(_programs_in(unit.params))
            elif step.kind == IN_PLACE:  # over a dead operand's buffer, a base array
                fresh = False
                join([step.aux], outs)
            elif step.kind == POOLED:  # a pooled buffer, or the impl's result in its operands' layout
                key = step.aux
                out_strided = any(strided.get(s, False) for s in ins)
            elif step.kind == PLAIN:
                prim = unit.primitive
                if prim.layout is not None:
                    fresh, out_strided = prim.layout(in_strided, [slots.aval_of.get(s) for s in step.ins],
                                                     [slots.aval_of[o] for o in outs], unit.params)
                else:
                    out_strided = prim.impl_into is not None and any(strided.get(s, False) for s in ins)
                if not fresh:
                    join(ins, outs)
            if fresh:
                allocs.append([(o, b, key) for o, b in zip(outs, sizes)])
            else:
                allocs.append([])
            if step.kind != FUSED and unit.primitive.workspace is not None:
                # (an operand read twice is one array: its aval once, then None)
                work = int(unit.primitive.workspace(
                    [slots.aval_of.get(s) if s not in step.ins[:i] else None for i, s in enumerate(step.ins)],
                    [slots.aval_of[o] for o in outs], unit.params, in_strided))
            for o in outs:
                strided[o] = bool(out_strided)
            self.workspace.append(work)
            self.nested.append(nested)
            released.append([(s, _nbytes(slots.aval_of[s]), key) for s, key in step.release])
        # the memory groups, their deaths: the step after which the last of their slots is deleted
        self.allocs = [[(find(o), b, key) for o, b, key in a] for a in allocs]
        self.released = [[(find(s), b, key) for s, b, key in r] for r in released]
        cleared = {}
        for k, step in enumerate(steps):
            for s in step.clear:
                cleared[s] = k
        kept = set(slots.out_slots)
        death = {}
        for s in list(parent) + [o for step in steps for o in step.outs]:
            g = find(s)
            if s in kept or g in kept or death.get(g) == slots.never:
                death[g] = slots.never
            else:
                death[g] = max(death.get(g, -1), cleared.get(s, slots.never))
        self.dies = [[] for _ in steps]
        for g, k in death.items():
            if 0 <= k < slots.never:
                self.dies[k].append(g)


def planned_peak_bytes(p):
    """The bytes plan ``p`` allocates at the peak of a run, its outputs included, over its
    arguments and constants (NOTE [planned peak memory]); computed once per plan."""
    if p._peak is None:
        p._peak = _follow_memory(p.memory) if p.memory is not None else 0
    return p._peak


def _nested_peak(programs, out_bytes):
    """A call's working memory beyond its results: its largest program's planned peak."""
    peak = 0
    for program in programs:
        peak = max(peak, planned_peak_bytes(nested_plan(program)))
    return max(0, peak - out_bytes)


def _follow_memory(facts):
    pool = {}          # pool key -> free buffers
    live = peak = 0    # bytes allocated (the pool's free buffers included)
    extra = [w + (_nested_peak(n, sum(b for _, b, _ in a)) if n else 0)
             for w, n, a in zip(facts.workspace, facts.nested, facts.allocs)]
    for _ in range(2):  # the second run starts with the first one's pool
        owned = {}
        for k, allocs in enumerate(facts.allocs):
            new = 0
            for g, b, key in allocs:
                if key is not None and pool.get(key):
                    pool[key] -= 1             # a free buffer of the pool: allocated already
                else:
                    new += b
                owned[g] = owned.get(g, 0) + b
            peak = max(peak, live + new + extra[k])
            live += new
            for g, b, key in facts.released[k]:
                owned[g] = owned.get(g, 0) - b  # stays allocated, in the pool
                pool[key] = pool.get(key, 0) + 1
            for g in facts.dies[k]:
                live -= owned.pop(g, 0)
        live -= sum(owned.values())  # the outputs go to the caller; the pool stays
    return peak


def _cuda_fused_callable(group):
    return kernels.fused_elementwise(group.cuda_kernel_source(), group.shape,
                                     [v.aval.dtype for v in group.outputs], group.reference)


# NOTE [a plan runs as generated Python]
# A call of a staged program should cost little more than the impls it calls. A loop over
# step tuples pays, per step, for unpacking the tuple, building the operand list, a branch on
# the step kind and the release/clear loops; so the plan is compiled once into the source
# of one straight-line Python function (as ``dataclasses`` and ``torch.fx`` do), whose
# locals are the slots: ``r7 = f7(r3, c2)``; a slot's last use is followed by ``del r7``;
# a pooled step pops its buffer from a list bound to the (shape, dtype) key; a released
# root is appended to that list. The steps stay as data on the plan (tests and tools read
# them); :func:`source` shows the generated code.

def _operand(s, constant_slots):
    return f"c{s}" if s in constant_slots else f"r{s}"


def _call(k, ins, params, constant_slots, out=None):
    args = [_operand(s, constant_slots) for s in ins]
    if params:
        args.append(f"**p{k}")
    if out is not None:  # the step's writer: the ufunc, or the primitive's impl_into
        args.append(f"out={out}")
        return f"w{k}({', '.join(args)})"
    return f"f{k}({', '.join(args)})"


def _fresh(value):
    """A copy of a constant that a program returns (arrays are mutable; numbers are not)."""
    return value.copy() if hasattr(value, "copy") and hasattr(value, "shape") else value


def namespace_of(p):
    """The names every generated function of plan ``p`` reads, and its constants
    (``c{slot}``); returns ``(namespace, constant slots)``."""
    computed = set()
    for step in p.steps:
        computed.update(step.outs)
    constant_slots = {s for s in range(len(p.init)) if s not in computed and s not in p.in_slots}
    namespace = {"ndarray": np.ndarray, "generic": np.generic,
                 # a scalar result becomes a 0-d array of the plan's device (CuPy refuses NumPy operands)
                 "asarray": np.asarray if p.array_types[0] is np.ndarray else backend.xp_for("gpu").asarray,
                 "ARRAY_TYPES": p.array_types, "EMPTY": p.empty, "FRESH": _fresh}
    for s in constant_slots:
        namespace[f"c{s}"] = p.init[s]
    return namespace, constant_slots


def results_of(p, constant_slots):
    """The expressions of ``p``'s results: a constant returned is copied (the caller owns
    its results, and may write into them)."""
    return [f"FRESH(c{s})" if s in constant_slots else f"r{s}" for s in p.out_slots]


def step_lines(p, namespace, constant_slots, pad, direct=None, prepared=None, timed=False):
    """The lines of ``p``'s steps, indented by ``pad``, their names bound in ``namespace``
    (NOTE [a plan runs as generated Python]). ``direct``: ``{step: expression}``, the
    steps whose writer puts the result into that buffer; ``prepared``: ``{step: operand
    names}``, the steps that call their impl's ``prepared`` on those operands (NOTE [a loop
    runs as generated Python] in cuvmap/transforms/loop_plans.py). ``timed``: each step
    reads ``CLOCK()`` before and after and adds the difference to ``TIMES[k]`` (names the
    caller binds: :func:`timed_program`)."""
    direct, prepared = direct or {}, prepared or {}
    out_is_scalar = p.out_is_scalar
    lines = []
    pool_names = {}

    def pool_list(key):
        if key not in pool_names:
            name = f"P{len(pool_names)}"
            pool_names[key] = name
            namespace[name] = p.pool.setdefault(key, [])
        return pool_names[key]

    for k, step in enumerate(p.steps):
        kind, impl, ins, params, aux, writer = step.kind, step.impl, step.ins, step.params, step.aux, step.writer
        if timed:
            lines.append(f"{pad}t = CLOCK()")
        namespace[f"f{k}"] = impl
        if writer is not None:
            namespace[f"w{k}"] = writer
        if params:
            namespace[f"p{k}"] = params
        plain = _call(k, ins, params, constant_slots)
        outs = step.outs
        r = f"r{outs[0]}"
        if k in direct:
            # the step's writer puts its result where the caller asks (a loop's y, into its row)
            namespace[f"w{k}"] = step.direct
            y = direct[k]
            lines += [f"{pad}try:",
                      f"{pad}    {r} = {_call(k, ins, params, constant_slots, out=y)}",
                      f"{pad}except (TypeError, ValueError):",
                      f"{pad}    {r} = {plain}",
                      f"{pad}    {y} = {r}"]
        elif k in prepared:
            lines.append(f"{pad}{r} = G{k}({', '.join(prepared[k])})")
        elif kind in (FUSED, MULTI):
            lines.append(f"{pad}{', '.join(f'r{o}' for o in outs)}, = {plain}")
        elif kind == PLAIN:
            lines.append(f"{pad}{r} = {plain}")
        elif kind == IN_PLACE:
            t = f"r{aux}"
            lines += [f"{pad}if type({t}) in ARRAY_TYPES and {t}.base is None:",
                      f"{pad}    try:",
                      f"{pad}        {r} = {_call(k, ins, params, constant_slots, out=t)}",
                      f"{pad}    except (TypeError, ValueError):",
                      f"{pad}        {r} = {plain}",
                      f"{pad}else:",
                      f"{pad}    {r} = {plain}"]
        else:
            pl = pool_list(aux)
            if writer is not impl and aux[1].kind == "f" and p.array_types[0] is np.ndarray:
                # a writer that is not a ufunc (select's impl_into, for floats) gets a fresh
                # buffer when the pool is empty: its plain impl returns a view, which would
                # never give the pool a buffer. (A ufunc keeps its own result dtype: NumPy's
                # sqrt of uint8 is float16, where the aval says float64.)
                key = f"K{pl[1:]}"
                namespace[key] = aux
                lines += [f"{pad}try:",
                          f"{pad}    {r} = {_call(k, ins, params, constant_slots, out=f'({pl}.pop() if {pl} else EMPTY(*{key}))')}",
                          f"{pad}except (TypeError, ValueError, IndexError):",
                          f"{pad}    {r} = {plain}"]
            else:
                lines += [f"{pad}if {pl}:",
                          f"{pad}    try:",
                          f"{pad}        {r} = {_call(k, ins, params, constant_slots, out=f'{pl}.pop()')}",
                          f"{pad}    except (TypeError, ValueError, IndexError):",
                          f"{pad}        {r} = {plain}",
                          f"{pad}else:",
                          f"{pad}    {r} = {plain}"]
        if out_is_scalar[k]:
            for o in outs:
                lines.append(f"{pad}if type(r{o}) is not ndarray and isinstance(r{o}, generic): r{o} = asarray(r{o})")
        for s, key in step.release:
            lines.append(f"{pad}if type(r{s}) in ARRAY_TYPES and r{s}.base is None: {pool_list(key)}.append(r{s})")
        cleared = [f"r{s}" for s in step.clear if s not in constant_slots]
        if cleared:
            lines.append(f"{pad}del {', '.join(cleared)}")
        if timed:
            lines.append(f"{pad}TIMES[{k}] += CLOCK() - t")
    return lines


def _compile(p, timed=False):
    """The source of ``p``'s straight-line function, and the namespace it runs in
    (``timed``: each step timed, :func:`timed_program`)."""
    namespace, constant_slots = namespace_of(p)
    lines = ["def program(args):"]
    if p.in_slots:
        lines.append(f"    {', '.join(f'r{s}' for s in p.in_slots)}, = args")
    lines += step_lines(p, namespace, constant_slots, "    ", timed=timed)
    lines.append(f"    return [{', '.join(results_of(p, constant_slots))}]")
    return "\n".join(lines) + "\n", namespace


def timed_program(p, clock):
    """A function that runs plan ``p`` as its program does (same steps, same buffer pool)
    and adds the time of each step, read by ``clock()`` before and after it, to
    ``times[k]``: returns ``(program, times)``, ``times`` a list of floats (cuvmap.profiler)."""
    source, namespace = _compile(p, timed=True)
    times = [0.0] * len(p.steps)
    namespace.update(CLOCK=clock, TIMES=times)
    exec(code_of(source, "<cuvmap timed plan>"), namespace)
    return namespace["program"], times


# NOTE [generated code is compiled once per text]
# Python's ``compile`` is most of the cost of a small plan, and eager transforms make the
# same plans again and again: ``grad`` of a function that calls ``lax.scan`` stages the
# body anew at every call, and derives and plans its forward and backward bodies anew, and
# their text is the same each time (the slots are numbered in program order; the
# functions, params and constants are names bound in the namespace, not text). So the code
# objects are kept by their text, a bounded cache (:data:`CODE_CACHE_SIZE` entries), and a
# plan made again costs its planning and an ``exec`` of code already compiled.
CODE_CACHE_SIZE = 512
_code_cache = lru.LRU(CODE_CACHE_SIZE)


def code_of(source, filename):
    """The code object of ``source`` (NOTE [generated code is compiled once per text])."""
    key = (source, filename)
    code = _code_cache.get(key)
    if code is None:
        code = _code_cache.put(key, compile(source, filename, "exec"))
    return code


def source(p):
    """The generated Python of plan ``p`` (NOTE [a plan runs as generated Python])."""
    return p.source


def run(closed, args):
    """Runs ``closed`` on concrete ``args`` (its constants first, as the call primitive's
    operands are): a program called from another one (a custom rule's body, a batched or
    differentiated program that a transform runs), planned on its first run. Such a plan is
    never a CUDA graph of its own; while a graph is being captured on this thread, a fresh
    plan runs, so that every buffer it writes comes from the capture's private pool (NOTE
    [graph replay] in cuvmap/cuda/graphs.py)."""
    return execute(nested_plan(closed), args[len(closed.consts):])


def nested_plan(closed):
    """The plan of a program that another one runs (NOTE [graph replay]): made once and
    kept on ``closed``, never a CUDA graph; a fresh one while a graph is being captured on
    this thread."""
    if cuda_graphs.capturing_here():
        return plan(closed, graphs=False)
    return plan_for(closed.plans, closed, graphs=False)


def plan_for(plans, closed, donated=(), graphs=None):
    """The plan of ``closed`` for the current jit settings, made once and kept in the dict
    ``plans`` (a program keeps one plan per combination of ``jit_gpu_fusion`` and
    ``jit_cuda_graphs``); ``graphs=False`` plans without CUDA graphs whatever the setting."""
    key = (config.jit_gpu_fusion, config.jit_cuda_graphs if graphs is None else graphs)
    p = plans.get(key)
    if p is None:
        p = plans.setdefault(key, plan(closed, donated, graphs=key[1]))
    return p


def execute(p, args):
    """Runs plan ``p`` on the program's (non-constant) arguments; returns its outputs."""
    return p.program(args)
