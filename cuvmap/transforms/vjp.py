"""Reverse mode: the interpreter behind ``vjp``, ``grad``, ``value_and_grad`` and ``jacrev``.

``vjp(f, x) == (f(x), ct ↦ ctᵀ·∂f(x))``. While ``f`` runs, the grad interpreter records a
tape: for every primitive applied to one of its tracers, the primitive, its params, its
primal operands and output, and which operands are tape nodes. The backward pass walks the
tape in reverse, applying each primitive's VJP rule to the output cotangent and summing
the cotangents that reach each node.

A primitive ``y = p(x_0, ..., x_n)`` has a VJP rule per operand:
``rule(i, ct, y, *primals, **params) -> ctᵀ·∂y/∂x_i`` (for linear primitives, the
transpose). Only the operands that are tape nodes are asked for, so the gradient of a
weight never computes the gradient of the data. Rules call primitives, and the backward
pass runs after this transform has been popped, so those primitives reach the transforms
below: ``vmap(grad(f))`` runs the backward pass on batch tracers and hits the batching
rules of the backward primitives, ``grad(grad(f))`` records the backward pass on the outer
tape. A cotangent whose shape differs from its operand's (an operand that NumPy-broadcast)
is summed back to the operand's shape here.
"""
from cuvmap import core
from cuvmap.core import MissingRuleError, PrimalTracer, Trace

primitive_vjps = {}


class VJPTracer(PrimalTracer):
    __slots__ = ("node",)

    def __init__(self, main, primal, node):
        self._main = main
        self.primal = primal
        self.node = node


class Tape:
    """The record of a reverse-mode trace. Nodes ``0 .. num_inputs-1`` are the inputs;
    node ``k >= num_inputs`` is ``entries[k - num_inputs]``."""

    __slots__ = ("entries", "num_inputs")

    def __init__(self):
        self.entries = []
        self.num_inputs = 0


class VJPTrace(Trace):
    __slots__ = ()

    def process_primitive(self, primitive, args, params):
        main = self.main
        primals = list(args)
        operand_nodes = []
        for i, x in enumerate(args):
            if type(x) is VJPTracer and x._main is main:
                primals[i] = x.primal
                operand_nodes.append((i, x.node))
        out = primitive.bind(*primals, **params)
        if not primitive.differentiable or not core.is_float(out):
            return out
        rule = primitive_vjps.get(primitive)
        if rule is None:
            raise MissingRuleError(f"primitive {primitive.name} has no VJP rule (needed by grad/vjp)")
        tape = main.global_data
        node = tape.num_inputs + len(tape.entries)
        tape.entries.append((primitive, params, rule, primals, out, operand_nodes))
        return VJPTracer(main, out, node)


def backward_pass(tape, output_cts):
    """Runs the tape backwards.

    Args:
      tape: the :class:`Tape` of a finished trace.
      output_cts: pairs ``(node, ct)`` seeding the cotangents of the outputs.
    Returns:
      the cotangent of each input node (``None`` where no path reached it).
    """
    from cuvmap.lax import elementwise

    n_in = tape.num_inputs
    cts = [None] * (n_in + len(tape.entries))
    for node, ct in output_cts:
        cts[node] = ct if cts[node] is None else elementwise.add(cts[node], ct)
    entries = tape.entries
    for k in range(len(entries) - 1, -1, -1):
        node = n_in + k
        ct = cts[node]
        if ct is None:
            continue
        cts[node] = None
        primitive, params, rule, primals, out, operand_nodes = entries[k]
        for i, operand_node in operand_nodes:
            ct_i = rule(i, ct, out, *primals, **params)
            if ct_i is None:
                continue
            ct_i = match_operand(ct_i, primals[i])
            prev = cts[operand_node]
            cts[operand_node] = ct_i if prev is None else elementwise.add(prev, ct_i)
    return cts[:n_in]


def match_operand(ct, primal):
    """Sums a cotangent over the dims its operand was broadcast along (NumPy broadcasting)
    and casts it to the operand's dtype."""
    ct_shape = core.shape_of(ct)
    shape = core.shape_of(primal)
    if ct_shape == shape and (type(primal) is float or core.dtype_of(ct) == core.dtype_of(primal)):
        return ct
    from cuvmap.lax import elementwise, shape as lax_shape

    if ct_shape != shape:
        ct = lax_shape.unbroadcast(ct, shape)
    if type(primal) is not float and core.dtype_of(ct) != core.dtype_of(primal):
        ct = elementwise.convert_element_type(ct, core.dtype_of(primal))
    return ct


def defvjp(primitive, *per_operand_rules):
    """Registers one VJP rule per operand: ``rule(ct, out, *primals, **params)``; ``None``
    for operands that carry no derivative."""

    def rule(i, ct, out, *primals, **params):
        r = per_operand_rules[i]
        return None if r is None else r(ct, out, *primals, **params)

    primitive_vjps[primitive] = rule


def defderivative(primitive, *per_operand_rules):
    """For elementwise primitives, whose Jacobian is diagonal: ``rule(g, out, *primals)``
    returns ``g * ∂out/∂x_i`` and serves as both the JVP rule (``g`` a tangent) and the
    VJP rule (``g`` a cotangent)."""
    from cuvmap.transforms import jvp

    defvjp(primitive, *per_operand_rules)
    jvp.defjvp(primitive, *per_operand_rules)
