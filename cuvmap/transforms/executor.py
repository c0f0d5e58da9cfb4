"""The planned executor: runs a staged program without tracers.

A program is planned once (:func:`plan`): every value gets a slot in a flat list, and each
equation becomes a step ``(kind, impl, input slots, output slot, params, aux, release,
clear)``, so a call is one loop over steps with no tracer objects, no rule lookups and no
dictionaries. The plan also decides where each result is written (NOTE [buffer planning]),
and the first CPU plan asks the C allocator to keep the memory programs free (NOTE [keeping
freed host memory]).
"""
import ctypes
import os
import sys
import threading

import numpy as np

from cuvmap import backend, core

# step kinds
PLAIN, IN_PLACE, POOLED = 0, 1, 2

# Buffers smaller than this are not reused: allocating them is cheaper than the pool.
MIN_REUSE_BYTES = 4096


# NOTE [buffer planning]
# Fresh arrays are slow to touch on these machines (every page faults on first write), so a
# program should write into memory it already has. The plan follows each buffer through the
# program as a *group*: the slots that may share its memory (a reshape or a slice of it,
# anything a primitive might return as a view). Only an elementwise primitive whose impl is
# a ufunc is known to return a new array that owns its memory (a *root*); any other
# primitive's output joins the groups of its inputs, except those declared below to return
# memory of their own. Then, for an elementwise step:
#
# - in place: when an input is the root of a group none of whose slots is used later or
#   returned, with the output's shape and dtype, the ufunc writes into it (``out=``); the
#   output carries on the group. Cotangent sums ``add(ct, ct_i)`` accumulate this way;
# - pooled: otherwise the output goes into a buffer from the program's pool (keyed by
#   shape and dtype) when one is free;
#
# and when a group dies (its last slot's last use), its roots go back to the pool. The pool
# belongs to the plan and survives across calls, so a steady state allocates almost only
# the outputs, which are never pooled (they belong to the caller). Arguments are never
# written, except the donated ones (``jit(donate_argnums=...)``), which may be written in
# place but are never pooled. At run time a root is reused only if it still is a base
# array of the plan's array type (a guard against an impl that returned a view or a scalar).


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


def host_memory_setting():
    """What :func:`keep_host_memory` did (a sentence), or None before any CPU plan."""
    return _host_memory


def _ufunc_primitives():
    from cuvmap.lax import elementwise

    return {p for p in vars(elementwise).values()
            if isinstance(p, core.Primitive) and isinstance(p.impl, np.ufunc)}


def _own_memory_primitives():
    """Primitives whose output never shares memory with an operand (without being known
    to own it: ``dot_general`` may return a transposed view of its product)."""
    import importlib

    from cuvmap.lax import linalg, reduction

    conv = importlib.import_module("cuvmap.lax.conv")  # cuvmap.lax.conv is also a function's name

    return {reduction.reduce_sum_p, linalg.dot_general_p, conv.conv_p,
            conv.conv_backward_input_p, conv.conv_backward_weight_p}


_tables = None


def _primitive_tables():
    global _tables
    if _tables is None:
        _tables = (_ufunc_primitives(), _own_memory_primitives())
    return _tables


class Plan:
    __slots__ = ("steps", "init", "in_slots", "out_slots", "pool", "array_types", "num_reused_steps")

    def __init__(self, steps, init, in_slots, out_slots, array_types):
        self.steps = steps
        self.init = init
        self.in_slots = in_slots
        self.out_slots = out_slots
        self.pool = {}
        self.array_types = array_types
        self.num_reused_steps = sum(1 for s in steps if s[0] != PLAIN)


def _nbytes(aval):
    return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


def plan(closed, donated=()):
    """Plans ``closed`` (NOTE [buffer planning]); ``donated`` holds the indices of the
    arguments whose buffers may be overwritten."""
    ufuncs, own_memory = _primitive_tables()
    j = closed.jaxpr
    slot_of = {}
    init = []

    def new_slot(value=None):
        init.append(value)
        return len(init) - 1

    for v, c in zip(j.constvars, closed.consts):
        slot_of[v] = new_slot(c)
    in_slots = []
    for v in j.invars:
        slot_of[v] = new_slot()
        in_slots.append(slot_of[v])
    literal_slots = set()

    def slot(x):
        if type(x).__name__ == "Literal":
            s = new_slot(x.val)
            literal_slots.add(s)
            return s
        return slot_of[x]

    eqn_ins = []
    for eqn in j.eqns:
        eqn_ins.append([slot(x) for x in eqn.inputs])
        slot_of[eqn.out] = new_slot()
    out_slots = [slot(v) for v in j.outvars]
    returned = set(out_slots)
    never = len(j.eqns)
    last_use = {}
    for k, ins in enumerate(eqn_ins):
        for s in ins:
            last_use[s] = k
    for s in returned:
        last_use[s] = never

    aval_of = {slot_of[v]: v.aval for v in list(j.constvars) + list(j.invars)}
    for eqn in j.eqns:
        aval_of[slot_of[eqn.out]] = eqn.out.aval

    # groups: id -> [members, roots, poolable]
    group_of = {}
    groups = {}

    def new_group(s, roots, poolable):
        groups[s] = [{s}, list(roots), poolable]
        group_of[s] = s

    for i, s in enumerate(in_slots):
        new_group(s, [s] if i in donated else [], False)
    for v in j.constvars:
        new_group(slot_of[v], [], False)

    def dead_after(g, k):
        return all(last_use.get(m, -1) <= k for m in groups[g][0])

    steps = []
    releases = {k: [] for k in range(len(j.eqns))}
    for k, eqn in enumerate(j.eqns):
        ins = eqn_ins[k]
        out = slot_of[eqn.out]
        aval = eqn.out.aval
        array_ins = [s for s in ins if s not in literal_slots]
        reusable = (eqn.primitive in ufuncs and not eqn.params and aval.shape
                    and _nbytes(aval) >= MIN_REUSE_BYTES)
        kind, aux = PLAIN, None
        if reusable:
            for s in array_ins:
                g = group_of[s]
                members, roots, _ = groups[g]
                a = aval_of[s]
                if (roots == [s] and a.shape == aval.shape and a.dtype == aval.dtype
                        and dead_after(g, k) and all(group_of[t] != g or t == s for t in array_ins)):
                    kind, aux = IN_PLACE, s
                    members.add(out)
                    group_of[out] = g
                    groups[g][1] = [out]
                    break
            else:
                kind, aux = POOLED, (aval.shape, aval.dtype)
                new_group(out, [out], True)
        elif eqn.primitive in ufuncs or eqn.primitive in own_memory or not array_ins:
            new_group(out, [out] if eqn.primitive in ufuncs else [], eqn.primitive in ufuncs)
        else:
            merged = {group_of[s] for s in array_ins}
            first = merged.pop()
            members, roots, poolable = groups[first]
            for g in merged:
                m2, r2, p2 = groups.pop(g)
                members |= m2
                roots.extend(r2)
                poolable = poolable and p2
                for t in m2:
                    group_of[t] = first
            groups[first][2] = poolable
            members.add(out)
            group_of[out] = first
        steps.append([kind, eqn.primitive.impl, tuple(ins), out, eqn.params, aux, (), ()])

    # when each group dies, its poolable roots go to the pool; every slot is cleared after
    # its last use (a group's roots after the group's, so the pool gets them)
    clear_at = {k: [] for k in range(len(j.eqns))}
    for g, (members, roots, poolable) in groups.items():
        death = max(last_use.get(m, -1) for m in members)
        for m in members:
            lu = last_use.get(m, -1)
            if m in roots:
                lu = death
            if 0 <= lu < never and m not in in_slots and m not in literal_slots:
                clear_at[lu].append(m)
        if 0 <= death < never and poolable:
            for r in roots:
                if _nbytes(aval_of[r]) >= MIN_REUSE_BYTES:
                    releases[death].append((r, (aval_of[r].shape, aval_of[r].dtype)))
    for k, step in enumerate(steps):
        released = {r for r, _ in releases[k]}
        step[6] = tuple(releases[k])
        step[7] = tuple(s for s in clear_at[k] if s not in released) + tuple(released)
    devices = {a.device for a in aval_of.values() if a.device}
    if any(d.startswith("gpu") for d in devices):
        array_types = (backend.xp_for("gpu").ndarray,)
    else:
        array_types = (np.ndarray,)
        if _host_memory is None:
            keep_host_memory()
    return Plan([tuple(s) for s in steps], init, in_slots, out_slots, array_types)


def _pool_take(pool, key):
    buffers = pool.get(key)
    if buffers:
        try:
            return buffers.pop()
        except IndexError:  # another thread took the last one
            return None
    return None


def _call_into(ufunc, operands, out):
    """``ufunc(*operands, out=out)``, or None when the array library refuses the ``out=``
    (then the step allocates, as an unplanned one would; a real error recurs there)."""
    try:
        return ufunc(*operands, out=out)
    except (TypeError, ValueError):
        return None


def run(closed, args):
    """Runs ``closed`` on concrete ``args`` (its constants first, as the call primitive's
    operands are); plans it on the first run."""
    p = closed.plan
    if p is None:
        p = closed.plan = plan(closed)
    num_consts = len(closed.consts)
    return execute(p, args[num_consts:])


def execute(p, args):
    regs = list(p.init)
    for s, x in zip(p.in_slots, args):
        regs[s] = x
    pool = p.pool
    array_types = p.array_types
    for kind, impl, ins, out, params, aux, release, clear in p.steps:
        if kind == PLAIN:
            r = impl(*[regs[i] for i in ins], **params)
        elif kind == IN_PLACE:
            target = regs[aux]
            r = None
            if type(target) in array_types and target.base is None:
                r = _call_into(impl, [regs[i] for i in ins], target)
            if r is None:
                r = impl(*[regs[i] for i in ins])
        else:
            buf = _pool_take(pool, aux)
            r = None if buf is None else _call_into(impl, [regs[i] for i in ins], buf)
            if r is None:
                r = impl(*[regs[i] for i in ins])
        if type(r) is not np.ndarray and isinstance(r, np.generic):
            r = np.asarray(r)
        regs[out] = r
        for s, key in release:
            buf = regs[s]
            if type(buf) in array_types and buf.base is None:
                pool.setdefault(key, []).append(buf)
        for s in clear:
            regs[s] = None
    return [regs[s] for s in p.out_slots]
