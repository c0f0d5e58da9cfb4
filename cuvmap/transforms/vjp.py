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
import dataclasses

from cuvmap import core
from cuvmap.core import MissingRuleError, PrimalTracer, Trace
from cuvmap.transforms import complex_rules, ir, jvp, staging
from cuvmap.transforms.jvp import has_aval_of, match_aval
from cuvmap.transforms.partial_eval import partial_eval_jaxpr
from cuvmap.core.bfloat16 import kind_of

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
    """``VJPTracer(main, primal, node)``: a primal value and its node on the tape."""

    __slots__ = ()

    @property
    def node(self):
        return self.datum


class Tape:
    """The record of a reverse-mode trace. Nodes ``0 .. num_inputs-1`` are the inputs;
    node ``k >= num_inputs`` is ``entries[k - num_inputs]``."""

    __slots__ = ("entries", "num_inputs", "calls", "names")

    def __init__(self):
        self.entries = []
        self.num_inputs = 0
        # staged programs' entries: index -> number of outputs (the entries after the
        # first output's are None; NOTE [a call on the tape])
        self.calls = {}
        # entry index -> the name stack it was recorded under, where not empty (NOTE
        # [named scopes] in cuvmap/core/tracers.py)
        self.names = {}

    def new_input(self):
        """A new input node (before any entry is recorded); returns its index."""
        if self.entries:
            raise AssertionError("a tape's inputs come before its entries")
        self.num_inputs += 1
        return self.num_inputs - 1


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
        if primitive not in complex_rules.primitives_with_complex_rules:
            complex_rules.check(primitive, out, [primals[i] for i, _ in operand_nodes], "VJP")
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
        names = core._state.name_stack
        if names:
            tape.names[len(tape.entries)] = names
        tape.entries.append((primitive, params, rule, kept, kept_out, operand_nodes))
        return VJPTracer(main, out, node)

    def process_call(self, primitive, args, params):
        """A call primitive under reverse mode: its ``vjp`` method computes the outputs now
        and gives the rule of its backward pass, which the tape records as one entry for
        all of the call's outputs that take a cotangent (NOTE [a call on the tape], NOTE
        [call primitives] in :mod:`cuvmap.transforms.call`)."""
        primals, operand_nodes = self._unwrap(args)
        if not operand_nodes:
            return primitive.bind(*primals, **params)
        needs_ct = [False] * len(args)
        for i, _ in operand_nodes:
            needs_ct[i] = True
        out_primals, with_ct, backward = primitive.vjp(primals, needs_ct, params)
        if not with_ct:
            return list(out_primals)
        avals = [_aval_of(p) for p in primals]
        return record_call(self.main, primitive, params, backward, avals, operand_nodes, out_primals, with_ct)

    def _unwrap(self, args):
        """The primal values of ``args`` and the ``(operand index, node)`` of the operands
        that are nodes of this tape."""
        main = self.main
        primals = list(args)
        operand_nodes = []
        for i, x in enumerate(args):
            if type(x) is VJPTracer and x._main is main:  # main.owns(x), inlined: every bind
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
    names = core._state.name_stack
    if names:
        tape.names[len(tape.entries)] = names
    tape.entries.append((primitive, params, rule, operand_avals, None, operand_nodes))
    tape.entries.extend([None] * (len(with_ct) - 1))
    results = list(out_primals)
    for offset, j in enumerate(with_ct):
        results[j] = VJPTracer(main, out_primals[j], node + offset)
    return results


def _aval_of(x):
    """What the tape keeps of a value its rule does not read (NOTE [what the tape keeps]):
    its shape and dtype (built without the conversions of ``ShapedArray.__init__``: this
    runs for every recorded operand). A Python scalar becomes its weak 0-d aval, so rules
    may read ``x.shape`` and ``x.dtype`` of any operand they do not read the value of."""
    scalar_dtype = core._PY_SCALAR_DTYPES.get(type(x))
    if scalar_dtype is not None:
        return core.ShapedArray((), scalar_dtype, weak_type=True)
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
    from cuvmap.lax import elementwise  # a rule helper's primitives: lax imports this module

    n_in = tape.num_inputs
    cts = [None] * (n_in + len(tape.entries))
    for node, ct in output_cts:
        cts[node] = ct if cts[node] is None else elementwise.add(cts[node], ct)
    entries = tape.entries
    calls = tape.calls
    names = tape.names
    base = core.name_stack()
    try:
        for k in range(len(entries) - 1, -1, -1):
            if names:  # each entry's rules under its names, transposed (NOTE [named scopes] in core/tracers.py)
                core.set_name_stack(_transposed_names(base, names.get(k)))
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
    finally:
        if names:
            core.set_name_stack(base)
    return cts[:n_in]


def _transposed_names(base, recorded):
    """The name stack of a backward rule: ``base`` (the stack when the backward pass
    started) and ``transpose(<the names the entry was recorded under, below base>)``."""
    if not recorded:
        return base
    inner = recorded[len(base):] if recorded[:len(base)] == base else recorded
    return base + (f"transpose({'/'.join(inner)})",) if inner else base


# NOTE [a call on the tape]
# A staged program (``grad(jit(f))``) has several outputs and one backward program for all
# of them, which needs every output's cotangent at once. Its outputs take consecutive
# nodes; the entry at the first holds the call, the following entries are None (so a node
# is still ``num_inputs`` + its entry's index), and ``tape.calls`` maps the first entry's
# index to the number of outputs. Every output node is later than each input node, so
# when the reverse walk reaches the first entry, all of the outputs' cotangents are in.
def _backward_call(entry, cts, node, num_outs):
    from cuvmap.lax import elementwise  # a rule helper's primitives: lax imports this module

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
    if has_aval_of(ct, primal):
        return ct
    from cuvmap.lax import shape as lax_shape  # a rule helper's primitives: lax imports this module

    return match_aval(ct, primal, lax_shape.unbroadcast)


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
    defvjp(primitive, *per_operand_rules, reads=reads)
    jvp.defjvp(primitive, *per_operand_rules)


def deflinear(primitive, transpose):
    """A primitive linear in its single operand: its JVP applies it to the tangent, and
    ``transpose(ct, x, **params)`` is its VJP, where ``x`` is the operand's aval (a linear
    map's transpose needs its shape and dtype, never its value)."""
    jvp.primitive_jvps[primitive] = lambda i, t, out, x, **params: primitive.bind(t, **params)
    defvjp(primitive, lambda ct, out, x, **params: transpose(ct, x, **params), reads=())


# ---------------------------------------------------------------------------------------
# Reverse mode of a staged program
# ---------------------------------------------------------------------------------------


def joint_vjp_jaxpr(closed, needs_ct, in_avals):
    """The joint program of reverse mode through ``closed``: arguments are the primals
    (``closed``'s constants and arguments, with ``in_avals``) then the cotangents of the
    floating-point outputs; outputs are ``closed``'s outputs then the cotangents of the
    operands marked ``needs_ct``. It is staged by running ``vjp`` of ``eval_jaxpr`` on
    staged values. Returns ``(ClosedJaxpr, ct_outputs)``, with ``ct_outputs`` marking the
    outputs that take a cotangent."""
    flat = ir.consts_as_inputs(closed)
    n = len(in_avals)
    out_avals = closed.out_avals
    ct_outputs = tuple(kind_of(a.dtype) in "fc" for a in out_avals)

    def joint(*vals):
        primals, cts = vals[:n], iter(vals[n:])
        tape = Tape()
        with core.new_main(VJPTrace, tape, name="vjp") as main:
            ins = []
            for p, needed in zip(primals, needs_ct):
                if needed:
                    ins.append(VJPTracer(main, p, tape.new_input()))
                else:
                    ins.append(p)
            outs = ir.eval_jaxpr(flat, [], ins)
        seeds, out_p = [], []
        for o, takes_ct in zip(outs, ct_outputs):
            ct = next(cts) if takes_ct else None
            if main.owns(o):
                out_p.append(o.primal)
                seeds.append((o.node, ct))
            else:
                out_p.append(o)
        in_cts = backward_pass(tape, seeds)
        wanted = [p for p, needed in zip(primals, needs_ct) if needed]
        return out_p + [core.full_like_concrete(p, 0) if c is None else match_operand(c, p)
                        for c, p in zip(in_cts, wanted)]

    ct_avals = [a for a, takes in zip(out_avals, ct_outputs) if takes]
    whole = staging.trace_to_jaxpr(joint, list(in_avals) + ct_avals, name="vjp(jit)")
    return whole, ct_outputs


@dataclasses.dataclass(frozen=True, slots=True)
class VJPPrograms:
    """Reverse mode through a staged program (:func:`vjp_programs`): ``forward(primals) ->
    outputs + saved``; ``backward(primals_read, saved, output cotangents) -> cotangents of
    the operands that need one``. ``primals_read`` indexes the primals the backward
    program reads directly; ``ct_outputs`` marks the outputs that take a cotangent."""

    forward: object
    backward: object
    ct_outputs: tuple
    primals_read: list
    num_saved: int


def vjp_programs(closed, needs_ct, in_avals, saveable):
    """The forward and backward programs of reverse mode through ``closed`` (over its
    constants and arguments, with ``in_avals``) for the operands marked ``needs_ct``: the
    joint program (:func:`joint_vjp_jaxpr`) split by partial evaluation with the output
    cotangents unknown (:func:`cuvmap.transforms.partial_eval.partial_eval_jaxpr`).
    ``saveable`` is the policy: ``everything_saveable`` for a jitted program (the forward
    program returns every residual), a checkpoint's policy for a region (the backward
    program recomputes the rest). Returns a :class:`VJPPrograms`, cached on ``closed``."""
    key = ("vjp", tuple(needs_ct), tuple(in_avals), saveable)
    hit = closed.derived.get(key)
    if hit is not None:
        return hit
    whole, ct_outputs = joint_vjp_jaxpr(closed, needs_ct, in_avals)
    whole = ir.optimize(whole)
    n, num_outs, num_cts = len(in_avals), len(ct_outputs), sum(ct_outputs)
    split = partial_eval_jaxpr(whole, [False] * n + [True] * num_cts,
                               instantiate=[False] * num_outs + [True] * sum(needs_ct), saveable=saveable)
    if any(split.out_unknown[:num_outs]):
        raise AssertionError("an output of a staged program depends on a cotangent")
    programs = VJPPrograms(split.known, split.staged, ct_outputs, split.known_read, split.num_res)
    closed.derived[key] = programs
    return programs
