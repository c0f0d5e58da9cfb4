"""``linear_transpose``: the transpose of a linear function (``jax.linear_transpose``).

For a linear ``f: X → Y``, ``linear_transpose(f, *primals)`` returns ``f_T: Y → X`` with
``⟨f_T(ct), x⟩ = ⟨ct, f(x)⟩`` for every ``x``: the transposed matrix, for ``f(x) = A @ x``
(``f_T(ct) = Aᵀ @ ct``). The primals give only the shapes and dtypes of the arguments.
A linear function's transpose is its VJP at any point, so ``f_T`` is the VJP at zeros;
what makes the name safe is the check that ``f`` is linear (NOTE [checking linearity]):
the VJP of a non-linear ``f`` at zeros would be a silent wrong answer.
"""
import numpy as np

from cuvmap import api, api_util, core, tree
from cuvmap.jit_api import make_jaxpr
from cuvmap.transforms.ir import ClosedJaxpr, Literal, eval_jaxpr

# NOTE [checking linearity]
# ``f`` is staged (make_jaxpr, on the primals' shapes and dtypes) and the program is read
# forward, marking the variables that depend on the arguments. An equation that reads a
# dependent variable must be linear in it, by the primitive's kind:
#   - structural and summing maps of one dependent operand (reshape, transpose,
#     broadcast_in_dim, slice, pad with value 0, reduce_sum, cumsum, gather, conj, real,
#     float conversions, the collectives, ...), with any other operands (indices) not dependent;
#   - sums (add, sub, concatenate, complex, scatter_add): every operand dependent or a zero
#     constant (``x + 1`` is affine, not linear);
#   - products (mul, dot_general, conv): exactly one dependent operand; div: the
#     numerator only;
#   - selections (select, select_n): the predicate not dependent, each case dependent or a
#     zero constant (``where(mask, x, 0)``);
#   - a call whose program maps its inputs one to one (checkpoint, jit's call): its program, read the same way.
# Every other primitive applied to a dependent value (sin, exp, x * x, a custom_jvp
# function, control flow) raises a TypeError naming it, and so does an output that is a
# non-zero constant. The check is syntactic, as JAX's (which fails in partial evaluation
# or transposition): it may refuse a function that is linear by accident of its values,
# never accept one that is not.
_UNARY_LINEAR = {
    "neg", "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice", "slice_transpose",
    "reduce_sum", "cumsum", "conj", "real", "imag", "take", "take_transpose", "gather", "optimization_barrier",
    "name", "copy",
}
_COLLECTIVES = {"psum", "all_gather", "ppermute", "psum_scatter", "all_to_all"}  # each operand mapped linearly
_SUMS = {"add", "add_any", "sub", "concatenate", "complex", "scatter_add"}
_PRODUCTS = {"mul", "dot_general", "conv", "conv_backward_input", "conv_backward_weight"}
_SELECTIONS = {"select", "select_n"}


def _not_linear(where, eqn, why):
    raise TypeError(f"{where}: the function is not linear in its arguments: {why} "
                    f"({eqn.primitive.name} is applied to a value that depends on them); linear_transpose "
                    "transposes linear functions only (use vjp for the derivative of a non-linear function)")


def _check_program(jaxpr, consts, dependent_in, where):
    """The dependence of ``jaxpr``'s outputs on its inputs (``dependent_in``: one bool per
    constvar then invar); raises for an equation that is not linear (NOTE [checking
    linearity])."""
    values = dict(zip(jaxpr.constvars, consts))
    dependent = {v for v, d in zip(list(jaxpr.constvars) + list(jaxpr.invars), dependent_in) if d}

    def dep(x):
        return not isinstance(x, Literal) and x in dependent

    def is_zero(x):
        value = x.val if isinstance(x, Literal) else values.get(x)
        return value is not None and not isinstance(value, core.Tracer) and not np.any(np.asarray(value) != 0)

    live = {x for x in jaxpr.outvars if not isinstance(x, Literal)}
    for eqn in reversed(jaxpr.eqns):  # only the equations the outputs need (x > 0 unused is no harm)
        if any(o in live for o in eqn.outs):
            live.update(x for x in eqn.inputs if not isinstance(x, Literal))
    for eqn in jaxpr.eqns:
        flags = [dep(x) for x in eqn.inputs]
        if not any(flags) or not any(o in live for o in eqn.outs):
            continue
        name = eqn.primitive.name
        if name in _COLLECTIVES:
            pass
        elif name in _UNARY_LINEAR or (name == "integer_pow" and eqn.params.get("y") == 1):
            if not flags[0] or any(flags[1:]):
                _not_linear(where, eqn, "an index or second operand depends on the arguments")
        elif name == "pad":
            if eqn.params.get("value", 0) != 0:
                _not_linear(where, eqn, f"padding with {eqn.params['value']!r} (not 0) is affine")
        elif name == "convert_element_type":
            if not np.issubdtype(eqn.params["new_dtype"], np.inexact):
                _not_linear(where, eqn, "a conversion to an integer or bool dtype")
        elif name in _SUMS:
            operands = eqn.inputs
            if name == "scatter_add":  # (operand, indices, updates)
                if flags[1]:
                    _not_linear(where, eqn, "scatter indices depend on the arguments")
                operands = [eqn.inputs[0], eqn.inputs[2]]
            for x in operands:
                if not dep(x) and not is_zero(x):
                    _not_linear(where, eqn, "a sum of the arguments and a non-zero constant is affine")
        elif name in _PRODUCTS:
            if sum(flags) != 1:
                _not_linear(where, eqn, "a product of two values that depend on the arguments")
        elif name == "div":
            if flags[1]:
                _not_linear(where, eqn, "a division by a value that depends on the arguments")
        elif name in _SELECTIONS:
            if flags[0]:
                _not_linear(where, eqn, "a selection whose predicate depends on the arguments")
            for x in eqn.inputs[1:]:
                if not dep(x) and not is_zero(x):
                    _not_linear(where, eqn, "a selection between the arguments and a non-zero constant")
        else:
            programs = [v for v in eqn.params.values() if isinstance(v, ClosedJaxpr)]
            inner = programs[0] if len(programs) == 1 else None
            if inner is None or len(eqn.inputs) != len(inner.jaxpr.constvars) + len(inner.jaxpr.invars) \
                    or len(eqn.outs) != len(inner.jaxpr.outvars):
                _not_linear(where, eqn, f"{name} is not a linear primitive")
            inner_consts = [values.get(x, x.val if isinstance(x, Literal) else None) for x in eqn.inputs]
            inner_out = _check_program(inner.jaxpr, inner_consts[:len(inner.jaxpr.constvars)] or inner.consts,
                                       flags, where)
            dependent.update(o for o, d in zip(eqn.outs, inner_out) if d)
            continue
        dependent.update(eqn.outs)
    return [dep(x) for x in jaxpr.outvars]


def linear_transpose(fun, *primals, reduce_axes=()):
    """The transpose of the linear function ``fun`` (JAX's ``jax.linear_transpose``).

    Args:
      fun: a function linear in its arguments (pytrees of floating or complex arrays).
      primals: arrays, Python numbers or :class:`~cuvmap.ShapeDtypeStruct` giving the
        shapes and dtypes of ``fun``'s arguments (their values are not used).
      reduce_axes: accepted for JAX's signature; must be empty.
    Returns:
      ``fun_T(ct)``: for a cotangent of ``fun``'s output structure, shapes and dtypes, the
      tuple of one cotangent per argument, ``fun_T(ct) = (Aᵀ ct,)`` for ``fun(x) = A x``.
    Raises:
      TypeError: when ``fun`` is not linear (NOTE [checking linearity]) or an argument is
        not floating or complex.

    Example::

        A = np.arange(6.).reshape(2, 3)
        f_T = cuvmap.linear_transpose(lambda x: A @ x, np.zeros(3))
        f_T(np.ones(2))      # (A.T @ np.ones(2),)
    """
    api_util.check_callable(fun, "linear_transpose")
    where = f"linear_transpose({api_util.fun_name(fun)})"
    if reduce_axes:
        raise NotImplementedError(f"{where}: reduce_axes is not supported (JAX deprecated it)")

    def zeros(leaf):
        shape, dtype = (leaf.shape, leaf.dtype) if hasattr(leaf, "shape") and hasattr(leaf, "dtype") \
            else (np.shape(leaf), core.dtype_of(leaf))
        if not np.issubdtype(dtype, np.inexact):
            raise TypeError(f"{where}: linear_transpose only supports float or complex arguments (JAX also "
                            f"transposes integer -> integer functions; cuvmap does not), got {np.dtype(dtype)}")
        return np.zeros(shape, dtype)

    points = tree.map(zeros, primals, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
    closed, out_shapes = make_jaxpr(fun, return_shape=True)(*points)
    for aval in closed.out_avals:
        if not np.issubdtype(aval.dtype, np.inexact):
            raise TypeError(f"{where}: linear_transpose only supports float or complex outputs, got {aval.dtype}")
    flags = [False] * len(closed.jaxpr.constvars) + [True] * len(closed.jaxpr.invars)
    out_dependent = _check_program(closed.jaxpr, closed.consts, flags, where)
    if not all(out_dependent):  # a constant output must be zero (else the function is affine)
        outs = eval_jaxpr(closed.jaxpr, closed.consts, [np.zeros(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars])
        if any(not d and np.any(np.asarray(o) != 0) for d, o in zip(out_dependent, outs)):
            raise TypeError(f"{where}: the function is not linear in its arguments: an output does not depend on "
                            "them and is not zero (an affine function)")
    _, vjp_fun = api.vjp(fun, *points)
    out_leaves, out_tree = tree.flatten(out_shapes)

    def transposed(out_cotangent):
        ct_leaves, ct_tree = tree.flatten(out_cotangent)
        if ct_tree != out_tree:
            raise TypeError(f"{where}: cotangent tree does not match function output, expected {out_tree} but got "
                            f"{ct_tree}")
        for ct, out in zip(ct_leaves, out_leaves):
            if np.shape(ct) != tuple(out.shape) or not _same_kind(ct, out.dtype):
                raise TypeError(f"{where}: cotangent type does not match function output, expected "
                                f"{np.dtype(out.dtype)}{list(out.shape)} but got {core.dtype_of(ct)}{list(np.shape(ct))}")
        return vjp_fun(out_cotangent)

    return transposed



def _same_kind(ct, dtype):
    """A cotangent's dtype matches the output's: the same dtype, or for a Python number the
    same kind (a float for a real output, a complex for a complex one)."""
    if isinstance(ct, (bool, int, float, complex)):
        return (isinstance(ct, complex)) == np.issubdtype(dtype, np.complexfloating)
    return core.dtype_of(ct) == np.dtype(dtype)
