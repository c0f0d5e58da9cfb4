"""Staging: the interpreter behind ``jit`` and ``make_jaxpr``.

``trace_to_jaxpr(f, avals)`` runs ``f`` once on :class:`StagedTracer` values, which have
an aval (shape, dtype, weak type, device) and no value, and records every primitive
applied to them as an equation of a :class:`~cuvmap.transforms.ir.Jaxpr` (JAX's dynamic
trace). Values the function meets that are not its arguments — arrays it closed over,
tracers of transforms outside the staging — become the program's constants.

A staged program runs through the call primitive :data:`jit_call_p` (NOTE [call
primitives] in :mod:`cuvmap.transforms.call`): the eval interpreter runs it on the planned
executor (:mod:`cuvmap.transforms.executor`), and each transform derives a program of its
own from it instead of falling back to eager evaluation — ``vmap`` a batched program
(:func:`cuvmap.transforms.batching.batch_jaxpr`), ``jvp`` a JVP program
(:func:`cuvmap.transforms.jvp.jvp_jaxpr`), ``vjp``/``grad`` a forward and a backward
program (:func:`cuvmap.transforms.vjp.vjp_programs`, by partial evaluation). Under staging
(``jit`` of a function calling a jitted one) the program is inlined; the other call
primitives (a checkpointed region, a custom-derivative call, control flow) are staged as
one equation each (:meth:`StagingTrace.stage_equation`).

Derived programs are cached on the program they come from, so ``vmap(jit(f))`` stages
its batched program once per batch layout.
"""
import dataclasses

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ConcretizationError, Trace, Tracer
from cuvmap.transforms import ir
from cuvmap.transforms.call import CallPrimitive
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var


# ---------------------------------------------------------------------------------------
# The staging trace
# ---------------------------------------------------------------------------------------


class StagedTracer(Tracer):
    """A value of a function being staged: the program variable it is (which has its aval)."""

    __slots__ = ("var",)

    def __init__(self, main, var):
        self._main = main
        self.var = var

    @property
    def aval(self):
        return self.var.aval

    @property
    def shape(self):
        return self.var.aval.shape

    @property
    def dtype(self):
        return self.var.aval.dtype

    def _concrete_value(self):
        # NOTE [a staged value has a device but no value]
        # Code that asks the concrete array under a tracer for its backend (``xp_of``,
        # ``full_like_concrete``) gets an empty array of the value's dtype on its device:
        # enough to pick NumPy or CuPy and a dtype. Nothing may read values through it;
        # the conversions below raise instead.
        return _device_witness(self.var.aval)

    def _concretization_error(self, what):
        origin = _origin_of(self.var)
        depends = f" that depends on {origin}" if origin else ""
        stager = self._main.global_data.stager
        return ConcretizationError(
            f"{what} of a traced value (shape {self.shape}, {self.dtype}){depends}: {stager.why}; {stager.hint}",
            where=self._main.name,
        )


# NOTE [who staged a value]
# A Python ``if``, ``float()`` or ``int()`` on a staged value has no answer: the function
# is traced once, on avals, for every value it will run on. What to do instead depends on
# who staged it: under ``jit`` a configuration argument can be made static, while the body
# of a ``scan`` or the branch of a ``cond`` (staged even when the user wrote no ``jit``)
# needs ``cnp.where`` or ``lax.cond``. So each stager passes ``trace_to_jaxpr`` a
# :class:`Stager` whose two sentences the error prints.
@dataclasses.dataclass(frozen=True)
class Stager:
    """Who stages a function, as the error of a staged value's Python conversion says it:
    ``why`` its values are not known while it is traced, and the ``hint`` of what to do."""

    why: str
    hint: str


JIT_STAGER = Stager(
    why="under jit (and checkpoint, which stages its function too) the values of the arguments are not known "
        "while the function is traced",
    hint="mark that argument static with static_argnums/static_argnames if it is a configuration value, or use "
         "cuvmap.numpy.where to choose per element")


_witnesses = {}


def _device_witness(aval):
    key = (aval.dtype, aval.device)
    w = _witnesses.get(key)
    if w is None:
        device = aval.device or "cpu"
        if device == "cpu":
            w = np.empty(0, aval.dtype)
        else:
            cp = backend.xp_for("gpu")
            with cp.cuda.Device(int(device.split(":")[1])):
                w = cp.empty(0, aval.dtype)
        _witnesses[key] = w
    return w


def _origin_of(var):
    return getattr(var, "origin", None)


class JaxprBuilder:
    """The state of one staging: the equations so far and the constants met."""

    __slots__ = ("eqns", "constvars", "consts", "const_ids", "stager")

    def __init__(self, stager=JIT_STAGER):
        self.stager = stager
        self.eqns = []
        self.constvars = []
        self.consts = []
        self.const_ids = {}

    def const_var(self, x):
        key = id(x)
        v = self.const_ids.get(key)
        if v is None:
            v = Var(core.get_aval(x))
            self.const_ids[key] = v
            self.constvars.append(v)
            self.consts.append(x)
        return v


def _out_device(avals):
    for a in avals:
        if a.device is not None:
            return a.device
    return "cpu"


class StagingTrace(Trace):
    __slots__ = ()

    def to_input(self, builder, x):
        if self.main.owns(x):
            return x.var
        if type(x) in core._PY_SCALAR_DTYPES or (type(x) is np.ndarray and x.shape == () and x.dtype.kind in "biuf"):
            return Literal(x)
        return builder.const_var(x)

    def process_primitive(self, primitive, args, params):
        builder = self.main.global_data
        inputs = [self.to_input(builder, x) for x in args]
        avals = [v.aval for v in inputs]
        out = primitive.shape_rule(*avals, **params)
        out_aval = core.ShapedArray(out.shape, out.dtype, False, _out_device(avals))
        origin = next((v.origin for v in inputs if type(v) is Var and v.origin), None)
        var = Var(out_aval, origin)
        builder.eqns.append(JaxprEqn(primitive, inputs, var, params))
        return StagedTracer(self.main, var)

    def process_call(self, primitive, args, params):
        return primitive.stage(self, args, params)

    def stage_equation(self, primitive, args, params, out_avals):
        """Stages ``primitive(*args, **params)`` as one equation with one result per aval
        of ``out_avals`` (NOTE [an equation with several results] in ir.py); returns their
        tracers. Results without a device take the operands'."""
        if not out_avals:
            return []  # a call without results computes nothing anyone can read
        builder = self.main.global_data
        inputs = [self.to_input(builder, x) for x in args]
        device = _out_device([v.aval for v in inputs])
        outs = tuple(Var(core.ShapedArray(a.shape, a.dtype, a.weak_type, a.device or device)) for a in out_avals)
        builder.eqns.append(JaxprEqn(primitive, inputs, outs, params))
        return [StagedTracer(self.main, v) for v in outs]


def trace_to_jaxpr(f, in_avals, name="jit", origins=None, stager=JIT_STAGER):
    """Stages ``f(*args)`` for arguments with ``in_avals``. Returns ``(ClosedJaxpr,
    outputs)`` where ``outputs`` is what ``f`` returned, with each staged value replaced by
    its program output index (``f``'s return value may hold other things: the caller
    decides what to do with them). ``origins`` name the arguments and ``stager`` the
    staging in errors (NOTE [who staged a value])."""
    builder = JaxprBuilder(stager)
    with core.new_main(StagingTrace, builder, name=name) as main, core.staging(main):
        invars = [Var(a, None if origins is None else origins[i]) for i, a in enumerate(in_avals)]
        tracers = [StagedTracer(main, v) for v in invars]
        outs = f(*tracers)
        outvars = []
        for o in outs:
            if main.owns(o):
                outvars.append(o.var)
            elif type(o) in core._PY_SCALAR_DTYPES:
                outvars.append(Literal(o))
            else:
                outvars.append(builder.const_var(o))
    jaxpr = Jaxpr(builder.constvars, invars, builder.eqns, outvars)
    return ClosedJaxpr(jaxpr, builder.consts)


# ---------------------------------------------------------------------------------------
# jit's call primitive
# ---------------------------------------------------------------------------------------


class JitCallPrimitive(CallPrimitive):
    """``jit_call[program]``: a jitted function's staged program applied to its operands
    (the program's constants, then its arguments). Every transform derives a program of
    its own from it (NOTE [call primitives] in :mod:`cuvmap.transforms.call`); staged into
    another program (``jit`` of a function calling a jitted one) it is inlined."""

    __slots__ = ()
    what = "a jit-compiled program"

    def stage(self, trace, args, params):
        closed = params["program"]
        return ir.eval_jaxpr(closed.jaxpr, args[:len(closed.consts)], args[len(closed.consts):])


jit_call_p = JitCallPrimitive("jit_call")


def call(closed, args):
    """Runs ``closed`` on ``args`` under whatever transforms own them (or its constants)."""
    return jit_call_p.bind(*closed.consts, *args, program=closed)
