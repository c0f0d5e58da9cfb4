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
  with the policy deciding what is kept (:mod:`cuvmap.transforms.partial_eval`); the
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
from cuvmap import api_util, config, core, tree
from cuvmap.core import primitive
from cuvmap.api_util import TransformError
from cuvmap.transforms import executor, ir, staging
from cuvmap.transforms.checkpoint_name import checkpoint_name, name_p  # noqa: F401  (jax.ad_checkpoint's names)
from cuvmap.transforms.partial_eval import everything_saveable, nothing_saveable, partial_eval_jaxpr
from cuvmap.transforms.program_call import ProgramCall


# ---------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------


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


def save_only_these_names(*names):
    """A policy that keeps the values named (:func:`checkpoint_name`) with one of
    ``names`` and recomputes everything else (JAX's policy of that name)."""
    names = frozenset(names)

    def policy(prim, *avals, **params):
        return prim is name_p and params["name"] in names

    return policy


def save_any_names_but_these(*names):
    """A policy that keeps every named value (:func:`checkpoint_name`) except those
    named with one of ``names``, and recomputes the unnamed ones (JAX's policy of that
    name)."""
    names = frozenset(names)

    def policy(prim, *avals, **params):
        return prim is name_p and params["name"] not in names

    return policy


def save_anything_except_these_names(*names):
    """A policy that keeps everything except the values named with one of ``names``
    (JAX's policy of that name)."""
    names = frozenset(names)

    def policy(prim, *avals, **params):
        return not (prim is name_p and params["name"] in names)

    return policy


def save_from_both_policies(policy_1, policy_2):
    """A policy that keeps what either policy keeps (JAX's policy of that name)."""

    def policy(prim, *avals, **params):
        return bool(policy_1(prim, *avals, **params) or policy_2(prim, *avals, **params))

    return policy


class _Policies:
    """The policies of :func:`checkpoint` (JAX's ``jax.checkpoint_policies``). A policy is
    any function ``policy(prim, *avals, **params) -> bool`` saying whether the output of
    an equation ``prim(*operands, **params)`` of the forward computation, with operands of
    ``avals``, is kept for the backward pass rather than recomputed. The policies that
    choose by name (``save_only_these_names``, ``save_any_names_but_these``,
    ``save_anything_except_these_names``) read the names that :func:`checkpoint_name`
    puts on values; ``save_from_both_policies`` combines two. JAX's offloading policies
    (to host memory) are not provided."""

    everything_saveable = staticmethod(everything_saveable)
    nothing_saveable = staticmethod(nothing_saveable)
    dots_saveable = staticmethod(dots_saveable)
    checkpoint_dots = staticmethod(dots_saveable)
    dots_with_no_batch_dims_saveable = staticmethod(dots_with_no_batch_dims_saveable)
    checkpoint_dots_with_no_batch_dims = staticmethod(dots_with_no_batch_dims_saveable)
    save_only_these_names = staticmethod(save_only_these_names)
    save_any_names_but_these = staticmethod(save_any_names_but_these)
    save_anything_except_these_names = staticmethod(save_anything_except_these_names)
    save_from_both_policies = staticmethod(save_from_both_policies)

    def __repr__(self):
        return "checkpoint_policies"


checkpoint_policies = _Policies()


# ---------------------------------------------------------------------------------------
# The call primitive
# ---------------------------------------------------------------------------------------


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


class RematCallPrimitive(ProgramCall):
    """``checkpoint[program policy prevent_cse]``: a checkpointed region, a program call
    (:mod:`cuvmap.transforms.program_call`) whose reverse mode keeps only
    what ``policy`` saves and whose derived programs (batched, JVP, forward and backward)
    are checkpointed regions again, so ``vmap(grad(checkpoint(f)))`` and ``grad(grad(...))``
    rematerialize too."""

    __slots__ = ()
    what = "a checkpointed function"

    def run(self, *args, program, policy, prevent_cse):
        key = (_REGION_PLAN, config.jit_gpu_fusion, primitive.impl_epoch())
        p = program.plans.get(key)
        if p is None:
            p = program.plans.setdefault(key, executor.plan(program, graphs=False))
        try:
            return executor.execute(p, args[len(program.consts):])
        finally:
            for buffers in p.pool.values():
                buffers.clear()  # the lists themselves stay: the plan's generated code holds them

    def saveable(self, params):
        return params["policy"] or nothing_saveable

    def stage(self, trace, args, params):
        """Staging: one equation (NOTE [an equation with several results] in
        :mod:`cuvmap.transforms.ir`), so the program optimizer cannot merge the
        recomputation with the forward computation; with ``prevent_cse=False`` the
        region's equations join the enclosing program instead, where its optimizer may
        merge them (JAX's ``prevent_cse=False``)."""
        if not params["prevent_cse"]:
            closed = params["program"]
            n = len(closed.consts)
            return ir.eval_jaxpr(closed.jaxpr, args[:n], args[n:])
        return super().stage(trace, args, params)

    def partial_eval(self, trace, args, params):
        """Partial evaluation (under :func:`~cuvmap.transforms.linearize.linearize`): the
        outputs that depend on known operands only are computed now; the others come from a
        staged region that recomputes, from the known operands, what the policy does not
        save."""
        main = trace.main
        unknown_ins = tuple(main.owns(x) for x in args)
        closed = params["program"]
        key = ("partial_eval", unknown_ins, params["policy"])
        split = closed.derived.get(key)
        if split is None:
            flat, _ = ir.hoist_consts(closed)
            split = closed.derived[key] = partial_eval_jaxpr(flat, unknown_ins, saveable=self.saveable(params))
        known_args = [x for x, u in zip(args, unknown_ins) if not u]
        outs = self.rebind(split.known, known_args, params)
        num_known = len(outs) - split.num_res
        known_outs, residuals = iter(outs[:num_known]), list(outs[num_known:])
        staged_args = [known_args[i] for i in split.known_read] + residuals + [x for x, u in zip(args, unknown_ins) if u]
        staged_program = split.staged
        staged = iter(super().stage(trace, list(staged_program.consts) + staged_args,
                                    dict(params, program=staged_program)))
        return [next(staged) if u else next(known_outs) for u in split.out_unknown]


checkpoint_p = RematCallPrimitive("checkpoint")


def _any_prevent_cse(prevent_cse, args):
    """JAX's per-argument ``prevent_cse`` (a pytree prefix of the positional arguments with
    bool leaves) as the region's one flag: the region stays one equation when any argument
    asks for it (CSE prevention changes what the optimizer may merge, never a value)."""
    try:
        flags = tree.broadcast_prefix(prevent_cse, tuple(args), lambda b: isinstance(b, bool))
    except tree.PrefixError as err:
        raise TransformError(f"prevent_cse {prevent_cse!r} must be a bool or a pytree prefix of the positional "
                             f"arguments with bool leaves: {err}") from None
    return any(flags)


# ---------------------------------------------------------------------------------------
# The user's function
# ---------------------------------------------------------------------------------------


def checkpoint(fun=None, *, prevent_cse=True, policy=None, static_argnums=(), static_argnames=()):
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
        it changes nothing. As in JAX it may also be a tuple: a pytree prefix of the
        positional arguments with bool leaves; the region is then kept whole when any
        of them is ``True``.
      policy: which residuals to keep after all: ``None`` (keep only the inputs) or a
        function ``policy(prim, *avals, **params) -> bool`` such as those of
        :data:`checkpoint_policies` (``everything_saveable``, ``nothing_saveable``,
        ``dots_saveable``, ``dots_with_no_batch_dims_saveable``, and by name
        ``save_only_these_names("h")`` with :func:`checkpoint_name`).
      static_argnums: positional arguments passed to ``fun`` as they are (not traced).
        As in JAX, an unhashable one (a dict) is closed over: the call is traced anew,
        its program not kept.
      static_argnames: the same for arguments passed by keyword (``jax.checkpoint``'s).
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
        return lambda f: checkpoint(f, prevent_cse=prevent_cse, policy=policy, static_argnums=static_argnums,
                                    static_argnames=static_argnames)
    api_util.check_callable(fun, "checkpoint")
    where = f"checkpoint({api_util.fun_name(fun)})"
    if isinstance(prevent_cse, list):
        prevent_cse = tuple(prevent_cse)
    if not isinstance(prevent_cse, (bool, tuple)):
        raise api_util.InputTypeError(f"{where}: prevent_cse must be a bool or tuple of bools (a pytree prefix of "
                                      f"the positional arguments), got type(prevent_cse)={type(prevent_cse)}")
    if policy is not None and not callable(policy):
        raise TransformError(
            f"{where}: policy must be None or a function policy(prim, *avals, **params) -> bool "
            f"(see checkpoint_policies), got {policy!r}")
    static_nums, static_names, _ = api_util.normalize_static(fun, static_argnums, static_argnames, (), where)
    cache = {}

    @api_util.with_context(where, fun)
    def checkpointed(*args, **kwargs):
        key, leaves, paths, avals, rebuild = staging.stage_arguments(fun, where, args, kwargs, static_nums, static_names,
                                                                     unhashable_ok=True)
        entry = cache.get(key) if key is not None else None
        if entry is None:
            closed, out_tree = staging.trace_program(fun, where, leaves, paths, avals, rebuild)
            entry = (ir.optimize(closed), out_tree)
            if key is not None and not any(isinstance(c, core.Tracer) for c in entry[0].consts):
                cache[key] = entry  # a program holding tracers of this call's transforms is for this call only
        program, out_tree = entry
        consts = program.consts
        if any(isinstance(c, core.Tracer) for c in consts):
            # values of transforms around this call (a jit's arguments it closes over): the
            # program takes them as operands, so that those transforms see them (and its
            # plan, run later, never holds a tracer)
            program, consts = ir.hoist_consts(program)
        cse = prevent_cse if isinstance(prevent_cse, bool) else _any_prevent_cse(prevent_cse, args)
        outs = checkpoint_p.bind(*consts, *leaves, program=program, policy=policy, prevent_cse=cse)
        results = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
        return tree.unflatten(out_tree, results)

    return checkpointed


remat = checkpoint
