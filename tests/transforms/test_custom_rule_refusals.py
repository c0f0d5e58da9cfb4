"""JAX's refusals of misused custom_jvp / custom_vjp functions (issue 32 item 7).

Each row is one misuse: the exception classes JAX raises there (cuvmap's error subclasses
them: ``TypeError``, ``ValueError``, ``AttributeError``, ``UnexpectedTracerError``) and the
key phrase of JAX's message, which cuvmap's message carries together with its own context
(the transform, the function, the argument, the types). A misuse that JAX computes through
is a row of ``COMPUTES``, checked against its closed form.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import CustomDerivativeError, EscapedTracerError
from cuvmap.custom_batching import custom_vmap
from cuvmap.custom_derivatives import SymbolicZero

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from name_rows import assert_refusal  # noqa: E402


def _square_with(rule):
    @cv.custom_jvp
    def f(x):
        return x ** 2

    f.defjvp(rule)
    return f


def foo_jvp_tangent_only(primals, tangents):
    return tangents[0]


def foo_jvp_list_tangent(primals, tangents):
    (x,), (t,) = primals, tangents
    return (x ** 2,), [2 * x * t, x]


def _tuple_out():
    @cv.custom_jvp
    def f(x):
        return (x ** 2,)

    f.defjvp(foo_jvp_list_tangent)
    return f


def f_jvp_pair_primal(primals, tangents):
    (x,), (t,) = primals, tangents
    return (x, x), (t, t)


def f_jvp_long_primal(primals, tangents):
    (x,), (t,) = primals, tangents
    return cnp.zeros((3,) + cnp.shape(x)), cnp.zeros((3,) + cnp.shape(x))


def _identity_with_jvp(rule):
    @cv.custom_jvp
    def f(x):
        return x

    f.defjvp(rule)
    return f


def short_tangent_jvp(primals, tangents):
    return primals[0] * 2.0, tangents[0][:2]


def f64_tangent_jvp(primals, tangents):
    return primals[0] * 2.0, np.ones(np.shape(primals[0]), np.float64)


def _doubling_with(rule):
    @cv.custom_jvp
    def f(x):
        return x * 2.0

    f.defjvp(rule)
    return f


def _kw_fun(kind):
    decorator = cv.custom_jvp if kind == "jvp" else cv.custom_vjp

    @decorator
    def f(x, y, *, z=None):
        return cnp.sin(x) + y

    if kind == "jvp":
        f.defjvp(lambda p, t: (f(*p), t[0] * cnp.cos(p[0]) + t[1]))
    else:
        f.defvjp(lambda x, y: (f(x, y), x), lambda x, ct: (ct * cnp.cos(x), ct))
    return f


def _vjp_fun(fwd, bwd, n=1, symbolic_zeros=False):
    if n == 1:
        @cv.custom_vjp
        def f(x):
            return x
    else:
        @cv.custom_vjp
        def f(x, y):
            return x

    f.defvjp(fwd, bwd, symbolic_zeros=symbolic_zeros)
    return f


def f_fwd_pair_out(x):
    return (x, x), None


def f_fwd_not_pair(x):
    return x


def f_bwd_not_tuple(_, g):
    return 2.0 * g


def f_bwd_two(_, g):
    return (g, g)


def foo_bwd_short(_, g):
    return cnp.zeros(3), cnp.zeros(3)


def _swapped_symbolic_zeros():
    @cv.custom_vjp
    def f(x, y, z):
        return x, y, z

    def fwd(x, y, z):
        return f(x.value, y.value, z.value), None

    def bwd(_, gs):
        x_bar, y_bar, z_bar = gs
        return y_bar, x_bar, z_bar  # swapped: symbolic zeros of the wrong shapes

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f


def _nondiff_vjp():
    f = cv.custom_vjp(lambda x, y: x * y, nondiff_argnums=(0,))
    f.defvjp(lambda x, y: (x * y, None), lambda x, _, g: (x * g,))
    return f


def _no_jvp():
    @cv.custom_jvp
    def foo(x):
        return x ** 2
    return foo


def _no_vjp():
    @cv.custom_vjp
    def foo(x):
        return x ** 2
    return foo


def _sin_vmap(rule=None):
    @custom_vmap
    def f(x):
        return cnp.sin(x)

    if rule is not None:
        f.def_vmap(rule)
    return f


def rule_abc(axis_size, in_batched, xs):
    return [cnp.sin(xs), cnp.cos(xs)], in_batched


def rule_abc2(axis_size, in_batched, xs):
    return [cnp.sin(xs)], in_batched


def sin_rule(axis_size, in_batched, xs):
    return cnp.sin(xs), in_batched[0]


def _closes_over(x):
    @cv.custom_jvp
    def g(y):
        return x + y

    g.defjvp(lambda p, t: (g(p[0]), 2 * p[0]))
    return g(1.0)


def _nondiff_hides(x):
    g = cv.custom_jvp(lambda h, y: h(y), nondiff_argnums=(0,))
    g.defjvp(lambda h, p, t: (g(h, p[0]), 2.0 * t[0]))
    return g(lambda y: x + y, x)


X3 = np.arange(1.0, 4.0)
JVP_PAIR = "Custom JVP rule foo_jvp_tangent_only for function f must produce a pair (list or tuple of length two) " \
           "representing primal and tangent outputs, but got 1.0"
TANGENT_TYPES = "Custom JVP rule must produce primal and tangent outputs with corresponding shapes and dtypes. "

# name: (thunk, exception classes, a phrase of the message (literal))
REFUSALS = {
    "jvp rule returns no pair": (lambda: cv.jvp(_square_with(foo_jvp_tangent_only), (2.0,), (1.0,)),
                                 (TypeError, CustomDerivativeError), JVP_PAIR),
    "jvp rule's tangent structure differs": (
        lambda: cv.jvp(_tuple_out(), (2.0,), (1.0,)), (TypeError,),
        "Custom JVP rule foo_jvp_list_tangent for function f must produce primal and tangent outputs with equal "
        "container (pytree) structures, but got PyTreeSpec((*,)) and PyTreeSpec([*, *]) respectively."),
    "jvp rule's primal structure differs from f's": (
        lambda: cv.jvp(cv.jit(_identity_with_jvp(f_jvp_pair_primal)), (np.float32(1.0),), (np.float32(1.0),)),
        (TypeError,),
        "Custom JVP rule f_jvp_pair_primal for function f must produce a pair (list or tuple of length two) where "
        "the first element represents the primal output (equal in value to the output of the custom_jvp-decorated "
        "function f, and in particular of the same container/pytree structure), but instead the JVP rule output's "
        "first element had container/pytree structure:\n    (float32[], float32[])\nwhile the custom_jvp-decorated "
        "function f had output container/pytree structure:\n    float32[]."),
    "jvp rule's primal shape differs from f's": (
        lambda: cv.jvp(cv.jit(_identity_with_jvp(f_jvp_long_primal)), (X3,), (X3,)), (TypeError,),
        "first element had shapes/dtypes of:\n    float64[3,3]\nwhile the custom_jvp-decorated function f had output "
        "shapes/dtypes of:\n    float64[3]"),
    "jvp rule's tangent shape, under jvp": (
        lambda: cv.jvp(_doubling_with(short_tangent_jvp), (X3,), (X3,)), (TypeError,),
        TANGENT_TYPES + "Expected float64[3] (tangent type of float64[3]) but got float64[2]."),
    "jvp rule's tangent shape, under grad": (
        lambda: cv.grad(lambda x: _doubling_with(short_tangent_jvp)(x).sum())(X3), (TypeError,),
        TANGENT_TYPES + "Expected float64[3] (tangent type of float64[3]) but got float64[2]."),
    "jvp rule's tangent dtype": (
        lambda: cv.jvp(_doubling_with(f64_tangent_jvp), (X3.astype(np.float32),), (X3.astype(np.float32),)),
        (TypeError,), TANGENT_TYPES + "Expected float32[3] (tangent type of float32[3]) but got float64[3]."),
    "custom_jvp called without a rule": (lambda: _no_jvp()(2.0), (AttributeError, CustomDerivativeError),
                                         "No JVP defined for custom_jvp function foo using defjvp."),
    "custom_jvp differentiated without a rule": (lambda: cv.grad(_no_jvp())(2.0), (AttributeError,),
                                                 "No JVP defined for custom_jvp function foo using defjvp."),
    "custom_vjp called without rules": (lambda: _no_vjp()(2.0), (AttributeError,),
                                        "No VJP defined for custom_vjp function foo using defvjp."),
    "custom_jvp missing an argument": (
        lambda: _kw_fun("jvp")(0.5), (TypeError,),
        "The input arguments to the custom_jvp-decorated function f could not be resolved to positional-only "
        "arguments (the rules take positional arguments). Binding failed with the error:\n"
        "missing a required argument: 'y'"),
    "custom_vjp given a keyword-only argument": (
        lambda: _kw_fun("vjp")(0.5, 0.1, z=1.0), (TypeError,),
        "The following keyword arguments could not be resolved to positions: z"),
    "fwd returns no pair": (
        lambda: cv.grad(_vjp_fun(f_fwd_not_pair, f_bwd_two))(1.0), (TypeError,),
        "Custom VJP fwd rule f_fwd_not_pair for function f must produce a pair (list or tuple of length two)"),
    "fwd's primal structure differs from f's": (
        lambda: cv.grad(lambda x: cv.jit(_vjp_fun(f_fwd_pair_out, f_bwd_two))(x))(np.float32(1.0)), (TypeError,),
        "instead the fwd rule output's first element had container/pytree structure:\n    (float32[], float32[])"),
    "bwd returns no tuple": (lambda: cv.grad(_vjp_fun(lambda x: (x, None), f_bwd_not_tuple))(3.0), (TypeError,),
                             "Custom VJP bwd rule f_bwd_not_tuple for function f must produce a tuple"),
    "bwd returns too many cotangents": (
        lambda: cv.grad(_vjp_fun(lambda x: (x, None), f_bwd_two))(3.0), (TypeError,),
        "Custom VJP bwd rule f_bwd_two for function f must produce a tuple of length equal to the number of "
        "differentiable arguments of the primal function, 1 (argument 0 (x)), but got length 2"),
    "bwd returns a cotangent of the wrong structure": (
        lambda: cv.grad(lambda p: _vjp_fun(lambda p: (p, None), lambda _, g: ({"a": g["a"]},))(p)["a"])(
            {"a": 1.0, "b": 2.0}),
        (TypeError,), "must produce an output with the same container (pytree) structure as the args tuple"),
    "bwd returns a cotangent of the wrong shape": (
        lambda: cv.grad(lambda x, y: _vjp_fun(lambda x, y: (x, None), foo_bwd_short, n=2)(x, y * y).sum(),
                        argnums=1)(np.ones(3), np.ones(4)),
        (ValueError, CustomDerivativeError),
        "at output[1] the bwd rule attached to f (foo_bwd_short) produced an output of type float64[3] which "
        "doesn't match expected type float64[4], the type of argument 1 (y)"),
    "bwd returns a symbolic zero of the wrong shape": (
        lambda: cv.grad(lambda x, y, z: _swapped_symbolic_zeros()(x, y, z)[2].sum())(
            np.ones(1), np.ones(2), np.ones(3)),
        (ValueError,), "Consider just returning a None here instead of a SymbolicZero object."),
    "a traced value among a custom_vjp's nondiff_argnums": (
        lambda: cv.jit(lambda x, y: _nondiff_vjp()(x, y))(2.0, 3.0), (EscapedTracerError, TypeError),
        "custom_vjp function <lambda>: argument 0 (x) is in nondiff_argnums but is a traced value"),
    "a custom_jvp body closing over jvp's value": (lambda: cv.jvp(_closes_over, (3.0,), (1.0,)),
                                                   (EscapedTracerError, TypeError), "can't close over Tracers"),
    "a custom_jvp body closing over grad's value": (lambda: cv.grad(_closes_over)(3.0), (EscapedTracerError,),
                                                    "custom_jvp_call: the function g closes over a traced value"),
    "a nondiff function closing over jvp's value": (lambda: cv.jvp(_nondiff_hides, (2.0,), (1.0,)),
                                                    (EscapedTracerError,), "can't close over Tracers"),
    "custom_vmap called without a rule": (lambda: _sin_vmap()(0.5), (AttributeError, TypeError),
                                          "No batching rule defined for custom_vmap function f using def_vmap."),
    "custom_vmap rule's out_batched does not match its output": (
        lambda: cv.vmap(_sin_vmap(rule_abc))(X3), (ValueError,),
        "structure of output value and output batching specification returned by custom vmap rule (rule_abc) do "
        "not match"),
    "custom_vmap rule's output does not match the function's": (
        lambda: cv.vmap(_sin_vmap(rule_abc2))(X3), (ValueError,),
        "structure of output returned by custom vmap rule (rule_abc2) does not match that of original "
        "custom-vmapped function.\nOriginal output: PyTreeSpec(*)\nRule output: PyTreeSpec([*])"),
    "reverse mode of a custom_vmap function": (
        lambda: cv.grad(_sin_vmap(sin_rule))(0.5), (ValueError, TypeError),
        "Linearization failed to produce known values for all output primals"),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_refusals(name):
    assert_refusal(name, *REFUSALS[name])


def test_symbolic_zero_of_the_right_shape_is_accepted():
    f = _vjp_fun(lambda x, y: (x.value, None), lambda _, g: (g, SymbolicZero.from_primal_value(np.ones(2))), n=2,
                 symbolic_zeros=True)
    np.testing.assert_allclose(cv.grad(lambda x, y: f(x, y).sum())(np.ones(3), np.ones(2)), np.ones(3))
