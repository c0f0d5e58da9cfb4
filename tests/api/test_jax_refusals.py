"""JAX's refusals of misused transforms (issue 32 item 7): each row is a misuse, the
exception classes JAX raises there (cuvmap's error subclasses them) and the key phrase of
JAX's message, which cuvmap's message carries next to its own context (the transform, the
function, the argument, the types)."""
import sys
from pathlib import Path

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from name_rows import assert_refusal  # noqa: E402

X = np.ones((2, 5), np.float32)
Y = np.ones((5, 3), np.float32)


def f(x):
    return x * 2.0


def foo(x):
    return (x, x)


def _pullback(fun, *primals):
    return cv.vjp(fun, *primals)[1]


def _linearized(fun, *primals):
    return cv.linearize(fun, *primals)[1]


def _compiled(*args):
    return cv.jit(lambda x: cnp.sqrt(x ** 2) + 1.0).lower(*args).compile()


# name: (thunk, exception classes, a phrase of the message (literal))
REFUSALS = {
    "grad of a string": (lambda: cv.grad(f)("foo"), (TypeError, cv.TransformError),
                         "argument 0 (x) 'foo' of type <class 'str'> is not a valid JAX type"),
    "grad of an object array": (lambda: cv.grad(f)(np.array([1, 2], dtype=object)), (TypeError,),
                                "with dtype object is not a valid JAX type"),
    "grad of an int": (lambda: cv.grad(lambda x: x ** 2)(3), (TypeError,),
                       "grad requires real- or complex-valued inputs (input dtype that is a sub-dtype of np.inexact), "
                       "but got int64."),
    "jacfwd of a complex": (lambda: cv.jacfwd(lambda x: x ** 2)(3.0 + 1j), (TypeError,),
                            "jacfwd requires real-valued inputs (input dtype that is a sub-dtype of np.floating), "
                            "but got complex128"),
    "jvp with primals not a tuple": (lambda: cv.jvp(lambda x, y: x + y, 0.0, (1.0,)), (TypeError,),
                                     "primal and tangent arguments to jax.jvp must be tuples or lists; found float "
                                     "and tuple."),
    "jvp with tangents of another structure": (lambda: cv.jvp(lambda x, y: x * y, (np.float32(2),), ()), (TypeError,),
                                               "primal and tangent arguments to jax.jvp must have the same tree "
                                               "structure"),
    "jvp with a tuple and a list": (lambda: cv.jvp(f, (np.float32(2),), [np.float32(2)]), (TypeError,),
                                    "must have the same tree structure"),
    "jvp with a tangent of another dtype": (lambda: cv.jvp(f, (np.float16(2),), (np.float32(4),)), (TypeError,),
                                            "primal and tangent arguments to jax.jvp do not match"),
    "jvp with a tangent of another shape": (lambda: cv.jvp(f, (np.ones(3),), (np.ones(4),)), (ValueError,),
                                            "jvp called with different primal and tangent shapes"),
    "vjp function given two cotangents": (lambda: _pullback(foo, 1.0)(1.0, 1.0), (TypeError,),
                                          "The function returned by `jax.vjp` applied to foo was called with 2 "
                                          "arguments"),
    "vjp cotangent of another structure": (lambda: _pullback(lambda x, y: x * y, np.float32(3), np.float32(4))(
        (np.float32(7), np.float32(100))), (ValueError,), "unexpected tree structure"),
    "vjp cotangent of another dtype": (lambda: _pullback(lambda x, y: x * y, np.float32(3), np.float32(4))(
        np.float16(42)), (ValueError,), "cotangent leaf 0 has type float16[], but the output leaf has type float32[] "
                                        "(unexpected JAX type (e.g. shape/dtype) for argument to VJP function)"),
    "vjp cotangent of another shape": (lambda: _pullback(cnp.matmul, X, Y)(np.ones((2, 4), np.float32)), (ValueError,),
                                       "unexpected JAX type"),
    "linearized function given a tangent of another shape": (
        lambda: _linearized(cnp.sum, np.array([1.0, 2.0, 3.0]))(np.ones((3, 2))), (ValueError,),
        "linearized function called on tangent values inconsistent with the original primal values"),
    "linearized function given an int tangent of a float": (
        lambda: _linearized(f, 1.0)(1), (ValueError,), "tangent values inconsistent"),
    "jit of a string": (lambda: cv.jit(f)("foo"), (TypeError, cv.TransformError),
                        "Error interpreting argument to f as an abstract array. The problematic value is of type "
                        "<class 'str'> and was passed to the function at path x."),
    "jit of a masked array": (lambda: cv.jit(f)(np.ma.array([1, 2, 3], mask=[True, False, True])), (ValueError,),
                              "numpy masked arrays are not supported"),
    "compiled with another pytree": (lambda: _compiled(1.0)([1.0]), (TypeError,),
                                     "Function compiled with input pytree does not match the input pytree it was "
                                     "called with"),
    "compiled with another dtype": (lambda: _compiled(np.float32(1))(np.int32(1)), (TypeError,),
                                    "Argument types differ from the types for which this computation was compiled. "
                                    "The mismatches are:\nArgument 'x' compiled with float32[] and called with "
                                    "int32[]"),
    "compiled under vmap": (lambda: cv.vmap(_compiled(1.0))(np.ones(3)), (TypeError,),
                            "Cannot apply JAX transformations to a function lowered and compiled for a particular "
                            "signature. Detected argument of Tracer type"),
    "float() under jit": (lambda: cv.jit(float)(1.0), (TypeError, cv.ConcretizationError),
                          "Abstract tracer value encountered where concrete value is expected: float() of traced "
                          "array with shape float64[]. The problem arose with the `float` function. If trying to "
                          "convert the data type of a value, try using `x.astype(float)`"),
    "int() under jit": (lambda: cv.jit(int)(0), (TypeError,), "try using `x.astype(int)`"),
    "item() under jit": (lambda: cv.jit(lambda x: x.item())(np.array(1.0)), (TypeError,), "Abstract tracer value"),
    "if on a traced bool": (lambda: cv.jit(lambda x: x if x > 0 else -x)(1), (TypeError,),
                            "Attempted boolean conversion of traced array with shape bool[]."),
    "np.exp of a traced value": (lambda: cv.grad(lambda x: np.exp(x).sum())(np.zeros(3)), (TypeError,),
                                 "The numpy.ndarray conversion method __array__() was called on traced array with "
                                 "shape float64[3]"),
    "a jit output that is a class": (lambda: cv.jit(lambda x: (x, cv.custom_jvp))(1.0), (TypeError,),
                                     "returned a value of type <class 'type'> at output component [1], which is "
                                     "not a valid JAX type"),
}


def f3(a, b, c):
    return a


def h(a, /, b, c, *args, **kwargs):
    return a


def gen(x):
    yield x


REFUSALS.update({
    "jit static_argnums out of range": (lambda: cv.jit(f3, static_argnums=(0, 1, 3)), (ValueError,),
                                        "Jitted function has static_argnums=(0, 1, 3), but only accepts 3 "
                                        "positional arguments"),
    "jit donate_argnums out of range": (lambda: cv.jit(f3, donate_argnums=-4), (ValueError,),
                                        "but only accepts 3 positional arguments"),
    "jit static_argnames not a parameter": (lambda: cv.jit(f3, static_argnames=("b", "not_defined")), (ValueError,),
                                            "Jitted function has invalid argnames ['not_defined'] in static_argnames"),
    "jit static_argnames positional-only": (lambda: cv.jit(h, static_argnames=("a", "c")), (ValueError,),
                                            "These are positional-only"),
    "jit static_argnames of *args": (lambda: cv.jit(h, static_argnames="args"), (ValueError,),
                                     "These are positional-only"),
    "jit of a generator function": (lambda: cv.jit(gen), (TypeError,), "Expected a function, got a generator function"),
    "jit of a staticmethod": (lambda: cv.jit(staticmethod(f)), (TypeError,),
                              "staticmethod arguments are not supported"),
})


REFUSALS.update({
    "ShapeDtypeStruct without a dtype": (lambda: cv.ShapeDtypeStruct((), None), (ValueError,), "dtype must be specified"),
    "ShapeDtypeStruct with a None dim": (lambda: cv.ShapeDtypeStruct((None, 2), np.int32), (ValueError,),
                                         "`shape` (None, 2) cannot have None"),
    "len of a scalar ShapeDtypeStruct": (lambda: len(cv.ShapeDtypeStruct((), np.float32)), (TypeError,),
                                         "len() of unsized object"),
    "grad without the argument it differentiates": (lambda: cv.grad(lambda x, y: x + y)(y=1.0), (TypeError,),
                                                     "differentiating with respect to argnums=0 requires at least 1 "
                                                     "positional arguments to be passed by the caller, but got only 0 "
                                                     "positional arguments."),
    "dot of mismatched vectors": (lambda: cv.grad(lambda x, y: cnp.dot(x, y))(np.zeros(3), np.zeros(4)),
                                  (TypeError, cv.ShapeError),
                                  "dot_general requires contracting dimensions to have the same shape, got (3,) and "
                                  "(4,)."),
})


class _Incomparable:
    def __hash__(self):
        return 1

    def __eq__(self, other):
        raise NotImplementedError("no comparison")


REFUSALS["a static argument that cannot be compared"] = (
    lambda: cv.jit(lambda x, y: x + 3, static_argnums=1)(1, _Incomparable()), (ValueError,),
    "static arguments should be comparable using __eq__")


REFUSALS["tree.map over trees of different structures"] = (
    lambda: cv.tree.map(lambda x, y: (x, y), {"a": 1, "c": [1, 2]}, {"a": 1, "c": None}, is_leaf=lambda x: x is None),
    (ValueError,), "pytree structure error")


def test_shape_dtype_struct_len():
    s = cv.ShapeDtypeStruct((4, 2, 3), np.float32)
    assert len(s) == 4 and s and cv.ShapeDtypeStruct((0,), np.float32)


def _escape():
    saved = []
    cv.jit(lambda x: saved.append(x) or x)(np.ones((4, 3), np.int32))
    return saved[0] + 1


REFUSALS["an escaped tracer"] = (_escape, (cv.EscapedTracerError,),
                                 "an intermediate value with type int32[4,3] escaped the scope of its transformation")


@pytest.mark.parametrize("name", REFUSALS)
def test_refusals(name):
    assert_refusal(name, *REFUSALS[name])
