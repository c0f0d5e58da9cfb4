"""Custom batching rules: ``custom_vmap`` and ``sequential_vmap`` (``jax.custom_batching``).

A function ``f`` whose ``vmap`` the user states instead of the one its body implies::

    @cv.custom_batching.custom_vmap
    def f(x, y):
        return x + y

    @f.def_vmap
    def f_vmap_rule(axis_size, in_batched, xs, ys):
        # in_batched: one pytree of bools per argument; a batched argument has the batch
        # at axis 0
        return xs * ys, True       # (the batched output, which outputs are batched)

    cv.vmap(f)(xs, ys)             # runs the rule: xs * ys

Outside ``vmap`` the body runs. NOTE [batching a custom_vmap function] says how it composes.
"""
import functools

from cuvmap import api_util, core, tree
from cuvmap import lax
from cuvmap.core import CuvmapError
from cuvmap.jit_api import eval_shape
from cuvmap.transforms import ir, staging
from cuvmap.transforms.batching import bdim_at_front, move_bdim, not_mapped
from cuvmap.transforms.call import avals_of
from cuvmap.transforms.custom_call_site import resolve_args
from cuvmap.transforms.custom_derivatives import forward_def
from cuvmap.transforms.jvp import JVPTrace, JVPTracer, jvp_jaxpr, split_nonzero, zeros_like
from cuvmap.transforms.program_call import ProgramCall
from cuvmap.core.bfloat16 import kind_of

__all__ = ["CustomVmapError", "custom_vmap", "sequential_vmap"]


class CustomVmapError(CuvmapError, TypeError):
    """A custom_vmap function was misused: ``vmap`` of one without a rule, a rule that
    returned the wrong structure or shapes, reverse-mode differentiation (not supported,
    as in JAX: combine with ``custom_vjp``), a batched or differentiated value that the
    function closes over."""


class CustomVmapValueError(CustomVmapError, ValueError):
    """A custom_vmap rule's output does not match its batching spec or the function's
    output, or reverse mode met a custom_vmap function (JAX raises ``ValueError``)."""


class MissingVmapRuleError(CustomVmapError, AttributeError):
    """A custom_vmap function called before its rule was defined (JAX's ``AttributeError``)."""


# NOTE [batching a custom_vmap function]
# A call of a custom_vmap function stages its body (as JAX does: the output shapes must be
# known without the rule) and binds ``custom_vmap_call[program rule]`` on the values it
# closes over (the program's constants) and the leaves of its arguments. The methods of
# the primitive (NOTE [call primitives] in cuvmap/transforms/call.py) are its rules:
#
# - eval: the executor runs the body's program (with no transform active the body is
#   simply called);
# - vmap: the rule, called at the level below with the batched arguments' batch dims at
#   0 and ``in_batched`` saying which; it returns the outputs and which are batched. Under
#   nested vmaps the inner vmap calls the rule and the outer one batches what the rule
#   does, as in JAX;
# - jvp: again a custom_vmap call, of the JVP of the body, whose rule is the JVP of the
#   rule (where a primal and its tangent differ in batchedness the unbatched one is
#   broadcast first), so ``vmap(jvp(f))``, ``jvp(vmap(f))`` and ``jacfwd`` use the rule;
# - grad, vjp, linearize: an error naming ``custom_vjp`` (JAX's custom_vmap has no
#   reverse mode either; a ``custom_vjp`` around it gives one);
# - jit: one equation that keeps the rule, so ``vmap(jit(f))`` uses it too.
#
# Values the body closes over stay constants of the program: under a vmap that batches
# one of them, or a jvp that differentiates one, the rule cannot know it, and the call
# raises (pass such a value as an argument).


class CustomVmapCallPrimitive(ProgramCall):
    """``custom_vmap_call[program rule num_consts]`` (NOTE [batching a custom_vmap
    function]): ``program`` is the body over its constants (the first ``num_consts``
    operands) and the argument leaves; ``rule(axis_size, batched, vals) -> (outs,
    out_batched)`` is the flat batching rule."""

    __slots__ = ()
    what = "a custom_vmap function"

    def batch(self, axis, vals, dims, params):
        batched = [d is not not_mapped for d in dims]
        vals = [v if d is not_mapped else move_bdim(v, d, 0) for v, d in zip(vals, dims)]
        outs, out_batched = params["rule"](axis.size, batched, vals)
        return list(outs), [0 if b else not_mapped for b in out_batched]

    def jvp(self, primals, tangents, params):
        rule, num_consts = params["rule"], params["num_consts"]
        if any(t is not None for t in tangents[:num_consts]):
            raise CustomVmapError(
                f"custom_vmap function {rule.name}: jvp differentiates a value that its body closes over; "
                "pass that value as an argument of the function")
        program = params["program"]
        nonzero = [t is not None for t in tangents]
        floats = [kind_of(a.dtype) in "fc" for a in program.out_avals]
        jvp_program, out_nonzero = jvp_jaxpr(program, nonzero, avals_of(primals), instantiate=floats)
        outs = self.bind(*primals, *[t for t in tangents if t is not None], program=jvp_program,
                         rule=_JVPRule(rule, tuple(nonzero), len(floats)), num_consts=num_consts)
        n = len(out_nonzero)
        out_tangents = iter(outs[n:])
        return outs[:n], [next(out_tangents) if nz else None for nz in out_nonzero]

    def vjp(self, primals, needs_ct, params):
        raise _no_reverse_mode(params["rule"].name, "grad/vjp")

    def partial_eval(self, trace, args, params):
        raise _no_reverse_mode(params["rule"].name, "linearize")

    def dce(self, params, used_outputs):
        return None  # the rule computes every output: the equation is kept whole


custom_vmap_call_p = CustomVmapCallPrimitive("custom_vmap_call")


def _no_reverse_mode(name, transform):
    return CustomVmapValueError(
        f"{transform} of custom_vmap function {name}: custom_vmap functions have no reverse mode (as in JAX: "
        "Linearization failed to produce known values for all output primals); wrap the function in "
        "cv.custom_vjp to give one (@cv.custom_vjp above @custom_vmap), or differentiate it in forward mode "
        "(jvp, jacfwd)")


class _UserRule:
    """The user's rule as a flat rule over the call's operands (constants first): checks
    its arguments and its result against the body's (NOTE [batching a custom_vmap
    function])."""

    def __init__(self, cfun, in_tree, num_consts, out_tree, out_avals):
        self.cfun = cfun
        self.name = cfun.__name__
        self.in_tree = in_tree
        self.num_consts = num_consts
        self.out_tree = out_tree
        self.out_avals = out_avals

    @property
    def __name__(self):  # how a program's text shows it
        return getattr(self.cfun.vmap_rule, "__name__", None) or "vmap_rule"

    def __repr__(self):
        return self.__name__

    def error(self, message):
        return CustomVmapError(f"custom_vmap function {self.name}: {message}")

    def __call__(self, axis_size, batched, vals):
        nc = self.num_consts
        if any(batched[:nc]):
            raise self.error("vmap batches a value that its body closes over, which its rule cannot see; pass "
                             "that value as an argument of the function")
        rule = self.cfun.vmap_rule
        if rule is None:
            raise self.error("vmap needs a rule: define one with @f.def_vmap")
        args = tree.unflatten(self.in_tree, list(vals[nc:]))
        in_batched = list(tree.unflatten(self.in_tree, list(batched[nc:])))
        result = rule(axis_size, in_batched, *args)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise self.error(f"the vmap rule must return a pair (out, out_batched), got {tree.describe(result)}")
        out, out_batched = result
        paths, leaves, out_tree = tree.flatten_with_path(out)
        try:
            flags = tree.broadcast_prefix(out_batched, out, lambda b: isinstance(b, bool))
        except ValueError as err:
            raise CustomVmapValueError(
                f"custom_vmap function {self.name}: structure of output value and output batching specification "
                f"returned by custom vmap rule ({self.__name__}) do not match: out_batched must be a pytree of "
                f"bools matching its output (or a prefix of it): {err}.\nOutput values: {out_tree}\n"
                f"Batching spec: {tree.structure(out_batched)}") from None
        if out_tree != self.out_tree:
            raise CustomVmapValueError(
                f"custom_vmap function {self.name}: structure of output returned by custom vmap rule "
                f"({self.__name__}) does not match that of original custom-vmapped function.\nOriginal output: "
                f"{self.out_tree}\nRule output: {out_tree}")
        for path, leaf, b, aval in zip(paths, leaves, flags, self.out_avals):
            want = ((axis_size,) if b else ()) + aval.shape
            if not core.is_value(leaf) or core.shape_of(leaf) != want or core.dtype_of(leaf) != aval.dtype:
                got = (ir.pp_aval(core.ShapedArray(core.shape_of(leaf), core.dtype_of(leaf))) if core.is_value(leaf)
                       else f"a {type(leaf).__name__}")
                raise self.error(
                    f"the vmap rule returned {got} as output{tree.keystr(path)}, which it marks "
                    f"{'batched' if b else 'unbatched'}, so it must be {ir.pp_aval(core.ShapedArray(want, aval.dtype))}")
        return leaves, flags


class _JVPRule:
    """The JVP of a flat rule (NOTE [batching a custom_vmap function]): operands are the
    primals then the tangents of those marked ``nonzero``; outputs the primals then the
    tangents of the floating-point outputs (``num_outs`` in all)."""

    def __init__(self, rule, nonzero, num_outs):
        self.rule = rule
        self.name = rule.name
        self.nonzero = nonzero
        self.num_outs = num_outs

    @property
    def __name__(self):
        return f"jvp({self.rule.__name__})"

    def __repr__(self):
        return self.__name__

    def __call__(self, axis_size, batched, vals):
        n = len(self.nonzero)
        primals, p_batched = list(vals[:n]), list(batched[:n])
        tangents = [None] * n
        rest = iter(zip(vals[n:], batched[n:]))
        for i, nz in enumerate(self.nonzero):
            if not nz:
                continue
            t, t_batched = next(rest)
            if t_batched and not p_batched[i]:
                primals[i], p_batched[i] = bdim_at_front(primals[i], not_mapped, axis_size), True
            elif p_batched[i] and not t_batched:
                t = bdim_at_front(t, not_mapped, axis_size)
            tangents[i] = t
        with core.new_main(JVPTrace, name=f"jvp({self.name})") as main:
            ins = [p if t is None else JVPTracer(main, p, t) for p, t in zip(primals, tangents)]
            outs, out_batched = self.rule(axis_size, p_batched, ins)
        # every floating-point output gets a tangent (the program's instantiate)
        outs = [JVPTracer(main, o, zeros_like(o)) if core.is_float(o) and not main.owns(o) else o for o in outs]
        outs = [JVPTracer(main, o.primal, zeros_like(o.primal)) if main.owns(o) and o.tangent is None else o
                for o in outs]
        out_p, out_t, has_t = split_nonzero(main, outs)
        return out_p + out_t, list(out_batched) + [b for b, t in zip(out_batched, has_t) if t]


# ---------------------------------------------------------------------------------------
# The user's view
# ---------------------------------------------------------------------------------------


_STAGER = staging.Stager(
    why="custom_vmap stages its function to know the shapes of its outputs (as JAX traces it), so the values "
        "of its arguments are not known while it runs",
    hint="use cuvmap.numpy.where to choose per element, or lax.cond")


class custom_vmap:  # noqa: N801 - JAX's name
    """A function with a custom batching rule (``jax.custom_batching.custom_vmap``).

    ``f.def_vmap(rule)`` sets the rule ``rule(axis_size, in_batched, *args) -> (out,
    out_batched)``: ``in_batched`` has one pytree of bools per argument (of its
    structure), a batched argument has its batch dim at axis 0, and ``out_batched`` says
    which outputs (a pytree of bools of the output's structure, or a prefix of it: one
    ``True`` for all) carry the batch at axis 0. Outside ``vmap`` the function's body runs.
    It composes with ``jit``, nested ``vmap`` (the innermost vmap calls the rule; outer ones
    batch what the rule does) and forward mode (``jvp``/``jacfwd``, through the rule's
    JVP); reverse mode raises, as in JAX: put ``@cv.custom_vjp`` above it for ``grad``.

    Example::

        @cv.custom_batching.custom_vmap
        def solve(a, b):                   # one system
            return cnp.linalg.solve(a, b)

        @solve.def_vmap
        def solve_batched(axis_size, in_batched, a, b):
            a_batched, b_batched = in_batched
            ...                            # one batched solve
            return x, True
    """

    def __init__(self, fun):
        if not callable(fun):
            raise TypeError(f"custom_vmap: the function must be callable, got {fun!r}")
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.kind = "custom_vmap"
        self.vmap_rule = None

    def def_vmap(self, vmap_rule):
        """Sets the batching rule; returns it (usable as a decorator)."""
        if not callable(vmap_rule):
            raise TypeError(f"custom_vmap {self.__name__}.def_vmap: the rule must be callable, got {vmap_rule!r}")
        self.vmap_rule = vmap_rule
        return vmap_rule

    def __getattr__(self, name):
        return forward_def(self, name)

    def __call__(self, *args, **kwargs):
        args = tuple(resolve_args(self, args, kwargs))
        if self.vmap_rule is None:
            raise MissingVmapRuleError(f"No batching rule defined for custom_vmap function {self.__name__} using "
                                       "def_vmap.")
        if not core.trace_stack():
            return self.fun(*args)  # no transform active: the body, as it is
        name = api_util.fun_name(self.fun)
        where = f"custom_vmap({name})"
        paths, leaves, in_tree = tree.flatten_with_path(args)
        avals = [api_util.leaf_aval(self.fun, (0,) + tuple(p), x, where) for p, x in zip(paths, leaves)]
        out_tree_box = []

        def flat_fun(*flat):
            out = self.fun(*tree.unflatten(in_tree, list(flat)))
            out_paths, out_leaves, out_tree = tree.flatten_with_path(out)
            for path, leaf in zip(out_paths, out_leaves):
                if not core.is_value(leaf):
                    raise CustomVmapError(f"custom_vmap function {name} returned a {type(leaf).__name__} as "
                                          f"{api_util.describe_out(path)}; outputs are arrays, Python numbers or "
                                          "pytrees of them")
            out_tree_box.append(out_tree)
            return out_leaves

        origins = [api_util.describe_arg(self.fun, (0,) + tuple(p)) for p in paths]
        closed = staging.trace_to_jaxpr(flat_fun, avals, name=where, origins=origins, stager=_STAGER)
        program, consts = ir.hoist_consts(ir.optimize(closed))
        rule = _UserRule(self, in_tree, len(consts), out_tree_box[0], program.out_avals)
        outs = custom_vmap_call_p.bind(*consts, *leaves, program=program, rule=rule, num_consts=len(consts))
        return tree.unflatten(out_tree_box[0], outs)


def sequential_vmap(f):
    """A custom_vmap function whose rule calls ``f`` once per example, in order, and
    stacks the results (``jax.custom_batching.sequential_vmap``): for functions that
    cannot take a batch (a host callback, a debugging aid). A Python loop over the batch."""
    cf = custom_vmap(f)

    @cf.def_vmap
    def rule(axis_size, in_batched, *args):
        flags = tree.leaves(in_batched)
        leaves, in_tree = tree.flatten(args)
        if axis_size == 0:  # no example to run: zeros of the shapes f would return
            example = [core.ShapeDtypeStruct(core.shape_of(x)[1:] if b else core.shape_of(x), core.dtype_of(x))
                       for x, b in zip(leaves, flags)]
            shapes = eval_shape(f, *tree.unflatten(in_tree, example))
            witness = next(x for x, b in zip(leaves, flags) if b)
            return tree.map_preserving(lambda s: lax.broadcast_in_dim(core.full_like_concrete(witness, 0, (), s.dtype),
                                                           (0,) + s.shape, ()), shapes), True
        per_example, out_tree = [], None
        for i in range(axis_size):
            example = [lax.squeeze(lax.slice_in_dim(x, i, i + 1, axis=0), (0,)) if b else x for x, b in zip(leaves, flags)]
            outs, out_tree = tree.flatten(f(*tree.unflatten(in_tree, example)))
            per_example.append(outs)
        stacked = [lax.concatenate([lax.expand_dims(r[j], (0,)) for r in per_example], 0)
                   for j in range(len(per_example[0]))]
        return tree.unflatten(out_tree, stacked), True

    return cf
