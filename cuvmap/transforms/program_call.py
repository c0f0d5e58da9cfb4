"""Program calls: a call primitive whose every transform is a transform of its program.

A program call ``y = call[program](c, x)`` applies a staged program (a
:class:`~cuvmap.transforms.ir.ClosedJaxpr`) to its operands, the program's constants ``c``
then its arguments ``x``, and has one result per output of the program. ``jit``'s call
(:data:`jit_call_p`) and a checkpointed region (:data:`cuvmap.transforms.remat.checkpoint_p`)
are program calls. Each transform derives a program of its own from the program and binds
the primitive again with it (NOTE [call primitives] in :mod:`cuvmap.transforms.call`):

- eval: the planned executor runs the program (:mod:`cuvmap.transforms.executor`);
- ``vmap``: ``call[vmap(program)](c, x)``
  (:func:`cuvmap.transforms.batching.batch_jaxpr`);
- ``jvp``: ``call[jvp(program)](c, x, ẋ)``, a program of the primals and the nonzero
  tangents (:func:`cuvmap.transforms.jvp.jvp_jaxpr`);
- ``vjp``: ``call[forward](c, x)`` now, returning the outputs and the residuals the
  backward pass needs, and ``call[backward](residuals, ȳ)`` in the backward pass, both
  from partial evaluation of the joint forward-and-backward program
  (:func:`cuvmap.transforms.vjp.vjp_programs`, :mod:`cuvmap.transforms.partial_eval`);
- staging: one equation of the enclosing program (``jit``'s call is inlined instead);
- partial evaluation (``linearize``): staged as under ``jit``, the known operands becoming
  constants of the staged program;
- dead-code elimination: the dead outputs go, with what only they needed.

These defaults need the transforms that derive programs, so they live here, above
batching, jvp, vjp, partial_eval and the executor, while the protocol every call primitive
follows (:class:`~cuvmap.transforms.call.CallPrimitive`) stays below them. Derived
programs are cached on the program they come from, so ``vmap(jit(f))`` stages its batched
program once per batch layout.
"""
from cuvmap import core
from cuvmap.transforms import executor, ir
from cuvmap.transforms.batching import batch_jaxpr
from cuvmap.transforms.call import CallPrimitive, avals_of
from cuvmap.transforms.jvp import jvp_jaxpr
from cuvmap.transforms.partial_eval import everything_saveable
from cuvmap.transforms.vjp import vjp_programs


class ProgramCall(CallPrimitive):
    """A call primitive whose ``program`` param is a ClosedJaxpr over the operands (its
    constants, then its arguments) and which applies a derived program by binding itself
    again (:meth:`rebind`): the rules of every transform, as listed in this module's
    docstring."""

    __slots__ = ()

    def run(self, *args, program, **params):
        """Eval: the planned executor runs the program."""
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
        return everything_saveable

    def batch(self, axis, vals, dims, params):
        program, out_dims = batch_jaxpr(params["program"], axis, dims, avals_of(vals))
        return self.rebind(program, vals, params), out_dims

    def jvp(self, primals, tangents, params):
        nonzero = [t is not None for t in tangents]
        program, out_nonzero = jvp_jaxpr(params["program"], nonzero, avals_of(primals))
        outs = self.rebind(program, list(primals) + [t for t in tangents if t is not None], params)
        num_outs = len(out_nonzero)
        out_tangents = iter(outs[num_outs:])
        return outs[:num_outs], [next(out_tangents) if nz else None for nz in out_nonzero]

    def vjp(self, primals, needs_ct, params):
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


class JitCallPrimitive(ProgramCall):
    """``jit_call[program]``: a jitted function's staged program applied to its operands
    (the program's constants, then its arguments). Every transform derives a program of
    its own from it; staged into another program (``jit`` of a function calling a jitted
    one) it is inlined."""

    __slots__ = ()
    what = "a jit-compiled program"

    def stage(self, trace, args, params):
        closed = params["program"]
        return ir.eval_jaxpr(closed.jaxpr, args[:len(closed.consts)], args[len(closed.consts):])


jit_call_p = JitCallPrimitive("jit_call")


def call(closed, args):
    """Runs ``closed`` on ``args`` under whatever transforms own them (or its constants)."""
    return jit_call_p.bind(*closed.consts, *args, program=closed)
