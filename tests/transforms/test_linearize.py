"""``linearize``: ``(f(*primals), f_jvp)`` with ``f_jvp(*tangents)`` the JVP at the fixed
primals, evaluated without running ``f``'s primal computation again.

References: central finite differences in float64 and ``jvp`` (a different interpreter
path: ``jvp`` runs ``f`` each time, ``linearize`` stages the tangent part once); per-example
loops for ``vmap``; counts of Python calls and of primitive impl calls for "does not re-run".
"""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax, tree
from cuvmap.lax import elementwise
from cuvmap.test_util import numerical_jvp


def _rng(seed=0):
    return np.random.default_rng(seed)


def _random_like(rng, t):
    return tree.map(lambda x: rng.standard_normal(np.shape(x)) if np.asarray(x).dtype.kind == "f"
                    else np.zeros(np.shape(x)), t)


def _numbers(x):
    """``x`` as float64 numbers; a float0 tangent (an integer output's, JAX's) as its zeros."""
    x = np.asarray(x)
    return np.zeros(x.shape) if x.dtype == cv.dtypes.float0 else x.astype(np.float64)


def _assert_tree_close(a, b, atol=1e-10, rtol=1e-10):
    la, ta = tree.flatten(a)
    lb, tb = tree.flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        assert (np.asarray(x).dtype == cv.dtypes.float0) == (np.asarray(y).dtype == cv.dtypes.float0), (x, y)
        np.testing.assert_allclose(_numbers(x), _numbers(y), atol=atol, rtol=rtol)


def _branchy(x):
    # Python control flow on the primal: allowed, as under jvp
    return cnp.sin(x) if float(cnp.sum(cv.stop_gradient(x))) > 0 else cnp.cos(x)


def _mlp(params, x):
    h = cnp.tanh(x @ params["w1"] + params["b1"])
    return {"logits": h @ params["w2"], "norm": cnp.sum(h * h)}


# name -> (f, primals); all float64 except where integer inputs are the point
CASES = {
    "sin times x": (lambda x: cnp.sin(x) * x, (np.linspace(-1, 1, 7),)),
    "two arguments, tuple out": (lambda x, y: (x * y, cnp.exp(x) - cnp.log(y)),
                                 (np.linspace(0.1, 1, 4), np.linspace(1, 2, 4))),
    "pytree in, dict out (mlp)": (_mlp, ({"w1": _rng(1).standard_normal((4, 5)), "b1": _rng(2).standard_normal(5),
                                          "w2": _rng(3).standard_normal((5, 3))}, _rng(4).standard_normal((6, 4)))),
    "broadcasting and reductions": (lambda a, b: cnp.sum(cnp.tanh(a * b), axis=0) / cnp.max(b),
                                    (_rng(5).standard_normal((3, 1)), _rng(6).standard_normal((1, 4)) + 3)),
    "integer input": (lambda x, n: x * n + cnp.sin(x), (np.linspace(0, 1, 3), np.arange(3))),
    "Python scalar primal": (lambda x, s: cnp.sin(x * s) * s, (np.linspace(0, 1, 3), 2.0)),
    "output without a tangent": (lambda x: (x * 2.0, cnp.ones(3), cnp.argmax(x)), (np.array([0.3, 2.0, 1.0]),)),
    "jitted inside": (lambda x: cv.jit(lambda y: cnp.sin(y) ** 2)(x) + x, (np.linspace(0, 2, 5),)),
    "Python control flow on the primal": (_branchy, (np.linspace(0.5, 1, 3),)),
    "matmul chain": (lambda a, b: (a @ b) @ (a @ b).T, (_rng(7).standard_normal((3, 4)), _rng(8).standard_normal((4, 2)))),
    # a loop or cond in a checkpoint: its primal outputs leave partial evaluation staged
    # (NOTE [primal outputs staged by partial evaluation]) and must come back as values
    "checkpointed while_loop": (cv.checkpoint(lambda x: lax.while_loop(lambda c: c[0, 2] <= 8, lambda c: c * c, x)),
                                (np.arange(9.0).reshape(3, 3),)),
    "checkpointed fori_loop": (cv.checkpoint(lambda x: lax.fori_loop(0, 3, lambda i, c: cnp.sin(c) * x, x)),
                               (np.linspace(0.2, 1.4, 4),)),
    "checkpointed scan": (cv.checkpoint(lambda x: lax.scan(lambda c, w: (cnp.tanh(c * w), c * w), x, x)),
                          (np.linspace(-0.8, 0.9, 3),)),
    "checkpointed cond": (cv.checkpoint(lambda x: lax.cond(cnp.sum(x) > 0, lambda v: cnp.exp(v) * v, cnp.sin, x)),
                          (np.linspace(-0.3, 0.9, 4),)),
}


@pytest.mark.parametrize("name", CASES)
def test_linearize_matches_jvp_and_finite_differences(name):
    f, primals = CASES[name]
    out, f_jvp = cv.linearize(f, *primals)
    _assert_tree_close(out, f(*primals), atol=0, rtol=0)
    rng = _rng(10)
    for _ in range(2):
        tangents = _random_like(rng, primals)
        got = f_jvp(*tangents)
        _assert_tree_close(got, cv.jvp(f, primals, tangents)[1], atol=1e-12, rtol=1e-12)
        # integer inputs carry no derivative: finite differences move the float ones only
        fd_t = tree.map(lambda p, t: t if np.asarray(p).dtype.kind == "f" else np.zeros_like(p), primals, tangents)
        fd = numerical_jvp(f, primals, fd_t, eps=1e-6)
        got_f = tree.map(lambda g, p: np.asarray(g, np.float64) if np.asarray(p).dtype.kind == "f"
                         else np.zeros(np.shape(p)), got, f(*primals))
        _assert_tree_close(got_f, fd, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_linearized_function_is_linear_and_composes(name):
    """f_jvp is linear; jit(f_jvp) and vmap(f_jvp) agree with it (vmap: a loop over tangents)."""
    f, primals = CASES[name]
    _, f_jvp = cv.linearize(f, *primals)
    rng = _rng(11)
    t1, t2 = _random_like(rng, primals), _random_like(rng, primals)
    combo = tree.map(lambda a, b: 2.5 * a + b, t1, t2)
    out_combo = f_jvp(*combo)
    expected = tree.map(lambda a, b: 2.5 * _numbers(a) + _numbers(b), f_jvp(*t1), f_jvp(*t2))
    float_out = tree.map(lambda o: np.asarray(o).dtype.kind == "f", out_combo)
    for o, e, isf in zip(tree.leaves(out_combo), tree.leaves(expected), tree.leaves(float_out)):
        if isf:
            np.testing.assert_allclose(o, e, atol=1e-12, rtol=1e-12)
    if name != "Python scalar primal":  # a Python float cannot be stacked or traced as given
        _assert_tree_close(cv.jit(f_jvp)(*t1), f_jvp(*t1), atol=1e-14, rtol=1e-14)
        batch = [_random_like(rng, primals) for _ in range(3)]
        stacked = tree.map(lambda *ls: np.stack(ls), *batch)
        got = cv.vmap(f_jvp)(*stacked)
        per = [f_jvp(*b) for b in batch]
        _assert_tree_close(got, tree.map(lambda *ls: np.stack([np.asarray(v) for v in ls]), *per), atol=1e-12, rtol=1e-12)


def test_the_linearized_function_does_not_run_f_again(monkeypatch):
    """f runs once (Python calls); calls of f_jvp bind no sin or cos (the residuals sin(x)
    and cos(x) are constants of the tangent program), while jvp binds them each time."""
    calls = {"f": 0, "sin": 0, "cos": 0}
    for name in ("sin", "cos"):
        prim = getattr(elementwise, f"{name}_p")
        original = prim.impl

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(prim, "impl", counted)

    def f(x):
        calls["f"] += 1
        return cnp.sin(x) * cnp.cos(x) * x

    x = np.linspace(0, 1, 6)
    _, f_jvp = cv.linearize(f, x)
    assert calls["f"] == 1
    before = dict(calls)
    ts = [np.full(6, float(k)) for k in range(4)]
    outs = [f_jvp(t) for t in ts]
    assert calls == before, f"f_jvp re-ran primal work: {before} -> {calls}"
    program = cv.make_jaxpr(f_jvp)(ts[0])
    # only the tangent arithmetic: products with residuals, sums, the sign of d cos
    assert {e.primitive.name for e in program.jaxpr.eqns} <= {"mul", "add", "neg"}, str(program)
    expected = (np.cos(x) ** 2 - np.sin(x) ** 2) * x + np.sin(x) * np.cos(x)
    for k, o in enumerate(outs):
        np.testing.assert_allclose(o, expected * k, rtol=1e-12, atol=1e-12)
    cv.jvp(f, (x,), (ts[1],))
    assert calls["sin"] > before["sin"] and calls["f"] == 2  # the reference path does rerun


def test_has_aux():
    def f(x, y):
        z = cnp.sin(x) * y
        return z, {"mean": cnp.mean(z), "n": 3}

    x, y = np.linspace(0, 1, 4), np.linspace(1, 2, 4)
    out, f_jvp, aux = cv.linearize(f, x, y, has_aux=True)
    np.testing.assert_allclose(out, np.sin(x) * y)
    assert aux["n"] == 3 and isinstance(aux["mean"], np.ndarray)
    np.testing.assert_allclose(aux["mean"], np.mean(np.sin(x) * y))
    tx, ty = np.ones(4), np.full(4, 0.5)
    np.testing.assert_allclose(f_jvp(tx, ty), np.cos(x) * y * tx + np.sin(x) * ty, rtol=1e-12)


def test_linearize_under_vmap_is_per_example():
    f = lambda x: cnp.tanh(x) * cnp.sum(x ** 2)
    xs = _rng(20).standard_normal((5, 3))
    ts = _rng(21).standard_normal((5, 3))
    t = ts[0]
    got = cv.vmap(lambda x: cv.linearize(f, x)[1](t))(xs)
    np.testing.assert_allclose(got, np.stack([cv.jvp(f, (x,), (t,))[1] for x in xs]), rtol=1e-12)
    got2 = cv.vmap(lambda x, t: cv.linearize(f, x)[1](t))(xs, ts)
    np.testing.assert_allclose(got2, np.stack([cv.jvp(f, (x,), (t,))[1] for x, t in zip(xs, ts)]), rtol=1e-12)
    # the primal output under vmap, and f_jvp applied twice inside
    def both(x):
        y, f_jvp = cv.linearize(f, x)
        return y, f_jvp(t) + f_jvp(2 * t)
    ys, js = cv.vmap(both)(xs)
    np.testing.assert_allclose(ys, np.stack([f(x) for x in xs]), rtol=1e-12)
    np.testing.assert_allclose(js, 3 * np.stack([cv.jvp(f, (x,), (t,))[1] for x in xs]), rtol=1e-12)


def test_linearize_inside_grad_matches_finite_differences():
    """grad differentiates the linearized map's residuals (they depend on x)."""
    f = lambda x: cnp.sin(x) * cnp.exp(x)
    t = np.linspace(-1, 1, 4)
    g = lambda x: cnp.sum(cv.linearize(f, x)[1](t) ** 2)
    x = np.linspace(0.1, 0.9, 4)
    got = cv.grad(g)(x)
    h = lambda x: np.sum((np.exp(x) * (np.sin(x) + np.cos(x)) * t) ** 2)
    eps = 1e-6
    fd = np.array([(h(x + eps * e) - h(x - eps * e)) / (2 * eps) for e in np.eye(4)])
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
    # and jit around it all
    np.testing.assert_allclose(cv.jit(cv.grad(g))(x), got, rtol=1e-12)


def test_linearize_under_jit():
    f = lambda x: cnp.sin(x) * x
    x, t = np.linspace(0, 1, 5), np.ones(5)
    jf = cv.jit(lambda x, t: cv.linearize(f, x)[1](t))
    np.testing.assert_allclose(jf(x, t), cv.jvp(f, (x,), (t,))[1], rtol=1e-12)
    np.testing.assert_allclose(jf(x + 1, t), cv.jvp(f, (x + 1,), (t,))[1], rtol=1e-12)


def test_jacobian_from_vmap_of_the_linearized_function():
    f = lambda x: cnp.stack([x[0] * x[1], cnp.sin(x[2]), x[0] ** 3])
    x = np.array([0.5, -1.5, 2.0])
    _, f_jvp = cv.linearize(f, x)
    jac = cv.vmap(f_jvp, out_axes=1)(np.eye(3))
    expected = np.array([[x[1], x[0], 0], [0, 0, np.cos(x[2])], [3 * x[0] ** 2, 0, 0]])
    np.testing.assert_allclose(jac, expected, rtol=1e-12)


def test_float32_stays_float32():
    f = lambda x: cnp.exp(x) * 2.0
    x = np.linspace(0, 1, 3, dtype=np.float32)
    out, f_jvp = cv.linearize(f, x)
    t = f_jvp(np.ones(3, np.float32))
    assert out.dtype == np.float32 and t.dtype == np.float32
    np.testing.assert_allclose(t, 2 * np.exp(x), rtol=1e-6)


def test_result_does_not_alias_the_tangent():
    _, f_jvp = cv.linearize(lambda x: x, np.ones(3))
    t = np.arange(3.0)
    out = f_jvp(t)
    out[0] = 100.0
    assert t[0] == 0.0


@pytest.mark.parametrize("tangents, match", [
    ((np.ones(4),), r"linearize\(loss\): the tangent of argument 0 \(w\) has shape \(4,\), but its primal has shape \(3,\)"),
    ((np.ones(3, np.float32),), r"linearize\(loss\): the tangent of argument 0 \(w\) has dtype float32, but its primal has dtype float64"),
    ((np.ones(3), np.ones(3)), r"linearize\(loss\): the linearized function takes 1 tangent\(s\), one per primal of loss, but was called with 2"),
    (([np.ones(3)],), r"linearize\(loss\): the tangents have structure"),
    ((np.arange(3),), r"the tangent of argument 0 \(w\) has dtype int64"),
])
def test_bad_tangents_are_named(tangents, match):
    def loss(w):
        return cnp.sum(cnp.sin(w))

    _, f_jvp = cv.linearize(loss, np.ones(3))
    with pytest.raises(cv.TransformError, match=match):
        f_jvp(*tangents)


def test_bad_arguments():
    with pytest.raises(TypeError, match="linearize"):
        cv.linearize(3, np.ones(2))
    with pytest.raises(cv.TransformError, match=r"linearize\(<lambda>\): argument 0 \(x\) is a str"):
        cv.linearize(lambda x: x, "a")
    with pytest.raises(cv.TransformError, match="must return a pair"):
        cv.linearize(lambda x: x, np.ones(2), has_aux=True)


def test_linearize_on_each_backend(backend):
    f = lambda w, x: cnp.tanh(x @ w) * 2.0
    rng = _rng(30)
    w, x, tw = rng.standard_normal((4, 3)), rng.standard_normal((2, 4)), rng.standard_normal((4, 3))
    on = (lambda a: cv.device_put(a, "gpu")) if backend == "gpu" else (lambda a: a)
    back = lambda t: cv.device_put(t, "cpu")
    out, f_jvp = cv.linearize(f, on(w), on(x))
    _assert_tree_close(back(out), f(w, x), atol=1e-12, rtol=1e-12)
    want = cv.jvp(f, (w, x), (tw, np.zeros_like(x)))[1]
    _assert_tree_close(back(f_jvp(on(tw), on(np.zeros_like(x)))), want, atol=1e-12, rtol=1e-12)
    _assert_tree_close(back(cv.jit(f_jvp)(on(tw), on(np.zeros_like(x)))), want, atol=1e-12, rtol=1e-12)
