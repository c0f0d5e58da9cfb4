"""Control flow as JAX takes it (issue 32 item 4): ``scan(unroll=)`` that really unrolls,
``fori_loop(unroll=)`` and its bounds, ``cond`` with a numeric predicate and JAX's other
call forms, ``switch``'s clamping, forwarded operands and read-only carries under
``vmap(out_axes=None)``; and JAX's refusals (item 7): non-array outputs, ``has_aux``
misuse. References are Python loops and finite differences (float64)."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.lax.control_flow import ControlFlowError
from cuvmap.lax.control_flow.scan import _unrolled
from cuvmap.test_util import check_grads

RNG = np.random.default_rng(0)
W = RNG.normal(size=(3, 3)) * 0.5
XS = RNG.normal(size=(7, 3))
H0 = RNG.normal(size=3)


def _step(h, x):
    h = cnp.tanh(h @ W + x)
    return h, (h * 2.0, h.sum())


def _reference(h, xs, reverse):
    ys1, ys2 = [None] * len(xs), [None] * len(xs)
    for i in (range(len(xs) - 1, -1, -1) if reverse else range(len(xs))):
        h = np.tanh(h @ W + xs[i])
        ys1[i], ys2[i] = h * 2.0, h.sum()
    return h, np.stack(ys1), np.array(ys2)


UNROLLS = [0, 1, 2, 3, 6, 7, 9, True, False]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("unroll", UNROLLS)
def test_scan_unroll_matches_a_python_loop_eagerly_and_under_jit(unroll, reverse):
    ref = _reference(H0, XS, reverse)
    for run in (lax.scan, cv.jit(lax.scan, static_argnums=(0,), static_argnames=("reverse", "unroll"))):
        c, (y1, y2) = run(_step, H0, XS, reverse=reverse, unroll=unroll)
        np.testing.assert_allclose(c, ref[0], rtol=1e-12)
        np.testing.assert_allclose(y1, ref[1], rtol=1e-12)
        np.testing.assert_allclose(y2, ref[2], rtol=1e-12)


@pytest.mark.parametrize("unroll", [0, 3, True])
def test_scan_unroll_derivatives_and_vmap(unroll):
    def f(h, xs):
        c, (y1, y2) = lax.scan(_step, h, xs, unroll=unroll, reverse=True)
        return c.sum() + (y1 ** 2).sum() + y2.sum()

    check_grads(f, (H0, XS), order=2, modes=("fwd", "rev"))
    hs = RNG.normal(size=(4, 3))
    got = cv.vmap(lambda h: lax.scan(_step, h, XS, unroll=unroll)[0])(hs)
    np.testing.assert_allclose(got, np.stack([_reference(h, XS, False)[0] for h in hs]), rtol=1e-12)
    xss = RNG.normal(size=(2, 7, 3))
    got = cv.vmap(lambda xs: lax.scan(_step, H0, xs, unroll=unroll)[1][0], in_axes=0)(xss)
    np.testing.assert_allclose(got, np.stack([_reference(H0, xs, False)[1] for xs in xss]), rtol=1e-12)


def test_scan_unroll_stages_k_steps_into_one_program():
    """The block program holds the body k times (not one step run k times)."""
    calls = []

    def step(c, x):
        calls.append(1)
        return c * x + 1.0, c

    xs = np.arange(1.0, 8.0)
    lax.scan(step, 0.5, xs, unroll=3)
    program = None

    def spy(c, x):
        return step(c, x)

    closed = cv.make_jaxpr(lambda c, xs: lax.scan(spy, c, xs, unroll=3))(0.5, xs)
    eqn = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"][0]
    program = eqn.params["program"]
    assert eqn.params["unroll"] == 3
    block, _ = _unrolled(program, eqn.params["num_consts"], eqn.params["num_carry"], 3, False)
    body_ops = [e.primitive.name for e in program.jaxpr.eqns]
    block_ops = [e.primitive.name for e in block.jaxpr.eqns]
    assert sorted(block_ops) == sorted(body_ops * 3)
    assert len(block.jaxpr.invars) == len(program.jaxpr.invars) + 2  # 3 rows of x instead of 1


def test_scan_unroll_checks_its_argument():
    with pytest.raises(ControlFlowError, match=r"unroll must be a non-negative int or a bool .*, got -1"):
        lax.scan(_step, H0, XS, unroll=-1)
    with pytest.raises(ControlFlowError, match=r"unroll must be a non-negative int or a bool .*, got 1.5"):
        lax.scan(_step, H0, XS, unroll=1.5)
    with pytest.raises(ValueError, match="`unroll` must be a `bool` or a non-negative `int`"):
        lax.scan(_step, H0, XS, unroll=-2)
    with pytest.raises(ValueError, match="no leading axis to scan over"):
        lax.scan(_step, H0, (XS, 1.0))
    with pytest.raises(ValueError, match="xs has 7 entries along its leading axis, but length 5"):
        lax.scan(_step, H0, XS, length=5)
    c, _ = lax.scan(_step, H0, XS[:0], unroll=4)  # an empty scan
    np.testing.assert_array_equal(c, H0)


def test_a_scan_whose_body_does_nothing_runs():
    """JAX's test_xla_cpu_gpu_loop_cond_bug: a scan body with no steps, xs, ys or moving
    carries once generated a loop with an empty ``for`` (an IndentationError)."""
    def my_pow(x, n):
        def fun(state, _):
            val, keep = state
            return lax.cond(keep, lambda v: (v * x, True), lambda v: (v, False), val), None

        return lax.scan(fun, (1.0, True), None, length=n)[0][0]

    tangent = cv.linearize(lambda x: my_pow(x, 1), 3.0)[1](1.0)
    np.testing.assert_allclose(tangent, 1.0)
    np.testing.assert_allclose(lax.scan(lambda c, _: (c, None), 2.0, None, length=3)[0], 2.0)


# ---------------------------------------------------------------------------------------
# fori_loop
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("unroll", [None, 1, 2, 3, True, False])
def test_fori_loop_unroll(unroll):
    def body(i, c):
        return c * 0.5 + i

    ref = 1.0
    for i in range(2, 9):
        ref = ref * 0.5 + i
    np.testing.assert_allclose(lax.fori_loop(2, 9, body, 1.0, unroll=unroll), ref)
    np.testing.assert_allclose(lax.fori_loop(np.int16(2), 9, body, 1.0, unroll=unroll), ref)
    assert float(lax.fori_loop(0, -1, body, 10.0, unroll=unroll)) == 10.0
    check_grads(lambda c: lax.fori_loop(2, 9, lambda i, c: cnp.sin(c) * 0.8 + 0.1 * i, c, unroll=unroll), (0.3,), order=2)


def test_fori_loop_with_float_bounds_under_grad_counts_their_int():
    """As JAX: bounds whose values are known (floats, values under grad) count as int();
    no derivative flows to them."""
    f = lambda x: lax.fori_loop(x, x + 2.0, lambda i, c: c * 2.0, x)  # noqa: E731
    assert float(f(1.0)) == 4.0
    np.testing.assert_allclose(cv.grad(f)(1.0), 4.0)
    np.testing.assert_allclose(cv.linearize(f, 1.0)[1](1.0), 4.0)
    np.testing.assert_allclose(cv.jvp(f, (1.5,), (1.0,))[1], 4.0)
    np.testing.assert_allclose(lax.fori_loop(0.0, 3.7, lambda i, c: c + i, 0), 0 + 1 + 2)


def test_fori_loop_with_traced_bounds_is_a_while_loop():
    f = cv.jit(lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 1.5 + i, x))
    ref = 2.0
    for i in range(5):
        ref = ref * 1.5 + i
    np.testing.assert_allclose(f(5, 2.0), ref)
    np.testing.assert_allclose(cv.vmap(lambda n: lax.fori_loop(0, n, lambda i, c: c + 1.0, 0.0))(np.arange(4)),
                               np.arange(4.0))
    with pytest.raises(ValueError, match=r"Can only use `unroll` in `fori_loop` if the loop bounds are statically"):
        cv.jit(lambda n: lax.fori_loop(0, n, lambda i, c: c + 1.0, 0.0, unroll=3))(4)
    with pytest.raises(ValueError, match=r"Reverse-mode differentiation does not work for lax.while_loop"):
        cv.grad(lambda x: lax.cond(True, lambda x, _: lax.fori_loop(x, x + 2.0, lambda i, c: c * 2.0, x),
                                   lambda _, x: x, x, 1.0))(1.0)


def test_fori_loop_bounds_must_agree_in_dtype():
    with pytest.raises(TypeError, match=r"lower and upper arguments to fori_loop must have equal types, got int16 "
                                        r"and int32"):
        lax.fori_loop(np.int16(0), np.int32(10), lambda i, c: c, 7.0)
    with pytest.raises(ControlFlowError, match=r"fori_loop\(<lambda>\): upper must be a real scalar"):
        lax.fori_loop(0, np.ones(2), lambda i, c: c, 7.0)


# ---------------------------------------------------------------------------------------
# cond and switch
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pred, taken", [(2.5, True), (0.0, False), (-1, True), (0, False), (np.float32(1e-30), True),
                                         (np.uint8(0), False), (np.nan, True)])
def test_cond_takes_a_number_as_jax_does(pred, taken):
    got = lax.cond(pred, lambda x: x + 1.0, lambda x: x - 1.0, 1.0)
    assert float(got) == (2.0 if taken else 0.0)
    got = cv.jit(lambda p, x: lax.cond(p, lambda x: x + 1.0, lambda x: x - 1.0, x))(pred, 1.0)
    assert float(got) == (2.0 if taken else 0.0)


def test_cond_numeric_predicate_under_vmap_and_grad():
    preds, xs = np.array([0.0, 2.0, -0.5]), np.array([1.0, 2.0, 3.0])
    f = lambda p, x: lax.cond(p, lambda x: cnp.sin(x), lambda x: x ** 2, x)  # noqa: E731
    np.testing.assert_allclose(cv.vmap(f)(preds, xs), [1.0, np.sin(2.0), np.sin(3.0)])
    np.testing.assert_allclose(cv.vmap(cv.grad(f, argnums=1))(preds, xs), [2.0, np.cos(2.0), np.cos(3.0)])
    check_grads(lambda x: f(0.7, x), (0.4,), order=2)


def test_cond_call_forms_jax_accepts():
    np.testing.assert_allclose(lax.cond(True, lambda x: x * 2.0, lambda x: x, operand=3.0), 6.0)
    # the deprecated cond(pred, true_operand, true_fun, false_operand, false_fun)
    np.testing.assert_allclose(lax.cond(True, 1.0, lambda x: x + 1.0, 2.0, lambda x: x - 1.0), 2.0)
    np.testing.assert_allclose(lax.cond(False, 1.0, lambda x: x + 1.0, 2.0, lambda x: x - 1.0), 1.0)
    np.testing.assert_allclose(lax.switch(1, [lambda x: x, lambda x: -x], operand=3.0), -3.0)
    with pytest.raises(TypeError, match="if 'operand' keyword is passed then no positional operands"):
        lax.cond(True, lambda x: x, lambda x: x, 1.0, operand=2.0)


@pytest.mark.parametrize("bad, match", [(None, "cond predicate is None"),
                                        ("yes", "Pred must be a scalar, got yes of type <class 'str'>"),
                                        ((1.0, 1.0), r"Pred must be a scalar, got \(1.0, 1.0\) of type <class 'tuple'>"),
                                        (np.ones(2), r"pred must be a scalar \(a boolean or a number\), got float64\[2\]"),
                                        (1j, r"Pred type must be either boolean or number, got complex128\[\]")])
def test_cond_refuses_what_jax_refuses(bad, match):
    with pytest.raises(TypeError, match=match):
        lax.cond(bad, lambda x: x, lambda x: x, 1.0)


@pytest.mark.parametrize("index, expected", [(-5, 0), (-1, 0), (0, 0), (1, 1), (2, 2), (3, 2), (100, 2)])
def test_switch_clamps_its_index(index, expected):
    branches = [lambda x: x, lambda x: x * 10.0, lambda x: x * 100.0]
    assert float(lax.switch(index, branches, 1.0)) == 10.0 ** expected
    assert float(cv.jit(lambda i: lax.switch(i, branches, 1.0))(index)) == 10.0 ** expected
    got = cv.vmap(lambda i: lax.switch(i, branches, 1.0))(np.array([index, 1]))
    np.testing.assert_allclose(got, [10.0 ** expected, 10.0])


# ---------------------------------------------------------------------------------------
# Forwarded operands and read-only carries (NOTE [forwarded operands])
# ---------------------------------------------------------------------------------------


def test_a_forwarded_cond_operand_stays_unbatched():
    def f(x, y):
        return lax.cond(x < 3, lambda x, y: (x * 2, y), lambda x, y: (x * 3, y), x, y)

    x, y = np.arange(5), np.array(3.0)
    x2, y2 = cv.vmap(f, in_axes=(0, None), out_axes=(0, None))(x, y)
    np.testing.assert_array_equal(x2, [0, 2, 4, 9, 12])
    assert float(y2) == 3.0
    # the same under jit and grad
    g = cv.grad(lambda y: cv.vmap(f, in_axes=(0, None), out_axes=(0, None))(x, y)[1])(2.0)
    assert float(g) == 1.0


def test_read_only_carries_of_scan_and_while_stay_unbatched():
    def foo(w, x, c_max):
        def body(val):
            c, x, w = val
            return c + 1, x @ w, w

        _, x, w = lax.while_loop(lambda v: v[0] < c_max, body, (0, x, w))
        return w, x

    w, xs = RNG.normal(size=(2, 2)), RNG.normal(size=(4, 2))
    w_, x_ = cv.vmap(foo, in_axes=(None, 0, 0), out_axes=(None, 0))(w, xs, np.arange(4))
    np.testing.assert_array_equal(w_, w)
    np.testing.assert_allclose(x_, [xs[k] @ np.linalg.matrix_power(w, k) for k in range(4)], rtol=1e-12)

    def f(x, y):
        def g(_, y):
            return lax.scan(lambda y, _: (y, None), y, None, length=1)[0]

        return lax.cond(x < 0, g, g, x, y)

    assert float(cv.vmap(f, (0, None), None)(np.arange(3.0), 3.0)) == 3.0


def test_a_read_only_carry_differentiates_as_a_constant():
    def rnn(w, h, xs):
        def step(carry, x):
            w, h = carry
            h = cnp.tanh(h @ w + x)
            return (w, h), h

        (w_out, h), hs = lax.scan(step, (w, h), xs)
        return h.sum() + hs.sum() + (w_out ** 2).sum()

    check_grads(rnn, (W, H0, XS), order=2, modes=("fwd", "rev"))


# ---------------------------------------------------------------------------------------
# JAX's refusals (issue 32 item 7)
# ---------------------------------------------------------------------------------------

TRANSFORMS = {
    "vmap": lambda f: cv.vmap(f)(np.ones(3)),
    "grad": lambda f: cv.grad(f)(1.0),
    "jit": lambda f: cv.jit(f)(1.0),
    "jvp": lambda f: cv.jvp(f, (1.0,), (1.0,)),
    "vjp": lambda f: cv.vjp(f, 1.0),
    "linearize": lambda f: cv.linearize(f, 1.0),
    "jacfwd": lambda f: cv.jacfwd(f)(np.ones(2)),
    "jacrev": lambda f: cv.jacrev(f)(np.ones(2)),
}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
@pytest.mark.parametrize("out, what", [("hi", r"the output is str \('hi'\)"),
                                       ((1.0, object()), r"output \[1\] is object"),
                                       ({"a": np.array(["x"])}, r"output \['a'\] is an array of dtype <U1")])
def test_a_non_array_output_is_a_type_error_naming_function_and_output(transform, out, what):
    def returns_junk(x):
        return out

    with pytest.raises(TypeError, match=rf"{transform}\(returns_junk\): Output from .*returns_junk: {what}.*is not "
                                        "a valid JAX type") as info:
        TRANSFORMS[transform](returns_junk)
    assert isinstance(info.value, cv.OutputTypeError)


def test_none_and_empty_outputs_stay_allowed():
    assert cv.vmap(lambda x: None)(np.ones(3)) is None
    assert cv.jit(lambda x: ())(1.0) == ()


@pytest.mark.parametrize("out", [lambda x: (1.0, 2.0, 3.0), lambda x: x, lambda x: (x,)])
def test_has_aux_without_a_pair_is_a_type_error(out):
    with pytest.raises(TypeError, match="two-element tuple"):
        cv.grad(out, has_aux=True)(1.0)
    with pytest.raises(cv.AuxOutputError):
        cv.vjp(out, 1.0, has_aux=True)


def test_an_escaped_tracer_names_jax_error():
    leaked = []

    def keep(x):
        leaked.append(x)
        return x

    cv.jit(keep)(1.0)
    with pytest.raises(cv.EscapedTracerError, match="Encountered an unexpected tracer"):
        cnp.sin(leaked[0])
