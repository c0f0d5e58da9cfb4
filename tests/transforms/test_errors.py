"""Error messages: each names the transform and the function first, then the argument (by
pytree path), the shapes and what to do. No error surfaces as a raw NumPy traceback: it is a
``cuvmap.CuvmapError`` or a documented Python error (IndexError, TypeError) with a clear
message.
"""
import re

import numpy as np
import pytest

import cuvmap
import cuvmap.numpy as cnp
from cuvmap import grad, hessian, jacfwd, jacrev, jvp, value_and_grad, vjp, vmap
from cuvmap.core import Primitive
from cuvmap.transforms import batching, jvp as jvp_mod, vjp as vjp_mod


def loss(params, xs, ys):
    return ((xs @ params - ys) ** 2).sum()


def f(x):
    return x


def raises(exc, match):
    """``pytest.raises`` whose pattern must match from the start of the message."""
    return pytest.raises(exc, match="^" + match)


X43 = np.ones((4, 3))


# ---------------------------------------------------------------------------------------
# vmap: sizes, in_axes, out_axes, axis_size
# ---------------------------------------------------------------------------------------


def test_mismatched_mapped_sizes_name_each_argument():
    """JAX's message: each size, how many axes have it and one of them, the most common first."""
    with raises(cuvmap.TransformError, re.escape(
        "vmap(loss, in_axes=(None, 0, 0)): vmap got inconsistent sizes for array axes to be mapped:\n"
        "  * one axis had size 8: axis 0 of argument xs of type float64[8,3];\n"
        "  * one axis had size 10: axis 0 of argument ys of type float64[10]"
    )):
        vmap(loss, in_axes=(None, 0, 0))(np.ones(3), np.ones((8, 3)), np.ones(10))


def test_mismatched_sizes_inside_pytrees_and_keywords():
    d = {"a": np.ones((4, 2)), "b": [np.ones((4, 2)), np.ones((2, 5))]}
    with raises(cuvmap.TransformError, re.escape(
        "vmap(f, in_axes=({'a': 0, 'b': [0, 1]},)): vmap got inconsistent sizes for array axes to be mapped:\n"
        "  * most axes (2 of them) had size 4, e.g. axis 0 of argument x['a'] of type float64[4,2];\n"
        "  * one axis had size 5: axis 1 of argument x['b'][1] of type float64[2,5]"
    )):
        vmap(f, in_axes=({"a": 0, "b": [0, 1]},))(d)
    with raises(cuvmap.TransformError, re.escape("vmap(<lambda>): vmap got inconsistent sizes for array axes to be "
                                                 "mapped:\n  * one axis had size 4: axis 0 of argument x of type "
                                                 "float64[4,3];\n  * one axis had size 5: axis 0 of kwargs['y'] of "
                                                 "type float64[5,3]")):
        vmap(lambda x, y: x)(X43, y=np.ones((5, 3)))
    with raises(cuvmap.TransformError, re.escape("vmap(f): vmap got inconsistent sizes for array axes to be mapped:\n"
                                                 "  * the `axis_size` argument was 5;\n  * one axis had size 4: axis 0 "
                                                 "of argument x of type float64[4,3]")):
        vmap(f, axis_size=5)(X43)
    with raises(cuvmap.TransformError, re.escape("vmap(<lambda>): vmap got inconsistent sizes for array axes to be "
                                                 "mapped:\n  * one axis had size 4: axis 0 of argument x of type "
                                                 "float64[4,3];\n  * one axis had size 2: axis 0 of args[1] of type "
                                                 "float64[2]")):
        vmap(lambda x, *rest: x)(X43, np.ones(2))


@pytest.mark.parametrize("axis", [2, -3])
def test_in_axes_out_of_range(axis):
    with raises(cuvmap.TransformError, re.escape(
        f"vmap(loss, in_axes=(None, {axis}, 0)): in_axes {axis} is out of range for argument 1 (xs) of shape (4, 3) (rank 2)"
    )):
        vmap(loss, in_axes=(None, axis, 0))(np.ones(3), X43, np.ones(4))


def test_in_axes_of_a_scalar_argument():
    with raises(cuvmap.TransformError, re.escape("vmap(f): in_axes 0 is out of range for argument 0 (x) of shape () (rank 0)")):
        vmap(f)(np.float64(1.0))
    with raises(cuvmap.TransformError, re.escape("vmap(f): argument 0 (x) is a float, which has no axis 0 to map over")):
        vmap(f)(1.0)


def test_in_axes_not_a_prefix_of_the_arguments():
    d = {"a": X43, "b": X43}
    with raises(cuvmap.TransformError, re.escape(
        "vmap(f, in_axes=({'a': 0, 'c': 1},)): vmap in_axes specification must be a tree prefix of the "
        "corresponding value; in_axes ({'a': 0, 'c': 1},) is not a pytree prefix of the arguments. Mismatch "
        "details: at argument 0 (x), in_axes has a dict with keys ['a', 'c'], which is not a prefix of a "
        "dict with keys ['a', 'b'] (different keys or lengths)"
    )):
        vmap(f, in_axes=({"a": 0, "c": 1},))(d)
    with raises(cuvmap.TransformError, r"vmap\(f, in_axes=\(\(0, 0\),\)\): .*at argument 0 \(x\), in_axes has a tuple of length 2, which is not a prefix of an array of shape \(4, 3\) \(different types\)"):
        vmap(f, in_axes=((0, 0),))(X43)
    with raises(cuvmap.TransformError, r"vmap\(f, in_axes=\(\[0, 0\],\)\): .*at argument 0 \(x\), in_axes has a list of length 2, which is not a prefix of a tuple of length 2"):
        vmap(f, in_axes=([0, 0],))((X43, X43))


def test_one_vmap_over_argument_structures_met_in_turn():
    """The leaves' in_axes are kept per argument structure: each structure gets its own, a
    structure in_axes does not fit raises on every call, and the first one still maps."""
    g = vmap(lambda d: d["a"] * 2.0 + d.get("b", 0.0), in_axes=({"a": 0, "b": None},))
    h = vmap(lambda d: d["a"] * 2.0, in_axes=({"a": 1},))
    for _ in range(2):
        np.testing.assert_allclose(g({"a": X43, "b": np.ones(3)}), X43 * 2.0 + 1.0)
        np.testing.assert_allclose(h({"a": X43}), X43.T * 2.0)
        with raises(cuvmap.TransformError, r".*is not a pytree prefix of the arguments"):
            g({"a": X43})
        np.testing.assert_allclose(h({"a": X43.T}), X43 * 2.0)


def test_in_axes_tuple_of_the_wrong_length():
    with raises(cuvmap.TransformError, re.escape(
        "vmap(loss, in_axes=(None, 0)): vmap in_axes must be an int, None, or a tuple of entries corresponding to the "
        "positional arguments passed to the function, but got len(in_axes)=2, len(args)=3. (loss was called with 3 "
        "positional argument(s); give in_axes one entry per positional argument)"
    )):
        vmap(loss, in_axes=(None, 0))(np.ones(3), X43, np.ones(4))


# in_axes: (the phrase of JAX's TypeError, raised when vmap is applied)
BAD_IN_AXES = [(0.5, "a tuple of entries corresponding to the positional arguments passed to the function, but got 0.5."),
               ("0", "but got '0'."), ({"a": 0}, "but got {'a': 0}."),
               ((0, 1.0), "(nested) container with those types as leaves, but got (0, 1.0) (its leaf 1.0 is neither)"),
               ((0, {"a": True}), "its leaf True is neither"), (False, "but got False.")]


@pytest.mark.parametrize("in_axes, phrase", BAD_IN_AXES)
def test_in_axes_of_the_wrong_type(in_axes, phrase):
    with pytest.raises(TypeError) as info:
        vmap(lambda x, y: x, in_axes=in_axes)
    assert isinstance(info.value, cuvmap.TransformError)
    assert str(info.value).startswith("vmap(<lambda>") and "): vmap in_axes must be an int, None, or " \
        in str(info.value) and phrase in str(info.value), str(info.value)


def test_out_axes_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"vmap out_axes must be an int, None, or \(nested\) container with those "
                                        r"types as leaves, but got \(array\(\[1\., 2\.\]\),\)"):
        vmap(f, out_axes=(np.array([1.0, 2.0]),))


def test_nothing_mapped_and_no_axis_size():
    with raises(cuvmap.TransformError, re.escape(
        "vmap(f, in_axes=None): nothing is mapped (every in_axes entry is None or the arguments have no leaves) "
        "and no axis_size was given"
    )):
        vmap(f, in_axes=None)(X43)
    with raises(cuvmap.TransformError, re.escape(
            "vmap(<lambda>): vmap wrapped function must be passed at least one argument containing an array or "
            "axis_size must be specified, got empty *args=({},) and **kwargs={}")):
        vmap(lambda x: x)({})


def test_out_axes_none_for_a_batched_output():
    with raises(cuvmap.TransformError, re.escape(
        "vmap(<lambda>, out_axes=(0, None)): out_axes is None for output [1] of shape (3,), but it depends on the "
        "mapped inputs (it is batched); give it an axis (at vmap out_axes[1], got axis spec None but output was batched on axis 0)"
    )):
        vmap(lambda x: (x, x * 2), out_axes=(0, None))(X43)


def test_out_axes_out_of_range_or_not_a_prefix():
    with raises(cuvmap.TransformError, re.escape(
        "vmap(f, out_axes=3): out_axes 3 is out of range for the output of shape (3,) (rank 1 plus the mapped axis)"
    )):
        vmap(f, out_axes=3)(X43)
    with raises(cuvmap.TransformError, re.escape(
        "vmap(<lambda>, out_axes={'b': 0}): vmap out_axes specification must be a tree prefix of the corresponding "
        "value; out_axes {'b': 0} is not a pytree prefix of the outputs. Mismatch details: at the output, "
        "out_axes has a dict with keys ['b'], which is not a prefix of a dict with keys ['a'] (different keys or "
        "lengths)"
    )):
        vmap(lambda x: {"a": x}, out_axes={"b": 0})(X43)


def test_bad_chunk_size_and_non_callable():
    with raises(cuvmap.TransformError, re.escape("vmap(f): chunk_size must be a positive int or 'auto', got 0")):
        vmap(f, chunk_size=0)
    for transform in (vmap, grad, value_and_grad, jacfwd, jacrev, hessian):
        with raises(TypeError, re.escape(f"{transform.__name__}(3): the function to transform must be callable")):
            transform(3)


# ---------------------------------------------------------------------------------------
# grad and friends: outputs, inputs, argnums, has_aux
# ---------------------------------------------------------------------------------------


def test_grad_of_a_non_scalar_output():
    with raises(cuvmap.TransformError, re.escape(
        "grad(f): f must return a scalar (shape ()), got shape (4, 3); use vjp or jacrev for non-scalar outputs"
    )):
        grad(f)(X43)
    with raises(cuvmap.TransformError, re.escape("value_and_grad(<lambda>): <lambda> must return a scalar (shape ()), got a tuple")):
        value_and_grad(lambda x: (x.sum(),))(X43)
    with raises(cuvmap.TransformError, re.escape("grad(vmap(<lambda>)): vmap(<lambda>) must return a scalar")):
        grad(vmap(lambda x: x.sum()))(X43)


def test_grad_of_an_integer_valued_output():
    with raises(cuvmap.TransformError, re.escape(
        "grad(<lambda>): <lambda> returned a value of dtype int64; grad needs a floating-point output"
    )):
        grad(lambda x: cnp.argmax(x))(np.ones(3))
    with raises(cuvmap.TransformError, r"jacrev\(<lambda>\): output of dtype bool"):
        jacrev(lambda x: x > 0)(np.ones(3))


@pytest.mark.parametrize("transform", [grad, value_and_grad, jacfwd, jacrev, hessian])
def test_differentiating_with_respect_to_an_integer_input(transform):
    name = transform.__name__
    with raises(cuvmap.TransformError, re.escape(
        f"{name}(loss): argument 1 (xs)['i'] has dtype int64; {name} differentiates with respect to "
        "floating-point inputs only"
    )):
        transform(loss, argnums=1)(np.ones(3), {"f": X43, "i": np.arange(4)}, np.ones(4))


def test_grad_with_respect_to_a_python_int():
    with raises(cuvmap.TransformError, re.escape("grad(<lambda>): argument 0 (x) has dtype int64")):
        grad(lambda x: x * 2.0)(3)
    with pytest.raises(TypeError, match="has dtype int64"):  # JAX's exception type too
        grad(lambda x: x * 2.0)(3)


def test_argnums_out_of_range_or_of_the_wrong_type():
    with raises(cuvmap.TransformError, re.escape(
        "grad(loss): argnums 3 is out of range: loss was called with 3 positional arguments"
    )):
        grad(loss, argnums=3)(np.ones(3), X43, np.ones(4))
    with raises(cuvmap.TransformError, re.escape("jacrev(loss): argnums (0, -4) is out of range")):
        jacrev(loss, argnums=(0, -4))(np.ones(3), X43, np.ones(4))
    with raises(cuvmap.TransformError, re.escape("grad(loss): argnums must be an int or a tuple of ints, got 'xs'")):
        grad(loss, argnums="xs")(np.ones(3), X43, np.ones(4))


@pytest.mark.parametrize(
    "call",
    [
        lambda g: grad(g, has_aux=True)(np.ones(3)),
        lambda g: vjp(g, np.ones(3), has_aux=True),
        lambda g: jvp(g, (np.ones(3),), (np.ones(3),), has_aux=True),
        lambda g: jacrev(g, has_aux=True)(np.ones(3)),
        lambda g: jacfwd(g, has_aux=True)(np.ones(3)),
    ],
    ids=["grad", "vjp", "jvp", "jacrev", "jacfwd"],
)
def test_has_aux_needs_a_pair(call):
    """The message describes what came back (never an internal tracer type)."""
    def g(x):
        return x * 2

    with raises(cuvmap.TransformError, r"(grad|vjp|jvp|jacrev|jacfwd)\(g\): with has_aux=True, g must return a pair "
                r"\(output, aux\) as a two-element tuple, got an array of shape \(3,\)$"):
        call(g)


# ---------------------------------------------------------------------------------------
# jvp and vjp: tangents and cotangents
# ---------------------------------------------------------------------------------------


def test_jvp_with_mismatched_tangents():
    with raises(cuvmap.TransformError, re.escape("jvp(sin): tangent 0 has shape (3,), but its primal has shape (4, 3)")):
        jvp(cnp.sin, (X43,), (np.ones(3),))
    with raises(cuvmap.TransformError, re.escape("jvp(<lambda>): tangent 0['b'] has shape (2,), but its primal has shape (3,)")):
        jvp(lambda d: d["b"], ({"b": np.ones(3)},), ({"b": np.ones(2)},))
    with raises(cuvmap.TransformError, r"jvp\(loss\): tangents have structure .*, but primals have structure"):
        jvp(loss, (np.ones(3), X43, np.ones(4)), (np.ones(3), X43))
    with raises(cuvmap.TransformError, re.escape(
        "jvp(sin): tangent 0 has dtype int64, but its primal has dtype float64; a tangent must have its "
        "primal's dtype (as in JAX): cast it with .astype"
    )):
        jvp(cnp.sin, (X43,), (np.ones((4, 3), np.int64),))
    with raises(cuvmap.TransformError, re.escape(
        "jvp(sin): tangent 0 has dtype float64, but its primal has dtype float32; a tangent must have its "
        "primal's dtype (as in JAX): cast it with .astype"
    )):
        jvp(cnp.sin, (X43.astype(np.float32),), (np.ones((4, 3)),))
    with raises(cuvmap.TransformError, r"jvp\(sin\): primals and tangents must be tuples"):
        jvp(cnp.sin, X43, X43)


def test_vjp_with_a_cotangent_of_the_wrong_shape():
    _, pullback = vjp(cnp.sin, X43)
    with raises(cuvmap.TransformError, re.escape(
        "vjp(sin): cotangent leaf 0 has type float64[3], but the output leaf has type float64[4,3] (unexpected JAX "
        "type (e.g. shape/dtype) for argument to VJP function)"
    )):
        pullback(np.ones(3))
    _, pullback = vjp(cnp.sin, X43.astype(np.float32))
    with raises(cuvmap.TransformError, re.escape("vjp(sin): cotangent leaf 0 has type float16[4,3], but the output "
                                                 "leaf has type float32[4,3]")):
        pullback(np.ones((4, 3), np.float16))
    with pytest.raises(TypeError, match=r"applied to sin was called with 2 arguments"):
        pullback(np.ones((4, 3), np.float32), np.ones((4, 3), np.float32))
    _, pullback = vjp(lambda x: (x, x.sum()), X43)
    with raises(cuvmap.TransformError, r"vjp\(<lambda>\): the cotangent has structure .*, but the output has structure"):
        pullback(np.ones((4, 3)))


# ---------------------------------------------------------------------------------------
# Primitives without a rule
# ---------------------------------------------------------------------------------------


@pytest.fixture
def impl_only_primitive():
    """A primitive with an impl and nothing else, removed from every registry afterwards."""
    p = Primitive("impl_only_op")
    p.impl = lambda x: x * 2
    yield p
    for registry in (batching.primitive_batchers, jvp_mod.primitive_jvps, vjp_mod.primitive_vjps):
        registry.pop(p, None)
    assert p not in cuvmap.lax.all_primitives()


def test_primitive_without_rules(impl_only_primitive):
    p = impl_only_primitive
    np.testing.assert_array_equal(p.bind(np.ones(2)), 2.0)  # the impl alone works outside transforms
    with raises(cuvmap.MissingRuleError, re.escape(
        "vmap(<lambda>): primitive impl_only_op has no batching rule (needed by vmap)"
    )):
        vmap(lambda x: p.bind(x))(X43)
    with raises(cuvmap.MissingRuleError, re.escape(
        "grad(<lambda>): primitive impl_only_op has no VJP rule (needed by grad/vjp)"
    )):
        grad(lambda x: p.bind(x).sum())(np.ones(3))
    with raises(cuvmap.MissingRuleError, re.escape(
        "jvp(<lambda>): primitive impl_only_op has no JVP rule (needed by jvp)"
    )):
        jvp(lambda x: p.bind(x), (np.ones(3),), (np.ones(3),))
    with raises(cuvmap.MissingRuleError, r"jacfwd\(<lambda>\): primitive impl_only_op has no JVP rule"):
        jacfwd(lambda x: p.bind(x))(np.ones(3))
    assert issubclass(cuvmap.MissingRuleError, NotImplementedError)


# ---------------------------------------------------------------------------------------
# Tracers used where they cannot be
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run, where",
    [
        (lambda keep: vmap(keep)(X43), "vmap(keep)"),
        (lambda keep: grad(lambda x: keep(x).sum())(np.ones(3)), "grad(<lambda>)"),
        (lambda keep: jvp(keep, (np.ones(3),), (np.ones(3),)), "jvp(keep)"),
        (lambda keep: jacrev(keep)(np.ones(3)), "jacrev(keep)"),
    ],
    ids=["vmap", "grad", "jvp", "jacrev"],
)
def test_a_tracer_escaping_its_transform(run, where):
    leaked = []

    def keep(x):
        leaked.append(x)
        return x * 1.0

    run(keep)
    msg = re.escape(f"{where}: a traced value (shape (3,)) escaped this transform and was used by mul after the transform returned")
    with raises(cuvmap.EscapedTracerError, msg):
        leaked[0] * 2.0
    # also when the escaped tracer meets another transform's values
    with raises(cuvmap.EscapedTracerError, msg):
        vmap(lambda y: y * leaked[0])(X43)
    with raises(cuvmap.ConcretizationError, re.escape(f"{where}: a traced value with shape (3,) was converted to a NumPy array")):
        np.asarray(leaked[0])


def test_shape_error_in_an_op_names_the_op_and_logical_shapes():
    with raises(cuvmap.ShapeError, re.escape(
        "vmap(<lambda>): matmul: contracting dims do not match for shapes (3, 4) and (5, 6)"
    )):
        vmap(lambda x: x @ np.ones((5, 6)))(np.ones((2, 3, 4)))
    with raises(cuvmap.ShapeError, re.escape(
        "vmap(<lambda>): add(float64[3], float64[4]) under vmap(<lambda>): shapes (3,), (4,) do not broadcast"
    )):
        vmap(lambda x: x + np.ones(4))(X43)
    with raises(cuvmap.ShapeError, re.escape(
        "grad(<lambda>): dot_general(float64[3], float64[5, 6], dimension_numbers=(((0,), (0,)), ((), ())), "
        "preferred_element_type=float64) under "
        "grad(<lambda>): dim 0 of (3,) (size 3) does not match dim 0 of (5, 6) (size 5)"
    )):
        grad(lambda x: cuvmap.lax.dot_general(x, np.ones((5, 6)), (((0,), (0,)), ((), ()))).sum())(np.ones(3))
    with raises(cuvmap.ShapeError, re.escape(
        "vmap(<lambda>): reshape(float64[3], new_sizes=(2, 2)) under vmap(<lambda>): cannot reshape (3,) (3 elements) to (2, 2)"
    )):
        vmap(lambda x: x.reshape(2, 2))(X43)
    with raises(cuvmap.ShapeError, re.escape("jacfwd(<lambda>): matmul: contracting dims do not match for shapes (3,) and (4, 2)")):
        jacfwd(lambda x: x @ np.ones((4, 2)))(np.ones(3))
    with raises(cuvmap.ShapeError, re.escape("hessian(<lambda>): matmul: contracting dims do not match")):
        hessian(lambda x: (x @ np.ones((4, 2))).sum())(np.ones(3))
    assert issubclass(cuvmap.ShapeError, ValueError)


@pytest.mark.parametrize(
    "body, what",
    [
        (lambda x: x if x.sum() > 0 else -x, r"the truth value \(Python if, while, and, or, not\)"),
        (lambda x: x * float(x[0]), r"float\(\)"),
        (lambda x: x * int(x[0]), r"int\(\)"),
        (lambda x: x[: x.shape[0]] * list(range(3))[x.astype(np.int64)[0]], r"The __index__\(\) method was called on traced array: the use as a Python index \(range\(\), list\[...\]\)"),
    ],
    ids=["if", "float", "int", "index"],
)
def test_python_control_flow_on_a_batched_value(body, what):
    with raises(cuvmap.ConcretizationError, r"vmap\(<lambda>\): " + what + r" of a batched value \(shape \(\)\) depends on the example; use cuvmap.numpy.where"):
        vmap(body)(X43)
    assert issubclass(cuvmap.ConcretizationError, TypeError)


def test_python_if_on_a_batched_value_inside_grad():
    with raises(cuvmap.ConcretizationError, r"vmap\(grad\(<lambda>\)\): the truth value .* of a batched value"):
        vmap(grad(lambda x: x if x > 0 else -x))(np.ones(3))


@pytest.mark.parametrize(
    "transform, where",
    [
        (lambda g: vmap(g)(X43), "vmap(<lambda>)"),
        (lambda g: grad(lambda x: g(x).sum())(np.ones(3)), "grad(<lambda>)"),
        (lambda g: jvp(g, (np.ones(3),), (np.ones(3),)), "jvp(<lambda>)"),
        (lambda g: hessian(lambda x: g(x).sum())(np.ones(3)), "hessian(<lambda>)"),
    ],
    ids=["vmap", "grad", "jvp", "hessian"],
)
@pytest.mark.parametrize(
    "numpy_call, says",
    [
        (lambda x: np.asarray(x), "was converted to a NumPy array"),
        (lambda x: np.array(x) * 2, "was converted to a NumPy array"),
        (lambda x: np.sin(x), "was converted to a NumPy array"),
        (lambda x: np.add(x, 1.0), "was converted to a NumPy array"),
        (lambda x: np.arange(3.0)[x], "was used to index a concrete array"),
    ],
    ids=["asarray", "array", "sin", "np.add", "ndarray-indexed-by-tracer"],
)
def test_numpy_on_a_tracer(transform, where, numpy_call, says):
    with raises(cuvmap.ConcretizationError, re.escape(f"{where}: a traced value with shape (3,) {says}")):
        transform(lambda x: numpy_call(x))


def test_numpy_array_indexed_by_a_batched_integer():
    # integer values are traced by vmap (not by grad, where they carry no derivative)
    with raises(cuvmap.ConcretizationError, re.escape("vmap(<lambda>): a traced value with shape (2,) was used to index a concrete array")):
        vmap(lambda i: np.arange(5.0)[i])(np.zeros((3, 2), np.int64))
    np.testing.assert_array_equal(vmap(lambda i: cnp.take(np.arange(5.0), i))(np.arange(3)), [0.0, 1.0, 2.0])


# ---------------------------------------------------------------------------------------
# Documented Python errors with clear messages
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, exc, match, under_grad",
    [
        (lambda x: x[5], IndexError, r"index 5 is out of bounds for axis 0 with size 3", True),
        (lambda x: x[0, 0], IndexError, r"too many indices \(2\) for an array of shape \(3,\)", True),
        (lambda x: x[1.0], IndexError, r"unsupported index 1.0 of type float", True),
        (lambda x: x[x > 0], IndexError, r"boolean mask indexing is not supported on traced values", True),
        (lambda x: x[np.array([0.5])], IndexError, r"arrays used as indices must be integers", True),
        (lambda x: x.__setitem__(0, 1.0), TypeError, r"traced values are immutable", True),
        (lambda x: len(x.sum()), TypeError, r"len\(\) of a 0-d tracer", True),
        (lambda x: x & 1, TypeError, r"bitwise_and \(operator &\): operands must be integers or booleans, got float64 and int64", True),
        (lambda x: np.sum(x, out=np.zeros(())), TypeError, r"sum: out= is not supported on traced values", True),
    ],
    ids=["out-of-bounds", "too-many", "float-index", "bool-mask", "float-array-index", "setitem", "len-0d", "float-and", "out="],
)
def test_documented_python_errors(body, exc, match, under_grad):
    with pytest.raises(exc, match=match):
        vmap(body)(X43)
    if under_grad:
        with pytest.raises(exc, match=match):
            grad(lambda x: body(x).sum())(np.ones(3))


# ---------------------------------------------------------------------------------------
# No raw NumPy errors: every failure is a cuvmap error whose message starts with a transform
# ---------------------------------------------------------------------------------------

BAD_PROGRAMS = [
    ("vmap-broadcast", lambda: vmap(lambda x: x * np.ones((2, 2)))(X43)),
    ("vmap-concat", lambda: vmap(lambda x: cnp.concatenate([x, np.ones((2, 2))]))(X43)),
    ("vmap-take-float", lambda: vmap(lambda x: cnp.take(x, np.array([0.5])))(X43)),
    ("vmap-transpose", lambda: vmap(lambda x: x.transpose(1, 0))(X43)),
    ("vmap-sum-axis", lambda: vmap(lambda x: x.sum(axis=1))(X43)),
    ("grad-matmul", lambda: grad(lambda x: (x @ np.ones((2, 2))).sum())(np.ones(3))),
    ("jvp-where", lambda: jvp(lambda x: cnp.where(x > 0, x, np.ones(2)), (np.ones(3),), (np.ones(3),))),
    ("vjp-reshape", lambda: vjp(lambda x: x.reshape(4), np.ones(3))),
    ("jacrev-stack", lambda: jacrev(lambda x: cnp.stack([x, x[:2]]))(np.ones(3))),
    ("vmap-grad-dot", lambda: vmap(grad(lambda w, x: cnp.dot(w, x).sum()), in_axes=(None, 0))(np.ones(3), np.ones((2, 4)))),
    ("grad-vmap-sizes", lambda: grad(lambda w: vmap(lambda a, b: a * b)(w, np.ones(4)).sum())(np.ones(3))),
]


@pytest.mark.parametrize("program", [p[1] for p in BAD_PROGRAMS], ids=[p[0] for p in BAD_PROGRAMS])
def test_failures_are_cuvmap_errors_that_start_with_the_transform(program):
    with pytest.raises(cuvmap.CuvmapError) as info:
        program()
    assert re.match(r"^(vmap|grad|jvp|vjp|jacrev|jacfwd|hessian|value_and_grad)\(", str(info.value)), str(info.value)
    assert "Traceback" not in str(info.value)


# Out-of-range integer indices raise instead of reading a neighbouring row (gathers that
# fold rows into one axis add row offsets; found in review).
OUT_OF_RANGE_INDICES = [
    ("cross_entropy label", lambda: cuvmap.nn.cross_entropy(np.array([[0.0, 1, 2], [10, -5, 3]]), np.array([3, 0])),
     r"cross_entropy: index 3 is out of bounds for the classes \(integer labels lie in \[0, 3\)"),
    ("cross_entropy label -1", lambda: cuvmap.nn.cross_entropy(np.array([[0.0, 1, 2], [10, -5, 3]]), np.array([0, -1])),
     r"cross_entropy: index -1 is out of bounds for the classes \(integer labels lie in \[0, 3\)"),
    ("take_along_axis", lambda: cnp.take_along_axis(np.arange(6.0).reshape(2, 3), np.array([[3], [0]]), 1),
     r"take_along_axis: index 3 is out of bounds for axis 1 with size 3"),
    ("several index arrays", lambda: vmap(lambda x: x[np.array([0]), np.array([4])])(np.ones((2, 3, 4))),
     r"indexing: index 4 is out of bounds for axis 1 with size 4"),
    ("batched indices under vmap", lambda: vmap(lambda x, i: cnp.take(x, i, 0))(np.ones((2, 3)), np.array([[3], [0]])),
     r"take: index 3 is out of bounds for the gathered axis with size 3"),
]


@pytest.mark.parametrize("name,call,message", OUT_OF_RANGE_INDICES, ids=[r[0] for r in OUT_OF_RANGE_INDICES])
def test_out_of_range_indices_raise(name, call, message):
    # an IndexError stays one under every transform (NOTE [errors keep their kind])
    with pytest.raises(IndexError, match=message):
        call()


# Messages in the user's coordinates and terms, never those of a primitive the user did not
# write (a physical axis under vmap, the broadcast_in_dim inside take_along_axis).
USER_TERMS = [
    ("take under vmap names no physical axis",
     lambda: vmap(lambda x: cnp.take(x, np.array([9]), axis=1))(np.ones((2, 3, 4))),
     IndexError, r"^take: index 9 is out of bounds for the gathered axis with size 4$"),
    ("take_along_axis indices that do not broadcast",
     lambda: cnp.take_along_axis(np.ones((3, 4)), np.ones((5, 7), np.int64), axis=0),
     cuvmap.ShapeError,
     re.escape("take_along_axis: indices of shape (5, 7) do not broadcast against the array of shape (3, 4) "
               "outside axis 0 (dim 1: 7 vs 4)")),
    ("take_along_axis indices under vmap",
     lambda: vmap(lambda a, i: cnp.take_along_axis(a, i, axis=0))(np.ones((2, 3, 4)), np.ones((2, 5, 7), np.int64)),
     cuvmap.ShapeError, r"^vmap\(<lambda>\): take_along_axis: indices of shape \(5, 7\) do not broadcast"),
    ("a batch given to a per-example loss",
     lambda: grad(lambda x: (x.reshape(-1) @ np.ones((12, 2))).sum())(np.ones((4, 3, 4))),
     cuvmap.ShapeError,
     re.escape("matmul: contracting dims do not match for shapes (48,) and (12, 2) (48 vs 12); the first "
               "operand's dim is 4× the other's: if it holds a batch of 4 examples where the function expects "
               "one (a flatten or reshape(-1) over the batch), map the function over the batch with cuvmap.vmap")),
    ("a plain mismatch gets no batch hint",
     lambda: cnp.matmul(np.ones(5), np.ones((3, 2))),
     cuvmap.ShapeError, r"for shapes \(5,\) and \(3, 2\) \(5 vs 3\)$"),
]


@pytest.mark.parametrize("name,call,exc,message", USER_TERMS, ids=[r[0] for r in USER_TERMS])
def test_errors_in_the_users_terms(name, call, exc, message):
    with pytest.raises(exc) as info:
        call()
    assert re.search(message, str(info.value)), str(info.value)
    assert "broadcast_in_dim" not in str(info.value)


# A NumPy array indexed (or written) at a traced position: NumPy's C indexing reaches
# ``Tracer.__array__``; the message names the indexing and what to write instead.
CONCRETE_TABLE = np.arange(12.0).reshape(4, 3)


def _write_at(i):
    table = CONCRETE_TABLE.copy()
    table[i] = 0.0
    return i


# name: (f, argument, what the message says)
INDEXING_A_CONCRETE_ARRAY = {
    "a[i]": (lambda i: CONCRETE_TABLE[i], 1, "was used to index a concrete array"),
    "a[idx]": (lambda i: CONCRETE_TABLE[i], np.array([0, 2]), "was used to index a concrete array"),
    "a[0, argmax]": (lambda x: CONCRETE_TABLE[0, cnp.argmax(x)], np.ones(3), "was used to index a concrete array"),
    "a[i] = v": (_write_at, 1, "was used as the position of an assignment into a concrete array"),
}


@pytest.mark.parametrize("name", INDEXING_A_CONCRETE_ARRAY)
@pytest.mark.parametrize("transform", ["jit", "vmap"])
def test_indexing_a_concrete_array_with_a_tracer_names_the_indexing(name, transform):
    f, arg, says = INDEXING_A_CONCRETE_ARRAY[name]
    run = cuvmap.jit(f) if transform == "jit" else cuvmap.vmap(f)
    arg = arg if transform == "jit" else np.stack([arg, arg])
    with raises(cuvmap.ConcretizationError, ".*" + re.escape(says)) as info:
        run(arg)
    assert "cuvmap.numpy." in str(info.value)
    assert "np.asarray" not in str(info.value)


def test_the_suggested_take_indexes_with_a_tracer():
    out = cuvmap.vmap(lambda i: cnp.take(CONCRETE_TABLE, i, axis=0))(np.array([1, 3]))
    np.testing.assert_array_equal(out, CONCRETE_TABLE[[1, 3]])


@pytest.mark.parametrize("transform", [grad, value_and_grad, jacfwd, jacrev, hessian, cuvmap.jit, cuvmap.vmap,
                                       cuvmap.checkpoint], ids=lambda t: t.__name__)
def test_transformed_functions_keep_the_docstring_and_wrapped(transform):
    """JAX's functools.wraps: ``__doc__`` and ``__wrapped__`` are the function's (the name is
    ``transform(f)``: docs/jax.md)."""
    def square_sum(x):
        """Σ x²."""
        return cnp.sum(x * x)

    wrapped = transform(square_sum)
    if transform is cuvmap.vmap:  # JAX's: the original documentation after a line on the vectorization
        assert wrapped.__doc__.startswith("Vectorized version of square_sum.")
        assert wrapped.__doc__.endswith("\n\nOriginal documentation:\n\nΣ x².")
    else:
        assert wrapped.__doc__ == "Σ x²."
    assert wrapped.__wrapped__ is square_sum
    assert "square_sum" in wrapped.__name__
