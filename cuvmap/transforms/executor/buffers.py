"""Buffer planning: a slot for every value of a program, the buffers' groups, where each
step writes its result (in place, into the plan's pool, or wherever its impl puts it), and
what is released and cleared after each step (NOTE [buffer planning]). The result is the
plan's steps, data that :mod:`~cuvmap.transforms.executor.codegen` compiles.
"""
import dataclasses

import numpy as np

from cuvmap.core import bfloat16
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


def nbytes(aval):
    return int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize


def unit_outputs(unit):
    """The variables a unit (an equation or a fused group) computes."""
    return unit.outputs if isinstance(unit, fusion.FusedGroup) else unit.outs


class Slots:
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
            for v in unit_outputs(unit):
                self.slot_of[v] = self._new()
        self.out_slots = [self._read(v) for v in j.outvars]
        self.aval_of = {self.slot_of[v]: v.aval for v in list(j.constvars) + list(j.invars)}
        for unit in units:
            for v in unit_outputs(unit):
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


class Groups:
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


def place_results(units, slots, groups, gpu, fused_callable, laid_out=None):
    """The steps, each with the place of its result (NOTE [buffer planning]): written in
    place over a dead operand's buffer, into a pooled buffer, or wherever its impl puts
    it; each result joins or starts a group as it goes. ``laid_out``: the values laid out
    channels-last and the convolutions that write them (a
    :class:`~cuvmap.transforms.executor.layouts.ChannelsLast`; NOTE [channels-last
    activations in a plan])."""
    steps = []
    writes, values = (laid_out.writes, laid_out.values) if laid_out is not None else ({}, frozenset())
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
            steps.append(Step(MULTI, writes.get(k) or bfloat16.eqn_impl(eqn), ins, outs, eqn.params))
            continue
        if k in writes or eqn.outs[0] in values:
            # a channels-last value (NOTE [channels-last activations in a plan]): a fresh
            # result in its operands' layout, never pooled (the pool's buffers are C order)
            groups.new(slots.slot_of[eqn.outs[0]], [], False)
            steps.append(Step(PLAIN, writes.get(k) or bfloat16.eqn_impl(eqn), ins, slots.slot_of[eqn.outs[0]],
                              eqn.params))
            continue
        steps.append(_place_result(k, eqn, ins, array_ins, slots, groups, gpu))
    return steps


def _place_result(k, eqn, ins, array_ins, slots, groups, gpu):
    """The step of equation ``k``, which has one result (NOTE [buffer planning])."""
    var = eqn.outs[0]
    out = slots.slot_of[var]
    aval = var.aval
    prim = eqn.primitive
    if bfloat16.eqn_involves_bfloat16(eqn):
        # computed in float32 (NOTE [bfloat16 computes in float32]): a fresh result, no writer
        if prim.owns_output or not array_ins:
            groups.new(out, [], False)
        else:
            groups.join(array_ins, (out,))
        return Step(PLAIN, bfloat16.eqn_impl(eqn), ins, out, eqn.params)
    writes = prim.impl_into is not None
    reusable = (writes and not eqn.params and aval.shape and nbytes(aval) >= MIN_REUSE_BYTES
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


def schedule_frees(steps, slots, groups, gpu):
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
                if nbytes(slots.aval_of[r]) >= MIN_REUSE_BYTES:
                    releases[death].append((r, (slots.aval_of[r].shape, slots.aval_of[r].dtype)))
    for k, step in enumerate(steps):
        released = {r for r, _ in releases[k]}
        step.release = tuple(releases[k])
        step.clear = tuple(s for s in clear_at[k] if s not in released) + tuple(released)
