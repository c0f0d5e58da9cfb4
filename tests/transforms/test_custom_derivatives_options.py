"""JAX's autodiff options (issue 33 item 2): ``grad(allow_int=, reduce_axes=)``,
``custom_jvp``/``custom_vjp`` with ``nondiff_argnames``, traced nondiff arguments,
``symbolic_zeros``, ``optimize_remat``, rules that call the function on tangents,
``custom_gradient``, ``closure_convert``, ``checkpoint_name`` and the name policies,
``stop_gradient`` of a pytree. Every value is checked against a closed form or finite
differences (``cuvmap.test_util.check_grads``), under grad, jvp, vmap and jit.
"""
import functools

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap import numpy as cnp
from cuvmap.custom_derivatives import (
    CustomVJPPrimal, SymbolicZero, closure_convert, custom_gradient, custom_jvp, custom_vjp,
    custom_vjp_primal_tree_values, zero_from_primal,
)
from cuvmap.lax import elementwise
from cuvmap.test_util import check_grads
from cuvmap.transforms.custom_derivatives import CustomDerivativeError

X = np.array([0.3, -1.2, 2.0])


# ---------------------------------------------------------------------------------------
# grad options and float0
# ---------------------------------------------------------------------------------------


def test_allow_int_gives_float0_zero_gradients():
    g = cv.grad(lambda x, n: x * n, argnums=(0, 1), allow_int=True)(2.0, 3)
    assert float(g[0]) == 3.0
    assert g[1].dtype == cv.float0 and g[1].shape == () and cv.dtypes.float0 is cv.float0
    value, g = cv.value_and_grad(lambda d: cnp.sum(d["x"] * d["n"]), allow_int=True)(
        {"x": np.array([1.0, 2.0]), "n": np.array([3, 4])})
    assert float(value) == 11.0
    np.testing.assert_array_equal(g["x"], [3.0, 4.0])
    assert g["n"].dtype == cv.float0 and g["n"].shape == (2,)


def test_an_integer_input_without_allow_int_names_the_option():
    with pytest.raises(cv.TransformError, match=r"argument 0 \(x\) has dtype int64.*allow_int=True"):
        cv.grad(lambda x: x * 2.0)(3)


def test_reduce_axes_raises_jax_message():
    with pytest.raises(NotImplementedError, match="reduce_axes argument to grad is deprecated"):
        cv.grad(lambda x: x, reduce_axes=("i",))
    with pytest.raises(NotImplementedError, match="reduce_axes"):
        cv.value_and_grad(lambda x: x, reduce_axes=("i",))
    assert float(cv.grad(lambda x: x * x, reduce_axes=())(3.0)) == 6.0


# ---------------------------------------------------------------------------------------
# stop_gradient on pytrees
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [lax.stop_gradient, cv.stop_gradient], ids=["lax", "api"])
def test_stop_gradient_stops_every_leaf_of_a_pytree(stop):
    """d/dx Σ sg(x)² = 0 and d/dx Σ sg(x)·x = x, with x inside a dict and a tuple."""
    f = lambda x: cnp.sum(stop({"a": x, "b": (x, 2.0)})["a"] ** 2)
    np.testing.assert_array_equal(cv.grad(f)(X), np.zeros(3))
    g = lambda x: cnp.sum(stop({"a": x})["a"] * x)
    for fn in (cv.grad(g), cv.jit(cv.grad(g)), cv.grad(cv.jit(g))):
        np.testing.assert_allclose(fn(X), X)
    np.testing.assert_allclose(cv.jvp(g, (X,), (np.ones(3),))[1], X.sum())


# ---------------------------------------------------------------------------------------
# nondiff arguments
# ---------------------------------------------------------------------------------------


@functools.partial(custom_jvp, nondiff_argnames=("n",))
def power(x, n):
    """x ** n"""
    return x ** n


@power.defjvp
def _power_jvp(n, primals, tangents):
    (x,), (t,) = primals, tangents
    return power(x, n), n * x ** (n - 1) * t


def test_nondiff_argnames_resolve_to_positions_and_keep_the_wrapper_attributes():
    assert power.nondiff_argnums == (1,)
    assert power.__name__ == "power" and power.__doc__ == "x ** n" and callable(power.__wrapped__)
    for n in (2, 3):
        np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(power(x, n)))(X), n * X ** (n - 1))
        np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(power(x, n=n)))(X), n * X ** (n - 1))
    with pytest.raises(TypeError, match="nondiff_argnames names 'm'"):
        custom_jvp(lambda x, n: x, nondiff_argnames=("m",))


def test_nondiff_argnums_and_argnames_combine_and_the_rule_gets_them_in_order():
    @functools.partial(custom_vjp, nondiff_argnums=(2,), nondiff_argnames=("scale",))
    def scaled(scale, x, label):
        return scale * x

    seen = []

    def fwd(scale, x, label):
        return scaled(scale, x, label), None

    def bwd(scale, label, _, ct):
        seen.append((scale, label))
        return (scale * ct,)

    scaled.defvjp(fwd, bwd)
    assert scaled.nondiff_argnums == (0, 2)
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(scaled(3.0, x, "k")))(X), np.full(3, 3.0))
    assert seen == [(3.0, "k")]


@functools.partial(custom_jvp, nondiff_argnums=(1,))
def scale_by(x, s):
    return x * s


@scale_by.defjvp
def _scale_by_jvp(s, primals, tangents):
    return scale_by(primals[0], s), tangents[0] * s


def test_a_traced_nondiff_argument_of_custom_jvp_is_allowed_and_takes_no_derivative():
    """f(x, s) = x·s with s nondiff: ∂/∂x = s; ∂/∂s through the nondiff slot is 0 (JAX's
    stop_gradient), so d/ds f(s, s) = s (the first slot only)."""
    s = np.array([2.0, -1.0, 0.5])
    for fn in (cv.grad(lambda x, s: cnp.sum(scale_by(x, s))), cv.jit(cv.grad(lambda x, s: cnp.sum(scale_by(x, s))))):
        np.testing.assert_allclose(fn(X, s), s)
    np.testing.assert_allclose(cv.vmap(cv.grad(scale_by))(X, s), s)
    np.testing.assert_allclose(cv.grad(lambda s: cnp.sum(scale_by(s, s)))(s), s)
    np.testing.assert_allclose(cv.jvp(lambda x: scale_by(x, s), (X,), (np.ones(3),))[1], s)


def test_a_traced_nondiff_argument_of_custom_vjp_raises_as_in_jax():
    @functools.partial(custom_vjp, nondiff_argnums=(1,))
    def f(x, s):
        return x * s

    f.defvjp(lambda x, s: (x * s, None), lambda s, _, ct: (ct * s,))
    with pytest.raises(CustomDerivativeError, match=r"argument 1 \(s\) is in nondiff_argnums but is a traced value"):
        cv.grad(lambda s: f(2.0, s))(3.0)


# ---------------------------------------------------------------------------------------
# symbolic zeros
# ---------------------------------------------------------------------------------------


def _product_with_symbolic_zeros(log):
    @custom_jvp
    def prod(x, y):
        return x * y

    @functools.partial(prod.defjvp, symbolic_zeros=True)
    def _jvp(primals, tangents):
        (x, y), (xd, yd) = primals, tangents
        log.append((type(xd) is SymbolicZero, type(yd) is SymbolicZero))
        out = None
        if type(xd) is not SymbolicZero:
            out = xd * y
        if type(yd) is not SymbolicZero:
            out = x * yd if out is None else out + x * yd
        return prod(x, y), (SymbolicZero.from_primal_value(x * y) if out is None else out)

    return prod


def test_custom_jvp_symbolic_zeros_mark_the_inputs_not_differentiated():
    log = []
    prod = _product_with_symbolic_zeros(log)
    x, y = X, np.array([1.5, 2.0, -3.0])
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(prod(x, y)))(x), y)
    assert log[-1] == (False, True)
    np.testing.assert_allclose(cv.grad(lambda y: cnp.sum(prod(x, y)))(y), x)
    assert log[-1] == (True, False)
    np.testing.assert_allclose(cv.jvp(lambda x, y: prod(x, y), (x, y), (np.ones(3), np.ones(3)))[1], x + y)
    assert log[-1] == (False, False)
    for fn in (cv.vmap(cv.grad(prod)), cv.jit(cv.vmap(cv.grad(prod))), cv.vmap(cv.jit(cv.grad(prod)))):
        np.testing.assert_allclose(fn(x, y), y)
    assert all(t and not s for s, t in log[-3:])  # the tangent of y is symbolic under vmap and jit too
    # a symbolic zero output tangent: the input is not differentiated at all
    np.testing.assert_array_equal(cv.jvp(lambda x: prod(x, y), (x,), (np.ones(3),))[1], y)
    check_grads(lambda x, y: prod(x, y), (x, y), order=1)


def test_symbolic_zero_has_the_aval_and_zero_from_primal_makes_it():
    z = SymbolicZero.from_primal_value(np.ones((2, 3), np.float32))
    assert z.shape == (2, 3) and z.dtype == np.float32 and z.ndim == 2 and z.size == 6
    np.testing.assert_array_equal(z.instantiate(), np.zeros((2, 3), np.float32))
    tree_ = zero_from_primal({"a": np.ones(2), "b": 1.0}, symbolic_zeros=True)
    assert type(tree_["a"]) is SymbolicZero and tree_["b"].shape == ()
    plain = zero_from_primal({"a": np.ones(2)})
    np.testing.assert_array_equal(plain["a"], np.zeros(2))


def _pair_with_symbolic_zeros(log):
    @custom_vjp
    def pair(x, y, z):
        return x * 2.0, x * 3.0

    def fwd(x, y, z):
        log.append(("fwd", x.perturbed, y.perturbed, z.perturbed))
        assert isinstance(x, CustomVJPPrimal)
        x, y, z = custom_vjp_primal_tree_values((x, y, z))
        return pair(x, y, z), None

    def bwd(_, cts):
        c1, c2 = cts
        log.append(("bwd", type(c1) is SymbolicZero, type(c2) is SymbolicZero))
        total = None
        for c, k in ((c1, 2.0), (c2, 3.0)):
            if type(c) is not SymbolicZero:
                total = c * k if total is None else total + c * k
        return total, None, SymbolicZero.from_primal_value(1.0)

    pair.defvjp(fwd, bwd, symbolic_zeros=True)
    return pair


def test_custom_vjp_symbolic_zeros_mark_unperturbed_inputs_and_zero_cotangents():
    log = []
    pair = _pair_with_symbolic_zeros(log)
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(pair(x, 1.0, 2.0)[0]))(X), np.full(3, 2.0))
    assert log[-2:] == [("fwd", True, False, False), ("bwd", False, True)]
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(pair(x, 1.0, 2.0)[1]))(X), np.full(3, 3.0))
    assert log[-1] == ("bwd", True, False)
    g = cv.grad(lambda x, y, z: cnp.sum(pair(x, y, z)[0] + pair(x, y, z)[1]), argnums=(0, 1, 2))(X, 1.0, 2.0)
    np.testing.assert_allclose(g[0], np.full(3, 5.0))
    assert float(g[1]) == 0.0 and float(g[2]) == 0.0
    assert ("fwd", True, True, True) in log
    for fn in (cv.vmap(cv.grad(lambda x: pair(x, 1.0, 2.0)[0])),
               cv.jit(cv.vmap(cv.grad(lambda x: pair(x, 1.0, 2.0)[1])))):
        assert fn(X).shape == (3,)
    np.testing.assert_allclose(cv.jit(cv.grad(lambda x: cnp.sum(pair(x, 1.0, 2.0)[1])))(X), np.full(3, 3.0))


def test_optimize_remat_is_accepted_and_changes_no_value():
    @custom_vjp
    def f(x):
        return cnp.sin(x)

    f.defvjp(lambda x: (cnp.sin(x), cnp.cos(x)), lambda c, ct: (ct * c,), optimize_remat=True)
    assert f.optimize_remat
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(cv.checkpoint(f)(x)))(X), np.cos(X))
    with pytest.raises(NotImplementedError, match="symbolic_zeros"):
        f.defvjp(lambda x: (x, None), lambda _, ct: (ct,), symbolic_zeros=True, optimize_remat=True)


# ---------------------------------------------------------------------------------------
# A rule that calls the function on tangents (linear functions)
# ---------------------------------------------------------------------------------------


@custom_jvp
def negate(x):
    return -x


@negate.defjvp
def _negate_jvp(primals, tangents):
    return negate(primals[0]), negate(tangents[0])


@custom_jvp
def divide(x, y):
    return x / y


@divide.defjvp
def _divide_jvp(primals, tangents):
    (x, y), (xd, _) = primals, tangents
    return divide(x, y), divide(xd, y)  # deliberately ignores y's tangent


def test_a_rule_calling_the_function_on_tangents_works_in_reverse_mode():
    """The body of a custom_jvp call on a tangent is transposed (JAX's idiom for linear
    functions): d(−x)/dx = −1, and the rule's d(x/y)/dx = 1/y."""
    for fn in (cv.grad(negate), cv.grad(cv.jit(negate)), cv.jit(cv.grad(negate))):
        assert float(fn(3.0)) == -1.0
    np.testing.assert_allclose(cv.vmap(cv.grad(negate))(X), -np.ones(3))
    assert float(cv.grad(cv.grad(lambda x: negate(x) * x))(2.0)) == -2.0
    _, pullback = cv.vjp(lambda x: divide(x, 2.0), 1.0)
    assert float(pullback(1.0)[0]) == 0.5
    assert float(cv.grad(lambda y: divide(1.0, y))(2.0)) == 0.0  # the rule says so
    scanned = lambda x: lax.scan(lambda c, _: (negate(c), None), x, None, length=3)[0]
    assert float(cv.grad(scanned)(3.0)) == -1.0
    assert float(cv.grad(cv.checkpoint(scanned, policy=cv.checkpoint_policies.nothing_saveable))(3.0)) == -1.0


# ---------------------------------------------------------------------------------------
# custom_gradient, closure_convert
# ---------------------------------------------------------------------------------------


@custom_gradient
def sin_with_doubled_gradient(x):
    """sin(x), with gradient 2·cos(x)"""
    return cnp.sin(x), lambda g: g * 2.0 * cnp.cos(x)


def test_custom_gradient_uses_the_returned_vjp_under_every_transform():
    want = 2.0 * np.cos(X)
    assert sin_with_doubled_gradient.__name__ == "sin_with_doubled_gradient"
    np.testing.assert_allclose(sin_with_doubled_gradient(X), np.sin(X))
    for fn in (cv.grad(lambda x: cnp.sum(sin_with_doubled_gradient(x))),
               cv.jit(cv.grad(lambda x: cnp.sum(sin_with_doubled_gradient(x)))),
               cv.grad(cv.jit(lambda x: cnp.sum(sin_with_doubled_gradient(x)))),
               cv.vmap(cv.grad(sin_with_doubled_gradient)), cv.jit(cv.vmap(cv.grad(sin_with_doubled_gradient)))):
        np.testing.assert_allclose(fn(X), want, rtol=1e-12)
    with pytest.raises(CustomDerivativeError, match="forward-mode"):
        cv.jvp(sin_with_doubled_gradient, (X,), (X,))


def test_custom_gradient_of_several_arguments_and_a_bad_return():
    @custom_gradient
    def mul(x, y):
        return x * y, lambda g: (g * y, g * x * 10.0)

    gx, gy = cv.grad(mul, argnums=(0, 1))(2.0, 3.0)
    assert (float(gx), float(gy)) == (3.0, 20.0)

    @custom_gradient
    def bad(x):
        return x

    with pytest.raises(CustomDerivativeError, match=r"must return a pair \(output, vjp\)"):
        bad(1.0)


def test_closure_convert_hoists_the_traced_values_a_function_closes_over():
    """d/dw of converted(2, *consts) with the closure x·w is 2."""
    def outer(w):
        f = lambda x: x * w + 1.0
        converted, consts = closure_convert(f, 1.0)
        assert len(consts) == (1 if isinstance(w, cv.core.Tracer) else 0)  # only traced values are hoisted
        return converted(2.0, *consts)

    assert float(outer(3.0)) == 7.0
    for fn in (cv.grad(outer), cv.jit(cv.grad(outer)), cv.grad(cv.jit(outer))):
        assert float(fn(3.0)) == 2.0
    converted, consts = closure_convert(lambda x: x * 3.0, 1.0)
    assert consts == [] and float(converted(2.0)) == 6.0
    with pytest.raises(TypeError, match="same pytree structure as the example arguments"):
        converted((1.0, 2.0))


def test_closure_convert_with_a_custom_vjp_nondiff_function():
    """JAX's documented use: a function argument among nondiff_argnums, its closure's
    traced values as differentiable arguments. f(x) = Σ (x·w)² ⇒ ∂/∂w = Σ 2·x²·w."""
    @functools.partial(custom_vjp, nondiff_argnums=(0,))
    def apply(fn, x, *consts):
        return fn(x, *consts)

    def fwd(fn, x, *consts):
        out, pullback = cv.vjp(fn, x, *consts)
        return out, pullback

    def bwd(fn, pullback, ct):
        return pullback(ct)

    apply.defvjp(fwd, bwd)

    def loss(w):
        fn = lambda x: cnp.sum((x * w) ** 2)
        converted, consts = closure_convert(fn, X)
        return apply(converted, X, *consts)

    np.testing.assert_allclose(cv.grad(loss)(1.5), np.sum(2 * X ** 2 * 1.5), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# checkpoint_name and the name policies
# ---------------------------------------------------------------------------------------


def _named_layer(x):
    h = cv.checkpoint_name(cnp.sin(x), "h")
    return cnp.sum(cnp.sin(h) * 2.0)


def _count_sin(monkeypatch):
    counts = {"sin": 0}
    original = elementwise.sin_p.impl

    def counted(*args, **kwargs):
        counts["sin"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(elementwise.sin_p, "impl", counted)
    return counts


P = cv.checkpoint_policies


@pytest.mark.parametrize("policy, sins", [
    (None, 3),                                             # sin(x) computed again in the backward pass
    (P.save_only_these_names("h"), 2),                     # h kept
    (P.save_only_these_names("other"), 3),
    (P.save_any_names_but_these("h"), 3),
    (P.save_any_names_but_these("other"), 2),
    (P.save_anything_except_these_names("h"), 2),        # sin(x) itself is kept; h is recomputed from it
    (P.save_from_both_policies(P.dots_saveable, P.save_only_these_names("h")), 2),
])
def test_name_policies_keep_the_named_values(monkeypatch, policy, sins):
    """d/dx Σ 2·sin(sin(x)) = 2·cos(sin(x))·cos(x), the same whatever is saved; the count
    of sin evaluations says what was recomputed."""
    want = 2.0 * np.cos(np.sin(X)) * np.cos(X)
    counts = _count_sin(monkeypatch)
    np.testing.assert_allclose(cv.grad(cv.checkpoint(_named_layer, policy=policy))(X), want, rtol=1e-12)
    assert counts["sin"] == sins
    np.testing.assert_allclose(cv.jit(cv.grad(cv.checkpoint(_named_layer, policy=policy)))(X), want, rtol=1e-12)
    np.testing.assert_allclose(cv.vmap(cv.grad(cv.checkpoint(_named_layer, policy=policy)))(X[:, None]),
                               want[:, None], rtol=1e-12)


def test_checkpoint_name_is_the_identity_under_every_transform():
    f = lambda x: cnp.sum(cv.checkpoint_name({"a": x * x}, "sq")["a"])
    np.testing.assert_allclose(cv.grad(f)(X), 2 * X)
    np.testing.assert_allclose(cv.jvp(f, (X,), (np.ones(3),))[1], np.sum(2 * X))
    np.testing.assert_allclose(cv.vmap(cv.grad(f))(X[:, None]), 2 * X[:, None])
    assert "name[name='sq']" in str(cv.make_jaxpr(f)(X))
    with pytest.raises(TypeError, match="name must be a string"):
        cv.checkpoint_name(X, 3)
    check_grads(f, (X,), order=2)


def test_checkpoint_static_argnums_and_prevent_cse():
    f = cv.checkpoint(lambda x, n: cnp.sum(cnp.sin(x) ** n), prevent_cse=False, static_argnums=(1,))
    np.testing.assert_allclose(cv.grad(f)(X, 3), 3 * np.sin(X) ** 2 * np.cos(X), rtol=1e-12)
    g = cv.remat(lambda x: cnp.sum(cnp.sin(x)), prevent_cse=True, policy=P.checkpoint_dots)
    np.testing.assert_allclose(cv.jit(cv.grad(g))(X), np.cos(X), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# bfloat16 (ml_dtypes): refused by name until the transforms compute with it
# ---------------------------------------------------------------------------------------


def test_bfloat16_is_named_only_when_ml_dtypes_is_installed():
    try:
        import ml_dtypes
    except ImportError:
        assert not cv.dtypes.has_bfloat16() and not hasattr(cnp, "bfloat16")
    else:
        assert cnp.bfloat16 is ml_dtypes.bfloat16 is cv.dtypes.bfloat16


def test_float8_inputs_are_refused_by_name():
    """ml_dtypes' types other than bfloat16 (which computes: tests/numpy/test_bfloat16.py)
    have no rules in cuvmap: every transform and eager primitive refuses them by name."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.ones(3, ml_dtypes.float8_e4m3fn)
    for call in (lambda: cv.grad(lambda x: cnp.sum(x))(x), lambda: cv.vjp(cnp.sin, x),
                 lambda: cv.jvp(cnp.sin, (x,), (x,)), lambda: cv.vmap(cnp.sin)(x), lambda: cv.jit(cnp.sin)(x),
                 lambda: cnp.sin(x), lambda: cnp.add(x, 1.0)):
        with pytest.raises(TypeError, match="dtype float8_e4m3fn, which cuvmap.* not support yet"):
            call()
    np.testing.assert_array_equal(cnp.sin(x.astype(np.float32)), np.sin(np.ones(3, np.float32)))


class _FakeBfloat16Array:
    """An operand whose dtype is of the kind ml_dtypes' types have (``"V"``, no fields),
    for the refusal without ml_dtypes installed."""

    shape = (3,)
    dtype = np.dtype("V2")


def test_an_ml_dtypes_kind_of_dtype_is_refused_without_ml_dtypes():
    with pytest.raises(TypeError, match=r"argument 0 \(x\) has dtype void16, which cuvmap's transforms do not support"):
        cv.grad(lambda x: x)(_FakeBfloat16Array())
    with pytest.raises(TypeError, match="dtype void16, which cuvmap does not support yet"):
        cnp.sin(np.zeros(3, np.dtype("V2")))
    # float0 (a structured void dtype) is not refused: it is the gradient of an integer
    assert cv.dtypes.unsupported_dtype(np.zeros(2, cv.float0)) is None


def test_casts_to_and_constants_of_ml_dtypes_kinds_are_refused_by_name():
    """A cast to one of ml_dtypes' types cuvmap does not compute with (float8, int4) inside
    a differentiated function gave a silent zero derivative and a captured constant of one
    crashed staging: both raise naming the dtype (V2 stands in where ml_dtypes is not
    installed)."""
    kinds = [np.dtype("V2")]
    try:
        import ml_dtypes
        kinds += [np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.int4)]
    except ImportError:
        pass
    x = np.ones(3, np.float32)
    for dtype in kinds:
        name = dtype.name
        for call in (lambda: cv.grad(lambda x: cnp.sum(lax.convert_element_type(x, dtype).astype(np.float32)))(x),
                     lambda: cv.jit(lambda x: lax.convert_element_type(x, dtype))(x),
                     lambda: lax.convert_element_type(x, dtype)):
            with pytest.raises(TypeError, match=f"convert_element_type: a cast to {name}, which cuvmap"):
                call()
        const = np.zeros(3, dtype)
        with pytest.raises(TypeError, match=f"closes over has dtype {name}, which cuvmap's transforms do not support"):
            cv.jit(lambda x: x * const)(x)
