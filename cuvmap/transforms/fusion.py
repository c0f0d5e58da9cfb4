"""Elementwise fusion of a staged program, for the GPU.

On the GPU every primitive is a kernel launch, and a chain of elementwise primitives
reads and writes each intermediate from device memory. A *fused group* is a set of
elementwise equations with one output shape ``S`` that runs as one generated kernel: for
each index ``i`` of ``S``,

    v_1[i] = e_1(inputs[i]),  v_2[i] = e_2(inputs[i], v_1[i]),  ...

in registers, and only the values used outside the group (or returned) are written out.
The external inputs broadcast to ``S`` (an input of shape ``(16,)`` into a group of shape
``(8, 16)``), literals are written into the kernel's source.

:func:`fuse` partitions a program's equations into such groups and the equations left
alone (NOTE [fusion groups]); it knows no array library and is tested on the CPU, where
:meth:`FusedGroup.reference` runs a group through the primitives' own impls.
:meth:`FusedGroup.cuda_kernel_source` writes the group as the pieces of a CuPy
``ElementwiseKernel`` (``cuvmap/cuda/kernels.py`` compiles them).
"""

import dataclasses

import numpy as np

from cuvmap.transforms.ir import Literal

# NOTE [fusion groups]
# A group runs at the position of the event that closes it, so every member's inputs are
# computed before it runs; the partition walks the program in order and keeps at most one
# open group per output shape:
#
# - a fusible equation (an elementwise primitive of the table below, operands of supported
#   dtypes) joins the open group of its shape, or opens one; an operand produced by the
#   open group of *another* shape closes that group first (the operand becomes an input);
# - any other equation that reads a value of an open group closes that group first, so
#   the group has run when the equation needs the value;
# - a group that would exceed MAX_GROUP_EQNS equations or MAX_KERNEL_ARGS inputs and
#   outputs is closed first (a kernel's parameters are limited, and long bodies spill);
# - at the end the open groups close, in any order: two open groups never depend on each
#   other (a read across them would have closed one).
#
# A closed group of one equation is not worth a kernel: it stays the equation. A group's
# outputs are the members' values read by any equation outside it or returned.

MAX_GROUP_EQNS = 64
MAX_KERNEL_ARGS = 24

C_TYPES = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "signed char", np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short", np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int32): "int", np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int64): "long long", np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.float32): "float", np.dtype(np.float64): "double",
}

class CExpression:
    """How a generated kernel computes one elementwise primitive: the ``fused`` attribute
    of its :class:`~cuvmap.core.Primitive`, set where the primitive is defined.

    ``template`` is a C expression over the operands converted to the computation type
    T (``{0}``, ``{1}``, ``{2}``: the operands' variables; ``{T}``: T's C name), or a
    function of the equation's params that returns one, which may name the params
    (``{y}``). It is the formula the primitive's impl computes through CuPy's ufuncs, so a
    fused program gives the unfused bits (NOTE [fused kernels round as the unfused ones]
    in cuvmap/cuda/kernels.py). The computation type is the output's dtype, except:

    - ``comparison_dtype(*operand_avals)``, where given, makes the primitive a
      comparison: it computes in that dtype (the operands' common one), and an integer
      literal out of its range compares by value, as in NumPy;
    - the operands at ``bool_operands`` are converted to ``bool`` (select's predicate).

    ``float_only``: fused only where the computation type is a float. ``accepts(**params)
    -> bool``: which params the template handles (by default none: an equation with
    params is not fused). ``unfused(dtype, **params) -> bool``: where the template would
    not give the unfused bits in the computation type ``dtype`` (NOTE [fused kernels round
    as the unfused ones] in cuvmap/cuda/kernels.py), so the equation runs unfused.
    """

    __slots__ = ("template", "float_only", "comparison_dtype", "bool_operands", "accepts", "unfused")

    def __init__(self, template, *, float_only=False, comparison_dtype=None, bool_operands=(), accepts=None,
                 unfused=None):
        self.template = template
        self.float_only = float_only
        self.comparison_dtype = comparison_dtype
        self.bool_operands = tuple(bool_operands)
        self.accepts = accepts
        self.unfused = unfused

    def __repr__(self):
        return f"CExpression({self.template!r})"


def _operand_aval(x):
    return x.aval


def _computation_dtype(eqn):
    """The dtype in which the equation's arithmetic happens: the output's, except for
    comparisons (their operands' common dtype, weak literals taking the array's)."""
    comparison_dtype = eqn.primitive.fused.comparison_dtype
    if comparison_dtype is not None:
        return np.dtype(comparison_dtype(*[_operand_aval(x) for x in eqn.inputs]))
    return eqn.outs[0].aval.dtype


def fusible(eqn):
    """Whether ``eqn`` can be a member of a fused group."""
    expression = eqn.primitive.fused
    # an equation with several results (NOTE [an equation with several results] in ir.py) is a call
    if expression is None or eqn.primitive.multiple_results:
        return False
    aval = eqn.outs[0].aval
    if not aval.shape or aval.dtype not in C_TYPES:
        return False
    if any(_operand_aval(x).dtype not in C_TYPES for x in eqn.inputs):
        return False
    if eqn.params and (expression.accepts is None or not expression.accepts(**eqn.params)):
        return False
    if expression.unfused is not None and expression.unfused(_computation_dtype(eqn), **eqn.params):
        return False
    return not expression.float_only or _computation_dtype(eqn).kind == "f"


@dataclasses.dataclass(eq=False, slots=True)
class FusedGroup:
    """Member equations (in program order) of one kernel, its external inputs (variables
    and literals, without repeats) and its outputs (member variables read outside)."""

    eqns: list
    inputs: list
    outputs: list
    shape: tuple

    def __repr__(self):
        names = " ".join(e.primitive.name for e in self.eqns)
        return f"FusedGroup({len(self.eqns)} eqns [{names}], {len(self.inputs)} in, {len(self.outputs)} out)"

    # -- a reference that runs anywhere ----------------------------------------------------

    def reference(self, *values):
        """The group's outputs computed by its members' impls, one by one: what the kernel
        must equal (and what runs when the kernel cannot be built)."""
        env = {id(x): v for x, v in zip(self.inputs, values)}
        for eqn in self.eqns:
            ins = [env[id(x)] if id(x) in env else x.val for x in eqn.inputs]
            env[id(eqn.outs[0])] = eqn.primitive.impl(*ins, **eqn.params)
        return tuple(env[id(v)] for v in self.outputs)

    # -- CUDA source -------------------------------------------------------------------------

    def cuda_kernel_source(self):
        """``(in_params, out_params, operation, name)`` of a CuPy ``ElementwiseKernel``
        computing the group; array inputs are ``in0, in1, ...`` and outputs ``out0, ...``."""
        names = {}
        in_params = []
        for i, x in enumerate(self.inputs):
            names[id(x)] = f"in{i}"
            in_params.append(f"{x.aval.dtype.name} in{i}")
        lines = []
        for n, eqn in enumerate(self.eqns):
            t = C_TYPES[eqn.outs[0].aval.dtype]
            lines.append(f"{t} v{n} = {_c_expression(eqn, names)};")
            names[id(eqn.outs[0])] = f"v{n}"
        out_params = []
        for j, v in enumerate(self.outputs):
            out_params.append(f"{v.aval.dtype.name} out{j}")
            lines.append(f"out{j} = {names[id(v)]};")
        operation = "\n".join(lines)
        name = f"cuvmap_fused_{len(self.eqns)}_" + "_".join(e.primitive.name for e in self.eqns[:4])
        return ", ".join(in_params), ", ".join(out_params), operation, name


def _c_literal(value, dtype):
    """``value`` as a C constant of ``dtype``, rounded to it as NumPy rounds a weak scalar
    into the array's dtype; a value that is not finite there (inf, NaN, a float32
    overflow) is written by its bits."""
    t = C_TYPES[dtype]
    if dtype.kind == "b":
        return "true" if value else "false"
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            v = np.asarray(value, dtype=dtype)
        if np.isfinite(v):
            return f"(({t}){float(v)!r})"
        if dtype == np.float32:
            return f"__int_as_float(0x{int(v.view(np.uint32)):08x})"
        return f"__longlong_as_double(0x{int(v.view(np.uint64)):016x}LL)"
    return f"(({t}){int(value)}LL)" if dtype.kind == "i" else f"(({t}){int(value)}ULL)"


def _fits(value, dtype):
    info = np.iinfo(dtype)
    return isinstance(value, (bool, np.bool_)) or info.min <= int(value) <= info.max


def _c_expression(eqn, names):
    expression = eqn.primitive.fused
    comp = _computation_dtype(eqn)
    t = C_TYPES[comp]

    def operand(x, as_type):
        if id(x) in names:
            return f"(({C_TYPES[as_type]}){names[id(x)]})"
        return _c_literal(x.val, as_type)

    if (expression.comparison_dtype is not None and comp.kind in "iu"
            and any(isinstance(x, Literal) and not _fits(x.val, comp) for x in eqn.inputs)):
        # NumPy compares an integer array with an out-of-range Python int by value
        # (uint8 < 300 holds everywhere); a cast of 300 to uint8 would wrap it
        comp = np.dtype(np.int64)
    ops = [operand(x, np.dtype(np.bool_) if i in expression.bool_operands else comp)
           for i, x in enumerate(eqn.inputs)]
    template = expression.template
    if callable(template):
        template = template(**eqn.params)
    return template.format(*ops, T=t, **eqn.params)


# ---------------------------------------------------------------------------------------
# The partition (NOTE [fusion groups])
# ---------------------------------------------------------------------------------------


def fuse(eqns, outvars):
    """Partitions ``eqns`` into a list of units, each a :class:`JaxprEqn` or a
    :class:`FusedGroup` of two or more equations, in an order in which every unit's
    inputs are computed before it runs."""
    readers = {}
    for k, eqn in enumerate(eqns):
        for x in eqn.inputs:
            readers.setdefault(id(x), set()).add(k)
    returned = {id(v) for v in outvars}
    units = []
    open_groups = {}  # shape -> [member indices]
    owner = {}  # id(var) -> the shape of the open group that computes it

    def close(shape):
        members = open_groups.pop(shape)
        for k in members:
            owner.pop(id(eqns[k].outs[0]), None)
        if len(members) == 1:
            units.append(eqns[members[0]])
            return
        member_set = set(members)
        inside = {id(eqns[k].outs[0]) for k in members}
        inputs, seen = [], set()
        for k in members:
            for x in eqns[k].inputs:
                if id(x) in inside or id(x) in seen:
                    continue
                if isinstance(x, Literal):  # written into the source
                    continue
                seen.add(id(x))
                inputs.append(x)
        outputs = [eqns[k].outs[0] for k in members
                   if id(eqns[k].outs[0]) in returned or readers.get(id(eqns[k].outs[0]), set()) - member_set]
        units.append(FusedGroup([eqns[k] for k in members], inputs, outputs, shape))

    def argument_count(members):
        """Inputs plus outputs of a group of ``members`` (outputs as known so far: a later
        member can only turn an output into an internal value)."""
        inside = {id(eqns[k].outs[0]) for k in members}
        ins = {id(x) for k in members for x in eqns[k].inputs
               if id(x) not in inside and not isinstance(x, Literal)}
        member_set = set(members)
        outs = sum(1 for k in members
                   if id(eqns[k].outs[0]) in returned or readers.get(id(eqns[k].outs[0]), set()) - member_set)
        return len(ins) + outs

    for k, eqn in enumerate(eqns):
        produced_by = {owner[id(x)] for x in eqn.inputs if id(x) in owner}
        if fusible(eqn):
            shape = eqn.outs[0].aval.shape
            for s in produced_by - {shape}:
                close(s)
            members = open_groups.get(shape)
            if members is not None and (len(members) >= MAX_GROUP_EQNS
                                        or argument_count(members + [k]) > MAX_KERNEL_ARGS):
                close(shape)
                members = None
            if members is None:
                members = open_groups[shape] = []
            members.append(k)
            owner[id(eqn.outs[0])] = shape
        else:
            for s in produced_by:
                close(s)
            units.append(eqn)
    for shape in list(open_groups):
        close(shape)
    return units
