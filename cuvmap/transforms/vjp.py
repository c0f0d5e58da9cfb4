"""Reverse mode: the interpreter behind ``vjp``, ``grad``, ``value_and_grad`` and ``jacrev``.

``vjp(f, x) == (f(x), ct ↦ ctᵀ·∂f(x))``. While ``f`` runs, the grad interpreter records a
tape: for every primitive applied to one of its tracers, the primitive, its params, its
primal operands and output, and which operands are tape nodes. The backward pass walks the
tape in reverse, applying each primitive's VJP rule to the output cotangent and summing
the cotangents that reach each node.

A primitive ``y = p(x_0, ..., x_n)`` has a VJP rule per operand:
``rule(i, ct, y, *primals, **params) -> ctᵀ·∂y/∂x_i`` (for linear primitives, the
transpose). Each rule declares which forward values it reads (NOTE [what the tape keeps]);
the tape keeps those and only the avals of the rest. Only the operands that are tape nodes are asked for, so the gradient of a
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
# NOTE [what the tape keeps]
# Reverse mode must keep, until the backward pass, the forward values its rules read —
# and only those. ``add``, ``neg``, reshapes, transposes, broadcasts, slices and sums read
# none (their transposes need shapes and dtypes alone), ``exp`` reads its output, ``mul``
# its operands, ``take`` its indices but not the gathered array. Keeping everything would
# hold every intermediate of a long chain alive (20 steps of ``y = y + 1.0`` on 8 MB
# arrays: 160 MB), where JAX holds nothing. ``primitive_vjp_reads[p]`` is a pair
# ``(operands, out)``: the frozenset of operand indices the rules read (``None``: all of
# them) and whether they read the output. For the others the tape stores the aval (a
# ShapedArray, or the Python scalar itself, which costs nothing and keeps its weak type),
# so a rule's view of an unread operand has ``.shape`` and ``.dtype`` only, and a rule that
# does not read the output gets ``None`` for it (the cotangent has its shape). A primitive
# without a declaration keeps everything. ``declare_reads`` fills the table.
primitive_vjp_reads = {}


class VJPTracer(PrimalTracer):
    __slots__ = ("node",)

    def __init__(self, main, primal, node):
        self._main = main
        self.primal = primal
        self.node = node


class Tape:
    """The record of a reverse-mode trace. Nodes ``0 .. num_inputs-1`` are the inputs;
    node ``k >= num_inputs`` is ``entries[k - num_inputs]``."""

    __slots__ = ("entries", "num_inputs", "calls")

    def __init__(self):
        self.entries = []
        self.num_inputs = 0
        # staged programs' entries: index -> number of outputs (the entries after the
        # first output's are None; NOTE [a call on the tape])
        self.calls = {}


class VJPTrace(Trace):
    __slots__ = ()

    def process_primitive(self, primitive, args, params):
        main = self.main
        primals, operand_nodes = self._unwrap(args)
        out = primitive.bind(*primals, **params)
        if not primitive.differentiable or not core.is_float(out):
            return out
        rule = primitive_vjps.get(primitive)
        if rule is None:
            raise MissingRuleError(f"primitive {primitive.name} has no VJP rule (needed by grad/vjp)")
        reads = primitive_vjp_reads.get(primitive)
        if reads is None:
            kept, kept_out = primals, out
        else:
            read_operands, read_out = reads
            if read_operands is None:
                kept = primals
            else:
                kept = [x if i in read_operands else _aval_of(x) for i, x in enumerate(primals)]
            kept_out = out if read_out else None
        tape = main.global_data
        node = tape.num_inputs + len(tape.entries)
        tape.entries.append((primitive, params, rule, kept, kept_out, operand_nodes))
        return VJPTracer(main, out, node)

    def process_call(self, primitive, args, params):
        """A staged program under reverse mode: its forward program runs now and returns
        the outputs and residuals; the tape records one entry for all of the call's
        floating-point outputs, whose rule runs the backward program on the residuals and
        the outputs' cotangents (:func:`cuvmap.transforms.staging.vjp_jaxprs`)."""
        from cuvmap.transforms import staging

        primals, operand_nodes = self._unwrap(args)
        if not operand_nodes:
            return primitive.bind(*primals, **params)
        closed = params["program"]
        needs_ct = [False] * len(args)
        for i, _ in operand_nodes:
            needs_ct[i] = True
        forward, backward, ct_outputs = staging.vjp_jaxprs(closed, needs_ct, staging.avals_of(primals))
        outs = staging.call(forward, primals)
        num_outs = len(ct_outputs)
        out_primals, residuals = outs[:num_outs], outs[num_outs:]
        with_ct = [j for j, takes in enumerate(ct_outputs) if takes]
        if not with_ct:
            return out_primals
        ct_avals = [closed.jaxpr.outvars[j].aval for j in with_ct]

        def rule(cts):
            cts = [staging.zeros(a) if c is None else c for c, a in zip(cts, ct_avals)]
            return staging.call(backward, residuals + cts)

        return record_call(self.main, primitive, params, rule, staging.avals_of(primals), operand_nodes,
                           out_primals, with_ct)


    # NOTE [reverse mode of a custom_jvp function]
    # A custom_jvp function's derivative is its JVP rule, ``(primals, tangents) ->
    # (primal_out, tangent_out)``, whose tangent_out is linear in the tangents; reverse mode
    # needs that linear map's transpose. JAX gets it by linearizing the rule (partial
    # evaluation) and transposing the linear part. Here the rule runs once with the primals
    # at the level below and, for the tangents of the operands being differentiated, tracers
    # of a fresh reverse-mode trace whose primal values are zeros: its own tape then records
    # the rule's tangent computation (the primitives applied to the tangents, with the
    # primal-dependent factors as the values they read), and walking that tape backwards
    # from the output cotangents is the transpose (a linear map's VJP at any point — zero
    # here — is its transpose). The outer tape holds one call entry (NOTE [a call on the
    # tape]) whose rule is that backward walk. So the rule, never ``f``'s body, defines the
    # gradient; the rule's primal-dependent values are values of the level below, so
    # ``grad(grad(f))`` differentiates the rule's tangent expression, as JAX does. The price
    # is one evaluation of the rule's tangent part on zeros, whose values nothing reads (under
    # ``jit`` dead-code elimination drops them). A rule whose tangent_out is not linear in
    # the tangents is not a JVP rule; its reverse mode is then the transpose of its part
    # that is.
    def process_custom_jvp_call(self, primitive, args, params):
        """A ``custom_jvp`` function under reverse mode (NOTE [reverse mode of a custom_jvp
        function])."""
        primals, operand_nodes = self._unwrap(args)
        if not operand_nodes:
            return primitive.bind(*primals, **params)
        main = self.main
        inner_tape = Tape()
        with core.new_main(VJPTrace, inner_tape, name=main.name) as inner:
            tangents = [core.full_like_concrete(p, 0) for p in primals]
            for i, _ in operand_nodes:
                tangents[i] = VJPTracer(inner, tangents[i], inner_tape.num_inputs)
                inner_tape.num_inputs += 1
            out_primals, out_tangents = params["jvp"](primals, tangents)
        with_ct = [j for j, (p, t) in enumerate(zip(out_primals, out_tangents))
                   if core.is_float(p) and type(t) is VJPTracer and t._main is inner]
        if not with_ct:
            return list(out_primals)
        seed_nodes = [out_tangents[j].node for j in with_ct]
        avals = [_aval_of(p) for p in primals]

        def rule(cts):
            in_cts = backward_pass(inner_tape, [(n, c) for n, c in zip(seed_nodes, cts) if c is not None])
            return [None if c is None else match_operand(c, avals[i]) for c, (i, _) in zip(in_cts, operand_nodes)]

        return record_call(self.main, primitive, params, rule, avals, operand_nodes, out_primals, with_ct)

    def process_custom_vjp_call(self, primitive, args, params):
        """A ``custom_vjp`` function under reverse mode: ``fwd`` runs now, at the level below
        (its outputs and residuals are values there), and the tape records one call entry
        whose rule is ``bwd`` on the residuals and the outputs' cotangents (zeros for those
        that get none)."""
        from cuvmap.transforms import staging

        primals, operand_nodes = self._unwrap(args)
        if not operand_nodes:
            return primitive.bind(*primals, **params)
        out_primals, residuals = params["fwd"](*primals)
        with_ct = [j for j, p in enumerate(out_primals) if core.is_float(p)]
        if not with_ct:
            return list(out_primals)
        out_avals = staging.avals_of(out_primals)
        avals = [_aval_of(p) for p in primals]
        bwd = params["bwd"]

        def rule(cts):
            full = [None] * len(out_avals)
            for j, c in zip(with_ct, cts):
                full[j] = c
            full = [staging.zeros(a) if c is None else c for c, a in zip(full, out_avals)]
            in_cts = bwd(residuals, full)
            return [None if in_cts[i] is None else match_operand(in_cts[i], avals[i]) for i, _ in operand_nodes]

        return record_call(self.main, primitive, params, rule, avals, operand_nodes, out_primals, with_ct)

    def _unwrap(self, args):
        """The primal values of ``args`` and the ``(operand index, node)`` of the operands
        that are nodes of this tape."""
        main = self.main
        primals = list(args)
        operand_nodes = []
        for i, x in enumerate(args):
            if type(x) is VJPTracer and x._main is main:
                primals[i] = x.primal
                operand_nodes.append((i, x.node))
        return primals, operand_nodes

def record_call(main, primitive, params, rule, operand_avals, operand_nodes, out_primals, with_ct):
    """Records a call with several outputs on ``main``'s tape (NOTE [a call on the tape]):
    ``rule(cts)`` maps the cotangents of the outputs ``with_ct`` (``None`` where none
    reached one) to those of the operands in ``operand_nodes``, in their order. Returns
    the outputs, those in ``with_ct`` as tracers of ``main``."""
    tape = main.global_data
    node = tape.num_inputs + len(tape.entries)
    tape.calls[len(tape.entries)] = len(with_ct)
    tape.entries.append((primitive, params, rule, operand_avals, None, operand_nodes))
    tape.entries.extend([None] * (len(with_ct) - 1))
    results = list(out_primals)
    for offset, j in enumerate(with_ct):
        results[j] = VJPTracer(main, out_primals[j], node + offset)
    return results


def _aval_of(x):
    """What the tape keeps of a value its rule does not read (NOTE [what the tape keeps]):
    its shape and dtype (built without the conversions of ``ShapedArray.__init__``: this
    runs for every recorded operand)."""
    if type(x) in core._PY_SCALAR_DTYPES:
        return x
    aval = object.__new__(core.ShapedArray)
    aval.shape = x.shape
    aval.dtype = x.dtype
    aval.weak_type = False
    return aval


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
    calls = tape.calls
    for k in range(len(entries) - 1, -1, -1):
        node = n_in + k
        if calls and k in calls:
            _backward_call(entries[k], cts, node, calls[k])
            continue
        ct = cts[node]
        if ct is None:
            continue
        entry = entries[k]
        if entry is None:  # a later output of a staged call: its first entry takes it
            continue
        cts[node] = None
        primitive, params, rule, primals, out, operand_nodes = entry
        for i, operand_node in operand_nodes:
            ct_i = rule(i, ct, out, *primals, **params)
            if ct_i is None:
                continue
            ct_i = match_operand(ct_i, primals[i])
            prev = cts[operand_node]
            cts[operand_node] = ct_i if prev is None else elementwise.add(prev, ct_i)
    return cts[:n_in]


# NOTE [a call on the tape]
# A staged program (``grad(jit(f))``) has several outputs and one backward program for all
# of them, which needs every output's cotangent at once. Its outputs take consecutive
# nodes; the entry at the first holds the call, the following entries are None (so a node
# is still ``num_inputs`` + its entry's index), and ``tape.calls`` maps the first entry's
# index to the number of outputs. Every output node is later than each input node, so
# when the reverse walk reaches the first entry, all of the outputs' cotangents are in.
def _backward_call(entry, cts, node, num_outs):
    from cuvmap.lax import elementwise

    group = cts[node:node + num_outs]
    if all(c is None for c in group):
        return
    cts[node:node + num_outs] = [None] * num_outs
    _, _, rule, operand_avals, _, operand_nodes = entry
    in_cts = rule(group)
    for (i, operand_node), ct_i in zip(operand_nodes, in_cts):
        if ct_i is None:  # (a custom rule's zero cotangent)
            continue
        prev = cts[operand_node]
        cts[operand_node] = ct_i if prev is None else elementwise.add(prev, ct_i)


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


def declare_reads(primitive, reads, num_operands=None):
    """Records which forward values ``primitive``'s VJP rules read (NOTE [what the tape
    keeps]): ``reads`` holds operand indices and ``"out"``, or is ``"all"``.
    ``num_operands``: the primitive's operand count, when fixed (reading every operand is
    then recorded as ``None``, which the tape handles without a per-operand test)."""
    if reads == "all":
        primitive_vjp_reads.pop(primitive, None)
        return
    reads = frozenset(reads)
    bad = [r for r in reads if r != "out" and not (isinstance(r, int) and r >= 0)]
    if bad or (num_operands is not None and any(isinstance(r, int) and r >= num_operands for r in reads)):
        raise ValueError(f"{primitive.name}: reads must hold operand indices and 'out', got {sorted(map(str, reads))}")
    operands = frozenset(r for r in reads if r != "out")
    if num_operands is not None and len(operands) == num_operands:
        operands = None
    primitive_vjp_reads[primitive] = (operands, "out" in reads)


def defvjp(primitive, *per_operand_rules, reads="all"):
    """Registers one VJP rule per operand: ``rule(ct, out, *primals, **params)``; ``None``
    for operands that carry no derivative. ``reads``: the operand indices and ``"out"``
    whose values the rules use (NOTE [what the tape keeps]); the rules see the others as
    avals. ``"all"`` (the default) keeps every value."""

    def rule(i, ct, out, *primals, **params):
        r = per_operand_rules[i]
        return None if r is None else r(ct, out, *primals, **params)

    primitive_vjps[primitive] = rule
    declare_reads(primitive, reads, len(per_operand_rules))


def defderivative(primitive, *per_operand_rules, reads="all"):
    """For elementwise primitives, whose Jacobian is diagonal: ``rule(g, out, *primals)``
    returns ``g * ∂out/∂x_i`` and serves as both the JVP rule (``g`` a tangent) and the
    VJP rule (``g`` a cotangent). ``reads`` as in :func:`defvjp` (for the VJP; the JVP
    rule always has every value)."""
    from cuvmap.transforms import jvp

    defvjp(primitive, *per_operand_rules, reads=reads)
    jvp.defjvp(primitive, *per_operand_rules)


def deflinear(primitive, transpose):
    """A primitive linear in its single operand: its JVP applies it to the tangent, and
    ``transpose(ct, x, **params)`` is its VJP, where ``x`` is the operand's aval (a linear
    map's transpose needs its shape and dtype, never its value)."""
    from cuvmap.transforms import jvp

    jvp.primitive_jvps[primitive] = lambda i, t, out, x, **params: primitive.bind(t, **params)
    defvjp(primitive, lambda ct, out, x, **params: transpose(ct, x, **params), reads=())
