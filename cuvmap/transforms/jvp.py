"""Forward mode: the interpreter behind ``jvp``, ``jacfwd`` and ``hessian``.

``jvp(f, (x,), (t,)) == (f(x), ∂f(x)·t)``. A ``JVPTracer(primal, tangent)`` carries a value
and its directional derivative; ``tangent is None`` is a symbolic zero, which costs
nothing and is never materialised unless an output needs it.

A primitive ``y = p(x_0, ..., x_n)`` has a JVP rule per operand:
``rule(i, t_i, y, *primals, **params) -> ∂y/∂x_i · t_i``; the tracer adds the
contributions of the operands whose tangents are not zero. Rules call primitives, so they
are differentiable and batchable in turn. A contribution whose shape differs from the
output's (an operand that NumPy-broadcast) is broadcast to the output shape here.
"""
import numpy as np

from cuvmap import core
from cuvmap.core import MissingRuleError, PrimalTracer, Trace
from cuvmap.transforms import complex_rules, ir, staging
from cuvmap.core.bfloat16 import kind_of

primitive_jvps = {}


class JVPTracer(PrimalTracer):
    """``JVPTracer(main, primal, tangent)``: a primal value and its tangent (``None``: a
    symbolic zero)."""

    __slots__ = ()

    @property
    def tangent(self):
        return self.datum


class JVPTrace(Trace):
    __slots__ = ()

    def process_primitive(self, primitive, args, params):
        main = self.main
        primals = list(args)
        tangents = None
        for i, x in enumerate(args):
            if type(x) is JVPTracer and x._main is main:  # main.owns(x), inlined: every bind
                primals[i] = x.primal
                if x.tangent is not None:
                    if tangents is None:
                        tangents = []
                    tangents.append((i, x.tangent))
        out = primitive.bind(*primals, **params)
        if tangents is None or not primitive.differentiable or not core.is_float(out):
            return out
        rule = primitive_jvps.get(primitive)
        if rule is None:
            raise MissingRuleError(f"primitive {primitive.name} has no JVP rule (needed by jvp)")
        if primitive not in complex_rules.primitives_with_complex_rules:
            complex_rules.check(primitive, out, [primals[i] for i, _ in tangents], "JVP")
        t_out = None
        for i, t in tangents:
            contribution = rule(i, t, out, *primals, **params)
            if contribution is None:
                continue
            t_out = contribution if t_out is None else _add(t_out, contribution)
        if t_out is None:
            return out
        t_out = _match_aval(t_out, out)
        return JVPTracer(main, out, t_out)

    def process_call(self, primitive, args, params):
        """A call primitive under jvp: its ``jvp`` method, on the primals and the tangents
        (``None``: a symbolic zero; NOTE [call primitives] in :mod:`cuvmap.transforms.call`)."""
        main = self.main
        primals, tangents = [], []
        for x in args:
            ours = main.owns(x)
            primals.append(x.primal if ours else x)
            tangents.append(x.tangent if ours else None)
        if all(t is None for t in tangents):
            return primitive.bind(*primals, **params)
        out_primals, out_tangents = primitive.jvp(primals, tangents, params)
        return [p if t is None else JVPTracer(main, p, _match_aval(t, p)) for p, t in zip(out_primals, out_tangents)]


def jvp_jaxpr(closed, nonzero, in_avals, instantiate=None):
    """The program of the JVP of ``closed`` (over its constants and arguments, with
    ``in_avals``): arguments are the primals then the tangents of the operands marked
    ``nonzero``; outputs are the primal outputs then the tangents of the outputs marked in
    the returned ``out_nonzero``. ``instantiate`` (one bool per output): the outputs marked
    get a tangent even when it is zero (control flow's carries need one). Returns
    ``(ClosedJaxpr, out_nonzero)``, cached on ``closed``."""
    instantiate = None if instantiate is None else tuple(instantiate)
    key = ("jvp", tuple(nonzero), tuple(in_avals), instantiate)
    hit = closed.derived.get(key)
    if hit is not None:
        return hit
    flat = ir.consts_as_inputs(closed)
    n = len(in_avals)
    out_nonzero = []

    def pushed(*vals):
        primals, tangents = vals[:n], iter(vals[n:])
        with core.new_main(JVPTrace, name="jvp") as main:
            ins = [JVPTracer(main, p, next(tangents)) if nz else p for p, nz in zip(primals, nonzero)]
            outs = ir.eval_jaxpr(flat, [], ins)
        if instantiate is not None:
            outs = [_with_tangent(main, o) if inst else o for o, inst in zip(outs, instantiate)]
        out_p, out_t, nz = split_nonzero(main, outs)
        out_nonzero.extend(nz)
        return out_p + out_t

    tangent_avals = [a for a, nz in zip(in_avals, nonzero) if nz]
    program = ir.optimize(staging.trace_to_jaxpr(pushed, list(in_avals) + tangent_avals, name="jvp(jit)"))
    closed.derived[key] = (program, tuple(out_nonzero))
    return closed.derived[key]


def _with_tangent(main, x):
    """``x`` as a tracer of ``main`` with a tangent, zeros where it has none (a value that
    is not floating point has none)."""
    if main.owns(x):
        if x.tangent is not None:
            return x
        x = x.primal
    return JVPTracer(main, x, zeros_like(x)) if core.is_float(x) else x


def zeros_like(x):
    """Zeros with ``x``'s (logical) shape and dtype, as a primitive's result (under
    staging, a broadcast equation rather than a constant array)."""
    from cuvmap.lax import shape as lax_shape  # a rule helper's primitives: lax imports this module

    return lax_shape.broadcast_in_dim(core.full_like_concrete(x, 0, shape=()), core.shape_of(x), ())


def split_nonzero(main, values):
    """``(primals, tangents, nonzero)`` of ``values`` at level ``main``: the primal of each
    (a value of another level is its own primal), the tangents that are not symbolic zeros,
    and which values have one. The operands and results of a JVP program (:func:`jvp_jaxpr`)."""
    primals, tangents, nonzero = [], [], []
    for x in values:
        ours = main.owns(x)
        primals.append(x.primal if ours else x)
        nonzero.append(ours and x.tangent is not None)
        if nonzero[-1]:
            tangents.append(x.tangent)
    return primals, tangents, nonzero


def _add(a, b):
    from cuvmap.lax import elementwise  # a rule helper's primitives: lax imports this module

    return elementwise.add(a, b)


def has_aval_of(x, like):
    """Whether ``x`` has the shape and dtype of ``like`` (any real float dtype, for a
    weakly typed Python float ``like``): the common case, which :func:`match_aval` returns
    as is."""
    if core.shape_of(x) != core.shape_of(like):
        return False
    if type(like) is float:
        return kind_of(core.dtype_of(x)) == "f"
    return core.dtype_of(x) == core.dtype_of(like)


def match_aval(x, like, fit_shape):
    """``x`` with the shape and dtype of ``like``: ``fit_shape(x, shape)`` makes the shape
    (broadcasting a tangent to its output, summing a cotangent back to its operand), and a
    cast the dtype; a Python float ``like`` (weakly typed) takes ``x``'s dtype, its real
    one for a complex ``x``. A complex ``x`` cast to a real dtype keeps its real part: the
    transpose of the real-to-complex cast (NOTE [complex convention] in
    cuvmap/transforms/complex_rules.py)."""
    from cuvmap.lax import elementwise  # a rule helper's primitives: lax imports this module

    shape = core.shape_of(like)
    if core.shape_of(x) != shape:
        x = fit_shape(x, shape)
    dtype = core.dtype_of(x)
    if type(like) is float:
        if kind_of(dtype) == "c":
            x = elementwise.convert_element_type(x, np.finfo(dtype).dtype)
    elif dtype != core.dtype_of(like):
        x = elementwise.convert_element_type(x, core.dtype_of(like))
    return x


def _match_aval(t, out):
    """Broadcasts a tangent to the output's shape and casts it to the output's dtype."""
    if has_aval_of(t, out):
        return t
    from cuvmap.lax import shape as lax_shape  # a rule helper's primitives: lax imports this module

    return match_aval(t, out, lax_shape.broadcast_to)


def defjvp(primitive, *per_operand_rules):
    """Registers one JVP rule per operand: ``rule(t, out, *primals, **params)``; ``None``
    for operands that carry no derivative (indices, predicates)."""

    def rule(i, t, out, *primals, **params):
        r = per_operand_rules[i]
        return None if r is None else r(t, out, *primals, **params)

    primitive_jvps[primitive] = rule
