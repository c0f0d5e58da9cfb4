"""Staging: the interpreter behind ``jit`` and ``make_jaxpr``.

``trace_to_jaxpr(f, avals)`` runs ``f`` once on :class:`StagedTracer` values, which have
an aval (shape, dtype, weak type, device) and no value, and records every primitive
applied to them as an equation of a :class:`~cuvmap.transforms.ir.Jaxpr` (JAX's dynamic
trace). Values the function meets that are not its arguments — arrays it closed over,
tracers of transforms outside the staging — become the program's constants.

A staged program runs through the call primitive :data:`jit_call_p`. Its ``bind`` asks
the innermost transform that owns an operand to process the call (``process_call``, as
JAX's call primitives do), and each transform derives a program of its own from the
staged one instead of falling back to eager evaluation:

- the eval interpreter runs the planned executor (:mod:`cuvmap.transforms.executor`);
- ``vmap`` stages ``vmap(eval_jaxpr)`` into a batched program (:func:`batch_jaxpr`);
- ``jvp`` stages the program's JVP (:func:`jvp_jaxpr`);
- ``vjp``/``grad`` stage the joint forward-and-backward program and split it into a
  forward program, which also returns the residuals the backward pass reads, and a
  backward program from residuals and output cotangents (:func:`vjp_jaxprs`): JAX's
  partial evaluation, with the output cotangents as the unknown inputs;
- a staging transform (``jit`` of a function calling a jitted one) inlines the program.

A ``custom_jvp``/``custom_vjp`` function is staged as one equation that keeps its rules
(NOTE [staging a custom derivative]).

Derived programs are cached on the program they come from, so ``vmap(jit(f))`` stages
its batched program once per batch layout.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ConcretizationError, Trace, Tracer
from cuvmap.transforms import ir
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var


# ---------------------------------------------------------------------------------------
# The staging trace
# ---------------------------------------------------------------------------------------


class StagedTracer(Tracer):
    """A value of a function being staged: an aval and the program variable it is."""

    __slots__ = ("_aval", "var")

    def __init__(self, main, aval, var):
        self._main = main
        self._aval = aval
        self.var = var

    @property
    def aval(self):
        return self._aval

    @property
    def shape(self):
        return self._aval.shape

    @property
    def dtype(self):
        return self._aval.dtype

    def _concrete_value(self):
        # NOTE [a staged value has a device but no value]
        # Code that asks the concrete array under a tracer for its backend (``xp_of``,
        # ``full_like_concrete``) gets an empty array of the value's dtype on its device:
        # enough to pick NumPy or CuPy and a dtype. Nothing may read values through it;
        # the conversions below raise instead.
        return _device_witness(self._aval)

    def _concretization_error(self, what):
        origin = _origin_of(self.var)
        depends = f" that depends on {origin}" if origin else ""
        hint = ("mark that argument static with static_argnums/static_argnames if it is a "
                "configuration value, or use cuvmap.numpy.where to choose per element")
        return ConcretizationError(
            f"{what} of a traced value (shape {self.shape}, {self.dtype}){depends}: under "
            f"jit (and checkpoint, which stages its function too) the values of the arguments are not "
            f"known while the function is traced; {hint}",
            where=self._main.name,
        )


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

    __slots__ = ("eqns", "constvars", "consts", "const_ids")

    def __init__(self):
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
        if type(x) is StagedTracer and x._main is self.main:
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
        return StagedTracer(self.main, out_aval, var)

    def process_call(self, primitive, args, params):
        # jit inside jit: the inner program becomes part of the outer one
        closed = params["program"]
        return ir.eval_jaxpr(closed.jaxpr, args[:len(closed.consts)], args[len(closed.consts):])

    # NOTE [staging a custom derivative]
    # A custom_jvp or custom_vjp function under jit is staged as one equation with several
    # results (NOTE [an equation with several results] in ir.py),
    # ``custom_jvp_call[fun jvp]`` or ``custom_vjp_call[fun fwd bwd]``, not as its
    # body: a program staged before anyone differentiates it (``grad(jit(f))`` stages ``f``
    # first, then derives the VJP program from it) must still know the rule. ``fun`` becomes
    # the staged program of the body (run by the executor when the program runs as it is);
    # the rules stay Python functions, which the transforms that derive programs call when
    # they meet the equation (``eval_jaxpr`` binds it again), as they would eagerly. A body
    # that closes over a traced value cannot be staged this way (the rules, called later,
    # would meet that value after its transform returned), so it is an error.
    def process_custom_jvp_call(self, primitive, args, params):
        """A custom-derivative call under staging (NOTE [staging a custom derivative])."""
        builder = self.main.global_data
        inputs = [self.to_input(builder, x) for x in args]
        fun = params["fun"]
        closed = trace_to_jaxpr(fun, [v.aval for v in inputs], name=self.main.name)
        for c in closed.consts:
            if isinstance(c, Tracer):
                from cuvmap.transforms.custom_derivatives import CustomDerivativeError

                raise CustomDerivativeError(
                    f"{primitive.name}: the body of {fun.__name__} closes over a traced value (shape "
                    f"{c.shape}) of {c._main.name}; a custom-derivative function under jit must get "
                    "its traced values as arguments (pass it as one)"
                )
        program = ir.optimize(closed)
        if not program.jaxpr.outvars:
            return []
        outs = tuple(Var(v.aval) for v in program.jaxpr.outvars)
        builder.eqns.append(JaxprEqn(primitive, inputs, outs, dict(params, fun=StagedFun(program, fun.__name__))))
        return [StagedTracer(self.main, v.aval, v) for v in outs]

    process_custom_vjp_call = process_custom_jvp_call


class StagedFun:
    """A staged program as a function of its arguments (the ``fun`` of a staged
    custom-derivative call): ``StagedFun(program, name)(*args)`` runs it through
    :data:`jit_call_p`, so every transform processes it as a jitted call."""

    def __init__(self, program, name):
        self.program = program
        self.__name__ = name

    def __call__(self, *args):
        return call(self.program, args)

    def __repr__(self):
        return self.__name__


def trace_to_jaxpr(f, in_avals, name="jit", origins=None):
    """Stages ``f(*args)`` for arguments with ``in_avals``. Returns ``(ClosedJaxpr,
    outputs)`` where ``outputs`` is what ``f`` returned, with each staged value replaced by
    its program output index (``f``'s return value may hold other things: the caller
    decides what to do with them)."""
    builder = JaxprBuilder()
    with core.new_main(StagingTrace, builder, name=name) as main, core.staging(main):
        invars = [Var(a, None if origins is None else origins[i]) for i, a in enumerate(in_avals)]
        tracers = [StagedTracer(main, a, v) for a, v in zip(in_avals, invars)]
        outs = f(*tracers)
        outvars = []
        for o in outs:
            if type(o) is StagedTracer and o._main is main:
                outvars.append(o.var)
            elif type(o) in core._PY_SCALAR_DTYPES:
                outvars.append(Literal(o))
            else:
                outvars.append(builder.const_var(o))
    jaxpr = Jaxpr(builder.constvars, invars, builder.eqns, outvars)
    return ClosedJaxpr(jaxpr, builder.consts)


# ---------------------------------------------------------------------------------------
# The call primitive
# ---------------------------------------------------------------------------------------


class CallPrimitive(core.Primitive):
    """A primitive whose one param is a staged program (``program=ClosedJaxpr``) and
    whose operands are the program's constants then its arguments. It has several
    outputs, so ``bind`` returns a list and the transforms process it with
    ``process_call`` rather than their per-primitive rules."""

    __slots__ = ()

    def bind(self, *args, **params):
        top = core.find_top_main(self, args)
        try:
            if top is None:
                return self.impl(*args, **params)
            process = getattr(top.trace, "process_call", None)
            if process is None:
                raise core.MissingRuleError(f"{top.name} cannot process a staged program (jit)")
            return process(self, args, params)
        except core._PASS_THROUGH:
            raise
        except Exception as err:
            core._set_note(err, core._NOTE_PREFIX + f"a jit-compiled program under {top.name if top else 'eval'}")
            raise


def _run_program(*args, program):
    from cuvmap.transforms import executor

    return executor.run(program, args)


jit_call_p = CallPrimitive("jit_call")
jit_call_p.impl = _run_program


def call(closed, args):
    """Runs ``closed`` on ``args`` under whatever transforms own them (or its constants)."""
    return jit_call_p.bind(*closed.consts, *args, program=closed)


def _as_program_inputs(closed):
    """The program with its constants turned into leading arguments (the call primitive's
    operands are constants then arguments, and a transform may own a constant)."""
    j = closed.jaxpr
    return Jaxpr([], j.constvars + j.invars, j.eqns, j.outvars)


def avals_of(values):
    """The avals of operands (tracers' logical avals; arrays' with their device)."""
    return [core.get_aval(v) for v in values]


def zeros(aval):
    """A concrete array of zeros with ``aval``'s shape, dtype and device."""
    device = aval.device or "cpu"
    if device == "cpu":
        return np.zeros(aval.shape, aval.dtype)
    cp = backend.xp_for("gpu")
    with cp.cuda.Device(int(device.split(":")[1])):
        return cp.zeros(aval.shape, aval.dtype)


# ---------------------------------------------------------------------------------------
# Derived programs: batching, JVP, VJP
# ---------------------------------------------------------------------------------------


def batch_jaxpr(closed, axis, dims, in_avals):
    """The program of ``vmap`` of ``closed`` (over constants and arguments) for batch dims
    ``dims`` of physical operands with ``in_avals``, mapping ``axis`` (a
    :class:`~cuvmap.transforms.batching.AxisData`). Returns ``(ClosedJaxpr, out_dims)``."""
    from cuvmap.transforms.batching import BatchTracer, new_batch_main

    key = ("batch", axis.size, axis.name, tuple(dims), tuple(in_avals))
    hit = closed.derived.get(key)
    if hit is not None:
        return hit
    flat = _as_program_inputs(closed)
    out_dims = []

    def batched(*vals):
        with new_batch_main(axis, "vmap") as main:
            ins = [v if d is None else BatchTracer(main, v, d) for v, d in zip(vals, dims)]
            outs = ir.eval_jaxpr(flat, [], ins)
        res = []
        for o in outs:
            if type(o) is BatchTracer and o._main is main:
                res.append(o.val)
                out_dims.append(o.bdim)
            else:
                res.append(o)
                out_dims.append(None)
        return res

    program = ir.optimize(trace_to_jaxpr(batched, in_avals, name="vmap(jit)"))
    closed.derived[key] = (program, tuple(out_dims))
    return closed.derived[key]


def jvp_jaxpr(closed, nonzero, in_avals):
    """The program of the JVP of ``closed``: arguments are the primals then the tangents
    of the operands marked ``nonzero``; outputs are the primal outputs then the tangents
    of the outputs marked in the returned ``out_nonzero``. Returns
    ``(ClosedJaxpr, out_nonzero)``."""
    from cuvmap.transforms.jvp import JVPTrace, JVPTracer, split_nonzero

    key = ("jvp", tuple(nonzero), tuple(in_avals))
    hit = closed.derived.get(key)
    if hit is not None:
        return hit
    flat = _as_program_inputs(closed)
    n = len(in_avals)
    out_nonzero = []

    def pushed(*vals):
        primals, tangents = vals[:n], iter(vals[n:])
        with core.new_main(JVPTrace, name="jvp") as main:
            ins = [JVPTracer(main, p, next(tangents)) if nz else p for p, nz in zip(primals, nonzero)]
            outs = ir.eval_jaxpr(flat, [], ins)
        out_p, out_t, nz = split_nonzero(main, outs)
        out_nonzero.extend(nz)
        return out_p + out_t

    tangent_avals = [_tangent_aval(a) for a, nz in zip(in_avals, nonzero) if nz]
    program = ir.optimize(trace_to_jaxpr(pushed, list(in_avals) + tangent_avals, name="jvp(jit)"))
    closed.derived[key] = (program, tuple(out_nonzero))
    return closed.derived[key]


def _tangent_aval(aval):
    return core.ShapedArray(aval.shape, aval.dtype, aval.weak_type, aval.device)


def vjp_jaxprs(closed, needs_ct, in_avals):
    """The forward and backward programs of reverse mode through ``closed``, for the
    operands marked ``needs_ct``.

    The joint program ``(primals, output cotangents) -> (outputs, input cotangents)``
    (:func:`joint_vjp_jaxpr`) is split: its equations that do not depend on a cotangent
    form the forward program, which returns the outputs and the residuals (its values that
    the other equations read); the rest form the backward program ``(residuals, output
    cotangents) -> input cotangents``. Returns ``(forward, backward, ct_outputs)``:
    ``ct_outputs`` marks the outputs that take a cotangent (the floating-point ones)."""
    key = ("vjp", tuple(needs_ct), tuple(in_avals))
    hit = closed.derived.get(key)
    if hit is not None:
        return hit
    whole, ct_outputs = joint_vjp_jaxpr(closed, needs_ct, in_avals)
    forward, backward = _split_known(whole, len(in_avals), len(ct_outputs))
    closed.derived[key] = (forward, backward, ct_outputs)
    return closed.derived[key]


def joint_vjp_jaxpr(closed, needs_ct, in_avals):
    """The joint program of reverse mode through ``closed``: arguments are the primals
    (``closed``'s constants and arguments, with ``in_avals``) then the cotangents of the
    floating-point outputs; outputs are ``closed``'s outputs then the cotangents of the
    operands marked ``needs_ct``. It is staged by running ``vjp`` of ``eval_jaxpr`` on
    staged values, and not optimized. Returns ``(ClosedJaxpr, ct_outputs)``, with
    ``ct_outputs`` marking the outputs that take a cotangent."""
    from cuvmap.transforms import vjp as vjp_mod

    flat = _as_program_inputs(closed)
    n = len(in_avals)
    out_avals = [v.aval for v in closed.jaxpr.outvars]
    ct_outputs = tuple(a.dtype.kind in "fc" for a in out_avals)

    def joint(*vals):
        primals, cts = vals[:n], iter(vals[n:])
        tape = vjp_mod.Tape()
        with core.new_main(vjp_mod.VJPTrace, tape, name="vjp") as main:
            ins = []
            for p, needed in zip(primals, needs_ct):
                if needed:
                    ins.append(vjp_mod.VJPTracer(main, p, tape.num_inputs))
                    tape.num_inputs += 1
                else:
                    ins.append(p)
            outs = ir.eval_jaxpr(flat, [], ins)
        seeds, out_p = [], []
        for o, takes_ct in zip(outs, ct_outputs):
            ct = next(cts) if takes_ct else None
            if type(o) is vjp_mod.VJPTracer and o._main is main:
                out_p.append(o.primal)
                seeds.append((o.node, ct))
            else:
                out_p.append(o)
        in_cts = vjp_mod.backward_pass(tape, seeds)
        wanted = [p for p, needed in zip(primals, needs_ct) if needed]
        return out_p + [core.full_like_concrete(p, 0) if c is None else vjp_mod.match_operand(c, p)
                        for c, p in zip(in_cts, wanted)]

    ct_avals = [a for a, takes in zip(out_avals, ct_outputs) if takes]
    whole = trace_to_jaxpr(joint, list(in_avals) + [_tangent_aval(a) for a in ct_avals], name="vjp(jit)")
    return whole, ct_outputs


def split_by_unknown(eqns, unknown_vars):
    """Partial evaluation's split: the equations that read (transitively) a variable of
    ``unknown_vars`` are unknown, the others known. An equation with several results is
    split as a whole (NOTE [an equation with several results] in ir.py). Returns
    ``(known_eqns, unknown_eqns, unknown)``, ``unknown`` the set of unknown variables."""
    unknown = set(unknown_vars)
    known_eqns, unknown_eqns = [], []
    for eqn in eqns:
        if any(type(x) is Var and x in unknown for x in eqn.inputs):
            unknown.update(eqn.outs)
            unknown_eqns.append(eqn)
        else:
            known_eqns.append(eqn)
    return known_eqns, unknown_eqns, unknown


def _split_known(whole, num_primals, num_outs):
    """Partial evaluation with the cotangent arguments unknown: see :func:`vjp_jaxprs`."""
    whole = ir.optimize(whole)
    j = whole.jaxpr
    known_eqns, unknown_eqns, unknown = split_by_unknown(j.eqns, j.invars[num_primals:])
    outs, in_cts = j.outvars[:num_outs], j.outvars[num_outs:]
    for o in outs:
        if type(o) is Var and o in unknown:
            raise AssertionError("an output of a staged program depends on a cotangent")
    defined_known = set(j.constvars) | set(j.invars[:num_primals]) | {v for e in known_eqns for v in e.outs}
    residuals = []
    seen = set()
    for x in [x for e in unknown_eqns for x in e.inputs] + list(in_cts):
        if type(x) is Var and x in defined_known and x not in seen:
            seen.add(x)
            residuals.append(x)
    fwd_consts = [(v, c) for v, c in zip(j.constvars, whole.consts)]
    forward = ir.optimize(ClosedJaxpr(
        Jaxpr([v for v, _ in fwd_consts], j.invars[:num_primals], known_eqns, list(outs) + residuals),
        [c for _, c in fwd_consts]))
    res_vars = [Var(v.aval) for v in residuals]
    rename = dict(zip(residuals, res_vars))

    def sub(x):
        return rename.get(x, x) if type(x) is Var else x

    bwd_eqns = [JaxprEqn(e.primitive, [sub(x) for x in e.inputs], e.out, e.params) for e in unknown_eqns]
    backward = ir.optimize(ClosedJaxpr(
        Jaxpr([], res_vars + j.invars[num_primals:], bwd_eqns, [sub(x) for x in in_cts]), []))
    return forward, backward
