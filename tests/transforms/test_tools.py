"""The tools JAX users reach for around transforms (issue 26): ``named_scope``;
``debug.print`` / ``debug.callback`` under every transform (NOTE [debug callbacks] in
cuvmap/lax/callbacks.py); ``pure_callback``; ``custom_batching.custom_vmap`` /
``sequential_vmap``; ``eval_shape`` and ``ShapeDtypeStruct`` (in ``jit(...).lower/.trace/
.eval_shape`` too, without array work, with JAX's weak types); and effects kept inside
programs (debug callbacks in a dead ``cond`` or an inner ``jit``, never merged, folded or
dropped by the optimizer).

References: closed forms written out here (NumPy); the printed lines, closed forms of the
inputs (what one call per run, per example, per step must print); the host calls a
callback receives (their shapes, counted); the scopes written out by hand; eval_shape's
results against the shapes of the same functions run on arrays; and the counted NumPy
calls and primitive impls for "no array work"."""
import collections
import threading
import types

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import core, lax
from cuvmap.custom_batching import CustomVmapError
from cuvmap.lax import callbacks as lax_callbacks
from cuvmap.nn import layers

S = cv.ShapeDtypeStruct
X = np.array([0.25, 0.5, 1.0])
Y = np.array([1.0, 2.0, 3.0])
XS = np.array([[0.25, 0.5, 1.0], [1.5, 2.0, 2.5]])
YS = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])


# ---------------------------------------------------------------------------------------
# named_scope
# ---------------------------------------------------------------------------------------


@cv.named_scope("dense")
def _dense(w, x):
    return cnp.tanh(x @ w)


def _loss(w, x):
    h = x * 2.0  # outside every scope
    with cv.named_scope("loss"):
        return cnp.sum(_dense(w, h) ** 2)


W = np.ones((3, 4)) / 4
_FORWARD = [("mul", ""), ("dot_general", "loss/dense"), ("tanh", "loss/dense"), ("integer_pow", "loss"),
            ("reduce_sum", "loss")]
_JITTED_LOSS = cv.jit(_loss)


def _in_outer(w, x):
    with cv.named_scope("outer"):
        return _JITTED_LOSS(w, x)


def _scopes(closed):
    return [(e.primitive.name, "/".join(e.name_stack)) for e in closed.jaxpr.eqns]


# name: (the program, its equations' (primitive, scope) in order, or a check of them)
NAMED_SCOPES = {
    "f": (lambda: cv.make_jaxpr(_loss)(W, X), _FORWARD),
    "jit(f).lower: the optimized program keeps them": (lambda: _JITTED_LOSS.lower(W, X).program, _FORWARD),
    "inlined jitted f under an outer scope": (
        lambda: cv.make_jaxpr(_in_outer)(W, X),
        [(p, "outer/" + s if s else "outer") for p, s in _FORWARD]),
    "vmap(f)": (lambda: cv.make_jaxpr(cv.vmap(_loss, in_axes=(None, 0)))(W, XS),
                lambda eqns: [e for e in eqns if e[0] in ("tanh", "integer_pow")] == [("tanh", "loss/dense"),
                                                                                        ("integer_pow", "loss")]),
    "jvp(f): primal and tangent equations in the scope": (
        lambda: cv.make_jaxpr(lambda x, t: cv.jvp(lambda x: _loss(W, x), (x,), (t,)))(X, Y),
        lambda eqns: eqns[:2] == [("mul", ""), ("mul", "")] and {s for p, s in eqns if p == "tanh"} == {"loss/dense"}
        and {s for p, s in eqns[2:]} <= {"loss", "loss/dense"}),
    "grad(f): the backward pass under transpose(scope)": (
        lambda: cv.make_jaxpr(cv.grad(_loss))(W, X),
        lambda eqns: eqns[:5] == _FORWARD
        and {s for _, s in eqns[5:]} == {"transpose(loss)", "transpose(loss/dense)"}
        and ("dot_general", "transpose(loss/dense)") in eqns[5:]
        and all(s == "transpose(loss/dense)" for p, s in eqns[5:] if p in ("dot_general", "transpose"))),
    "vmap(grad(jit(f))): derived programs keep them": (
        lambda: cv.make_jaxpr(cv.vmap(cv.grad(_JITTED_LOSS), in_axes=(None, 0)))(W, XS),
        lambda eqns: ("tanh", "loss/dense") in eqns and ("dot_general", "transpose(loss/dense)") in eqns),
    "a scope outside make_jaxpr is not part of the program": (
        lambda: _with_scope("ignored", lambda: cv.make_jaxpr(_loss)(W, X)), _FORWARD),
}


def _with_scope(name, run):
    with cv.named_scope(name):
        return run()


@pytest.mark.parametrize("name", NAMED_SCOPES)
def test_named_scopes_are_kept_on_staged_equations(name):
    make, want = NAMED_SCOPES[name]
    closed = make()
    eqns = _scopes(closed)
    assert (want(eqns) if callable(want) else eqns == want), eqns
    text = str(closed).splitlines()
    for line, (_, scope) in zip(text[1:], eqns):  # the text shows each equation's scope
        assert line.endswith(f"  # [{scope}]") if scope else "#" not in line, line


def test_named_scope_changes_no_value_and_nests_as_decorator_and_context():
    want_grad = cv.grad(lambda w, x: cnp.sum(cnp.tanh((x * 2.0) @ w) ** 2))(W, X)
    assert np.allclose(cv.jit(cv.grad(_loss))(W, X), want_grad, rtol=1e-14, atol=0)
    assert np.allclose(_loss(W, X), np.sum(np.tanh((X * 2.0) @ W) ** 2), rtol=1e-14, atol=0)

    @cv.named_scope("a")
    def f(x):
        with cv.named_scope("b"), cv.named_scope("c"):
            y = cnp.sin(x)
        return cnp.cos(y)

    assert _scopes(cv.make_jaxpr(f)(X)) == [("sin", "a/b/c"), ("cos", "a")]
    assert core.name_stack() == ()


def test_named_scope_restores_the_stack_after_an_error_and_is_per_thread():
    with pytest.raises(ZeroDivisionError), cv.named_scope("broken"):
        1 / 0
    assert core.name_stack() == ()
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["other"] = _scopes(cv.make_jaxpr(cnp.sin)(X))
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with cv.named_scope("mine"):
        inside.set()
        done.wait()
        seen["mine"] = _scopes(cv.make_jaxpr(lambda x: _with_scope("s", lambda: cnp.sin(x)))(X))
    t.join()
    assert seen == {"other": [("sin", "")], "mine": [("sin", "s")]}


def test_named_scope_name_must_be_a_string():
    with pytest.raises(TypeError, match="named_scope: name must be a str"):
        with cv.named_scope(3):
            pass


# ---------------------------------------------------------------------------------------
# debug.print and debug.callback under every transform
# ---------------------------------------------------------------------------------------


def printing(x):
    cv.debug.print("x={x} s={s}", x=x, s=cnp.sum(x))
    return cnp.sum(cnp.sin(x))


def _line(x):
    return f"x={x} s={np.sum(x)}"


# name: (run it, the lines it prints)
DEBUG_PRINT = {
    "eager": (lambda: printing(X), [_line(X)]),
    "jit, two calls": (lambda: [cv.jit(printing)(v) for v in (X, X + 1)], [_line(X), _line(X + 1)]),
    "grad: the primal": (lambda: cv.grad(printing)(X), [_line(X)]),
    "jvp": (lambda: cv.jvp(printing, (X,), (np.ones(3),)), [_line(X)]),
    "vmap: each example in order": (lambda: cv.vmap(printing)(XS), [_line(XS[0]), _line(XS[1])]),
    "jit(vmap)": (lambda: cv.jit(cv.vmap(printing))(XS), [_line(XS[0]), _line(XS[1])]),
    "vmap(grad)": (lambda: cv.vmap(cv.grad(printing))(XS), [_line(XS[0]), _line(XS[1])]),
    "jit(grad)": (lambda: cv.jit(cv.grad(printing))(X), [_line(X)]),
    "grad(jit)": (lambda: cv.grad(cv.jit(printing))(X), [_line(X)]),
    "scan: each step": (
        lambda: cv.jit(lambda xs: lax.scan(lambda c, x: (printing(x) + c, None), 0.0, xs))(XS),
        [_line(XS[0]), _line(XS[1])]),
    "while_loop": (
        lambda: lax.while_loop(lambda c: c < 3, lambda c: (cv.debug.print("c={}", c), c + 1)[1], 0),
        ["c=0", "c=1", "c=2"]),
    "cond: the branch taken": (
        lambda: cv.jit(lambda p, x: lax.cond(p, printing, lambda x: cnp.sum(x), x))(True, X), [_line(X)]),
    "eval_shape: nothing runs": (lambda: cv.eval_shape(printing, X), []),
}


@pytest.mark.parametrize("name", DEBUG_PRINT)
def test_debug_print_runs_with_the_values_whatever_the_transform(name, capsys):
    run, lines = DEBUG_PRINT[name]
    run()
    assert capsys.readouterr().out.splitlines() == lines


def test_a_jitted_debug_print_runs_on_every_call_and_never_while_tracing(capsys):
    jf = cv.jit(printing)
    cv.make_jaxpr(printing)(X)  # staging alone prints nothing
    assert capsys.readouterr().out == ""
    for _ in range(3):
        jf(X)
    assert capsys.readouterr().out.splitlines() == [_line(X)] * 3 and jf.trace_count == 1


def test_debug_callback_gets_arrays_and_the_static_leaves():
    got = []
    cv.jit(lambda x: (cv.debug.callback(lambda a, b=None, *, note: got.append((type(a), a.shape, b, note)),
                                        {"w": x}["w"], None, note="n"), x)[1])(X)
    assert got == [(np.ndarray, (3,), None, "n")]


@pytest.mark.parametrize("bad, message", [(lambda: cv.debug.print(3, X), "fmt must be a str"),
                                          (lambda: cv.debug.callback("f", X), "fn must be callable")])
def test_debug_errors(bad, message):
    with pytest.raises(TypeError, match=message):
        bad()


# ---------------------------------------------------------------------------------------
# pure_callback
# ---------------------------------------------------------------------------------------


class Host:
    """A host function that records the shapes it was called with."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []
        self.__name__ = fn.__name__

    def __call__(self, *args, **kwargs):
        self.calls.append(tuple(np.shape(a) for a in cv.tree.leaves(args)))
        return self.fn(*args, **kwargs)


def _sinc_mul(x, y):
    return np.sinc(x) * y


def _sinc_mul_batched(x, y):  # expand_dims/broadcast_all: leading batch dims on both
    return np.sinc(x) * y


def _call(host, method=None):
    def f(x, y):
        return cv.pure_callback(host, S(np.broadcast_shapes(x.shape, y.shape), x.dtype), x, y,
                                vmap_method=method) * 2.0
    return f


def _ref(x, y):
    return np.sinc(x) * y * 2.0


# name: (host, run(host) -> result, expected result, the shapes of the host's calls)
PURE_CALLBACK = {
    "eager": (_sinc_mul, lambda h: _call(h)(X, Y), _ref(X, Y), [((3,), (3,))]),
    "jit: every call runs it": (_sinc_mul, lambda h: [cv.jit(_call(h))(X, Y), cv.jit(_call(h))(X, Y)][1],
                                _ref(X, Y), [((3,), (3,))] * 2),
    "vmap sequential: one call per example": (
        _sinc_mul, lambda h: cv.vmap(_call(h, "sequential"))(XS, YS), _ref(XS, YS), [((3,), (3,))] * 2),
    "vmap expand_dims, one operand batched": (
        _sinc_mul_batched, lambda h: cv.vmap(_call(h, "expand_dims"), in_axes=(0, None))(XS, Y), _ref(XS, Y),
        [((2, 3), (1, 3))]),
    "vmap broadcast_all, one operand batched": (
        _sinc_mul_batched, lambda h: cv.vmap(_call(h, "broadcast_all"), in_axes=(None, 0))(X, YS), _ref(X, YS),
        [((2, 3), (2, 3))]),
    "vmap expand_dims, batch dim 1 moved to the front": (
        _sinc_mul_batched, lambda h: cv.vmap(_call(h, "expand_dims"), in_axes=(1, 1), out_axes=1)(XS.T, YS.T),
        _ref(XS, YS).T, [((2, 3), (2, 3))]),
    "nested vmap expand_dims: the outer batch in front": (
        _sinc_mul_batched,
        lambda h: cv.vmap(cv.vmap(_call(h, "expand_dims"), in_axes=(0, None)), in_axes=(None, 0))(XS, YS),
        np.stack([_ref(XS, y) for y in YS]), [((1, 2, 3), (2, 1, 3))]),
    "jit(vmap sequential)": (_sinc_mul, lambda h: cv.jit(cv.vmap(_call(h, "sequential")))(XS, YS), _ref(XS, YS),
                             [((3,), (3,))] * 2),
    "vmap(jit) expand_dims": (_sinc_mul_batched, lambda h: cv.vmap(cv.jit(_call(h, "expand_dims")))(XS, YS),
                              _ref(XS, YS), [((2, 3), (2, 3))]),
    "vmap of a batch of 0": (_sinc_mul, lambda h: cv.vmap(_call(h, "sequential"))(XS[:0], YS[:0]), XS[:0], []),
    "eval_shape: never called": (_sinc_mul, lambda h: cv.eval_shape(_call(h), S((3,), np.float64), Y),
                                 S((3,), np.float64), []),
    "jit drops a call whose result nobody reads (a pure function)": (
        _sinc_mul, lambda h: cv.jit(lambda x, y: (_call(h)(x, y), x + y)[1])(X, Y), X + Y, []),
    "pytrees in and out, keyword arguments": (
        lambda a, *, b: {"s": np.sum(a["u"] * b), "t": (a["u"] + b).astype(np.float32)},
        lambda h: cv.jit(lambda x, y: cv.pure_callback(h, {"s": S((), x.dtype), "t": S((3,), np.float32)},
                                                       {"u": x}, b=y))(X, Y),
        {"s": np.sum(X * Y), "t": (X + Y).astype(np.float32)}, [((3,),)]),
}


@pytest.mark.parametrize("name", PURE_CALLBACK)
def test_pure_callback(name):
    fn, run, want, calls = PURE_CALLBACK[name]
    host = Host(fn)
    got = run(host)
    if isinstance(want, S):
        assert got == want
    else:
        cv.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-14, atol=0) or
                    (g.dtype == np.asarray(w).dtype) or pytest.fail(f"dtype {g.dtype}"), got, want)
    assert host.calls == calls


def test_pure_callback_inside_custom_jvp_is_differentiable():
    host_sin, host_cos = Host(np.sin), Host(np.cos)

    @cv.custom_jvp
    def sin(x):
        return cv.pure_callback(host_sin, S(x.shape, x.dtype), x, vmap_method="expand_dims")

    @sin.defjvp
    def sin_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return sin(x), cv.pure_callback(host_cos, S(x.shape, x.dtype), x, vmap_method="broadcast_all") * t

    loss = lambda x: cnp.sum(sin(x) * Y)  # noqa: E731
    np.testing.assert_allclose(cv.grad(loss)(X), np.cos(X) * Y, rtol=1e-14)
    np.testing.assert_allclose(cv.jit(cv.grad(loss))(X), np.cos(X) * Y, rtol=1e-14)
    np.testing.assert_allclose(cv.vmap(cv.grad(loss))(XS), np.cos(XS) * Y, rtol=1e-14)
    np.testing.assert_allclose(cv.jacfwd(sin)(X), np.diag(np.cos(X)), rtol=1e-14)


_ERR_HOST = _call(_sinc_mul)
# name: (run, error class, message fragment)
PURE_CALLBACK_ERRORS = {
    "vmap without vmap_method": (lambda: cv.vmap(_ERR_HOST)(XS, YS), cv.MissingRuleError,
                                 r"vmap of pure_callback\(_sinc_mul\) needs a vmap_method"),
    "grad": (lambda: cv.grad(lambda x: cnp.sum(_ERR_HOST(x, Y)))(X), cv.MissingRuleError,
             r"grad/vjp cannot differentiate through pure_callback\(_sinc_mul\).*custom_jvp or cv.custom_vjp"),
    "grad(jit)": (lambda: cv.grad(cv.jit(lambda x: cnp.sum(_ERR_HOST(x, Y))))(X), cv.MissingRuleError,
                  "cannot differentiate through pure_callback"),
    "jvp": (lambda: cv.jvp(lambda x: _ERR_HOST(x, Y), (X,), (Y,)), cv.MissingRuleError,
            r"jvp cannot differentiate through pure_callback"),
    "linearize": (lambda: cv.linearize(lambda x: _ERR_HOST(x, Y), X), cv.MissingRuleError,
                  r"linearize\(<lambda>\): jvp cannot differentiate through pure_callback"),
    "a result of another dtype": (lambda: cv.pure_callback(lambda x: x.astype(np.float32), S((3,), np.float64), X),
                                  cv.CallbackError, r"returned f32\[3\] as result, but result_shape_dtypes "
                                                    r"declares f64\[3\]"),
    "a result of another shape": (lambda: cv.jit(lambda x: cv.pure_callback(lambda x: x[:2], S((3,), x.dtype), x))(X),
                                  cv.CallbackError, r"returned f64\[2\]"),
    "a result of another structure": (lambda: cv.pure_callback(lambda x: (x, x), S((3,), np.float64), X),
                                      cv.CallbackError, "returned a tuple of length 2"),
    "an unknown vmap_method": (lambda: cv.pure_callback(np.sin, S((3,), np.float64), X, vmap_method="loop"),
                               ValueError, "vmap_method must be one of 'sequential'"),
    "a callback that is not callable": (lambda: cv.pure_callback("sin", S((3,), np.float64), X), TypeError,
                                        "callback must be callable"),
    "an argument that is not an array": (lambda: cv.pure_callback(np.sin, S((3,), np.float64), "x"), TypeError,
                                         r"argument 0 .*is a str"),
    "result_shape_dtypes without shapes": (lambda: cv.pure_callback(np.sin, [3], X), TypeError,
                                           r"result_shape_dtypes\[0\] is a int"),
}


@pytest.mark.parametrize("name", PURE_CALLBACK_ERRORS)
def test_pure_callback_errors(name):
    run, cls, message = PURE_CALLBACK_ERRORS[name]
    with pytest.raises(cls, match=message):
        run()


# ---------------------------------------------------------------------------------------
# custom_vmap and sequential_vmap
# ---------------------------------------------------------------------------------------

# The rule computes cos(x)·y where the body computes sin(x)·y (as JAX's documentation
# does), so each result says which ran; ``RULE_CALLS`` records the rule's in_batched.
RULE_CALLS = []


@cv.custom_batching.custom_vmap
def sin_mul(x, y):
    return cnp.sin(x) * y


@sin_mul.def_vmap
def sin_mul_rule(axis_size, in_batched, xs, ys):
    RULE_CALLS.append((axis_size, list(in_batched)))
    return cnp.cos(xs) * ys, any(in_batched)


def _rule(x, y):
    return np.cos(x) * y


# name: (run, expected, the rule's calls)
CUSTOM_VMAP = {
    "eager: the body": (lambda: sin_mul(X, Y), np.sin(X) * Y, []),
    "jit: the body": (lambda: cv.jit(sin_mul)(X, Y), np.sin(X) * Y, []),
    "vmap: the rule": (lambda: cv.vmap(sin_mul)(XS, YS), _rule(XS, YS), [(2, [True, True])]),
    "vmap in_axes=(0, None)": (lambda: cv.vmap(sin_mul, in_axes=(0, None))(XS, Y), _rule(XS, Y), [(2, [True, False])]),
    "vmap in_axes=(1, 1): batch dims moved to 0": (lambda: cv.vmap(sin_mul, in_axes=(1, 1))(XS, YS),
                                                   _rule(XS.T, YS.T), [(3, [True, True])]),
    "jit(vmap)": (lambda: cv.jit(cv.vmap(sin_mul))(XS, YS), _rule(XS, YS), [(2, [True, True])]),
    "vmap(jit)": (lambda: cv.vmap(cv.jit(sin_mul))(XS, YS), _rule(XS, YS), [(2, [True, True])]),
    "vmap(vmap): the inner rule, batched by the outer vmap": (
        lambda: cv.vmap(cv.vmap(sin_mul, in_axes=(0, None)), in_axes=(None, 0))(XS, YS),
        np.stack([_rule(XS, y) for y in YS]), [(2, [True, False])]),
    "jvp(vmap): the rule's JVP": (
        lambda: cv.jvp(cv.vmap(sin_mul), (XS, YS), (np.ones_like(XS), np.zeros_like(YS))),
        (_rule(XS, YS), -np.sin(XS) * YS), [(2, [True, True])]),
    "vmap(jvp): a batched tangent beside an unbatched primal": (
        lambda: cv.vmap(lambda t: cv.jvp(sin_mul, (X, Y), (t, np.zeros(3))))(XS),
        (np.broadcast_to(_rule(X, Y), (2, 3)), -np.sin(X) * Y * XS), [(2, [True, False])]),
    "jacfwd(vmap)": (lambda: cv.jacfwd(cv.vmap(sin_mul))(X, Y), np.diag(-np.sin(X) * Y), [(3, [True, True])]),
    "grad(vmap): reverse mode of what the rule does": (
        lambda: cv.grad(lambda x: cnp.sum(cv.vmap(sin_mul)(x, YS)))(XS), -np.sin(XS) * YS, [(2, [True, True])]),
    "eval_shape(vmap): the rule staged": (lambda: cv.eval_shape(cv.vmap(sin_mul), S((5, 3), np.float32),
                                                                S((5, 3), np.float32)),
                                          S((5, 3), np.float32), [(5, [True, True])]),
}


@pytest.mark.parametrize("name", CUSTOM_VMAP)
def test_custom_vmap(name):
    run, want, rule_calls = CUSTOM_VMAP[name]
    RULE_CALLS.clear()
    got = run()
    if isinstance(want, S):
        assert got == want
    else:
        cv.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-14, atol=1e-15), tuple(got)
                    if isinstance(want, tuple) else got, want)
    assert RULE_CALLS == rule_calls


def test_custom_vmap_pytrees_and_an_out_batched_prefix():
    @cv.custom_batching.custom_vmap
    def f(p, x):
        return {"a": p["w"] * x, "b": (cnp.sum(x), p["w"])}

    @f.def_vmap
    def f_rule(axis_size, in_batched, p, xs):
        assert in_batched == [{"w": False}, True]
        return {"a": p["w"] * xs + 1.0, "b": (cnp.sum(xs, axis=1), p["w"])}, {"a": True, "b": (True, False)}

    got = cv.vmap(f, in_axes=(None, 0))({"w": 2.0}, XS)
    want = {"a": 2.0 * XS + 1.0, "b": (XS.sum(1), 2.0)}
    cv.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-14), got, want)


def test_custom_vjp_around_custom_vmap_gives_reverse_mode():
    """JAX's documented combination: ``f.def_vmap`` reaches the inner custom_vmap."""
    @cv.custom_vjp
    @cv.custom_batching.custom_vmap
    def f(x, y):
        return cnp.sin(x) * y

    @f.def_vmap
    def f_rule(axis_size, in_batched, xs, ys):
        return cnp.cos(xs) * ys, True

    f.defvjp(lambda x, y: (f(x, y), (x, y)), lambda r, ct: (cnp.cos(r[0]) * r[1] * ct, cnp.sin(r[0]) * ct))
    np.testing.assert_allclose(cv.vmap(f)(XS, YS), np.cos(XS) * YS, rtol=1e-14)
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(f(x, Y)))(X), np.cos(X) * Y, rtol=1e-14)
    np.testing.assert_allclose(cv.vmap(cv.grad(lambda x, y: cnp.sum(f(x, y))))(XS, YS), np.cos(XS) * YS, rtol=1e-14)


def test_sequential_vmap_calls_the_function_per_example():
    host = Host(lambda x: np.sort(x))
    sort = cv.custom_batching.sequential_vmap(lambda x: cv.pure_callback(host, S(x.shape, x.dtype), x))
    np.testing.assert_array_equal(cv.vmap(sort)(YS), np.sort(YS, axis=1))
    assert host.calls == [((3,),), ((3,),)]
    np.testing.assert_array_equal(cv.jit(cv.vmap(sort))(YS), np.sort(YS, axis=1))
    assert cv.vmap(sort)(YS[:0]).shape == (0, 3)


@cv.custom_batching.custom_vmap
def _no_rule(x):
    return x * 2.0


def _closes_over(x, y):
    @cv.custom_batching.custom_vmap
    def g(z):
        return z * y

    g.def_vmap(lambda n, b, z: (z * y, True))
    return g(x)


def _bad_rule(out):
    @cv.custom_batching.custom_vmap
    def g(x):
        return x * 2.0

    g.def_vmap(lambda n, b, x: out(x))
    return g


# name: (run, message fragment)
CUSTOM_VMAP_ERRORS = {
    "vmap without a rule": (lambda: cv.vmap(_no_rule)(XS),
                            r"No batching rule defined for custom_vmap function _no_rule using def_vmap"),
    "grad": (lambda: cv.grad(lambda x: cnp.sum(sin_mul(x, Y)))(X),
             r"grad/vjp of custom_vmap function sin_mul: custom_vmap functions have no reverse mode.*custom_vjp"),
    "vmap(grad)": (lambda: cv.vmap(cv.grad(lambda x, y: cnp.sum(sin_mul(x, y))))(XS, YS), "no reverse mode"),
    "grad(jit)": (lambda: cv.grad(cv.jit(lambda x: cnp.sum(sin_mul(x, Y))))(X), "no reverse mode"),
    "linearize": (lambda: cv.linearize(lambda x: sin_mul(x, Y), X), "linearize of custom_vmap function sin_mul"),
    "a closed-over value batched by the vmap": (lambda: cv.vmap(_closes_over, in_axes=(None, 0))(X, YS),
                                                 "vmap batches a value that its body closes over"),
    "a closed-over value differentiated": (lambda: cv.jvp(lambda y: _closes_over(X, y), (Y,), (Y,)),
                                           "jvp differentiates a value that its body closes over"),
    "a rule that returns no pair": (lambda: cv.vmap(_bad_rule(lambda x: x))(XS),
                                    r"must return a pair \(out, out_batched\)"),
    "a rule that drops the batch it claims": (lambda: cv.vmap(_bad_rule(lambda x: (x[0], True)))(XS),
                                              r"returned f64\[3\] as output, which it marks batched, so it "
                                              r"must be f64\[2,3\]"),
    "a rule of another structure": (lambda: cv.vmap(_bad_rule(lambda x: ((x, x), True)))(XS),
                                    r"structure of output returned by custom vmap rule \(<lambda>\) does not "
                                    "match that of original custom-vmapped function"),
    "out_batched that is no pytree of bools": (lambda: cv.vmap(_bad_rule(lambda x: (x, [True, False])))(XS),
                                               "out_batched must be a pytree of bools"),
}


@pytest.mark.parametrize("name", CUSTOM_VMAP_ERRORS)
def test_custom_vmap_errors(name):
    run, message = CUSTOM_VMAP_ERRORS[name]
    with pytest.raises(CustomVmapError, match=message):
        run()


def test_custom_vmap_def_vmap_needs_a_callable():
    with pytest.raises(TypeError, match="the rule must be callable"):
        sin_mul.def_vmap(3)


# ---------------------------------------------------------------------------------------
# eval_shape and ShapeDtypeStruct: the shapes of a run, wherever an array goes, no array work
# ---------------------------------------------------------------------------------------


MODEL = layers.Serial(layers.Dense(10), layers.Relu, layers.Dense(3), layers.LogSoftmax)
PARAMS = MODEL.init(np.random.default_rng(0), (-1, 784))[1]


def _per_example_grads(p, x, y):
    return cv.vmap(cv.grad(lambda p, x, y: cnp.sum(MODEL.apply(p, x[None]) * y)), in_axes=(None, 0, 0))(p, x, y)


def _sds(tree):
    return cv.tree.map(lambda a: S(a.shape, a.dtype), tree)


def _abstract_batch(n):
    return (_sds(PARAMS), S((n, 784), np.float32), S((n, 3), np.float32))


# name: (f, the abstract arguments, concrete arguments of the same avals)
EVAL_SHAPE = {
    "matmul": (lambda a, b: a @ b, (S((4, 5), np.float32), S((5, 2), np.float32)),
               (np.ones((4, 5), np.float32), np.ones((5, 2), np.float32))),
    "pytree out": (lambda x, y: {"a": x * y, "b": (cnp.sum(x), y)}, (S((3,), np.float32), 2.0),
                   (np.ones(3, np.float32), 2.0)),
    "int dtype": (lambda i: cnp.sum(i), (S((4,), np.int32),), (np.ones(4, np.int32),)),
    "per-example grads": (_per_example_grads, (_sds(PARAMS), S((6, 784), np.float32), S((6, 3), np.float32)),
                          (PARAMS, np.ones((6, 784), np.float32), np.ones((6, 3), np.float32))),
    "scan": (lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), (S((2,), np.float64), S((7, 2), np.float64)),
             (np.ones(2), np.ones((7, 2)))),
}


@pytest.mark.parametrize("name", EVAL_SHAPE)
def test_eval_shape_gives_the_shapes_of_a_run(name):
    f, abstract, concrete = EVAL_SHAPE[name]
    want = cv.tree.map(lambda a: S(np.shape(a), np.asarray(a).dtype, weak_type=isinstance(a, float)), f(*concrete))
    assert cv.eval_shape(f, *abstract) == want
    assert cv.eval_shape(f, *concrete) == want  # arrays are accepted too


def test_shape_dtype_struct_is_a_value_like_jaxs():
    s = S([2, 3], "float32")
    assert (s.shape, s.dtype, s.ndim, s.size, s.weak_type) == ((2, 3), np.dtype(np.float32), 2, 6, False)
    assert s == S((2, 3), np.float32) and hash(s) == hash(S((2, 3), np.float32)) and s != S((2, 3), np.float64)
    assert repr(s) == "ShapeDtypeStruct(shape=(2, 3), dtype=float32)"
    assert str(cv.make_jaxpr(lambda x: cnp.sin(x))(s)).splitlines()[0] == "{ lambda ; a:f32[2,3]. let"


def _count_array_work(run, monkeypatch):
    """Runs ``run()`` with every primitive's impl and every NumPy function and ufunc
    counted. Returns ``(impl calls, NumPy calls, NumPy calls that took or made an array
    of more than 128 bytes)``: the NumPy calls left are shape and dtype arithmetic."""
    impls, calls, big = [], collections.Counter(), collections.Counter()

    def large(x):
        return isinstance(x, np.ndarray) and x.nbytes > 128

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            calls[name] += 1
            if any(map(large, (*args, *kwargs.values(), out))):
                big[name] += 1
            return out
        return wrapper

    class CountedUfunc:
        def __init__(self, name, ufunc):
            self.__call__ = counted(name, ufunc)
            self._name, self._ufunc = name, ufunc

        def __call__(self, *args, **kwargs):
            return self.__dict__["__call__"](*args, **kwargs)

        def __getattr__(self, attr):  # reduce, accumulate, outer, at
            value = getattr(self._ufunc, attr)
            return counted(f"{self._name}.{attr}", value) if callable(value) else value

    for name, obj in list(vars(np).items()):
        if name.startswith("_"):
            continue
        if isinstance(obj, np.ufunc):
            monkeypatch.setattr(np, name, CountedUfunc(name, obj))
        elif callable(obj) and not isinstance(obj, (type, types.ModuleType)):
            monkeypatch.setattr(np, name, counted(name, obj))
    for p in core.registered_primitives():
        if p.impl is not None and "impl" not in type(p).__dict__:
            monkeypatch.setattr(p, "impl", (lambda impl, n: lambda *a, **k: (impls.append(n), impl(*a, **k))[1])(
                p.impl, p.name))
    try:
        run()
    finally:
        monkeypatch.undo()
    return impls, calls, big


def test_eval_shape_does_no_array_work(monkeypatch):
    """Per-example gradients of a million MNIST-sized examples: no primitive runs, no
    NumPy call takes or makes an array of more than 128 bytes, and the NumPy calls (shape
    and dtype arithmetic) are the same for a batch of 10 as for 10**6."""
    want = cv.tree.map(lambda a: S((10**6,) + a.shape, a.dtype), PARAMS)
    assert cv.eval_shape(_per_example_grads, *_abstract_batch(10**6)) == want  # warm caches
    counts = {}
    for n in (10, 10**6):
        impls, calls, big = _count_array_work(lambda: cv.eval_shape(_per_example_grads, *_abstract_batch(n)),
                                              monkeypatch)
        assert impls == [] and not big, (impls, big)
        counts[n] = calls
    assert counts[10] == counts[10**6] and sum(counts[10].values()) < 300, counts


def test_jit_lower_and_eval_shape_do_no_array_work(monkeypatch):
    jf = cv.jit(_per_example_grads)
    impls, _, big = _count_array_work(lambda: (jf.lower(*_abstract_batch(10**6)), jf.eval_shape(*_abstract_batch(7))),
                                      monkeypatch)
    assert impls == [] and not big, (impls, big)


def _f(x, y):
    return {"s": cnp.sum(cnp.sin(x) * y), "p": x * 2.0}


# name: (run, expected)
JIT_INSPECTION = {
    "lower: out_info": (lambda: cv.jit(_f).lower(S((3,), np.float32), 2.0).out_info,
                        {"s": S((), np.float32), "p": S((3,), np.float32)}),
    "lower: the optimized program's text": (
        lambda: cv.jit(lambda x: x * 0.0 + cnp.sin(x) + cnp.sin(x)).lower(S((2,), np.float64)).as_text(),
        "{ lambda ; a:f64[2]. let\n    b:f64[2] = mul a 0.0\n    c:f64[2] = sin a\n    d:f64[2] = add b c\n"
        "    e:f64[2] = add d c\n  in (e,) }"),
    "trace: the program as make_jaxpr stages it": (
        lambda: str(cv.jit(_f).trace(S((3,), np.float32), 2.0).jaxpr), str(cv.make_jaxpr(_f)(S((3,), np.float32), 2.0))),
    "trace: out_info": (lambda: cv.jit(_f).trace(S((4, 2), np.float64), np.float32(1.0)).out_info,
                        {"s": S((), np.float64), "p": S((4, 2), np.float64)}),
    "eval_shape of a jitted function": (lambda: cv.jit(_f).eval_shape(S((5,), np.float64), 1.0),
                                        {"s": S((), np.float64), "p": S((5,), np.float64)}),
    "cv.eval_shape(jit(f))": (lambda: cv.eval_shape(cv.jit(_f), S((5,), np.float32), 1.0),
                              {"s": S((), np.float32), "p": S((5,), np.float32)}),
    "a Python number passed through stays weakly typed": (lambda: cv.eval_shape(lambda a, b: (a, a * b), 2.0, X),
                                                          (S((), np.float64, weak_type=True), S((3,), np.float64))),
    "static arguments": (lambda: cv.jit(lambda x, n: x[:n], static_argnums=1).lower(S((6,), np.int32), 4).out_info,
                         S((4,), np.int32)),
}


@pytest.mark.parametrize("name", JIT_INSPECTION)
def test_jit_inspection_takes_shape_dtype_structs(name):
    run, want = JIT_INSPECTION[name]
    assert run() == want


def test_lower_keeps_the_program_for_calls_and_compile_checks_the_signature():
    jf = cv.jit(_f)
    compiled = jf.lower(S((3,), np.float64), 2.0).compile()
    assert jf.trace_count == 1
    want = {"s": np.sum(np.sin(X) * 2.0), "p": X * 2.0}
    for got in (jf(X, 2.0), compiled(X, 2.0)):
        cv.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-15), got, want)
    assert jf.trace_count == 1  # the lowered program ran
    with pytest.raises(TypeError, match="lowered for arguments of avals"):
        compiled(XS, 2.0)


def test_a_jitted_function_called_on_a_shape_dtype_struct_says_what_to_use():
    with pytest.raises(cv.TransformError, match=r"argument 0 \(x\) is a ShapeDtypeStruct.*\.lower\(\.\.\.\)"):
        cv.jit(_f)(S((3,), np.float64), 2.0)


# ---------------------------------------------------------------------------------------
# Weak types (NOTE [a weak value meets a strong one] in cuvmap/transforms/staging.py)
# ---------------------------------------------------------------------------------------

F32 = np.ones(3, np.float32)
U8 = np.arange(3, dtype=np.uint8)
I32 = np.arange(3, dtype=np.int32)

# name: (f, arguments, what eval_shape gives: JAX's weak types with NumPy's float64 default).
# The Python-number arguments run the same lines eagerly as Python arithmetic, whose
# results are the reference for jit's dtypes.
WEAK_TYPES = {
    "a Python number's arithmetic stays weak": (lambda x: x + 1, (2.0,), S((), np.float64, weak_type=True)),
    "a weak int and a weak float: a weak float": (lambda i, x: i * x + 1, (2, 3.0), S((), np.float64, weak_type=True)),
    "a weak value takes float32 from an array": (lambda x, a: (x + 1) * a, (2.0, F32), S((3,), np.float32)),
    "a weak int takes uint8": (lambda i, a: i * 2 + a, (3, U8), S((3,), np.uint8)),
    # JAX's lattice: an integer array under a weak float gives a weak float (issue 33)
    "a weak float with int32 is a weak float64": (lambda x, a: x * 2 + a, (2.0, I32),
                                                  S((3,), np.float64, weak_type=True)),
    # (eagerly through cuvmap.numpy: NumPy's own operators on NumPy arrays know no weak types)
    "int32 + a weak float takes float32 after": (lambda x, a, b: cnp.multiply(cnp.add(a, x), b), (1.5, I32, F32),
                                                 S((3,), np.float32)),
    "a weak value in where": (lambda x, a: cnp.where(a > 0, x * 2, a), (2.0, F32), S((3,), np.float32)),
    "a weak value in maximum": (lambda x, a: cnp.maximum(x - 1, a), (2.0, F32), S((3,), np.float32)),
    "a weak value under vmap": (lambda a, x: cv.vmap(lambda r: (x * 2.0) * r)(a), (np.ones((2, 3), np.float32), 3.0),
                                S((2, 3), np.float32)),
    "a weak value into a checkpointed region": (
        lambda x, a: cv.checkpoint(lambda y, b: cnp.sin(b) * y)(x + 1, a), (2.0, F32), S((3,), np.float32)),
    "a weak value under grad": (lambda x, a: cv.grad(lambda b: cnp.sum((x + 1) * b))(a), (2.0, F32), S((3,), np.float32)),
}


@pytest.mark.parametrize("name", WEAK_TYPES)
def test_weak_types_follow_jax_and_the_run_has_the_staged_dtype(name):
    f, args, want = WEAK_TYPES[name]
    assert cv.eval_shape(f, *args) == want
    out = cv.jit(f)(*args)
    assert (np.shape(out), np.asarray(out).dtype) == (want.shape, want.dtype)
    eager = f(*args)
    assert np.asarray(eager).dtype == want.dtype, "the same lines run eagerly"


def test_a_weak_struct_keeps_its_dtype():
    """JAX's lattice: a weakly typed float32 meeting a Python int stays a weak float32."""
    assert cv.eval_shape(lambda x: x + 1, S((), np.float32, weak_type=True)) == S((), np.float32, weak_type=True)
    assert cv.eval_shape(lambda x: x * 2.5, S((), np.int32, weak_type=True)) == S((), np.float64, weak_type=True)


def test_only_a_computed_weak_value_is_cast():
    """jit's Python-number arguments are Python numbers when it runs (NumPy keeps them
    weak): no cast; a weak value the program computed is a NumPy scalar: cast once."""
    text = str(cv.make_jaxpr(lambda x, a: (x * a, (x + 1) * a))(2.0, F32))
    assert text.count("convert_element_type[new_dtype=float32]") == 1, text


# ---------------------------------------------------------------------------------------
# Effects inside programs: a debug callback is kept wherever it is
# ---------------------------------------------------------------------------------------


def test_effects_survive_the_optimizer():
    """Identical callbacks are not merged (CSE), a callback of constants is not folded, and
    a callback whose token nothing reads is not dead code."""
    seen = []
    const = np.arange(2.0)

    def f(x):
        cv.debug.callback(lambda v: seen.append(("x", v.tolist())), x)
        cv.debug.callback(lambda v: seen.append(("x", v.tolist())), x)
        cv.debug.callback(lambda v, tag: seen.append((tag, v.tolist())), const, "const")
        return x * 2.0

    jf = cv.jit(f)
    jf(X)
    jf(X)
    assert seen == [("x", X.tolist()), ("x", X.tolist()), ("const", [0.0, 1.0])] * 2
    assert str(cv.make_jaxpr(f)(X)).count("debug_callback") == 3


def _print_x(x):
    cv.debug.print("x={}", x)
    return x * 2.0


_INNER = cv.jit(_print_x)
_CUSTOM = cv.custom_jvp(_print_x)
_CUSTOM.defjvp(lambda p, t: (_CUSTOM(p[0]), 2.0 * t[0]))


# name: (a jitted function of x whose printing part's result nobody reads, expected lines)
EFFECTS = {
    "an inner jit": (lambda x: (_INNER(x), x + 1.0)[1], ["x=1.0"]),
    "a cond": (lambda x: (lax.cond(x > 0, _print_x, lambda x: x, x), x + 1.0)[1], ["x=1.0"]),
    "a scan": (lambda x: (lax.scan(lambda c, _: (_print_x(c), None), x, None, length=2), x + 1.0)[1],
               ["x=1.0", "x=2.0"]),
    "a custom_jvp function": (lambda x: (_CUSTOM(x), x + 1.0)[1], ["x=1.0"]),
    "a checkpointed region": (lambda x: (cv.checkpoint(_print_x)(x), x + 1.0)[1], ["x=1.0"]),
    "in order with another": (lambda x: (cv.debug.print("first"), _INNER(x), cv.debug.print("last"), x)[-1],
                              ["first", "x=1.0", "last"]),
}


@pytest.mark.parametrize("name", EFFECTS)
def test_dead_code_elimination_keeps_effects_inside_programs(name, capsys):
    fn, lines = EFFECTS[name]
    jf = cv.jit(fn)
    for _ in range(2):
        jf(1.0)
    assert capsys.readouterr().out.splitlines() == lines * 2


def test_host_callbacks_are_never_replayed_by_a_cuda_graph():
    """A callback runs Python on every run: its primitives read the host (``host_sync``),
    so the executor never captures a program holding one as a CUDA graph."""
    assert lax_callbacks.debug_callback_p.host_sync and lax_callbacks.pure_callback_p.host_sync
    assert not lax_callbacks.pure_callback_p.effectful and lax_callbacks.debug_callback_p.effectful


def test_callbacks_under_jit_run_on_every_call_on_each_backend(backend):
    """On the GPU (the strict CuPy stand-in without one) a jitted program with a callback
    is never replayed as a CUDA graph, which would skip the Python call: each of four
    calls runs it (a graph is captured on the second call), the callbacks get the
    device's arrays and the pure callback's results come back on the device."""
    xp = cv.backend.xp_for(backend)
    seen = []

    def host(x):
        seen.append(("pure", type(x).__module__.split(".")[0]))
        return cv.backend.xp_of(x).sin(x)  # computed on the device: nothing read on the host

    @cv.jit
    def printing(x):
        cv.debug.callback(lambda v: seen.append(("debug", type(v).__module__.split(".")[0])), x)
        return cnp.sin(x) * 2.0

    @cv.jit
    def calling(x):
        return cv.pure_callback(host, S(x.shape, x.dtype), x) * 2.0

    x = xp.asarray(X)
    for f in (printing, calling):
        for _ in range(4):
            got = f(x)
        assert type(got).__module__.split(".")[0] == xp.__name__
        np.testing.assert_allclose(cv.backend.device_put(got, "cpu"), np.sin(X) * 2.0, rtol=1e-15)
    assert seen == [("debug", xp.__name__)] * 4 + [("pure", xp.__name__)] * 4
