"""Channels-last activations in a planned CPU program: which values a plan keeps laid out
``N spatial... C`` between convolutions (NOTE [channels-last activations in a plan]).
:func:`channels_last` reads the program; :func:`cuvmap.transforms.executor.plan` runs the
chosen convolutions on their channels-last impls and keeps the chosen values out of its
pool (whose buffers are in C order).
"""
import dataclasses

import numpy as np

from cuvmap.transforms import ir

# NOTE [channels-last activations in a plan]
# A convolution's vendor computes in its own layout (NOTE [activation layouts] in
# cuvmap/cpu/onednn.py), and each activation of a NumPy program goes in and out of it
# through a reorder. On the benchmark CNN at batch 128, jit(grad) reordered the first
# layer's activations (128×16×24×24) five times a call: the forward's output into
# ``N C H W``, relu's output into the second convolution's layout, again for that
# convolution's weight gradient, the input gradient it computes back into ``N C H W``,
# and relu's gradient into the first convolution's weight gradient. Each is a pass over
# 4.7 MB on the team, together about 5% of the call (ONEDNN_VERBOSE=1 lists them; with
# them gone the plan took 0.92 of the time, probe A/B of the two plans in one process).
# Elementwise code is indifferent to the layout: NumPy's ufuncs write their result in
# their operands' order (``order="K"``). So where a convolution's result only flows,
# through elementwise steps, into other convolutions, the plan asks the convolution for a
# channels-last result (a view whose memory is ``N spatial... C``: NOTE [channels-last
# results] in onednn.py) and every step downstream works on that memory.
#
# The plan finds those values by components: the values of rank 3 or more that
# elementwise equations join (an equation joins its result with each operand of the
# result's shape; operands broadcast from smaller shapes and literals do not join). A
# component is laid out channels-last when
#
# - every value in it is the result of one of its elementwise equations or a result
#   that a convolution can write channels-last (the primitive's ``channels_last`` fact,
#   float32: the dtype oneDNN runs): no argument, constant or other primitive's result,
#   whose layout is C order;
# - every reader of its values is one of its elementwise equations or an operand a
#   convolution reads as fast in either layout: no reshape (it would copy to C order),
#   reduction, call or loop, and no value is returned (results belong to the caller, in
#   C order);
# - some convolution writes into it and some convolution reads from it (else nothing is
#   saved).
#
# Elementwise here means a primitive a fused kernel could compute (``fused``) that has a
# writer and no ``layout`` rule: it allocates its result in its operands' layout (the
# Primitive docstring). Its steps in such a component run plain (no pooled or in-place
# buffer: the pool's are in C order, and a channels-last array never enters the pool).
# The numbers are the program's whatever the layout, bit for bit (tests/jit/
# test_channels_last_plan.py compares with the plan that keeps C order); a convolution
# whose kernel ignores the request (NumPy's, or any dtype but float32) returns C order and
# the steps downstream follow it. Eager calls and GPU programs never ask. On the benchmark
# CNN the first layer's activations qualify; the second's do not (its relu's result is
# reshaped for the dense layer).


@dataclasses.dataclass
class ChannelsLast:
    """What a plan lays out channels-last: ``writes`` ``{equation index: impl}`` (the
    convolutions that write a result so, and the impl that does), ``values`` (the
    variables laid out so)."""

    writes: dict
    values: frozenset


def is_elementwise(eqn):
    """An equation whose result follows its operands' layout (NOTE [channels-last
    activations in a plan])."""
    prim = eqn.primitive
    return (not prim.multiple_results and prim.fused is not None and prim.impl_into is not None
            and prim.layout is None)


def _convolution_fact(eqn):
    """``(reads, writes, impl)`` of an equation whose primitive states ``channels_last``
    for these params, with float32 results, else None."""
    fact = eqn.primitive.channels_last
    if fact is None or any(v.aval.dtype != np.float32 for v in eqn.outs):
        return None
    return fact(eqn.params)


def channels_last(eqns, outvars):
    """The plan's channels-last values of the program ``eqns`` returning ``outvars`` (NOTE
    [channels-last activations in a plan]), a :class:`ChannelsLast`."""
    producer, readers, facts, elementwise = {}, {}, {}, set()
    for k, e in enumerate(eqns):
        for i, v in enumerate(e.outs):
            producer[v] = (k, i)
        for i, v in enumerate(e.inputs):
            if type(v) is ir.Var:
                readers.setdefault(v, []).append((k, i))
        fact = _convolution_fact(e)
        if fact is not None:
            facts[k] = fact
        elif is_elementwise(e) and len(e.outs[0].aval.shape) >= 3:
            elementwise.add(k)
    parent = {}

    def root(v):
        parent.setdefault(v, v)
        while parent[v] is not v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for k in elementwise:
        out = eqns[k].outs[0]
        root(out)
        for v in eqns[k].inputs:
            if type(v) is ir.Var and v.aval.shape == out.aval.shape:
                parent[root(v)] = root(out)
    for k, (_, writes, _) in facts.items():
        for i in writes:
            if len(eqns[k].outs[i].aval.shape) >= 3:
                root(eqns[k].outs[i])
    components = {}
    for v in list(parent):
        components.setdefault(root(v), []).append(v)
    returned = {v for v in outvars if type(v) is ir.Var}
    writes, values = {}, set()
    for members in components.values():
        written = _component_writes(members, producer, readers, facts, elementwise, eqns, returned)
        if written:
            values.update(members)
            for k in written:
                writes[k] = facts[k][2]
    return ChannelsLast(writes, frozenset(values))


def _component_writes(members, producer, readers, facts, elementwise, eqns, returned):
    """The convolutions that write into a component that qualifies (NOTE [channels-last
    activations in a plan]), or an empty set."""
    written, read = set(), False
    for v in members:
        if v in returned or v not in producer:
            return set()
        k, i = producer[v]
        if k in facts and i in facts[k][1]:
            written.add(k)
        elif k not in elementwise:
            return set()
        for reader, operand in readers.get(v, ()):
            if reader in facts and operand in facts[reader][0]:
                read = True
            elif not (reader in elementwise and eqns[reader].outs[0].aval.shape == v.aval.shape):
                return set()
    return written if read else set()
