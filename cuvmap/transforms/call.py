"""Call primitives: primitives whose params hold a program.

A call primitive applies a staged program to its operands and has one result per output
of the program. ``jit``'s call (:data:`cuvmap.transforms.staging.jit_call_p`), a
checkpointed region (:mod:`cuvmap.transforms.remat`), the custom-derivative calls
(:mod:`cuvmap.transforms.custom_derivatives`) and control flow
(:mod:`cuvmap.lax.control_flow`) are call primitives. For a program call ``y =
call[program](c, x)`` — operands the program's constants ``c``, then its arguments ``x`` —
every transform is a transform of the program:

- ``vmap``: ``call[vmap(program)](c, x)``;
- ``jvp``: ``call[jvp(program)](c, x, ẋ)``, a program of the primals and the nonzero
  tangents;
- ``vjp``: ``call[forward](c, x)`` now, returning the outputs and the residuals the
  backward pass needs, and ``call[backward](residuals, ȳ)`` in the backward pass, both
  from partial evaluation of the joint forward-and-backward program
  (:func:`cuvmap.transforms.vjp.vjp_programs`, :mod:`cuvmap.transforms.partial_eval`);
- staging: one equation of the enclosing program (jit inlines its call instead);
- partial evaluation (``linearize``): what depends on known operands only is computed now,
  the rest is staged.
"""
from cuvmap import core
from cuvmap.transforms import ir


# NOTE [call primitives]
# There is one ``bind`` for every primitive (``core.Primitive.bind``). It finds the
# transform that processes the primitive and calls ``bind_with_trace`` (JAX's name),
# which for an ordinary primitive asks the trace to ``process_primitive`` — apply its rule
# from the transform's table — and for a call primitive asks it to ``process_call``. A
# trace's ``process_call`` turns its tracers into what the primitive's method for that
# transform takes, calls it, and wraps the results; the primitive holds the mathematics:
#
#   transform       trace            method of the call primitive
#   eval            (none)           impl(*args, **params) -> outputs
#   vmap            BatchTrace       batch(axis, vals, dims, params) -> (outputs, out_dims)
#   jvp             JVPTrace         jvp(primals, tangents, params) -> (out_primals, out_tangents)
#   vjp, grad       VJPTrace         vjp(primals, needs_ct, params) -> (out_primals, with_ct, backward)
#   jit, make_jaxpr StagingTrace     stage(trace, args, params) -> tracers of the trace
#   linearize       LinearizeTrace   partial_eval(trace, args, params) -> known values and tracers
#
# (``tangents`` holds ``None`` for a symbolic zero, in and out; ``needs_ct`` marks the
# operands whose cotangent the tape wants, ``with_ct`` the outputs that take one, and
# ``backward(cts)`` maps the cotangents of those outputs, ``None`` where none arrived, to
# the cotangents of the operands marked, ``None`` for a zero one.) The program optimizer
# asks ``dce(params, used_outputs)`` which inputs the equation still needs once some of its
# results are dead (NOTE [an equation with several results] in ir.py). The defaults below
# are those of a program call, whose ``program`` param is a ClosedJaxpr over the operands
# (its constants, then its arguments) and which applies a derived program by binding itself
# again (``rebind``); the other call primitives override what differs.
class CallPrimitive(core.Primitive):
    """A primitive whose params hold a program (NOTE [call primitives]); ``bind`` returns
    a list with one value per result. ``what`` names it in the note an error gets."""

    __slots__ = ()
    multiple_results = True
    what = None
    # the methods that hold a call primitive's rules: what the registry test asks a call
    # primitive of cuvmap's families (control flow) to define itself (test_util.missing_rules)
    rule_methods = ("run", "batch", "jvp", "vjp", "partial_eval", "dce", "out_avals")

    def __init__(self, name):
        super().__init__(name)
        self.impl = self.run

    def bind_with_trace(self, trace, args, params):
        return trace.process_call(self, args, params)

    def axis_mains(self, params):
        """The batching transforms of the named axes that collectives inside the call's
        programs act along: a call whose operands no vmap owns (a scan whose body sums a
        constant over ``"i"``) must still reach the vmap of ``"i"`` (NOTE [named axes] in
        cuvmap/core.py). Nothing for a call without collectives."""
        names = axis_names_in(params)
        return [core.axis_frame(name, self.name).main for name in names] if names else ()

    def bind_error(self, args, params, err, top):
        if self.what is not None:
            core.set_error_note(err, f"{self.what} under {top.name if top else 'eval'}")
        return err

    # -- the program call -----------------------------------------------------------------

    def run(self, *args, program, **params):
        """Eval: the planned executor runs the program."""
        from cuvmap.transforms import executor

        return executor.run(program, args)

    def rebind(self, program, args, params):
        """Applies ``program`` (a derived program) to ``args`` as this primitive with
        ``params``: its constants become the leading operands."""
        return self.bind(*program.consts, *args, **dict(params, program=program))

    def out_avals(self, params):
        return params["program"].out_avals

    def saveable(self, params):
        """What reverse mode keeps from the forward computation instead of recomputing it
        (a checkpoint policy: ``saveable(prim, *avals, **params)``); a program call keeps
        every residual."""
        from cuvmap.transforms.partial_eval import everything_saveable

        return everything_saveable

    def batch(self, axis, vals, dims, params):
        from cuvmap.transforms.batching import batch_jaxpr

        program, out_dims = batch_jaxpr(params["program"], axis, dims, avals_of(vals))
        return self.rebind(program, vals, params), out_dims

    def jvp(self, primals, tangents, params):
        from cuvmap.transforms.jvp import jvp_jaxpr

        nonzero = [t is not None for t in tangents]
        program, out_nonzero = jvp_jaxpr(params["program"], nonzero, avals_of(primals))
        outs = self.rebind(program, list(primals) + [t for t in tangents if t is not None], params)
        num_outs = len(out_nonzero)
        out_tangents = iter(outs[num_outs:])
        return outs[:num_outs], [next(out_tangents) if nz else None for nz in out_nonzero]

    def vjp(self, primals, needs_ct, params):
        from cuvmap.transforms.vjp import vjp_programs

        closed = params["program"]
        split = vjp_programs(closed, needs_ct, avals_of(primals), self.saveable(params))
        outs = self.rebind(split.forward, primals, params)
        num_outs = len(split.ct_outputs)
        out_primals, saved = outs[:num_outs], outs[num_outs:]
        with_ct = [j for j, takes in enumerate(split.ct_outputs) if takes]
        ct_avals = [closed.out_avals[j] for j in with_ct]
        kept = [primals[i] for i in split.primals_read] + saved  # what the tape holds until the backward pass

        def backward(cts):
            cts = [core.zeros_like_aval(a) if c is None else c for c, a in zip(cts, ct_avals)]
            return self.rebind(split.backward, kept + cts, params)

        return out_primals, with_ct, backward

    def stage(self, trace, args, params):
        """Staging: one equation with one result per output of the program."""
        return trace.stage_equation(self, args, params, self.out_avals(params))

    def partial_eval(self, trace, args, params):
        """Partial evaluation with ``trace``'s tracers unknown: staged as under ``jit``,
        the known operands becoming constants of the staged program."""
        return self.stage(trace, args, params)

    def dce(self, params, used_outputs):
        """The equation once only the outputs marked in ``used_outputs`` are read:
        ``(new_params, used_inputs, kept_outputs)`` — its params, the operands it still
        reads and the outputs it keeps (at least those used; a loop keeps the carries its
        live results need); ``None`` keeps it whole. A program call drops the dead outputs
        and what only they needed."""
        new_program, used_inputs = ir.dce_closed(params["program"], used_outputs)
        return dict(params, program=new_program), used_inputs, list(used_outputs)


def axis_names_in(params):
    """The names of the vmap axes (not process axes) that the collectives in the programs
    among ``params`` act along, nested calls' included; cached on each program."""
    names = set()
    for value in params.values():
        programs = value if isinstance(value, (tuple, list)) else (value,)
        for program in programs:
            program = getattr(program, "program", program)  # (a staged function)
            if isinstance(program, ir.ClosedJaxpr):
                names |= _program_axis_names(program)
    return names


def _program_axis_names(closed):
    hit = closed.derived.get("axis names")
    if hit is None:
        hit = set()
        for eqn in closed.jaxpr.eqns:
            names_of = getattr(eqn.primitive, "axis_names", None)  # a collective
            if names_of is not None:
                hit |= names_of(eqn.params)
            elif isinstance(eqn.primitive, CallPrimitive):
                hit |= axis_names_in(eqn.params)
        hit = closed.derived["axis names"] = frozenset(hit)
    return hit


def avals_of(values):
    """The avals of operands (tracers' logical avals; arrays' with their device)."""
    return [core.get_aval(v) for v in values]
