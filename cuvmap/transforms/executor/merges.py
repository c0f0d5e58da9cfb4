"""Equations merged for the plan: equations that read the same value and run faster as one
kernel call are replaced, in the plan only, by one equation with several results (NOTE
[equations merged for the plan]). The rules live with their primitives and register here
(:func:`register`); :func:`cuvmap.transforms.executor.plan` calls :func:`merge`.
"""
from cuvmap.transforms import ir

_rules = []


# NOTE [equations merged for the plan]
# A program states each result as its own equation: the backward pass of ``conv(x, w) + b``
# is ``conv_backward_input(g, w)``, ``conv_backward_weight(g, x)`` and ``reduce_sum(g)``,
# three reads of one output gradient ``g``, and the transforms (batching, derivatives, DCE,
# CSE) work on those equations. Some kernels compute several of them in one pass over their
# shared operand (oneDNN's backward-weights sums the bias gradient on its way: NOTE [one
# backward pass over the output gradient] in cuvmap/cpu/onednn.py). So when a program is
# planned, and only then (the program the transforms see is unchanged, as XLA fuses after
# JAX's transforms), :func:`merge` hands the rules the equations grouped by their first
# operand, and a rule returns the groups it merges, each with the equation that replaces
# them (a ``multiple_results`` primitive whose results are the group's, same variables).
# The merged equation takes the place of the group's first equation when every operand it
# reads is defined by then, else the place right after the last of those definitions; a
# group is left alone where no place comes before every reader of its results. A rule
# keeps the numbers the program states: its primitive computes what the group computes,
# up to the rounding of a sum taken in another order, and says so where it may differ.
# Rules: ``conv_backward`` (cuvmap/lax/convolution_merged.py).


def register(rule):
    """Adds ``rule(eqns) -> [(group, merged)]``: ``eqns`` are the equations (not of
    several results) whose first operand is one variable, in program order; each ``group``
    a list of some of them that ``merged``, one equation, replaces."""
    _rules.append(rule)
    return rule


def merge(eqns):
    """``eqns`` with the groups the rules find merged (NOTE [equations merged for the
    plan]): a new list; ``eqns`` itself when nothing merges."""
    if not _rules:
        return eqns
    by_first = {}
    for i, e in enumerate(eqns):
        if e.inputs and type(e.inputs[0]) is ir.Var and not e.primitive.multiple_results:
            by_first.setdefault(e.inputs[0], []).append(i)
    defined, readers = {}, {}
    for i, e in enumerate(eqns):
        for v in e.outs:
            defined[v] = i
        for v in e.inputs:
            if type(v) is ir.Var:
                readers.setdefault(v, i)   # the first reader
    at, removed = {}, set()
    for indices in by_first.values():
        if len(indices) < 2:
            continue
        for rule in _rules:
            for group, merged in rule([eqns[i] for i in indices if i not in removed]):
                positions = [i for i in indices if eqns[i] in group]
                last_definition = max((defined.get(v, -1) for v in merged.inputs if type(v) is ir.Var), default=-1)
                place = max(min(positions), last_definition + 1)
                first_reader = min((readers[v] for v in merged.outs if v in readers), default=len(eqns))
                if place > first_reader or place in at:
                    continue
                at[place] = merged
                removed.update(positions)
    if not at:
        return eqns
    out = []
    for i, e in enumerate(eqns):
        if i in at:
            out.append(at[i])
        if i not in removed:
            out.append(e)
    return out
