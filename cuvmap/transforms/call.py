"""Call primitives: primitives whose params hold a program — the protocol.

A call primitive applies one or more staged programs to its operands and has one result
per output. ``jit``'s call and a checkpointed region are *program calls*
(:class:`cuvmap.transforms.program_call.ProgramCall`: ``y = call[program](c, x)``, whose
every transform is a transform of the program); the custom-derivative calls
(:mod:`cuvmap.transforms.custom_derivatives`) and control flow
(:mod:`cuvmap.lax.control_flow`) are call primitives with rules of their own. This module
holds what they all share and nothing that derives a program, so it sits low, beside
:mod:`cuvmap.transforms.ir`: the one ``bind`` path (``bind_with_trace → process_call``),
the transforms of the named axes that the programs' collectives need (``axis_mains``),
the note an error gets, and staging as one equation. Each transform's trace turns its
tracers into what the primitive's method for that transform takes (NOTE [call
primitives]).
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
# results are dead (NOTE [an equation with several results] in ir.py). This class is the
# protocol and defines none of the rule methods but ``stage``, whose one equation serves
# every call primitive that is not inlined: each subclass defines the rest itself, or
# inherits them from a class that does — a program call's from
# :class:`cuvmap.transforms.program_call.ProgramCall`, which lives above the transforms
# whose programs it derives.
class CallPrimitive(core.Primitive):
    """A primitive whose params hold a program (NOTE [call primitives]); ``bind`` returns
    a list with one value per result. ``what`` names it in the note an error gets."""

    __slots__ = ()
    multiple_results = True
    what = None
    # the methods that hold a call primitive's rules (NOTE [call primitives]): the registry
    # test asks a call primitive of cuvmap's families for each (test_util.missing_rules)
    rule_methods = ("run", "batch", "jvp", "vjp", "partial_eval", "dce", "out_avals")

    def __init__(self, name):
        super().__init__(name, impl=getattr(self, "run", None))

    def bind_with_trace(self, trace, args, params):
        return trace.process_call(self, args, params)

    def axis_mains(self, params):
        """The batching transforms of the named axes that collectives inside the call's
        programs act along: a call whose operands no vmap owns (a scan whose body sums a
        constant over ``"i"``) must still reach the vmap of ``"i"`` (NOTE [named axes] in
        cuvmap/core/tracers.py). Nothing for a call without collectives."""
        names = axis_names_in(params)
        return [core.axis_frame(name, self.name).main for name in names] if names else ()

    def bind_error(self, args, params, err, top):
        if self.what is not None:
            core.set_error_note(err, f"{self.what} under {top.name if top else 'eval'}")
        return err

    def stage(self, trace, args, params):
        """Staging: one equation with one result per aval of ``out_avals(params)``."""
        return trace.stage_equation(self, args, params, self.out_avals(params))


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
