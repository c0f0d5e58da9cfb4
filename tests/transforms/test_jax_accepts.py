"""Arguments and compositions JAX accepts and computes with, which cuvmap computes too
(issue 32 item 7: compute where JAX computes). Each row is checked against its closed form."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax

X5 = np.arange(5.0)
W = np.arange(9.0).reshape(3, 3) / 10.0
V = np.arange(1.0, 4.0)


def _layer_loss(prevent_cse):
    layer = cv.checkpoint(lambda d: cnp.tanh(d["x"] @ d["W"]), prevent_cse=prevent_cse)
    return lambda w, x: cnp.sum(layer({"W": w, "x": x}) ** 2)


def _layer_grad_reference(w, x):
    y = np.tanh(x @ w)
    g = 2 * y * (1 - y ** 2)
    return np.outer(x, g), w @ g


def _kwonly_default():
    @cv.custom_vjp
    def f(x, *, scale=3.0):
        return scale * x

    f.defvjp(lambda x: (f(x), None), lambda _, g: (3.0 * g,))
    return f


def _sin_twice_cos():
    @cv.custom_vjp
    def f(x):
        assert cnp.ndim(x) == 0
        return cnp.sin(x)

    f.defvjp(lambda x: (f(x), cnp.cos(x)), lambda cos_x, g: (2 * cos_x * g,))
    return f


XX = np.arange(6.0).reshape(2, 3)

def _closes_over_a_vmap_value(x):
    @cv.custom_jvp
    def g(y):
        return x * y

    g.defjvp(lambda p, t: (g(p[0]), x * t[0]))
    return g(2.0)


def _scaled(static):
    f = cv.checkpoint(lambda x, cfg: x * cfg["scale"], **static)
    return lambda x: cnp.sum(f(x, cfg={"scale": 3.0}) if "static_argnames" in static else f(x, {"scale": 3.0}))


def _tan_with_sin_fwd(optimize_remat):
    @cv.custom_vjp
    def f(x):
        return cnp.tan(x)

    f.defvjp(lambda x: (cnp.sin(x), (x,)), lambda res, g: (cnp.cos(res[0]) * g,), optimize_remat=optimize_remat)
    return lambda x: cv.checkpoint(f)(x) ** 2


# name: (thunk, expected)
ACCEPTS = {
    "custom_vjp(optimize_remat=True): the value is f's": (
        lambda: cv.value_and_grad(_tan_with_sin_fwd(True))(3.2), (np.tan(3.2) ** 2, 2 * np.tan(3.2) * np.cos(3.2))),
    "custom_vjp(optimize_remat=True) under vmap and jit": (
        lambda: cv.jit(cv.vmap(cv.grad(_tan_with_sin_fwd(True))))(np.array([0.5, 3.2])),
        2 * np.tan([0.5, 3.2]) * np.cos([0.5, 3.2])),
    "custom_vjp without optimize_remat: the value is fwd's": (
        lambda: cv.value_and_grad(_tan_with_sin_fwd(False))(3.2), (np.sin(3.2) ** 2, 2 * np.sin(3.2) * np.cos(3.2))),
    "checkpoint with an unhashable static argument (closed over)": (
        lambda: cv.grad(_scaled(dict(static_argnums=1)))(X5), np.full(5, 3.0)),
    "checkpoint with static_argnames": (lambda: cv.grad(_scaled(dict(static_argnames="cfg")))(X5), np.full(5, 3.0)),
    "a custom_jvp body closing over vmap's value": (lambda: cv.vmap(_closes_over_a_vmap_value)(X5), 2.0 * X5),
    "grad of vmap of vmap of a custom_vjp function": (
        lambda: cv.grad(lambda x: cv.vmap(cv.vmap(_sin_twice_cos()))(x).sum())(XX), 2 * np.cos(XX)),
    "jit of grad of vmap of vmap of a custom_vjp function": (
        lambda: cv.jit(cv.grad(lambda x: cv.vmap(cv.vmap(_sin_twice_cos()))(x).sum()))(XX), 2 * np.cos(XX)),
    "vmap of grad of vmap of vmap of a custom_vjp function": (
        lambda: cv.vmap(cv.grad(lambda x: cv.vmap(cv.vmap(_sin_twice_cos()))(x).sum()))(XX[None]),
        2 * np.cos(XX)[None]),
    "lax.map(batch_size=0) is a vmap": (lambda: lax.map(lambda x: x ** 2, X5, batch_size=0), X5 ** 2),
    "lax.map(batch_size=0) under jit": (lambda: cv.jit(lambda xs: lax.map(cnp.sin, xs, batch_size=0))(X5),
                                        np.sin(X5)),
    "checkpoint(prevent_cse=) a tuple of bools": (
        lambda: cv.jit(cv.grad(lambda w, x: cnp.sum(cv.checkpoint(lambda w, x: cnp.tanh(x @ w),
                                                                  prevent_cse=(False, False))(w, x) ** 2),
                               argnums=(0, 1)))(W, V),
        _layer_grad_reference(W, V)),
    "checkpoint(prevent_cse=) a pytree prefix": (
        lambda: cv.jit(cv.grad(_layer_loss(({"W": False, "x": True},)), argnums=(0, 1)))(W, V),
        _layer_grad_reference(W, V)),
    "checkpoint(prevent_cse=) a list": (
        lambda: cv.grad(_layer_loss([True]), argnums=(0, 1))(W, V), _layer_grad_reference(W, V)),
    "custom_vjp keyword-only argument left at its default": (lambda: cv.grad(_kwonly_default())(2.0), 3.0),
}


@pytest.mark.parametrize("name", ACCEPTS)
def test_accepts(name):
    thunk, expected = ACCEPTS[name]
    out = thunk()
    for o, e in zip(out, expected) if isinstance(expected, tuple) else [(out, expected)]:
        np.testing.assert_allclose(o, e, rtol=1e-12, atol=1e-12)
