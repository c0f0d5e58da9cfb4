"""Custom derivative rules: ``custom_jvp`` and ``custom_vjp`` (JAX's names and semantics).

A function ``f`` whose derivative the user states instead of the one its body implies:

- ``custom_jvp``: a rule ``(x, ẋ) ↦ (f(x), ∂f(x)·ẋ)``, linear in ``ẋ``. Forward mode
  (``jvp``, ``jacfwd``) evaluates it; reverse mode (``grad``, ``vjp``, ``jacrev``) needs
  ``ct ↦ ctᵀ·∂f(x)``, the transpose of the rule's linear part, which the reverse-mode trace
  gets from a tape of the rule's tangent computation (NOTE [reverse mode of a custom_jvp
  function]).
- ``custom_vjp``: a pair ``fwd: x ↦ (f(x), r)`` and ``bwd: (r, ct) ↦ ctᵀ·∂f(x)``, the
  residuals ``r`` being whatever ``bwd`` needs from the forward pass. Reverse mode runs
  ``fwd`` forward and ``bwd`` backward; forward mode has no rule to use and raises, as in
  JAX.

``vmap`` of either maps the function and its rules (``vmap(f)``, ``vmap(rule)``, ...), so
``vmap(grad(f))`` and ``grad(vmap(f))`` both use the rule per example. The rules are
ordinary cuvmap functions, traced like any other, so higher derivatives
(``grad(grad(f))``, ``hessian``) differentiate the rules.

The machinery mirrors JAX's: a call of ``f`` binds a call primitive (NOTE [call
primitives] in :mod:`cuvmap.transforms.call`) with several results,
:data:`custom_jvp_call_p` or :data:`custom_vjp_call_p`, whose params are the flattened
function and rules, and whose methods are the rules of each transform:

- eval (no transform) runs ``f``;
- ``jvp`` runs the JVP rule (``custom_vjp``: an error if a tangent is nonzero);
- ``vjp`` gives the tape ``fwd``'s residuals and ``bwd`` (for ``custom_jvp`` the
  transposed rule);
- ``vmap`` binds again, one level down, with batched versions of ``f`` and the rules
  (NOTE [batching a custom rule]);
- staging keeps one equation that keeps the rules (NOTE [staging a custom derivative]), so
  ``grad(jit(f))`` still uses them.
"""
import functools
import inspect

from cuvmap import api_util, core, tree
from cuvmap.core import PrimalTracer, Tracer
from cuvmap.transforms import ir
from cuvmap.transforms.call import CallPrimitive, avals_of
from cuvmap.transforms.custom_batching_rules import batch_bwd, batch_fun, batch_fwd, batch_jvp
from cuvmap.transforms.custom_call_site import (
    CallSite, ClosedOverTracerError, CustomDerivativeError, MissingCustomRuleError, resolve_args,
)
from cuvmap.transforms.program_call import call
from cuvmap.transforms.staging import trace_to_jaxpr
from cuvmap.transforms.symbolic_zeros import is_zero
# (JAX's jax.custom_derivatives has these two as well)
from cuvmap.transforms.symbolic_zeros import custom_vjp_primal_tree_values, zero_from_primal  # noqa: F401
from cuvmap.transforms.vjp import Tape, VJPTrace, VJPTracer, backward_pass, match_operand


# ---------------------------------------------------------------------------------------
# The call primitives
# ---------------------------------------------------------------------------------------


class CustomCallPrimitive(CallPrimitive):
    """A call of a custom-derivative function (NOTE [call primitives] in
    :mod:`cuvmap.transforms.call`): operands are the leaves of its differentiable
    arguments, params the flat function (``fun(*leaves) -> out leaves``) and its rules;
    eagerly ``fun`` runs. Under ``vmap`` the call goes one level down with batched versions
    of the function and its rules (NOTE [batching a custom rule]); under ``jit`` it is one
    equation that keeps the rules (NOTE [staging a custom derivative]); the subclasses give
    forward and reverse mode."""

    __slots__ = ()
    rule_batchers = {}  # param name -> its batched version's maker (set below)

    def run(self, *args, fun, **rules):
        outs = list(fun(*args))
        # NOTE [a custom function closing over a derivative's value]
        # Evaluated with no transform owning its operands, a custom function whose result is
        # a derivative transform's traced value (jvp's, grad's) got it from a closure: its
        # rule never sees that value, so the derivative through it would be the body's, not
        # the rule's. JAX refuses it (UnexpectedTracerError); so does cuvmap. (A closed-over
        # vmap value is fine: batching the body is exact, as in JAX.)
        leaked = next((o for o in outs if isinstance(o, PrimalTracer)), None)
        if leaked is not None:
            raise ClosedOverTracerError(
                f"{self.name}: the function {fun.__name__} closes over a traced value (shape {leaked.shape}) of "
                f"{leaked._main.name}, which its custom rule cannot see: custom_jvp and custom_vjp functions can't "
                "close over Tracers of the transforms that differentiate them (JAX's UnexpectedTracerError); pass "
                "the value as an argument")
        return outs

    def batch(self, axis, vals, dims, params):
        name = f"vmap({params['fun'].__name__})"
        new_params = dict(params)
        for key, batcher in self.rule_batchers.items():
            new_params[key] = batcher(params[key], axis, dims, name)
        outs = self.bind(*vals, **new_params)
        return outs, [0] * len(outs)

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
    def stage(self, trace, args, params):
        """Staging (NOTE [staging a custom derivative])."""
        fun = params["fun"]
        closed = trace_to_jaxpr(fun, avals_of(args), name=trace.main.name)
        for c in closed.consts:
            if isinstance(c, Tracer):
                raise CustomDerivativeError(
                    f"{self.name}: the body of {fun.__name__} closes over a traced value (shape "
                    f"{c.shape}) of {c._main.name}; a custom-derivative function under jit must get "
                    "its traced values as arguments (pass it as one)"
                )
        program = ir.optimize(closed)
        staged = dict(params, fun=StagedFun(program, fun.__name__))
        return trace.stage_equation(self, args, staged, program.out_avals)

    def partial_eval(self, trace, args, params):
        """Partial evaluation (``linearize``) with some operands unknown: staged whole, as
        under ``jit``, so the rules stay with it."""
        return self.stage(trace, args, params)

    def dce(self, params, used_outputs):
        return None  # the rules compute every output: the equation is kept whole


class CustomJVPCallPrimitive(CustomCallPrimitive):
    """``custom_jvp_call[fun jvp]``: forward mode evaluates the JVP rule; reverse mode
    transposes it (NOTE [reverse mode of a custom_jvp function])."""

    __slots__ = ()

    def jvp(self, primals, tangents, params):
        """The rule, not the body, gives the outputs and their tangents (zero tangents,
        ``None``, are instantiated for the rule, or given as ``SymbolicZero``s with
        ``symbolic_zeros=True``, as JAX does)."""
        out_primals, out_tangents = params["jvp"](primals, list(tangents))
        return list(out_primals), [t if core.is_float(p) else None for p, t in zip(out_primals, out_tangents)]

    # NOTE [reverse mode of a custom_jvp function]
    # A custom_jvp function's derivative is its JVP rule, ``(primals, tangents) ->
    # (primal_out, tangent_out)``, whose tangent_out is linear in the tangents; reverse mode
    # needs that linear map's transpose. JAX gets it by linearizing the rule (partial
    # evaluation) and transposing the linear part. Here the rule runs once with the primals
    # at the level below and, for the tangents of the operands being differentiated, tracers
    # of a fresh reverse-mode trace whose primal values are zeros: its own tape then records
    # the rule's tangent computation (the primitives applied to the tangents, with the
    # primal-dependent factors as the values they read), and walking that tape backwards
    # from the output cotangents is the transpose (a linear map's VJP at any point — zero
    # here — is its transpose). The outer tape holds one call entry (NOTE [a call on the
    # tape] in vjp.py) whose rule is that backward walk. So the rule, never ``f``'s body,
    # defines the gradient; the rule's primal-dependent values are values of the level
    # below, so ``grad(grad(f))`` differentiates the rule's tangent expression, as JAX does.
    # The price is one evaluation of the rule's tangent part on zeros, whose values nothing
    # reads (under ``jit`` dead-code elimination drops them). A rule whose tangent_out is not
    # linear in the tangents is not a JVP rule; its reverse mode is then the transpose of its
    # part that is.
    def vjp(self, primals, needs_ct, params):
        """Reverse mode (NOTE [reverse mode of a custom_jvp function])."""
        differentiated = [i for i, needed in enumerate(needs_ct) if needed]
        inner_tape = Tape()
        with core.new_main(RuleTangentTrace, inner_tape, name="vjp") as inner:
            tangents = [None] * len(primals)
            for i in differentiated:
                tangents[i] = VJPTracer(inner, core.full_like_concrete(primals[i], 0), inner_tape.new_input())
            out_primals, out_tangents = params["jvp"](primals, tangents)
        with_ct = [j for j, (p, t) in enumerate(zip(out_primals, out_tangents)) if core.is_float(p) and inner.owns(t)]
        seed_nodes = [out_tangents[j].node for j in with_ct]
        avals = avals_of(primals)

        def backward(cts):
            in_cts = backward_pass(inner_tape, [(n, c) for n, c in zip(seed_nodes, cts) if c is not None])
            return [None if c is None else match_operand(c, avals[i]) for c, i in zip(in_cts, differentiated)]

        return list(out_primals), with_ct, backward


# NOTE [a custom_jvp function applied to tangents]
# JAX's idiom for a linear function is a JVP rule that calls the function itself on the
# tangents: ``return f(x), f(x_dot)``. Reverse mode transposes the rule's tangent
# computation by recording it on a tape of its own (NOTE [reverse mode of a custom_jvp
# function]); there ``f(x_dot)`` is a custom_jvp call on a tangent, whose reverse mode
# would run the rule again on a tangent of its own, and so on forever. A rule's tangent
# computation is linear and is transposed, not differentiated, so its trace takes a
# custom_jvp call on a tangent through the body, whose primitives the tape records and the
# backward pass transposes (JAX likewise transposes the body of a custom_jvp call that
# sits in a linear program). Only that trace does: a call on the primals (``f(x)``) and
# every call outside a rule keep their rule.
class RuleTangentTrace(VJPTrace):
    """The reverse-mode trace of a custom_jvp rule's tangent computation (NOTE [a
    custom_jvp function applied to tangents])."""

    __slots__ = ()

    def process_call(self, primitive, args, params):
        if primitive is custom_jvp_call_p:
            return list(params["fun"](*args))
        return super().process_call(primitive, args, params)


class CustomVJPCallPrimitive(CustomCallPrimitive):
    """``custom_vjp_call[fun fwd bwd]``: reverse mode runs ``fwd`` now and ``bwd`` in the
    backward pass; forward mode has no rule and raises, as in JAX."""

    __slots__ = ()

    def jvp(self, primals, tangents, params):
        raise CustomDerivativeError(
            f"can't apply forward-mode autodiff (jvp) to a custom_vjp function: "
            f"{params['fun'].__name__} defines reverse mode only (fwd and bwd); differentiate it "
            "with grad/vjp/jacrev, or make it a custom_jvp function"
        )

    def vjp(self, primals, needs_ct, params):
        """``fwd`` runs now, at the level below (its outputs and residuals are values
        there); the backward rule is ``bwd`` on the residuals and the outputs' cotangents
        (zeros for those that get none). With ``optimize_remat`` (JAX's), the outputs are
        ``f``'s and ``fwd`` runs in the backward pass for its residuals."""
        fwd = params["fwd"]
        remat = getattr(fwd, "optimize_remat", False)
        if remat:
            out_primals, residuals = list(params["fun"](*primals)), None
        else:
            out_primals, residuals = fwd(*primals, perturbed=tuple(needs_ct))
        with_ct = [j for j, p in enumerate(out_primals) if core.is_float(p)]
        out_avals = avals_of(out_primals)
        avals = avals_of(primals)
        differentiated = [i for i, needed in enumerate(needs_ct) if needed]
        bwd = params["bwd"]

        def backward(cts):
            full = [None] * len(out_avals)  # None: a zero cotangent (flat_bwd makes it zeros or symbolic)
            for j, c in zip(with_ct, cts):
                full[j] = c
            in_cts = bwd(fwd(*primals, perturbed=tuple(needs_ct))[1] if remat else residuals, full)
            return [None if in_cts[i] is None else match_operand(in_cts[i], avals[i]) for i in differentiated]

        return list(out_primals), with_ct, backward


custom_jvp_call_p = CustomJVPCallPrimitive("custom_jvp_call")
custom_vjp_call_p = CustomVJPCallPrimitive("custom_vjp_call")


class StagedFun:
    """A staged program as a function of its arguments (the ``fun`` of a staged
    custom-derivative call): ``StagedFun(program, name)(*args)`` runs it through
    jit's call primitive, so every transform processes it as a jitted call."""

    def __init__(self, program, name):
        self.program = program
        self.__name__ = name

    def __call__(self, *args):
        return call(self.program, args)

    def __repr__(self):
        return self.__name__


# ---------------------------------------------------------------------------------------
# The user's view: custom_jvp, custom_vjp
# ---------------------------------------------------------------------------------------


class custom_jvp:  # noqa: N801 - JAX's name
    """A function with a custom JVP rule (``jax.custom_jvp``).

    Example::

        @cv.custom_jvp
        def log1pexp(x):
            return cnp.log(1.0 + cnp.exp(x))

        @log1pexp.defjvp
        def log1pexp_jvp(primals, tangents):
            (x,), (x_dot,) = primals, tangents
            return log1pexp(x), x_dot * (1.0 - 1.0 / (1.0 + cnp.exp(x)))

        cv.grad(log1pexp)(100.0)     # 1.0 (the body's own derivative is nan there)

    The rule ``jvp(primals, tangents) -> (primal_out, tangent_out)`` gets tuples with one
    entry per argument (pytrees as the arguments are; integer arguments get zero tangents
    of their own dtype), and returns pytrees of ``f``'s output structure; ``tangent_out``
    must be linear in the tangents. Every transform uses it: ``jvp``/``jacfwd`` evaluate
    it, ``grad``/``vjp``/``jacrev`` transpose it, ``vmap`` maps it, ``jit`` keeps it.

    ``nondiff_argnums`` / ``nondiff_argnames``: positions / names of arguments that are
    not differentiated (Python callables, ints, flags, or arrays whose derivative is taken
    as zero: a traced value there is allowed, as in JAX, and acts as if under
    ``stop_gradient``); the rule gets them first: ``jvp(*nondiff_args, primals,
    tangents)``, with ``primals`` the other arguments. As a decorator with them:
    ``@functools.partial(custom_jvp, nondiff_argnums=(0,))``.

    ``defjvp(rule, symbolic_zeros=True)``: the rule gets a
    :class:`~cuvmap.custom_derivatives.SymbolicZero` for each tangent that is zero (an
    argument not differentiated) instead of an array of zeros, and may return one (or
    ``None``) for a zero output tangent (NOTE [symbolic zeros in custom rules]).
    ``f.__name__``, ``f.__doc__`` and ``f.__wrapped__`` are the function's.
    """

    def __init__(self, fun, nondiff_argnums=(), nondiff_argnames=()):
        _init_custom(self, fun, nondiff_argnums, "custom_jvp", nondiff_argnames)
        self.jvp = None
        self.symbolic_zeros = False

    def defjvp(self, jvp, symbolic_zeros=False):
        """Sets the JVP rule; returns it (usable as a decorator, or as
        ``functools.partial(f.defjvp, symbolic_zeros=True)``)."""
        if not callable(jvp):
            raise TypeError(f"custom_jvp {self.__name__}.defjvp: the rule must be callable, got {jvp!r}")
        self.jvp = jvp
        self.symbolic_zeros = bool(symbolic_zeros)
        return jvp

    def defjvps(self, *jvps):
        """Sets the JVP rule from one function per argument, ``jvp_i(t_i, primal_out,
        *primals) -> its contribution to tangent_out`` (``None`` for an argument without
        one); the contributions are summed (``jax.custom_jvp.defjvps``)."""
        if self.nondiff_argnums:
            raise TypeError(f"custom_jvp {self.__name__}: defjvps cannot be used with nondiff_argnums; use defjvp")

        def jvp(primals, tangents):
            if len(jvps) != len(primals):
                raise CustomDerivativeError(
                    f"custom_jvp function {self.__name__}: defjvps got {len(jvps)} rule(s) but the "
                    f"function was called with {len(primals)} argument(s)")
            primal_out = self(*primals)
            total = None
            for rule, t in zip(jvps, tangents):
                if rule is None or is_zero(t):
                    continue
                term = rule(t, primal_out, *primals)
                total = term if total is None else tree.map_preserving(lambda a, b: a + b, total, term)
            if total is None:
                total = tree.map_preserving(lambda o: core.full_like_concrete(o, 0), primal_out)
            return primal_out, total

        self.jvp = jvp
        self.symbolic_zeros = False

    def __getattr__(self, name):
        return forward_def(self, name)

    def __call__(self, *args, **kwargs):
        if self.jvp is None:
            raise MissingCustomRuleError(f"No JVP defined for custom_jvp function {self.__name__} using defjvp.")
        site = CallSite(self, "custom_jvp", resolve_args(self, args, kwargs))
        leaves, site.leaves = site.leaves, None
        outs = custom_jvp_call_p.bind(*leaves, fun=site.flat_fun(), jvp=site.flat_jvp())
        return tree.unflatten(site.out_tree, outs)


class custom_vjp:  # noqa: N801 - JAX's name
    """A function with a custom VJP rule (``jax.custom_vjp``).

    Example::

        @cv.custom_vjp
        def clip_gradient(x):
            return x

        def fwd(x):
            return x, None                      # (output, residuals)

        def bwd(residuals, ct):
            return (cnp.clip(ct, -1.0, 1.0),)   # one cotangent per argument

        clip_gradient.defvjp(fwd, bwd)

    ``fwd(*args) -> (out, residuals)`` takes the arguments ``f`` takes (all of them,
    ``nondiff_argnums`` included) and returns ``f``'s output and any pytree of residuals;
    ``bwd(residuals, ct) -> tuple`` returns one cotangent per differentiable argument, of
    its structure and shapes, ``None`` for a zero one (for a whole argument or a subtree).
    ``ct`` has the output's structure, with zeros for outputs that get no cotangent
    (integer outputs get zeros of their dtype). With ``nondiff_argnums`` (or
    ``nondiff_argnames``; Python values only: a traced value there raises, as in JAX),
    ``bwd(*nondiff_args, residuals, ct)``. Reverse mode
    (``grad``, ``vjp``, ``jacrev``) uses the pair; ``vmap`` maps ``f``, ``fwd`` and
    ``bwd``; ``jit`` keeps them; forward mode (``jvp``, ``jacfwd``) raises, as in JAX.

    ``defvjp(fwd, bwd, symbolic_zeros=True)``: ``fwd`` gets each argument leaf as a
    :class:`~cuvmap.custom_derivatives.CustomVJPPrimal` ``(value, perturbed)``, ``bwd``
    gets a :class:`~cuvmap.custom_derivatives.SymbolicZero` for each output cotangent
    that is zero and may return one (or ``None``) for a zero input cotangent (NOTE
    [symbolic zeros in custom rules]). ``optimize_remat=True`` (JAX's): reverse mode
    runs ``f`` for the outputs and ``fwd`` again in the backward pass for the residuals,
    which the tape then does not keep; the primal output is ``f``'s, as in JAX (without
    it, ``fwd``'s: they differ only when ``fwd``'s primal output disagrees with ``f``).
    """

    def __init__(self, fun, nondiff_argnums=(), nondiff_argnames=()):
        _init_custom(self, fun, nondiff_argnums, "custom_vjp", nondiff_argnames)
        self.fwd = None
        self.bwd = None
        self.symbolic_zeros = False
        self.optimize_remat = False

    def defvjp(self, fwd, bwd, symbolic_zeros=False, optimize_remat=False):
        """Sets the forward and backward rules (``symbolic_zeros``, ``optimize_remat``: see
        the class)."""
        for what, g in (("fwd", fwd), ("bwd", bwd)):
            if not callable(g):
                raise TypeError(f"custom_vjp {self.__name__}.defvjp: {what} must be callable, got {g!r}")
        if symbolic_zeros and optimize_remat:
            raise NotImplementedError(f"custom_vjp {self.__name__}.defvjp: optimize_remat does not support "
                                      "symbolic_zeros (as in JAX)")
        self.fwd = fwd
        self.bwd = bwd
        self.symbolic_zeros = bool(symbolic_zeros)
        self.optimize_remat = bool(optimize_remat)

    def __getattr__(self, name):
        return forward_def(self, name)

    def __call__(self, *args, **kwargs):
        if self.fwd is None or self.bwd is None:
            raise MissingCustomRuleError(f"No VJP defined for custom_vjp function {self.__name__} using defvjp.")
        site = CallSite(self, "custom_vjp", resolve_args(self, args, kwargs))
        leaves, site.leaves = site.leaves, None
        outs = custom_vjp_call_p.bind(*leaves, fun=site.flat_fun(), fwd=site.flat_fwd(), bwd=site.flat_bwd())
        return tree.unflatten(site.out_tree, outs)


def forward_def(obj, name):
    """A ``def*`` method of the custom function that ``obj`` decorates (JAX's
    ``forward_attr``): ``f.def_vmap`` of ``custom_vjp(custom_vmap(g))`` reaches the inner
    ``custom_vmap``, as ``f.defjvp`` of ``custom_vmap(custom_jvp(g))`` reaches the inner
    ``custom_jvp``. Called for the attributes that ``obj`` lacks."""
    fun = obj.__dict__.get("fun")
    if name.startswith("def") and fun is not None and callable(getattr(type(fun), name, None)):
        return getattr(fun, name)
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")


def _init_custom(obj, fun, nondiff_argnums, kind, nondiff_argnames=()):
    if not callable(fun):
        raise TypeError(f"{kind}: the function must be callable, got {fun!r}")
    nums = (nondiff_argnums,) if isinstance(nondiff_argnums, int) else tuple(nondiff_argnums)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in nums) or len(set(nums)) != len(nums):
        raise TypeError(f"{kind}: nondiff_argnums must be distinct ints, got {nondiff_argnums!r}")
    names = (nondiff_argnames,) if isinstance(nondiff_argnames, str) else tuple(nondiff_argnames)
    if names:
        params = list(inspect.signature(fun).parameters.values())
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for name in names:
            if name not in positional:
                raise TypeError(f"{kind} {api_util.fun_name(fun)}: nondiff_argnames names {name!r}, which is not "
                                f"a positional parameter of the function ({', '.join(positional)})")
        nums = tuple(sorted(set(nums) | {positional.index(name) for name in names}))
    functools.update_wrapper(obj, fun)
    if "__name__" not in vars(obj):  # a functools.partial has no __name__: the function it wraps names it
        obj.__name__ = api_util.fun_name(fun)
    obj.fun = fun
    obj.nondiff_argnums = nums
    obj.kind = kind


CustomJVPCallPrimitive.rule_batchers = {"fun": batch_fun, "jvp": batch_jvp}
CustomVJPCallPrimitive.rule_batchers = {"fun": batch_fun, "fwd": batch_fwd, "bwd": batch_bwd}
