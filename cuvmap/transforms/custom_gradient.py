"""``custom_gradient`` and ``closure_convert`` (JAX's names and semantics), built on
:class:`~cuvmap.transforms.custom_derivatives.custom_vjp` and on staging.

- ``custom_gradient(f)``: ``f(*args)`` returns ``(out, vjp)`` with ``vjp(ct)`` the
  cotangents of the arguments (TensorFlow's ``tf.custom_gradient`` style); the result is a
  ``custom_vjp`` function whose ``fwd`` runs ``f`` and keeps ``vjp`` as a staged program
  with its closed-over values as residuals (NOTE [a vjp closure as residuals]).
- ``closure_convert(f, *example_args)``: ``(converted, consts)`` with
  ``converted(*args, *consts) == f(*args)``: the traced values ``f`` closes over become
  explicit arguments, so that ``f`` can be passed to a ``custom_vjp`` function among its
  ``nondiff_argnums`` and the consts among its differentiable arguments.
"""
import functools

from cuvmap import api_util, core, tree
from cuvmap.core import Tracer
from cuvmap.transforms import ir
from cuvmap.transforms.custom_derivatives import CustomDerivativeError, custom_vjp
from cuvmap.transforms.staging import trace_to_jaxpr
from cuvmap.transforms.symbolic_zeros import tangent_aval


# NOTE [a vjp closure as residuals]
# ``custom_gradient``'s ``f`` returns its backward rule as a Python closure over values of
# the forward pass. Residuals must be values that every transform can carry (``vmap``
# batches them, ``jit`` stages them), and a closure over the tracers of a batch trace that
# has returned cannot run later. So ``fwd`` stages the closure, at the output cotangents'
# avals, into a program (as ``jit`` would) whose constants are exactly the values it closes
# over; those constants are the residuals, and ``bwd`` runs the program on them and on
# the cotangents (JAX does the same).
class _StagedRule:
    """Residuals of a ``custom_gradient`` call: the staged vjp closure (aux data) and the
    values it closes over (the children, which the transforms carry)."""

    __slots__ = ("program", "consts", "out_tree")

    def __init__(self, program, consts, out_tree):
        self.program = program
        self.consts = consts
        self.out_tree = out_tree


tree.register_pytree_node(
    _StagedRule, lambda r: (r.consts, (r.program, r.out_tree)),
    lambda aux, consts: _StagedRule(aux[0], list(consts), aux[1]))


def custom_gradient(fun):
    """``fun`` with the gradient it states (``jax.custom_gradient``).

    ``fun(*args) -> (out, vjp)``, where ``vjp(ct)`` returns the cotangents of the
    arguments ``ctᵀ·∂out/∂args``: a tuple with one per argument, or a single value for a
    function of one argument. Reverse mode (``grad``, ``vjp``) uses ``vjp``; ``vmap``
    and ``jit`` compose; forward mode raises, as for any ``custom_vjp`` function.

    Example::

        @cv.custom_gradient
        def clipped_sin(x):
            return cnp.sin(x), lambda g: cnp.clip(g * cnp.cos(x), -0.5, 0.5)
    """
    api_util.check_callable(fun, "custom_gradient")
    name = api_util.fun_name(fun)

    @functools.wraps(fun)
    def primal(*args):
        out, _ = _split(fun(*args), name)
        return out

    def fwd(*args):
        out, rule = _split(fun(*args), name)
        out_leaves, out_tree = tree.flatten(out)
        holder = {}

        def flat_rule(*ct_leaves):
            cts = rule(tree.unflatten(out_tree, list(ct_leaves)))
            if not isinstance(cts, tuple):
                cts = (cts,)
            leaves, holder["tree"] = tree.flatten(cts)
            return leaves

        program = trace_to_jaxpr(flat_rule, [tangent_aval(o) for o in out_leaves], name=f"custom_gradient({name})")
        staged, consts = ir.hoist_consts(program)
        return out, _StagedRule(staged, consts, holder["tree"])

    def bwd(res, ct):
        ct_leaves = tree.leaves(ct)
        in_cts = ir.eval_jaxpr(res.program.jaxpr, [], list(res.consts) + ct_leaves)
        return tree.unflatten(res.out_tree, list(in_cts))

    wrapped = custom_vjp(primal)
    wrapped.defvjp(fwd, bwd)
    return wrapped


def _split(result, name):
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and callable(result[1])):
        raise CustomDerivativeError(f"custom_gradient function {name}: it must return a pair (output, vjp) with "
                                    f"vjp a function of the output cotangent, got {tree.describe(result)}")
    return result


def closure_convert(fun, *example_args):
    """``(converted, consts)``: ``converted(*args, *consts)`` computes ``fun(*args)``
    with the traced values ``fun`` closes over (values of transforms around the call,
    which may carry derivatives) taken as the trailing arguments ``consts``
    (``jax.closure_convert``). ``fun`` is staged for arguments with the shapes and
    dtypes of ``example_args``; concrete values it closes over stay closed over.

    Example::

        converted, consts = cv.closure_convert(lambda x: x * w, x0)   # w traced
        converted(x0, *consts)                                        # == x0 * w
    """
    api_util.check_callable(fun, "closure_convert")
    name = api_util.fun_name(fun)
    leaves, in_tree = tree.flatten(example_args)
    holder = {}

    def flat(*arg_leaves):
        out = fun(*tree.unflatten(in_tree, list(arg_leaves)))
        out_leaves, holder["tree"] = tree.flatten(out)
        return out_leaves

    closed = trace_to_jaxpr(flat, [core.get_aval(x) for x in leaves], name=f"closure_convert({name})")
    out_tree = holder["tree"]
    consts = closed.consts
    hoisted = [isinstance(c, Tracer) for c in consts]
    const_args = [c for c, h in zip(consts, hoisted) if h]
    num_consts = len(const_args)

    def converted(*args_and_consts):
        num_args = len(args_and_consts) - num_consts
        args, given = args_and_consts[:num_args], iter(args_and_consts[num_args:])
        arg_leaves, tree2 = tree.flatten(tuple(args))
        if tree2 != in_tree:
            raise TypeError(f"closure_convert({name}): The inputs to the closure produced by closure_convert must "
                            f"have the same pytree structure as the example arguments, {in_tree}, followed by "
                            f"{num_consts} const(s); got {tree2}")
        all_consts = [next(given) if h else c for c, h in zip(consts, hoisted)]
        return tree.unflatten(out_tree, list(ir.eval_jaxpr(closed.jaxpr, all_consts, arg_leaves)))

    converted.__name__ = f"closure_convert({name})"
    return converted, const_args
