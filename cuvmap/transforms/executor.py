"""The planned executor: runs a staged program without tracers.

A program is planned once (:func:`plan`): every value gets a slot, and each equation (or
fused group of them) becomes a step ``(kind, impl, input slots, output slot(s), params,
aux, release, clear, writer)``; the plan decides where each result is written (NOTE
[buffer planning]) and compiles the steps into one straight-line Python function with no
tracer objects, no rule lookups and no dictionaries (NOTE [a plan runs as generated
Python]). The first CPU plan asks the C allocator to keep the memory programs free (NOTE
[keeping freed host memory]).
"""
import ctypes
import os
import sys
import threading

import numpy as np

from cuvmap import backend, core

# step kinds (FUSED: a fused elementwise kernel; MULTI: an equation with several results,
# NOTE [an equation with several results] in ir.py; the output of both is a tuple of slots)
PLAIN, IN_PLACE, POOLED, FUSED, MULTI = 0, 1, 2, 3, 4

# Buffers smaller than this are not reused: allocating them is cheaper than the pool.
MIN_REUSE_BYTES = 4096


# NOTE [buffer planning]
# Fresh arrays are slow to touch on these machines (every page faults on first write), so a
# program should write into memory it already has. The plan follows each buffer through the
# program as a *group*: the slots that may share its memory (a reshape or a slice of it,
# anything a primitive might return as a view). Only an elementwise primitive whose impl is
# a ufunc, or that has an ``impl_into`` writing into a given buffer (select), is known to
# return a new array that owns its memory (a *root*); any other
# primitive's output joins the groups of its inputs, except those declared below to return
# memory of their own. Then, for an elementwise step:
#
# - in place: when an input is the root of a group none of whose slots is used later or
#   returned, with the output's shape and dtype, the ufunc writes into it (``out=``); the
#   output carries on the group. Cotangent sums ``add(ct, ct_i)`` accumulate this way;
# - pooled: otherwise the output goes into a buffer from the program's pool (keyed by
#   shape and dtype) when one is free, else into a fresh one (so that a writer whose plain
#   impl returns a view, select's, still leaves a buffer for the pool);
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
    """The elementwise primitives whose results can be written into a buffer of the plan:
    those whose impl is a ufunc (``out=``), and those with an ``impl_into(*operands,
    out=buffer)`` (select), which may raise TypeError to decline (the step then calls the
    impl)."""
    from cuvmap.lax import elementwise

    return {p for p in vars(elementwise).values()
            if isinstance(p, core.Primitive) and (isinstance(p.impl, np.ufunc) or p.impl_into is not None)}


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
    """A planned program: its steps (data), the initial slot values (constants and
    literals), the argument and output slots, the buffer pool, and the generated function
    that runs it (NOTE [a plan runs as generated Python])."""

    __slots__ = ("steps", "init", "in_slots", "out_slots", "pool", "array_types", "empty", "num_reused_steps",
                 "source", "program")

    def __init__(self, steps, init, in_slots, out_slots, array_types, out_is_scalar):
        self.steps = steps
        self.init = init
        self.in_slots = in_slots
        self.out_slots = out_slots
        self.pool = {}
        self.array_types = array_types
        self.empty = backend.xp_for("gpu").empty if array_types[0] is not np.ndarray else np.empty
        self.num_reused_steps = sum(1 for s in steps if s[0] != PLAIN)
        self.source, namespace = _compile(self, out_is_scalar)
        exec(compile(self.source, "<cuvmap plan>", "exec"), namespace)
        self.program = namespace["program"]


def _nbytes(aval):
    return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


def _is_gpu_program(closed):
    avals = [v.aval for v in closed.jaxpr.constvars + closed.jaxpr.invars]
    avals += [v.aval for e in closed.jaxpr.eqns for v in e.outs]
    return any(a.device and a.device.startswith("gpu") for a in avals)


# Primitives whose impl reads values on the host (a GPU synchronisation): a program with
# one of them is never captured as a CUDA graph (NOTE [graph replay] in cuvmap/cuda/graphs.py).
def _host_sync_primitives():
    from cuvmap.lax import indexing

    return {indexing.check_index_bounds_p}


def graph_capturable(closed):
    """Whether ``closed`` may be captured as a CUDA graph: it runs on the GPU and none of
    its equations reads values on the host."""
    from cuvmap.transforms import ir

    syncs = _host_sync_primitives()

    def programs(value):
        if isinstance(value, ir.ClosedJaxpr):
            return [value]
        if isinstance(value, tuple):  # cond's branches
            return [v for v in value if isinstance(v, ir.ClosedJaxpr)]
        return []

    def syncs_in(jaxpr):  # the programs of calls (checkpointed regions, loops, ...) included
        for e in jaxpr.eqns:
            if e.primitive in syncs or getattr(e.primitive, "host_sync", False):
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
    """
    from cuvmap import config
    from cuvmap.transforms import fusion

    ufuncs, own_memory = _primitive_tables()
    j = closed.jaxpr
    gpu = _is_gpu_program(closed)
    if fuse is None:
        fuse = gpu and config.jit_gpu_fusion
    units = fusion.fuse(j.eqns, j.outvars) if fuse else list(j.eqns)
    if fused_callable is None:
        fused_callable = _cuda_fused_callable
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

    def unit_outputs(unit):
        return unit.outputs if isinstance(unit, fusion.FusedGroup) else unit.outs

    unit_ins = []
    for unit in units:
        unit_ins.append([slot(x) for x in unit.inputs])
        for v in unit_outputs(unit):
            slot_of[v] = new_slot()
    out_slots = [slot(v) for v in j.outvars]
    returned = set(out_slots)
    never = len(units)
    last_use = {}
    for k, ins in enumerate(unit_ins):
        for s in ins:
            last_use[s] = k
    for s in returned:
        last_use[s] = never

    aval_of = {slot_of[v]: v.aval for v in list(j.constvars) + list(j.invars)}
    for unit in units:
        for v in unit_outputs(unit):
            aval_of[slot_of[v]] = v.aval

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

    def join(array_ins, outs):
        """Merges the groups of ``array_ins`` into one, which ``outs`` join."""
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
        for o in outs:
            members.add(o)
            group_of[o] = first

    def dead_after(g, k):
        return all(last_use.get(m, -1) <= k for m in groups[g][0])

    steps = []
    releases = {k: [] for k in range(len(units))}
    for k, unit in enumerate(units):
        ins = unit_ins[k]
        if isinstance(unit, fusion.FusedGroup):
            # a kernel writes fresh arrays of its own: each output is a group of its own
            outs = tuple(slot_of[v] for v in unit.outputs)
            for s in outs:
                new_group(s, [s], False)
            steps.append([FUSED, fused_callable(unit), tuple(ins), outs, {}, None, (), (), None])
            continue
        eqn = unit
        array_ins = [s for s in ins if s not in literal_slots]
        if type(eqn.out) is tuple:
            # a function of its own (a checkpointed region, a custom-derivative call): its
            # results may be views of its operands (an identity), so they join the
            # operands' groups
            outs = tuple(slot_of[v] for v in eqn.out)
            if array_ins:
                join(array_ins, outs)
            else:
                for o in outs:
                    new_group(o, [], False)
            steps.append([MULTI, eqn.primitive.impl, tuple(ins), outs, eqn.params, None, (), (), None])
            continue
        out = slot_of[eqn.out]
        aval = eqn.out.aval
        reusable = (eqn.primitive in ufuncs and not eqn.params and aval.shape
                    and _nbytes(aval) >= MIN_REUSE_BYTES)
        if reusable and eqn.primitive.impl_into is not None and (gpu or aval.dtype.kind != "f"):
            reusable = False  # select_into blends NumPy floats only: elsewhere it would decline
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
                if gpu:
                    # on the GPU only in place: a buffer pooled across calls could still be
                    # read by a kernel of the previous call on another stream (CuPy's own
                    # pool, which a fresh result comes from, orders its blocks by stream)
                    new_group(out, [out], False)
                else:
                    kind, aux = POOLED, (aval.shape, aval.dtype)
                    new_group(out, [out], True)
        elif eqn.primitive in ufuncs or eqn.primitive in own_memory or not array_ins:
            new_group(out, [out] if eqn.primitive in ufuncs else [], eqn.primitive in ufuncs)
        else:
            join(array_ins, (out,))
        writer = (eqn.primitive.impl_into or eqn.primitive.impl) if kind != PLAIN else None
        steps.append([kind, eqn.primitive.impl, tuple(ins), out, eqn.params, aux, (), (), writer])

    # when each group dies, its poolable roots go to the pool; every slot is cleared after
    # its last use (a group's roots after the group's, so the pool gets them)
    clear_at = {k: [] for k in range(len(units))}
    for g, (members, roots, poolable) in groups.items():
        death = max(last_use.get(m, -1) for m in members)
        for m in members:
            lu = last_use.get(m, -1)
            if m in roots:
                lu = death
            if 0 <= lu < never and m not in in_slots and m not in literal_slots:
                clear_at[lu].append(m)
        if 0 <= death < never and poolable and not gpu:  # (the GPU pools nothing across calls)
            for r in roots:
                if _nbytes(aval_of[r]) >= MIN_REUSE_BYTES:
                    releases[death].append((r, (aval_of[r].shape, aval_of[r].dtype)))
    for k, step in enumerate(steps):
        released = {r for r, _ in releases[k]}
        step[6] = tuple(releases[k])
        step[7] = tuple(s for s in clear_at[k] if s not in released) + tuple(released)
    array_types = (backend.xp_for("gpu").ndarray,) if gpu else (np.ndarray,)
    if not gpu and _host_memory is None:
        keep_host_memory()
    out_is_scalar = [any(v.aval.shape == () for v in unit_outputs(u)) for u in units]
    p = Plan([tuple(s) for s in steps], init, in_slots, out_slots, array_types, out_is_scalar)
    if graphs is None:
        graphs = config.jit_cuda_graphs
    if graphs and graph_capturable(closed):
        from cuvmap.cuda import graphs as cuda_graphs

        def make_program():  # a plan of its own: its buffers belong to the graph
            return plan(closed, donated, fuse, fused_callable, graphs=False).program

        p.program = cuda_graphs.GraphRunner(p.program, make_program)
    return p


def _cuda_fused_callable(group):
    from cuvmap.cuda import kernels

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


def _compile(p, out_is_scalar):
    """The source of ``p``'s straight-line function, and the namespace it runs in."""
    computed = set()
    for step in p.steps:
        computed.update(step[3] if step[0] in (FUSED, MULTI) else (step[3],))
    constant_slots = {s for s in range(len(p.init)) if s not in computed and s not in p.in_slots}
    namespace = {"ndarray": np.ndarray, "generic": np.generic, "asarray": np.asarray,
                 "ARRAY_TYPES": p.array_types, "EMPTY": p.empty, "FRESH": _fresh}
    for s in constant_slots:
        namespace[f"c{s}"] = p.init[s]
    pool_names = {}

    def pool_list(key):
        if key not in pool_names:
            name = f"P{len(pool_names)}"
            pool_names[key] = name
            namespace[name] = p.pool.setdefault(key, [])
        return pool_names[key]

    lines = ["def program(args):"]
    if p.in_slots:
        lines.append(f"    {', '.join(f'r{s}' for s in p.in_slots)}, = args")
    for k, (kind, impl, ins, out, params, aux, release, clear, writer) in enumerate(p.steps):
        namespace[f"f{k}"] = impl
        if writer is not None:
            namespace[f"w{k}"] = writer
        if params:
            namespace[f"p{k}"] = params
        plain = _call(k, ins, params, constant_slots)
        outs = out if kind in (FUSED, MULTI) else (out,)
        r = f"r{outs[0]}"
        if kind in (FUSED, MULTI):
            lines.append(f"    {', '.join(f'r{o}' for o in outs)}, = {plain}")
        elif kind == PLAIN:
            lines.append(f"    {r} = {plain}")
        elif kind == IN_PLACE:
            t = f"r{aux}"
            lines += [f"    if type({t}) in ARRAY_TYPES and {t}.base is None:",
                      "        try:",
                      f"            {r} = {_call(k, ins, params, constant_slots, out=t)}",
                      "        except (TypeError, ValueError):",
                      f"            {r} = {plain}",
                      "    else:",
                      f"        {r} = {plain}"]
        else:
            pl = pool_list(aux)
            if writer is not impl and aux[1].kind == "f" and p.array_types[0] is np.ndarray:
                # a writer that is not a ufunc (select's impl_into, for floats) gets a fresh
                # buffer when the pool is empty: its plain impl returns a view, which would
                # never give the pool a buffer. (A ufunc keeps its own result dtype: NumPy's
                # sqrt of uint8 is float16, where the aval says float64.)
                key = f"K{pl[1:]}"
                namespace[key] = aux
                lines += ["    try:",
                          f"        {r} = {_call(k, ins, params, constant_slots, out=f'({pl}.pop() if {pl} else EMPTY(*{key}))')}",
                          "    except (TypeError, ValueError, IndexError):",
                          f"        {r} = {plain}"]
            else:
                lines += [f"    if {pl}:",
                          "        try:",
                          f"            {r} = {_call(k, ins, params, constant_slots, out=f'{pl}.pop()')}",
                          "        except (TypeError, ValueError, IndexError):",
                          f"            {r} = {plain}",
                          "    else:",
                          f"        {r} = {plain}"]
        if out_is_scalar[k]:
            for o in outs:
                lines.append(f"    if type(r{o}) is not ndarray and isinstance(r{o}, generic): r{o} = asarray(r{o})")
        for s, key in release:
            lines.append(f"    if type(r{s}) in ARRAY_TYPES and r{s}.base is None: {pool_list(key)}.append(r{s})")
        cleared = [f"r{s}" for s in clear if s not in constant_slots]
        if cleared:
            lines.append(f"    del {', '.join(cleared)}")
    # a constant returned is copied: the caller owns its results, and may write into them
    lines.append(f"    return [{', '.join(f'FRESH(c{s})' if s in constant_slots else f'r{s}' for s in p.out_slots)}]")
    return "\n".join(lines) + "\n", namespace


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
    from cuvmap.cuda import graphs as cuda_graphs

    if cuda_graphs.capturing_here():
        return plan(closed, graphs=False)
    return plan_for(closed.plans, closed, graphs=False)


def plan_for(plans, closed, donated=(), graphs=None):
    """The plan of ``closed`` for the current jit settings, made once and kept in the dict
    ``plans`` (a program keeps one plan per combination of ``jit_gpu_fusion`` and
    ``jit_cuda_graphs``); ``graphs=False`` plans without CUDA graphs whatever the setting."""
    from cuvmap import config

    key = (config.jit_gpu_fusion, config.jit_cuda_graphs if graphs is None else graphs)
    p = plans.get(key)
    if p is None:
        p = plans.setdefault(key, plan(closed, donated, graphs=key[1]))
    return p


def execute(p, args):
    """Runs plan ``p`` on the program's (non-constant) arguments; returns its outputs."""
    return p.program(args)
