"""Planning a program: :func:`plan` runs the phases (fusion, buffer planning, the memory
facts, code generation) into a :class:`Plan`, whose generated function runs the program;
the plans that programs keep (:func:`plan_for`, :func:`nested_plan`), running them
(:func:`execute`, :func:`run`), their pools and their planned peak memory.
"""
import numpy as np

from cuvmap import backend, config
from cuvmap.core import primitive
from cuvmap.cuda import graphs as cuda_graphs, kernels
from cuvmap.transforms import fusion, ir
from cuvmap.transforms.executor import codegen, host_memory, layouts, merges, peak_memory
from cuvmap.transforms.executor.buffers import PLAIN, Groups, Slots, place_results, schedule_frees, unit_outputs

class Plan:
    """A planned program: its steps (data), the initial slot values (constants and
    literals), the argument and output slots, the buffer pool, and the generated function
    that runs it (NOTE [a plan runs as generated Python])."""

    __slots__ = ("steps", "init", "in_slots", "out_slots", "pool", "array_types", "empty", "num_reused_steps",
                 "source", "program", "memory", "_peak", "out_is_scalar", "loops", "scopes")

    def __init__(self, steps, init, in_slots, out_slots, array_types, out_is_scalar, memory=None, scopes=None):
        self.steps = steps
        # each step's named scope (NOTE [named scopes] in core/tracers.py): its equation's name
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
        self.source, namespace = codegen.compile_plan(self)
        exec(codegen.code_of(self.source, "<cuvmap plan>"), namespace)
        self.program = namespace["program"]


def _gpu_device(closed):
    """The device (``"gpu:<id>"``) of a GPU program, or None for a CPU one."""
    avals = [v.aval for v in closed.jaxpr.constvars + closed.jaxpr.invars]
    avals += [v.aval for e in closed.jaxpr.eqns for v in e.outs]
    return next((a.device for a in avals if a.device and a.device.startswith("gpu")), None)


def is_gpu_program(closed):
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

    return is_gpu_program(closed) and not syncs_in(closed.jaxpr)


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
    and the last use of each (:class:`Slots`), where each unit writes its result
    (:func:`place_results`, over the buffers' groups of :class:`Groups`), what is
    released to the pool and cleared after each step (:func:`schedule_frees`), and the
    generated function (:class:`Plan`, :func:`compile_plan`).
    """
    j = closed.jaxpr
    gpu = is_gpu_program(closed)
    if fuse is None:
        fuse = gpu and config.jit_gpu_fusion
    eqns = merges.merge(j.eqns)  # NOTE [equations merged for the plan]
    units = fusion.fuse(eqns, j.outvars) if fuse else list(eqns)
    slots = Slots(closed, units, _constants_on_device(closed, units) if gpu else closed.consts)
    groups = Groups(slots, donated)
    # NOTE [channels-last activations in a plan]
    laid_out = None if gpu or fuse else layouts.channels_last(eqns, j.outvars)
    steps = place_results(units, slots, groups, gpu, fused_callable or _cuda_fused_callable, laid_out)
    schedule_frees(steps, slots, groups, gpu)
    array_types = (backend.xp_for("gpu").ndarray,) if gpu else (np.ndarray,)
    if not gpu and host_memory.host_memory_setting() is None:
        host_memory.keep_host_memory()
    out_is_scalar = [any(v.aval.shape == () for v in unit_outputs(u)) for u in units]
    p = Plan(steps, slots.init, slots.in_slots, slots.out_slots, array_types, out_is_scalar,
             peak_memory.MemoryFacts(units, steps, slots, groups), [_unit_scope(u) for u in units])
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


def planned_peak_bytes(p):
    """The bytes plan ``p`` allocates at the peak of a run, its outputs included, over its
    arguments and constants (NOTE [planned peak memory]); computed once per plan."""
    if p._peak is None:
        p._peak = (peak_memory.follow_memory(p.memory, lambda program: planned_peak_bytes(nested_plan(program)))
                   if p.memory is not None else 0)
    return p._peak

def _cuda_fused_callable(group):
    return kernels.fused_elementwise(group.cuda_kernel_source(), group.shape,
                                     [v.aval.dtype for v in group.outputs], group.reference)


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
    key = (config.jit_gpu_fusion, config.jit_cuda_graphs if graphs is None else graphs, primitive.impl_epoch())
    p = plans.get(key)
    if p is None:
        p = plans.setdefault(key, plan(closed, donated, graphs=key[1]))
    return p


def execute(p, args):
    """Runs plan ``p`` on the program's (non-constant) arguments; returns its outputs."""
    return p.program(args)
