"""Linearization: ``linearize(f, *primals) == (f(*primals), f_jvp)`` with
``f_jvp(*tangents) == ∂f(*primals)·tangents``.

The JVP of ``f`` at fixed primals is a linear map of the tangents. ``linearize`` computes
``f(*primals)`` once and keeps that linear map as a staged program whose only arguments
are the tangents: every value the map needs from the primal computation (a residual:
``cos(x)`` for ``sin``, an operand of ``mul``) is a constant of the program, so each call
of ``f_jvp`` runs the tangent arithmetic and nothing of ``f``'s primal computation.

This is JAX's linearize, forward mode followed by partial evaluation, done online: ``f``
runs under the JVP interpreter whose tangents are staged values of a
:class:`LinearizeTrace` one level below (the *unknowns*), while the primals are the real
values (the *knowns*). The JVP rules bind the primal primitive on the primals, which runs
now, at the levels under ``linearize`` (eagerly, or under the transforms that own the
primals: ``vmap(lambda x: linearize(f, x)[1](t))``, ``grad`` of a linearized map); the
primitives they apply to tangents reach the staging trace and become the equations of the
tangent program, with the primal values they read as its constants. Since the primals are
real values, Python control flow on them works, as under ``jvp``.

``f_jvp(*tangents)`` runs that program through the call primitive, so it composes like a
jitted function: ``jit(f_jvp)``, ``vmap(f_jvp)`` (a Jacobian, column by column) and
``grad`` through it all work, and where the constants are tracers of an outer transform
(linearize under ``vmap``), that transform processes the call.
"""
from cuvmap import api_util, core, dtypes, tree
from cuvmap.api_util import TransformError
from cuvmap.core import new_main
from cuvmap.transforms import ir
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, Literal, Var
from cuvmap.transforms.jvp import JVPTrace, JVPTracer
from cuvmap.transforms.program_call import call
from cuvmap.transforms.staging import JaxprBuilder, StagedTracer, StagingTrace


class LinearizeTrace(StagingTrace):
    """The staging trace of :func:`linearize`'s tangents: its values are the *unknowns*
    of partial evaluation. It stages what it is given as :class:`StagingTrace` does; it is
    a class of its own so that call primitives can tell it from ``jit``'s staging, where
    every operand is staged: here the operands that are not its tracers are known now
    (a checkpointed region splits accordingly). It is never
    the thread's staging transform, so values made from nothing are computed now."""

    __slots__ = ()

    def process_call(self, primitive, args, params):
        """A call primitive with some operands unknown: its ``partial_eval`` method (NOTE
        [call primitives] in :mod:`cuvmap.transforms.call`)."""
        return primitive.partial_eval(self, args, params)


def linearize_flat(fun, primals, where, tangent_origins=None):
    """Runs ``fun(*primals)`` (flat lists of leaves in and out) under the JVP interpreter
    with staged tangents.

    Args:
      fun: ``fun(*leaves) -> (out_leaves, extra)``: the flat function and whatever else it
        returns (aux), passed back as is after the JVP tracers in it are replaced by their
        primals.
      primals: the leaves; those of floating dtype get a tangent.
      where: the name of the transform (in errors).
      tangent_origins: for each primal, the text naming its tangent in errors.
    Returns:
      ``(out_primals, program, out_nonzero, extra)``: the primal outputs, the tangent
      program (a :class:`~cuvmap.transforms.ir.ClosedJaxpr` from the tangents of the
      floating primals to the tangents of the outputs marked ``out_nonzero``; the others
      are zero), and ``extra``.
    """
    builder = JaxprBuilder()
    tangent_vars = []
    with new_main(LinearizeTrace, builder, name=where) as pe_main:
        tangents = []
        for i, p in enumerate(primals):
            if core.is_float(p):
                aval = core.get_aval(p)
                var = Var(aval, None if tangent_origins is None else tangent_origins[i])
                tangent_vars.append(var)
                tangents.append(StagedTracer(pe_main, var))
            else:
                tangents.append(None)
        with new_main(JVPTrace, name=where) as jvp_main:
            traced = [p if t is None else JVPTracer(jvp_main, p, t) for p, t in zip(primals, tangents)]
            outs, extra = fun(*traced)
        out_primals, outvars, out_nonzero = [], [], []
        for o in outs:
            ours = jvp_main.owns(o)
            out_primals.append(o.primal if ours else o)
            t = o.tangent if ours else None
            out_nonzero.append(t is not None)
            if t is None:
                continue
            if pe_main.owns(t):
                outvars.append(t.var)
            elif type(t) in core._PY_SCALAR_DTYPES:
                outvars.append(Literal(t))
            else:  # a tangent that does not depend on the input tangents
                outvars.append(builder.const_var(t))
        extra = tree.map_preserving(lambda a: a.primal if jvp_main.owns(a) else a, extra)
        staged_primals = [pe_main.owns(p) for p in out_primals]
        staged_vars = [p.var for p, s in zip(out_primals, staged_primals) if s]
    program = ir.optimize(ClosedJaxpr(Jaxpr(builder.constvars, tangent_vars, builder.eqns, outvars), builder.consts))
    if staged_vars:
        # NOTE [primal outputs staged by partial evaluation]
        # An equation with several results is split as a whole: a checkpointed region
        # holding a loop or a cond (whose JVP carries primals and tangents in one
        # equation) comes out of partial evaluation with its primal outputs staged too. A
        # primal output never depends on the tangents' values, so it is the staged part
        # run now with zero tangents (the region's primal computation once more, as a
        # checkpoint recomputes anyway); the linear map itself is unchanged.
        probe = ir.optimize(ClosedJaxpr(Jaxpr(builder.constvars, tangent_vars, builder.eqns, staged_vars),
                                        builder.consts))
        zeros = [core.full_like_concrete(p, 0, dtype=v.aval.dtype)
                 for p, v in zip([p for p in primals if core.is_float(p)], tangent_vars)]
        values = iter(call(probe, zeros))
        out_primals = [next(values) if s else p for p, s in zip(out_primals, staged_primals)]
    return out_primals, program, out_nonzero, extra


def linearize(f, *primals, has_aux=False):
    """The value of ``f`` at ``primals`` and its JVP there as a function of the tangents:
    ``(f(*primals), f_jvp)`` with ``f_jvp(*tangents) == jvp(f, primals, tangents)[1]``.

    ``f`` runs once, now; ``f_jvp`` evaluates the linear map ``t ↦ ∂f(*primals)·t``
    without running ``f``'s primal computation again (the values it needs from it are kept
    as constants), so it pays off when the same JVP is applied to many tangents.

    Args:
      f: a function of pytrees of arrays.
      *primals: the point of linearization, one value per positional argument of ``f``.
      has_aux: ``f`` returns ``(output, aux)``; aux is returned as a third value, not
        differentiated.
    Returns:
      ``(primal_out, f_jvp)``, or ``(primal_out, f_jvp, aux)``. ``f_jvp(*tangents)`` takes
      one tangent per primal, each with the structure, shapes and dtypes of its primal
      (tangents of integer inputs are ignored), and returns the output's tangent, with
      the output's structure.

    Example::

        y, f_jvp = linearize(cnp.sin, x)
        f_jvp(t)                 # == cnp.cos(x) * t, without computing sin or cos again
        vmap(f_jvp)(ts)          # many tangents at once
    """
    api_util.check_callable(f, "linearize")
    where = f"linearize({api_util.fun_name(f)})"

    @api_util.with_context(where, f)
    def run():
        return _linearize(f, primals, has_aux, where)

    out, f_jvp, aux = run()
    f_jvp = api_util.with_context(where, f, name=f"{api_util.fun_name(f)}_jvp")(f_jvp)
    return (out, f_jvp, aux) if has_aux else (out, f_jvp)


def _linearize(f, primals, has_aux, where):
    p_paths, p_leaves, p_tree = tree.flatten_with_path(tuple(primals))
    describe = [api_util.describe_arg(f, (0,) + tuple(path)) for path in p_paths]
    for what, x in zip(describe, p_leaves):
        if not core.is_value(x):
            raise TransformError(f"{what} is a {type(x).__name__}; inputs must be arrays, scalars or pytrees of them")

    out_tree_box = []

    def flat_fun(*leaves):
        out = f(*tree.unflatten(p_tree, list(leaves)))
        out, aux = api_util.split_aux(f, out, has_aux)
        out_leaves, out_tree = tree.flatten(out)
        api_util.check_outputs(f, out_leaves, out)
        out_tree_box.append(out_tree)
        return out_leaves, aux

    out_primals, program, out_nonzero, aux = linearize_flat(
        flat_fun, p_leaves, where, [f"the tangent of {what}" for what in describe])
    out_tree = out_tree_box[0]
    if has_aux:
        aux = tree.map_preserving(api_util.aux_result, aux)
    out_value = tree.unflatten(out_tree, api_util.unaliased([api_util.to_array_result(v) for v in out_primals], p_leaves))
    tangent_avals = iter(program.in_avals)
    in_avals = [next(tangent_avals) if core.is_float(p) else None for p in p_leaves]
    p_shapes = [core.shape_of(p) for p in p_leaves]
    p_dtypes = [core.dtype_of(p) for p in p_leaves]
    p_weak = [type(p) is float for p in p_leaves]
    # what the zero tangents of outputs that do not depend on the inputs are made from
    zero_like = [None if nz else o for o, nz in zip(out_primals, out_nonzero)]
    num_primals = len(primals)

    _INCONSISTENT = "linearized function called on tangent values inconsistent with the original primal values"

    def f_jvp(*tangents):
        if len(tangents) != num_primals:
            raise TransformError(
                f"the linearized function takes {num_primals} tangent(s), one per primal of "
                f"{api_util.fun_name(f)}, but was called with {len(tangents)}"
            )
        t_leaves, t_tree = tree.flatten(tuple(tangents))
        if t_tree != p_tree:
            raise TransformError(f"the tangents have structure {t_tree}, but the primals have structure {p_tree}")
        args = []
        for what, t, shape, dtype, weak, aval in zip(describe, t_leaves, p_shapes, p_dtypes, p_weak, in_avals):
            if not core.is_value(t):
                raise TransformError(f"the tangent of {what} is a {type(t).__name__}; tangents must be arrays or scalars")
            if core.shape_of(t) != shape:
                raise TransformError(
                    f"the tangent of {what} has shape {tuple(core.shape_of(t))}, but its primal has shape "
                    f"{tuple(shape)} ({_INCONSISTENT})")
            if aval is None:
                continue  # an integer input: no tangent
            if not core.is_float(t) or not (weak or type(t) is float or core.dtype_of(t) == dtype):
                raise TransformError(
                    f"the tangent of {what} has dtype {core.dtype_of(t)}, but its primal has dtype {dtype}; a "
                    f"tangent must have its primal's dtype (as in JAX): cast it with .astype ({_INCONSISTENT})"
                )
            if type(t) is not float and core.dtype_of(t) != aval.dtype:
                from cuvmap.lax import elementwise  # the cast primitive: lax imports the transforms

                t = elementwise.convert_element_type(t, aval.dtype)  # a Python float's primal: float64
            args.append(t)
        outs = iter(call(program, args) if program.jaxpr.outvars else ())
        # zero tangents: of the output's dtype, JAX's float0 for an integer or boolean output
        results = [(core.full_like_concrete(z, 0) if core.is_float(z) else dtypes.zeros_float0(core.shape_of(z)))
                   if z is not None else next(outs) for z in zero_like]
        results = api_util.unaliased([api_util.to_array_result(r) for r in results], t_leaves)
        return tree.unflatten(out_tree, results)

    return out_value, f_jvp, aux
