"""JAX's API for making a primitive (``Primitive(name)``, ``def_impl``,
``def_abstract_eval``, ``def_effectful_abstract_eval``, ``multiple_results``): it binds
eagerly, stages under jit as one equation (several results included), and a transform
without a registered rule raises MissingRuleError naming the primitive, never a number."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.core import MissingRuleError, Primitive, ShapedArray


def _double():
    p = Primitive("test_double")
    p.def_impl(lambda x, *, scale=2.0: scale * np.asarray(x))
    p.def_abstract_eval(lambda x, *, scale=2.0: ShapedArray(x.shape, x.dtype))
    return p


def _split():
    p = Primitive("test_split")
    p.multiple_results = True
    p.def_impl(lambda x: [x[:1], x[1:]])
    p.def_abstract_eval(lambda x: [cv.ShapeDtypeStruct((1,), x.dtype), cv.ShapeDtypeStruct((x.shape[0] - 1,), x.dtype)])
    return p


def test_a_primitive_binds_eagerly_and_under_jit():
    p = _double()
    x = np.arange(3.0)
    np.testing.assert_array_equal(p.bind(x), 2 * x)
    np.testing.assert_array_equal(p.bind(x, scale=3.0), 3 * x)
    np.testing.assert_array_equal(cv.jit(lambda x: p.bind(x, scale=0.5) + 1)(x), 0.5 * x + 1)
    text = str(cv.make_jaxpr(lambda x: p.bind(x, scale=3.0))(x))
    assert "= test_double[scale=3.0] a" in text, text


def test_multiple_results_are_one_equation():
    q, x = _split(), np.arange(4.0)
    assert q.multiple_results and not _double().multiple_results
    for run in (q.bind, cv.jit(q.bind)):
        head, tail = run(x)
        np.testing.assert_array_equal(head, x[:1])
        np.testing.assert_array_equal(tail, x[1:])
    jaxpr = cv.make_jaxpr(q.bind)(x).jaxpr
    assert len(jaxpr.eqns) == 1 and len(jaxpr.eqns[0].outs) == 2


def test_effectful_abstract_eval_takes_avals_and_effects():
    p = Primitive("test_effectful")
    p.def_impl(lambda x: np.asarray(x) + 1)
    p.def_effectful_abstract_eval(lambda x: (ShapedArray(x.shape, x.dtype), set()))
    np.testing.assert_array_equal(cv.jit(p.bind)(np.zeros(2)), np.ones(2))


@pytest.mark.parametrize("transform, rule", [
    (lambda f: cv.grad(lambda x: cnp.sum(f(x))), "VJP"),
    (lambda f: lambda x: cv.jvp(f, (x,), (x,)), "JVP"),
    (lambda f: cv.vmap(f), "batching"),
])
def test_a_transform_without_a_rule_names_the_primitive(transform, rule):
    p = _double()
    with pytest.raises(MissingRuleError, match=f"test_double has no {rule} rule"):
        transform(p.bind)(np.ones(2))


def test_an_abstract_eval_that_returns_no_aval_is_refused():
    p = Primitive("test_bad_eval")
    p.def_impl(lambda x: x)
    p.def_abstract_eval(lambda x: 3)
    with pytest.raises(TypeError, match="test_bad_eval: its abstract eval returned int, not an aval"):
        cv.jit(p.bind)(np.ones(2))
