"""custom_jvp and custom_vjp: the user's rule, not the function's body, is what every
transform differentiates, batches and stages.

References are independent of cuvmap: closed forms written in NumPy, float64 central
finite differences of NumPy functions, and per-example loops. Rules that are deliberately
wrong (3x the true derivative) tell apart a result that used the rule from one that
differentiated the body.
"""
import functools

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import CustomDerivativeError


def _rng(seed=0):
    return np.random.default_rng(seed)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def central_diff_grad(f, x, eps=1e-6):
    """The gradient of a NumPy function ``f`` of one float64 array by central differences."""
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


# ---------------------------------------------------------------------------------------
# log1pexp: a numerically stable JVP rule
# ---------------------------------------------------------------------------------------


@cv.custom_jvp
def log1pexp(x):
    return cnp.log(1.0 + cnp.exp(x))


@log1pexp.defjvp
def log1pexp_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return log1pexp(x), x_dot * (1.0 - 1.0 / (1.0 + cnp.exp(x)))


def naive_log1pexp(x):
    return cnp.log(1.0 + cnp.exp(x))


XS = np.array([-3.0, -0.5, 0.0, 0.7, 2.5, 10.0])


def test_log1pexp_plain_call_runs_the_function():
    np.testing.assert_allclose(log1pexp(XS), np.logaddexp(0.0, XS), rtol=1e-12)


@pytest.mark.parametrize("x", [np.float32(100.0), np.float64(1000.0)], ids=["float32-100", "float64-1000"])
def test_log1pexp_grad_is_one_where_the_body_gives_nan(x):
    # exp(x) overflows: the body's derivative exp(x) / (1 + exp(x)) is inf / inf
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(cv.grad(naive_log1pexp)(x))
        g = cv.grad(log1pexp)(x)
        assert g.dtype == x.dtype and float(g) == 1.0
        assert float(cv.grad(cv.jit(log1pexp))(x)) == 1.0
    assert float(cv.grad(log1pexp)(100.0)) == 1.0


@pytest.mark.parametrize("x", list(XS))
def test_log1pexp_grad_is_the_sigmoid(x):
    np.testing.assert_allclose(cv.grad(log1pexp)(x), sigmoid(x), rtol=1e-12)


def test_log1pexp_vmap_grad_is_a_per_example_sigmoid():
    want = np.array([sigmoid(x) for x in XS])
    np.testing.assert_allclose(cv.vmap(cv.grad(log1pexp))(XS), want, rtol=1e-12)
    np.testing.assert_allclose(cv.grad(lambda x: cv.vmap(log1pexp)(x).sum())(XS), want, rtol=1e-12)


def test_log1pexp_grad_grad_is_the_sigmoids_derivative():
    for x in XS:
        s = sigmoid(x)
        np.testing.assert_allclose(cv.grad(cv.grad(log1pexp))(x), s * (1 - s), rtol=1e-10)


def test_log1pexp_jvp_and_jacfwd():
    t = _rng(1).standard_normal(XS.shape)
    y, y_dot = cv.jvp(log1pexp, (XS,), (t,))
    np.testing.assert_allclose(y, np.logaddexp(0.0, XS), rtol=1e-12)
    np.testing.assert_allclose(y_dot, sigmoid(XS) * t, rtol=1e-12)
    np.testing.assert_allclose(cv.jacfwd(log1pexp)(XS), np.diag(sigmoid(XS)), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(cv.jacrev(log1pexp)(XS), np.diag(sigmoid(XS)), rtol=1e-12, atol=1e-15)
    _, big = cv.jvp(log1pexp, (np.array([100.0]),), (np.array([2.0]),))
    np.testing.assert_array_equal(big, [2.0])


def test_log1pexp_under_jit():
    np.testing.assert_allclose(cv.jit(log1pexp)(XS), np.logaddexp(0.0, XS), rtol=1e-12)
    assert float(cv.jit(cv.grad(log1pexp))(100.0)) == 1.0
    assert float(cv.grad(cv.jit(log1pexp))(100.0)) == 1.0
    np.testing.assert_allclose(cv.vmap(cv.jit(cv.grad(log1pexp)))(XS), sigmoid(XS), rtol=1e-12)
    np.testing.assert_allclose(cv.vmap(cv.jit(log1pexp))(XS), np.logaddexp(0.0, XS), rtol=1e-12)


def test_jitted_program_with_custom_calls_on_the_planned_executor():
    # large enough for the planner's buffer reuse; clip_gradient's output is a view of its
    # operand, and the add after it may write in place: the results must not change
    x = _rng(7).standard_normal(2048)

    def f(x):
        a = clip_gradient(x * 2.0) + 1.0
        b = log1pexp(a) * 3.0
        return a, b, clip_gradient(b) - a

    a = 2.0 * x + 1.0
    b = 3.0 * np.logaddexp(0.0, a)
    jf = cv.jit(f)
    for _ in range(3):  # the cached plan, with its pooled buffers
        got = jf(x)
        np.testing.assert_allclose(got[0], a, rtol=1e-14)
        np.testing.assert_allclose(got[1], b, rtol=1e-14)
        np.testing.assert_allclose(got[2], b - a, rtol=1e-14)
    assert jf.trace_count == 1
    g = cv.grad(lambda x: jf(x)[1].sum())(x)
    # d b / d a = 3 sigmoid(a), clipped by clip_gradient, times d(2x)/dx
    np.testing.assert_allclose(g, 2.0 * np.clip(3.0 * sigmoid(a), -1.0, 1.0), rtol=1e-12)


def test_make_jaxpr_keeps_the_custom_call_as_one_equation():
    closed = cv.make_jaxpr(log1pexp)(XS)
    assert [e.primitive.name for e in closed.jaxpr.eqns] == ["custom_jvp_call"]
    assert "custom_jvp_call[fun=log1pexp jvp=log1pexp_jvp]" in str(closed)


def test_log1pexp_on_each_backend(backend):
    xs = XS if backend == "cpu" else cv.device_put(XS, "gpu")
    to_host = lambda a: np.asarray(cv.device_put(a, "cpu"))  # noqa: E731
    np.testing.assert_allclose(to_host(cv.vmap(cv.grad(log1pexp))(xs)), sigmoid(XS), rtol=1e-12)
    np.testing.assert_allclose(to_host(cv.jit(log1pexp)(xs)), np.logaddexp(0.0, XS), rtol=1e-12)
    np.testing.assert_allclose(to_host(cv.grad(cv.jit(lambda x: log1pexp(x).sum()))(xs)), sigmoid(XS), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# A clipped-gradient identity (custom_vjp)
# ---------------------------------------------------------------------------------------


@cv.custom_vjp
def clip_gradient(x):
    return x


def _clip_fwd(x):
    return x, None


def _clip_bwd(residuals, ct):
    return (cnp.clip(ct, -1.0, 1.0),)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


def test_clip_gradient_is_an_identity_forward():
    x = _rng(2).standard_normal(5)
    np.testing.assert_array_equal(clip_gradient(x), x)
    out = cv.jit(clip_gradient)(x)
    np.testing.assert_array_equal(out, x)
    assert not np.shares_memory(out, x)  # NOTE [results never alias inputs]


def test_clip_gradient_clips_the_cotangent():
    x = _rng(3).standard_normal(6)
    c = np.array([-5.0, -1.0, -0.3, 0.2, 0.9, 40.0])
    want = np.clip(c, -1, 1)
    loss = lambda x: (clip_gradient(x) * c).sum()  # noqa: E731
    np.testing.assert_allclose(cv.grad(loss)(x), want, rtol=1e-15)
    np.testing.assert_allclose(cv.jit(cv.grad(loss))(x), want, rtol=1e-15)
    np.testing.assert_allclose(cv.grad(cv.jit(loss))(x), want, rtol=1e-15)
    # without the clip, the gradient would be c itself
    np.testing.assert_allclose(cv.grad(lambda x: (x * c).sum())(x), c)


def test_clip_gradient_per_example():
    rng = _rng(4)
    w = rng.standard_normal(3) * 4.0
    xs = rng.standard_normal((5, 3)) * 4.0

    def loss(w, x):
        return (clip_gradient(w * x) * x).sum()

    # per example: d/dw sum(clip(x) * x... ) = clip(x_i) * x_i elementwise (ct = x, clipped)
    want = np.stack([np.clip(x, -1, 1) * x for x in xs])
    got = cv.vmap(cv.grad(loss), in_axes=(None, 0))(w, xs)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    got_jit = cv.jit(cv.vmap(cv.grad(loss), in_axes=(None, 0)))(w, xs)
    np.testing.assert_allclose(got_jit, want, rtol=1e-14)
    np.testing.assert_allclose(cv.vmap(cv.jit(cv.grad(loss)), in_axes=(None, 0))(w, xs), want, rtol=1e-14)
    # grad of the vmapped sum: the per-example cotangents summed over the batch
    total = cv.grad(lambda w: cv.vmap(loss, in_axes=(None, 0))(w, xs).sum())(w)
    np.testing.assert_allclose(total, want.sum(0), rtol=1e-13)


# ---------------------------------------------------------------------------------------
# Straight-through estimators
# ---------------------------------------------------------------------------------------


@cv.custom_jvp
def round_ste(x):
    return cnp.round(x)


@round_ste.defjvp
def _round_ste_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return round_ste(x), t


@cv.custom_vjp
def sign_ste(x):
    return cnp.sign(x)


sign_ste.defvjp(lambda x: (cnp.sign(x), None), lambda _, ct: (ct,))


def test_straight_through_round():
    x = np.array([-1.7, -0.2, 0.4, 1.5001, 2.9])
    w = np.array([1.0, -2.0, 3.0, 0.5, 4.0])
    np.testing.assert_array_equal(round_ste(x), np.round(x))
    loss = lambda x: (round_ste(x) * w).sum()  # noqa: E731
    np.testing.assert_allclose(cv.grad(loss)(x), w)
    np.testing.assert_allclose(cv.grad(cv.jit(loss))(x), w)
    np.testing.assert_allclose(cv.jvp(round_ste, (x,), (w,))[1], w)
    np.testing.assert_allclose(cv.vmap(cv.grad(lambda x: round_ste(x) * 2.0))(x), np.full(5, 2.0))
    # the body alone has a zero gradient
    np.testing.assert_array_equal(cv.grad(lambda x: (cnp.round(x) * w).sum())(x), np.zeros(5))


def test_straight_through_sign():
    x = np.array([-1.7, -0.2, 0.4, 2.9])
    w = np.array([1.0, -2.0, 3.0, 4.0])
    loss = lambda x: (sign_ste(x) * w).sum()  # noqa: E731
    np.testing.assert_array_equal(sign_ste(x), np.sign(x))
    np.testing.assert_allclose(cv.grad(loss)(x), w)
    np.testing.assert_allclose(cv.jit(cv.grad(loss))(x), w)
    np.testing.assert_allclose(cv.vmap(cv.grad(lambda x: sign_ste(x) * 3.0))(x), np.full(4, 3.0))


# ---------------------------------------------------------------------------------------
# A deliberately wrong rule under every transform
# ---------------------------------------------------------------------------------------


@cv.custom_jvp
def sin3_jvp(x):
    return cnp.sin(x)


@sin3_jvp.defjvp
def _sin3_jvp_rule(primals, tangents):
    (x,), (t,) = primals, tangents
    return cnp.sin(x), 3.0 * cnp.cos(x) * t


@cv.custom_vjp
def sin3_vjp(x):
    return cnp.sin(x)


sin3_vjp.defvjp(lambda x: (cnp.sin(x), cnp.cos(x)), lambda cos_x, ct: (3.0 * cos_x * ct,))

X3 = np.array([-1.2, 0.3, 0.8, 2.0])


def _sum_of(f):
    return lambda x: f(x).sum()


# (name, transform of f at X3, the closed form that says the wrong rule was used)
WRONG_RULE_CASES = {
    "grad": (lambda f: cv.grad(_sum_of(f))(X3), lambda x: 3 * np.cos(x)),
    "vjp": (lambda f: cv.vjp(f, X3)[1](np.array([1.0, -2.0, 0.5, 3.0]))[0],
            lambda x: 3 * np.cos(x) * np.array([1.0, -2.0, 0.5, 3.0])),
    "jacrev": (lambda f: cv.jacrev(f)(X3), lambda x: np.diag(3 * np.cos(x))),
    "vmap(grad)": (lambda f: cv.vmap(cv.grad(f))(X3), lambda x: 3 * np.cos(x)),
    "grad(vmap)": (lambda f: cv.grad(_sum_of(cv.vmap(f)))(X3), lambda x: 3 * np.cos(x)),
    "grad(grad)": (lambda f: cv.vmap(cv.grad(cv.grad(f)))(X3), lambda x: -3 * np.sin(x)),
    "hessian": (lambda f: cv.hessian(_sum_of(f))(X3), lambda x: np.diag(-3 * np.sin(x))),
    "jit(grad)": (lambda f: cv.jit(cv.grad(_sum_of(f)))(X3), lambda x: 3 * np.cos(x)),
    "grad(jit)": (lambda f: cv.grad(cv.jit(_sum_of(f)))(X3), lambda x: 3 * np.cos(x)),
    "vmap(jit(grad))": (lambda f: cv.vmap(cv.jit(cv.grad(f)))(X3), lambda x: 3 * np.cos(x)),
    "jit(vmap(grad))": (lambda f: cv.jit(cv.vmap(cv.grad(f)))(X3), lambda x: 3 * np.cos(x)),
    "grad(vmap(jit))": (lambda f: cv.grad(_sum_of(cv.vmap(cv.jit(f))))(X3), lambda x: 3 * np.cos(x)),
    "grad(grad(jit))": (lambda f: cv.vmap(cv.grad(cv.grad(cv.jit(f))))(X3), lambda x: -3 * np.sin(x)),
    "jit(jacrev)": (lambda f: cv.jit(cv.jacrev(f))(X3), lambda x: np.diag(3 * np.cos(x))),
    "vmap(hessian)": (lambda f: cv.vmap(cv.hessian(f))(X3), lambda x: -3 * np.sin(x)),
    "hessian(jit)": (lambda f: cv.hessian(cv.jit(_sum_of(f)))(X3), lambda x: np.diag(-3 * np.sin(x))),
}
FORWARD_CASES = {
    "jvp": (lambda f: cv.jvp(f, (X3,), (np.array([1.0, 2.0, -1.0, 0.5]),))[1],
            lambda x: 3 * np.cos(x) * np.array([1.0, 2.0, -1.0, 0.5])),
    "jacfwd": (lambda f: cv.jacfwd(f)(X3), lambda x: np.diag(3 * np.cos(x))),
    "vmap(jvp)": (lambda f: cv.vmap(lambda x: cv.jvp(f, (x,), (1.0,))[1])(X3), lambda x: 3 * np.cos(x)),
    "jvp(vmap)": (lambda f: cv.jvp(cv.vmap(f), (X3,), (np.ones(4),))[1], lambda x: 3 * np.cos(x)),
    "jvp(jit)": (lambda f: cv.jvp(cv.jit(f), (X3,), (np.ones(4),))[1], lambda x: 3 * np.cos(x)),
    "jit(jacfwd)": (lambda f: cv.jit(cv.jacfwd(f))(X3), lambda x: np.diag(3 * np.cos(x))),
}


@pytest.mark.parametrize("case", list(WRONG_RULE_CASES) + list(FORWARD_CASES))
def test_wrong_jvp_rule_is_what_every_transform_uses(case):
    run, want = {**WRONG_RULE_CASES, **FORWARD_CASES}[case]
    np.testing.assert_allclose(run(sin3_jvp), want(X3), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", list(WRONG_RULE_CASES))
def test_wrong_vjp_rule_is_what_every_reverse_transform_uses(case):
    # (hessian = jacfwd(jacrev): the outer forward mode differentiates bwd's expression)
    run, want = WRONG_RULE_CASES[case]
    np.testing.assert_allclose(run(sin3_vjp), want(X3), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_mode_of_a_custom_vjp_function_raises(case):
    run, _ = FORWARD_CASES[case]
    with pytest.raises(CustomDerivativeError, match="can't apply forward-mode autodiff"):
        run(sin3_vjp)


def test_custom_vjp_under_jvp_with_a_zero_tangent_runs_the_function():
    # sin3_vjp applied to a value jvp does not differentiate: no forward rule is needed
    y, y_dot = cv.jvp(lambda x: x * 2.0 + sin3_vjp(X3), (1.0,), (1.0,))
    np.testing.assert_allclose(y, 2.0 + np.sin(X3))
    np.testing.assert_allclose(y_dot, np.full(4, 2.0))


def test_the_values_are_the_functions():
    np.testing.assert_allclose(cv.jit(sin3_jvp)(X3), np.sin(X3))
    np.testing.assert_allclose(cv.vmap(sin3_vjp)(X3), np.sin(X3))
    np.testing.assert_allclose(cv.jvp(sin3_jvp, (X3,), (np.ones(4),))[0], np.sin(X3))
    value, g = cv.value_and_grad(_sum_of(sin3_vjp))(X3)
    np.testing.assert_allclose(value, np.sin(X3).sum())
    np.testing.assert_allclose(g, 3 * np.cos(X3))


# ---------------------------------------------------------------------------------------
# nondiff_argnums
# ---------------------------------------------------------------------------------------


@functools.partial(cv.custom_vjp, nondiff_argnums=(0,))
def apply_fn(g, x):
    return g(x)


def _apply_fwd(g, x):
    return g(x), x


def _apply_bwd(g, x, ct):
    # a rule that knows g: 5 * g'(x) for g = sin, written as 5 cos(x)
    return (5.0 * cnp.cos(x) * ct,)


apply_fn.defvjp(_apply_fwd, _apply_bwd)


@functools.partial(cv.custom_jvp, nondiff_argnums=(1,))
def power(x, n):
    return x ** n


@power.defjvp
def _power_jvp(n, primals, tangents):
    (x,), (t,) = primals, tangents
    return power(x, n), 2.0 * n * x ** (n - 1) * t  # twice the true derivative


def test_nondiff_callable():
    np.testing.assert_allclose(apply_fn(cnp.sin, X3), np.sin(X3))
    np.testing.assert_allclose(cv.grad(lambda x: apply_fn(cnp.sin, x).sum())(X3), 5 * np.cos(X3))
    np.testing.assert_allclose(cv.vmap(cv.grad(lambda x: apply_fn(cnp.sin, x)))(X3), 5 * np.cos(X3))
    np.testing.assert_allclose(cv.jit(cv.grad(lambda x: apply_fn(cnp.sin, x).sum()))(X3), 5 * np.cos(X3))
    np.testing.assert_allclose(cv.grad(cv.jit(lambda x: apply_fn(cnp.sin, x).sum()))(X3), 5 * np.cos(X3))
    # second order through bwd: d/dx 5 cos(x) = -5 sin(x)
    np.testing.assert_allclose(cv.vmap(cv.grad(cv.grad(lambda x: apply_fn(cnp.sin, x))))(X3), -5 * np.sin(X3))


def test_nondiff_int():
    x = np.array([0.5, 1.5, -2.0])
    for n in (2, 3):
        np.testing.assert_allclose(power(x, n), x ** n)
        np.testing.assert_allclose(cv.grad(lambda x: power(x, n).sum())(x), 2.0 * n * x ** (n - 1))
        np.testing.assert_allclose(cv.jvp(lambda x: power(x, n), (x,), (np.ones(3),))[1], 2.0 * n * x ** (n - 1))
        np.testing.assert_allclose(cv.vmap(cv.grad(lambda x: power(x, n)))(x), 2.0 * n * x ** (n - 1))
        jitted = cv.jit(lambda x, n: cv.grad(lambda y: power(y, n).sum())(x), static_argnums=1)
        np.testing.assert_allclose(jitted(x, n), 2.0 * n * x ** (n - 1))
    # keyword call: resolved to positions as in JAX
    np.testing.assert_allclose(cv.grad(lambda x: power(x, n=3).sum())(x), 6.0 * x ** 2)


def test_nondiff_argument_that_is_traced_takes_no_derivative():
    # as in JAX since 0.4: a traced nondiff argument of a custom_jvp function is allowed and
    # acts as if under stop_gradient (a custom_vjp one raises: test_custom_derivatives_options.py)
    assert float(cv.grad(lambda n: power(2.0, n))(3.0)) == 0.0


# ---------------------------------------------------------------------------------------
# Pytrees, residuals, None cotangents
# ---------------------------------------------------------------------------------------


@cv.custom_jvp
def polar(p):
    """{"r", "theta"} -> (x, y), with a correct rule."""
    return p["r"] * cnp.cos(p["theta"]), p["r"] * cnp.sin(p["theta"])


@polar.defjvp
def _polar_jvp(primals, tangents):
    (p,), (t,) = primals, tangents
    c, s = cnp.cos(p["theta"]), cnp.sin(p["theta"])
    out = (p["r"] * c, p["r"] * s)
    return out, (t["r"] * c - p["r"] * s * t["theta"], t["r"] * s + p["r"] * c * t["theta"])


def _polar_np(r, theta):
    return r * np.cos(theta), r * np.sin(theta)


def test_pytree_inputs_and_outputs_against_finite_differences():
    rng = _rng(5)
    r, theta = rng.uniform(0.5, 2.0, 3), rng.uniform(-2, 2, 3)

    def loss(p):
        x, y = polar(p)
        return (x * x * y + 2.0 * y).sum()

    def loss_np_r(r_):
        x, y = _polar_np(r_, theta)
        return (x * x * y + 2.0 * y).sum()

    def loss_np_theta(th):
        x, y = _polar_np(r, th)
        return (x * x * y + 2.0 * y).sum()

    want = {"r": central_diff_grad(loss_np_r, r), "theta": central_diff_grad(loss_np_theta, theta)}
    p = {"r": r, "theta": theta}
    for g in (cv.grad(loss)(p), cv.jit(cv.grad(loss))(p), cv.grad(cv.jit(loss))(p)):
        np.testing.assert_allclose(g["r"], want["r"], rtol=1e-7)
        np.testing.assert_allclose(g["theta"], want["theta"], rtol=1e-7)
    # per example against a loop
    per = cv.vmap(cv.grad(loss))({"r": r[:, None], "theta": theta[:, None]})
    for b in range(3):
        gb = cv.grad(loss)({"r": r[b:b + 1], "theta": theta[b:b + 1]})
        np.testing.assert_allclose(per["r"][b], gb["r"], rtol=1e-14)
        np.testing.assert_allclose(per["theta"][b], gb["theta"], rtol=1e-14)
    jac = cv.jacfwd(polar)(p)
    np.testing.assert_allclose(jac[0]["theta"], np.diag(-r * np.sin(theta)), atol=1e-14)


@cv.custom_vjp
def scaled_product(d, s):
    """({"x", "y"}, s) -> {"a": x * y * s, "b": sin(x)}; bwd gives s no cotangent."""
    return {"a": d["x"] * d["y"] * s, "b": cnp.sin(d["x"])}


def _sp_fwd(d, s):
    return scaled_product(d, s), {"x": d["x"], "more": (d["y"], cnp.cos(d["x"])), "s": s}


def _sp_bwd(r, ct):
    y, cos_x = r["more"]
    return ({"x": ct["a"] * y * r["s"] + ct["b"] * cos_x, "y": None}, None)


scaled_product.defvjp(_sp_fwd, _sp_bwd)


def test_pytree_residuals_and_none_cotangents():
    rng = _rng(6)
    d = {"x": rng.standard_normal(4), "y": rng.standard_normal(4)}
    s = 1.5

    def loss(d, s):
        out = scaled_product(d, s)
        return (out["a"] + 2.0 * out["b"]).sum()

    gd, gs = cv.grad(loss, argnums=(0, 1))(d, s)
    np.testing.assert_allclose(gd["x"], d["y"] * s + 2.0 * np.cos(d["x"]), rtol=1e-14)
    np.testing.assert_array_equal(gd["y"], np.zeros(4))  # None: a zero cotangent
    assert float(gs) == 0.0
    per = cv.vmap(cv.grad(loss), in_axes=(0, None))(d, s)
    np.testing.assert_allclose(per["x"], d["y"] * s + 2.0 * np.cos(d["x"]), rtol=1e-14)
    jitted = cv.jit(cv.vmap(cv.grad(loss), in_axes=(0, None)))(d, s)
    np.testing.assert_allclose(jitted["x"], per["x"], rtol=1e-14)
    np.testing.assert_array_equal(jitted["y"], np.zeros(4))


def test_integer_argument_gets_a_zero_tangent():
    @cv.custom_jvp
    def shift(x, k):
        return x + k

    @shift.defjvp
    def _shift_jvp(primals, tangents):
        (x, k), (t, k_dot) = primals, tangents
        assert np.asarray(k_dot).dtype.kind == "i" and not np.any(np.asarray(k_dot))
        return shift(x, k), 3.0 * t

    np.testing.assert_allclose(cv.grad(lambda x: shift(x, np.int64(2)))(1.0), 3.0)
    np.testing.assert_allclose(cv.jvp(lambda x: shift(x, 2), (1.0,), (1.0,))[1], 3.0)


def test_defjvps():
    @cv.custom_jvp
    def mul3(x, y):
        return x * y

    mul3.defjvps(lambda t, ans, x, y: 3.0 * t * y, lambda t, ans, x, y: 3.0 * x * t)
    gx, gy = cv.grad(mul3, argnums=(0, 1))(2.0, 5.0)
    assert (float(gx), float(gy)) == (15.0, 6.0)
    np.testing.assert_allclose(cv.jvp(mul3, (2.0, 5.0), (1.0, 1.0))[1], 21.0)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


# (rules that return the wrong structure, shapes or types, missing rules, arguments that do
# not bind: the table of tests/transforms/test_custom_rule_refusals.py)


def test_a_body_closing_over_a_traced_value_under_jit_is_an_error():
    @cv.jit
    def g(x, s):
        @cv.custom_jvp
        def scaled(y):
            return y * s

        scaled.defjvp(lambda p, t: (scaled(p[0]), t[0] * s))
        return scaled(x)

    with pytest.raises(CustomDerivativeError, match="closes over a traced value"):
        g(1.0, 2.0)


def test_a_non_array_argument_needs_nondiff_argnums():
    with pytest.raises(CustomDerivativeError, match=r"argument 0 \(g\) is a function; .* nondiff_argnums"):
        f = cv.custom_vjp(lambda g, x: g(x))
        f.defvjp(lambda g, x: (g(x), None), lambda _, ct: (None, ct))
        f(cnp.sin, 1.0)
