"""Rematerialization: ``checkpoint`` (alias ``remat``) trades memory for computation in
reverse mode.

For ``y = f(x)`` inside a differentiated function, reverse mode needs ``f``'s residuals
``r(x)`` (the intermediates its VJP rules read) when the backward pass reaches it:
``x̄ = ȳᵀ·∂f(x)`` is computed from ``r(x)`` and ``ȳ``. Without ``checkpoint`` the tape
keeps ``r(x)`` from the forward pass to the backward pass. ``checkpoint(f)`` keeps only
``x`` (its inputs) and recomputes ``r(x)`` from ``x`` when the backward pass needs it, then
runs ``f``'s backward: the same gradient, ``f``'s forward computed twice, and between the
two passes a tape that holds ``x`` instead of ``r(x)``. Checkpointing the segments of a
long chain (``√n`` segments of ``√n`` steps) holds ``O(√n)`` arrays instead of ``O(n)``.

A policy chooses residuals that are worth keeping after all: ``policy(prim, *avals,
**params)`` is asked for every equation of the forward computation, and the values of
those it calls saveable are kept (``checkpoint_policies.dots_saveable`` keeps the matrix
products and recomputes the cheap elementwise ops around them).

The machinery mirrors JAX's ``remat``. ``checkpoint(f)`` stages ``f`` into a program (as
``jit`` does) and applies it through the call primitive :data:`checkpoint_p`, whose
rules carry the region through every transform:

- eval: the planned executor runs the program;
- ``vjp``/``grad``: the joint forward-and-backward program is split by partial evaluation
  with the policy deciding what is known and kept (:func:`partial_eval_remat`); the
  forward part runs now and returns the outputs (and the values the policy keeps), the
  tape keeps the inputs, and the backward part, which recomputes what it needs from the
  inputs, runs in the backward pass — itself as a checkpointed region, so ``grad(grad)``
  rematerializes too;
- ``vmap`` and ``jvp``: the batched and JVP programs, again as checkpointed regions (so
  ``vmap(grad(checkpoint(f)))`` recomputes per example, batched);
- ``jit`` and other staging: the region stays one equation of the staged program, with
  one result per output (NOTE [an equation with several results] in
  :mod:`cuvmap.transforms.ir`), so ``grad(jit(checkpoint(f)))`` and
  ``jit(grad(checkpoint(f)))`` rematerialize and the program optimizer cannot merge the
  recomputation with the forward computation (``prevent_cse``);
- ``linearize``: the primal outputs are computed now, and the linear map recomputes the
  residuals from the inputs on each call instead of keeping them (JAX's remat partial
  evaluation).
"""
from cuvmap import core, tree
from cuvmap.core import MissingRuleError
from cuvmap.transforms import ir, staging
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, JaxprEqn, Var


# ---------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------


def everything_saveable(prim, *avals, **params):
    """Keeps every residual: no recomputation (as without ``checkpoint``)."""
    return True


def nothing_saveable(prim, *avals, **params):
    """Keeps nothing but the inputs: everything is recomputed (the default, ``None``)."""
    return False


def dots_saveable(prim, *avals, **params):
    """Keeps the results of matrix products (``dot_general``: ``prim.kind == "dot"``),
    recomputes the rest."""
    return prim.kind == "dot"


def dots_with_no_batch_dims_saveable(prim, *avals, **params):
    """Keeps the results of matrix products without batch dimensions."""
    if prim.kind != "dot":
        return False
    (_, _), (x_batch, y_batch) = params["dimension_numbers"]
    return not x_batch and not y_batch


class _Policies:
    """The policies of :func:`checkpoint` (JAX's ``jax.checkpoint_policies``). A policy is
    any function ``policy(prim, *avals, **params) -> bool`` saying whether the output of
    an equation ``prim(*operands, **params)`` of the forward computation, with operands of
    ``avals``, is kept for the backward pass rather than recomputed. Policies that name
    values (``save_only_these_names`` with ``checkpoint_name``) are not provided."""

    everything_saveable = staticmethod(everything_saveable)
    nothing_saveable = staticmethod(nothing_saveable)
    dots_saveable = staticmethod(dots_saveable)
    checkpoint_dots = staticmethod(dots_saveable)
    dots_with_no_batch_dims_saveable = staticmethod(dots_with_no_batch_dims_saveable)
    checkpoint_dots_with_no_batch_dims = staticmethod(dots_with_no_batch_dims_saveable)

    def __repr__(self):
        return "checkpoint_policies"


checkpoint_policies = _Policies()


# ---------------------------------------------------------------------------------------
# The call primitive
# ---------------------------------------------------------------------------------------


class RematCallPrimitive(core.Primitive):
    """The call primitive of a checkpointed region: ``program=ClosedJaxpr`` (operands: its
    constants then its arguments), ``policy`` and ``prevent_cse`` as given to
    :func:`checkpoint`. ``bind`` returns a list, one array per result of the program (in a
    staged program, the region is one equation with as many results: NOTE [an equation
    with several results] in :mod:`cuvmap.transforms.ir`); the transforms' rules are in
    :data:`remat_rules`, by trace type."""

    __slots__ = ()

    def bind(self, *args, **params):
        top = core.find_top_main(self, args)
        try:
            if top is None:
                return self.impl(*args, **params)
            rule = remat_rules.get(type(top.trace))
            if rule is None:
                raise MissingRuleError(f"{top.name} has no rule for a checkpointed function (checkpoint)")
            return rule(top.trace, args, params)
        except core._PASS_THROUGH:
            raise
        except Exception as err:
            core._set_note(err, core._NOTE_PREFIX + f"a checkpointed function under {top.name if top else 'eval'}")
            raise


# NOTE [a region's buffers die with its run]
# The planned executor keeps a program's freed intermediates in a pool that lives with its
# plan, so that the next call writes into memory it already has (NOTE [buffer planning]),
# and on the GPU it may replay a program as a CUDA graph, which owns its buffers for good.
# A checkpointed region must do neither: the tape holds its programs (the forward part's
# and the backward part's) until the backward pass, and with buffers kept by each, the
# regions of a long chain would together hold as many arrays as the intermediates that
# checkpointing is there not to keep. So a region has a plan of its own, never replayed
# as a graph, whose pool is emptied when the run returns: its buffers are still reused
# within the run, and freed after it.
_REGION_PLAN = "checkpoint"


def _run_region(*args, program, policy, prevent_cse):
    from cuvmap import config
    from cuvmap.transforms import executor

    key = (_REGION_PLAN, config.jit_gpu_fusion)
    p = program.plans.get(key)
    if p is None:
        p = program.plans.setdefault(key, executor.plan(program, graphs=False))
    try:
        return executor.execute(p, args[len(program.consts):])
    finally:
        for buffers in p.pool.values():
            buffers.clear()  # the lists themselves stay: the plan's generated code holds them


checkpoint_p = RematCallPrimitive("checkpoint")
checkpoint_p.impl = _run_region

remat_rules = {}


def _bind(program, args, params):
    """Applies ``program`` as a checkpointed region with ``params``' policy."""
    return checkpoint_p.bind(*program.consts, *args, program=program, policy=params["policy"],
                             prevent_cse=params["prevent_cse"])


def _saveable(policy):
    if policy is None:
        return nothing_saveable
    return policy


# ---------------------------------------------------------------------------------------
# Partial evaluation with a policy
# ---------------------------------------------------------------------------------------


def partial_eval_remat(closed, unknown_ins, policy, instantiate=None):
    """Splits ``closed`` into what can be computed from its known inputs now and what
    needs the unknown ones, recomputing instead of keeping what ``policy`` does not save.

    The *known* program takes the known inputs and returns the known outputs, then the
    *saved* values: the outputs of known equations that the policy calls saveable and the
    unknown part reads. The *unknown* program takes the known inputs it reads, the saved
    values, then the unknown inputs, and returns the unknown outputs; it contains the
    equations that depend on an unknown input and, ahead of them, the known equations
    whose values they read and that are not saved (the recomputation), back to the inputs
    and the saved values. With ``nothing_saveable`` the only values passed from one to the
    other are inputs.

    Args:
      closed: the program.
      unknown_ins: for each argument, whether it is unknown.
      policy: ``policy(prim, *avals, **params) -> bool`` (``None``: nothing saveable).
      instantiate: for each output, whether the unknown program must return it even when
        it is known (reverse mode: every input cotangent).
    Returns:
      ``(known, unknown, out_unknown, used_known, num_saved)``: the two programs, which
      outputs the unknown one returns, the indices (among the known arguments) of the
      known arguments the unknown program takes, and the number of saved values.
    """
    saveable = _saveable(policy)
    j = closed.jaxpr
    instantiate = instantiate or [False] * len(j.outvars)
    known_invars = [v for v, u in zip(j.invars, unknown_ins) if not u]
    unknown_invars = [v for v, u in zip(j.invars, unknown_ins) if u]
    # an equation with several results (a nested region, a custom-derivative call) is split
    # as a whole: its results are kept or recomputed together
    known_eqns, unknown_eqns, unknown = staging.split_by_unknown(j.eqns, unknown_invars)
    out_unknown = [inst or (type(v) is Var and v in unknown) for v, inst in zip(j.outvars, instantiate)]
    defined_by = {v: e for e in known_eqns for v in e.outs}

    # what the unknown part reads of the known values: walk back from those reads through
    # the equations that are not saved
    saved, recompute = [], set()
    seen = set()
    stack = [x for e in unknown_eqns for x in e.inputs]
    stack += [v for v, u in zip(j.outvars, out_unknown) if u]
    stack.reverse()
    while stack:
        v = stack.pop()
        if type(v) is not Var or v in unknown or v in seen:
            continue
        seen.add(v)
        eqn = defined_by.get(v)
        if eqn is None:  # a known input or a constant
            continue
        if saveable(eqn.primitive, *(x.aval for x in eqn.inputs), **eqn.params):
            saved.append(v)  # only the results the unknown part reads
            continue
        recompute.add(eqn)
        stack.extend(reversed(eqn.inputs))
    recompute_eqns = [e for e in known_eqns if e in recompute]

    known = ir.optimize(ClosedJaxpr(
        Jaxpr(j.constvars, known_invars, known_eqns,
              [v for v, u in zip(j.outvars, out_unknown) if not u] + saved),
        closed.consts))
    body = recompute_eqns + unknown_eqns
    reads = {x for e in body for x in e.inputs if type(x) is Var}
    reads |= {v for v, u in zip(j.outvars, out_unknown) if u and type(v) is Var}
    used_known = [i for i, v in enumerate(known_invars) if v in reads]
    unknown_prog = ir.optimize(ClosedJaxpr(
        Jaxpr(j.constvars, [known_invars[i] for i in used_known] + saved + unknown_invars, body,
              [v for v, u in zip(j.outvars, out_unknown) if u]),
        closed.consts))
    return known, unknown_prog, out_unknown, used_known, len(saved)


def remat_vjp_programs(closed, needs_ct, in_avals, policy):
    """Reverse mode through a checkpointed region: the joint program
    (:func:`cuvmap.transforms.staging.joint_vjp_jaxpr`) split by :func:`partial_eval_remat`
    with the output cotangents unknown. Returns ``(forward, backward, ct_outputs,
    used_primals, num_saved)``: ``forward(primals) -> outputs + saved``,
    ``backward(used primals, saved, output cotangents) -> input cotangents``."""
    key = ("remat_vjp", tuple(needs_ct), tuple(in_avals), policy)
    hit = closed.derived.get(key)
    if hit is not None:
        return hit
    whole, ct_outputs = staging.joint_vjp_jaxpr(closed, needs_ct, in_avals)
    whole = ir.optimize(whole)
    n, num_outs, num_cts = len(in_avals), len(ct_outputs), sum(ct_outputs)
    unknown_ins = [False] * n + [True] * num_cts
    instantiate = [False] * num_outs + [True] * sum(needs_ct)
    forward, backward, out_unknown, used, num_saved = partial_eval_remat(whole, unknown_ins, policy, instantiate)
    if any(out_unknown[:num_outs]):
        raise AssertionError("an output of a checkpointed function depends on a cotangent")
    closed.derived[key] = (forward, backward, ct_outputs, used, num_saved)
    return closed.derived[key]


# ---------------------------------------------------------------------------------------
# The rules, by transform
# ---------------------------------------------------------------------------------------


def _remat_vjp(trace, args, params):
    """Reverse mode: the forward part runs now; the tape keeps the inputs (and the values
    the policy saves), and the backward part recomputes the rest in the backward pass."""
    from cuvmap.transforms import vjp as vjp_mod

    main = trace.main
    primals = list(args)
    operand_nodes = []
    for i, x in enumerate(args):
        if type(x) is vjp_mod.VJPTracer and x._main is main:
            primals[i] = x.primal
            operand_nodes.append((i, x.node))
    if not operand_nodes:
        return checkpoint_p.bind(*primals, **params)
    closed = params["program"]
    needs_ct = [False] * len(args)
    for i, _ in operand_nodes:
        needs_ct[i] = True
    forward, backward, ct_outputs, used, num_saved = remat_vjp_programs(
        closed, needs_ct, staging.avals_of(primals), params["policy"])
    outs = _bind(forward, primals, params)
    num_outs = len(ct_outputs)
    out_primals, saved = list(outs[:num_outs]), list(outs[num_outs:])
    with_ct = [j for j, takes in enumerate(ct_outputs) if takes]
    if not with_ct:
        return out_primals
    ct_avals = [closed.jaxpr.outvars[j].aval for j in with_ct]
    kept = [primals[i] for i in used] + saved  # what the tape holds until the backward pass

    def rule(cts):
        cts = [staging.zeros(a) if c is None else c for c, a in zip(cts, ct_avals)]
        return _bind(backward, kept + cts, params)

    return vjp_mod.record_call(main, checkpoint_p, params, rule, staging.avals_of(primals), operand_nodes,
                               out_primals, with_ct)


def _remat_jvp(trace, args, params):
    """Forward mode: the region's JVP program, as a checkpointed region."""
    from cuvmap.transforms.jvp import join_nonzero, split_nonzero

    primals, tangents, nonzero = split_nonzero(trace.main, args)
    if not tangents:
        return checkpoint_p.bind(*primals, **params)
    program, out_nonzero = staging.jvp_jaxpr(params["program"], nonzero, staging.avals_of(primals))
    return join_nonzero(trace.main, _bind(program, primals + tangents, params), out_nonzero)


def _remat_batch(trace, args, params):
    """vmap: the region's batched program, as a checkpointed region."""
    from cuvmap.transforms.batching import BatchTracer, not_mapped

    main = trace.main
    vals, dims = trace.unwrap(args)
    program, out_dims = staging.batch_jaxpr(params["program"], main.global_data, dims, staging.avals_of(vals))
    outs = _bind(program, vals, params)
    return [o if d is not_mapped else BatchTracer(main, o, d) for o, d in zip(outs, out_dims)]


def _stage_region(trace, args, params):
    """Staging (jit, make_jaxpr, the programs the transforms derive): the region is one
    equation with one result per output of its program (NOTE [an equation with several
    results] in :mod:`cuvmap.transforms.ir`)."""
    from cuvmap.transforms.staging import StagedTracer

    closed = params["program"]
    if not closed.jaxpr.outvars:
        return []  # a region without results computes nothing anyone can read
    builder = trace.main.global_data
    inputs = [trace.to_input(builder, x) for x in args]
    device = staging._out_device([v.aval for v in inputs])
    outs = tuple(Var(core.ShapedArray(a.shape, a.dtype, a.weak_type, a.device or device))
                 for a in closed.out_avals)
    builder.eqns.append(JaxprEqn(checkpoint_p, inputs, outs, params))
    return [StagedTracer(trace.main, v.aval, v) for v in outs]


def _remat_staging(trace, args, params):
    if not params["prevent_cse"]:
        # the region's equations join the enclosing program, where its optimizer may merge
        # them with others (JAX's prevent_cse=False)
        closed = params["program"]
        n = len(closed.consts)
        return ir.eval_jaxpr(closed.jaxpr, args[:n], args[n:])
    return _stage_region(trace, args, params)


def _remat_linearize(trace, args, params):
    """Partial evaluation (under :func:`~cuvmap.transforms.linearize.linearize`): the
    outputs that depend on known operands only are computed now; the others come from a
    staged region that recomputes, from the known operands, what the policy does not save."""
    from cuvmap.transforms.staging import StagedTracer

    main = trace.main
    unknown_ins = tuple(type(x) is StagedTracer and x._main is main for x in args)
    closed = params["program"]
    key = ("remat_pe", unknown_ins, params["policy"])
    split = closed.derived.get(key)
    if split is None:
        flat = ClosedJaxpr(staging._as_program_inputs(closed), [])
        split = closed.derived[key] = partial_eval_remat(flat, unknown_ins, params["policy"])
    known, unknown, out_unknown, used, num_saved = split
    known_args = [x for x, u in zip(args, unknown_ins) if not u]
    outs = _bind(known, known_args, params)
    num_known = len(outs) - num_saved
    known_outs, saved = iter(outs[:num_known]), list(outs[num_known:])
    unknown_args = [known_args[i] for i in used] + saved + [x for x, u in zip(args, unknown_ins) if u]
    staged = iter(_stage_region(trace, list(unknown.consts) + unknown_args, dict(params, program=unknown)))
    return [next(staged) if u else next(known_outs) for u in out_unknown]


def _register_rules():
    from cuvmap.transforms.batching import BatchTrace
    from cuvmap.transforms.jvp import JVPTrace
    from cuvmap.transforms.linearize import LinearizeTrace
    from cuvmap.transforms.staging import StagingTrace
    from cuvmap.transforms.vjp import VJPTrace

    remat_rules[VJPTrace] = _remat_vjp
    remat_rules[JVPTrace] = _remat_jvp
    remat_rules[BatchTrace] = _remat_batch
    remat_rules[StagingTrace] = _remat_staging
    remat_rules[LinearizeTrace] = _remat_linearize


_register_rules()


# ---------------------------------------------------------------------------------------
# The user's function
# ---------------------------------------------------------------------------------------


def checkpoint(fun=None, *, prevent_cse=True, policy=None, static_argnums=()):
    """Makes ``fun`` rematerialized under reverse mode: the backward pass recomputes
    ``fun``'s intermediates from its inputs instead of keeping them from the forward pass.

    ``checkpoint(fun)`` computes what ``fun`` computes, and every derivative is the same;
    under ``grad``/``vjp`` the tape holds ``fun``'s inputs (not its intermediates) until
    the backward pass, which runs ``fun``'s forward again before its backward. It
    composes with every transform: ``vmap(grad(checkpoint(f)))``, ``grad(grad(...))``,
    ``jvp``, ``linearize`` (the linear map recomputes instead of keeping residuals),
    ``jit(grad(checkpoint(f)))`` and ``grad(jit(checkpoint(f)))``.

    As in JAX, ``fun`` is staged (traced once per argument structure, shapes and dtypes,
    as by ``jit``), so Python control flow on the values of its arguments raises
    :class:`~cuvmap.core.ConcretizationError`; make such arguments static.

    Args:
      fun: the function; its arguments and results are pytrees of arrays and Python numbers.
      prevent_cse: ``True`` (the default) keeps the region one equation in staged programs
        (``jit``), so the program optimizer never merges the backward pass's recomputation
        with the forward computation. ``False`` inlines its equations into the enclosing
        staged program, where common-subexpression elimination may merge them (which, in
        ``jit(grad(...))``, gives the memory back for less computation); outside ``jit``
        it changes nothing.
      policy: which residuals to keep after all: ``None`` (keep only the inputs) or a
        function ``policy(prim, *avals, **params) -> bool`` such as those of
        :data:`checkpoint_policies` (``everything_saveable``, ``nothing_saveable``,
        ``dots_saveable``, ``dots_with_no_batch_dims_saveable``).
      static_argnums: positional arguments passed to ``fun`` as they are (not traced);
        they must be hashable.
    Returns:
      the checkpointed function.

    Like ``jit``, the checkpointed function caches its staged programs, so make it once
    and call it many times.

    Example::

        block = checkpoint(lambda w, x: cnp.tanh(x @ w))
        def loss(params, x):
            for w in params:         # the tape keeps each block's input; its activations
                x = block(w, x)      # are recomputed in the backward pass
            return cnp.sum(x ** 2)
    """
    if fun is None:
        return lambda f: checkpoint(f, prevent_cse=prevent_cse, policy=policy, static_argnums=static_argnums)
    from cuvmap import api_util
    from cuvmap.api_util import TransformError

    api_util.check_callable(fun, "checkpoint")
    where = f"checkpoint({api_util.fun_name(fun)})"
    if not isinstance(prevent_cse, bool):
        raise TransformError(f"{where}: prevent_cse must be True or False, got {prevent_cse!r}")
    if policy is not None and not callable(policy):
        raise TransformError(
            f"{where}: policy must be None or a function policy(prim, *avals, **params) -> bool "
            f"(see checkpoint_policies), got {policy!r}")
    static_nums, static_names, _ = api_util.normalize_static(fun, static_argnums, (), (), where)
    cache = {}

    @api_util.with_context(where, fun)
    def checkpointed(*args, **kwargs):
        key, leaves, paths, avals, rebuild = api_util.stage_arguments(fun, where, args, kwargs, static_nums, static_names)
        entry = cache.get(key)
        if entry is None:
            closed, out_tree = api_util.trace_program(fun, where, leaves, paths, avals, rebuild)
            entry = (ir.optimize(closed), out_tree)
            if not any(isinstance(c, core.Tracer) for c in entry[0].consts):
                cache[key] = entry  # a program holding tracers of this call's transforms is for this call only
        program, out_tree = entry
        outs = checkpoint_p.bind(*program.consts, *leaves, program=program, policy=policy, prevent_cse=prevent_cse)
        results = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
        return tree.unflatten(out_tree, results)

    return checkpointed


remat = checkpoint
