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
from cuvmap import core
from cuvmap.core import MissingRuleError, PrimalTracer, Trace

primitive_jvps = {}


class JVPTracer(PrimalTracer):
    __slots__ = ("tangent",)

    def __init__(self, main, primal, tangent):
        self._main = main
        self.primal = primal
        self.tangent = tangent


class JVPTrace(Trace):
    __slots__ = ()

    def process_primitive(self, primitive, args, params):
        main = self.main
        primals = list(args)
        tangents = None
        for i, x in enumerate(args):
            if type(x) is JVPTracer and x._main is main:
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
        """A staged program under jvp: its JVP program (primals and the nonzero tangents
        in, outputs and their nonzero tangents out), staged once per pattern of zeros."""
        from cuvmap.transforms import staging

        main = self.main
        primals, tangents, nonzero = split_nonzero(main, args)
        if not tangents:
            return primitive.bind(*primals, **params)
        program, out_nonzero = staging.jvp_jaxpr(params["program"], nonzero, staging.avals_of(primals))
        return join_nonzero(main, staging.call(program, primals + tangents), out_nonzero)

    def process_custom_jvp_call(self, primitive, args, params):
        """A ``custom_jvp`` function under jvp: its rule, not its body, gives the outputs
        and their tangents (zero tangents are instantiated, as JAX does for the rule)."""
        main = self.main
        primals, tangents = self._unwrap(args)
        if all(t is None for t in tangents):
            return primitive.bind(*primals, **params)
        tangents = [core.full_like_concrete(p, 0) if t is None else t for p, t in zip(primals, tangents)]
        out_primals, out_tangents = params["jvp"](primals, tangents)
        return [JVPTracer(main, p, _match_aval(t, p)) if core.is_float(p) else p
                for p, t in zip(out_primals, out_tangents)]

    def process_custom_vjp_call(self, primitive, args, params):
        """A ``custom_vjp`` function under jvp: it defines no forward-mode rule, so a
        nonzero tangent is an error (as in JAX); without one the call goes to the level
        below."""
        primals, tangents = self._unwrap(args)
        if any(t is not None for t in tangents):
            from cuvmap.transforms.custom_derivatives import CustomDerivativeError

            raise CustomDerivativeError(
                f"can't apply forward-mode autodiff (jvp) to a custom_vjp function: "
                f"{params['fun'].__name__} defines reverse mode only (fwd and bwd); differentiate it "
                "with grad/vjp/jacrev, or make it a custom_jvp function"
            )
        return primitive.bind(*primals, **params)

    def _unwrap(self, args):
        """The primals and the tangents (``None``: a symbolic zero) of ``args``."""
        main = self.main
        primals, tangents = [], []
        for x in args:
            if type(x) is JVPTracer and x._main is main:
                primals.append(x.primal)
                tangents.append(x.tangent)
            else:
                primals.append(x)
                tangents.append(None)
        return primals, tangents


def split_nonzero(main, values):
    """``(primals, tangents, nonzero)`` of ``values`` at level ``main``: the primal of each
    (a value of another level is its own primal), the tangents that are not symbolic zeros,
    and which values have one. The operands of a JVP program (staging.jvp_jaxpr)."""
    primals, tangents, nonzero = [], [], []
    for x in values:
        ours = type(x) is JVPTracer and x._main is main
        primals.append(x.primal if ours else x)
        nonzero.append(ours and x.tangent is not None)
        if nonzero[-1]:
            tangents.append(x.tangent)
    return primals, tangents, nonzero


def join_nonzero(main, outs, out_nonzero):
    """Tracers of ``main`` for the outputs of a JVP program: ``outs`` holds the primal
    outputs, then the tangents of those marked in ``out_nonzero``."""
    num_outs = len(out_nonzero)
    out_tangents = iter(outs[num_outs:])
    return [JVPTracer(main, p, next(out_tangents)) if nz else p for p, nz in zip(outs[:num_outs], out_nonzero)]


def _add(a, b):
    from cuvmap.lax import elementwise

    return elementwise.add(a, b)


def _match_aval(t, out):
    """Broadcasts a tangent to the output's shape and casts it to the output's dtype."""
    out_shape = core.shape_of(out)
    t_shape = core.shape_of(t)
    if t_shape == out_shape and (type(out) is float or core.dtype_of(t) == core.dtype_of(out)):
        return t
    from cuvmap.lax import elementwise, shape as lax_shape

    if t_shape != out_shape:
        t = lax_shape.broadcast_to(t, out_shape)
    if type(out) is not float and core.dtype_of(t) != core.dtype_of(out):
        t = elementwise.convert_element_type(t, core.dtype_of(out))
    return t


def defjvp(primitive, *per_operand_rules):
    """Registers one JVP rule per operand: ``rule(t, out, *primals, **params)``; ``None``
    for operands that carry no derivative (indices, predicates)."""

    def rule(i, t, out, *primals, **params):
        r = per_operand_rules[i]
        return None if r is None else r(t, out, *primals, **params)

    primitive_jvps[primitive] = rule
