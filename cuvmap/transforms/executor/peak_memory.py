"""The planned peak memory of a plan, followed before it runs (NOTE [planned peak memory]).
"""
from cuvmap.transforms import ir
from cuvmap.transforms.executor.buffers import FUSED, IN_PLACE, MULTI, PLAIN, POOLED, nbytes

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
# [choosing a chunk] in cuvmap/lax/control_flow/chunked.py).

def _programs_in(params):
    """The programs in a call's params (a ClosedJaxpr, or a tuple of them: cond's branches)."""
    found = []
    for value in params.values():
        if isinstance(value, ir.ClosedJaxpr):
            found.append(value)
        elif isinstance(value, tuple):
            found.extend(v for v in value if isinstance(v, ir.ClosedJaxpr))
    return found


class MemoryFacts:
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
            sizes = [nbytes(slots.aval_of[o]) for o in outs]
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
            released.append([(s, nbytes(slots.aval_of[s]), key) for s, key in step.release])
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


def _nested_peak(programs, out_bytes, program_peak):
    """A call's working memory beyond its results: its largest program's planned peak."""
    peak = 0
    for program in programs:
        peak = max(peak, program_peak(program))
    return max(0, peak - out_bytes)


def follow_memory(facts, program_peak):
    """The peak of a plan's runs from its :class:`MemoryFacts` (NOTE [planned peak
    memory]); ``program_peak(program)`` is the planned peak of a program that a step calls
    (the planner's, from the program's own plan)."""
    pool = {}          # pool key -> free buffers
    live = peak = 0    # bytes allocated (the pool's free buffers included)
    extra = [w + (_nested_peak(n, sum(b for _, b, _ in a), program_peak) if n else 0)
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
