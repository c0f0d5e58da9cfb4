"""The transforms — vmap, grad, value_and_grad, vjp, jvp, jacfwd, jacrev, hessian,
stop_gradient — alone and nested, with JAX's semantics.

Every check has an independent reference: a per-example Python loop (vmap), central finite
differences in float64 (derivatives), or a closed form (higher derivatives, Hessians).
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import cuvmap
import cuvmap.numpy as cnp
from cuvmap import grad, hessian, jacfwd, jacrev, jvp, stop_gradient, tree, value_and_grad, vjp, vmap


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------


def _take(t, prefix, b):
    """Example ``b`` of the pytree ``t`` mapped as the ``in_axes`` prefix ``prefix`` says
    (written independently of cuvmap's own prefix handling)."""
    if prefix is None:
        return t
    if isinstance(prefix, int):
        return tree.map(lambda leaf: np.take(np.asarray(leaf), b, axis=prefix), t)
    if isinstance(prefix, dict):
        return {k: _take(t[k], prefix[k], b) for k in t}
    return type(t)(_take(ti, pi, b) for ti, pi in zip(t, prefix))


def _stack(outs, prefix):
    """Stacks per-example outputs along the axes of the ``out_axes`` prefix ``prefix``."""
    if prefix is None:
        for o in outs[1:]:
            tree.map(np.testing.assert_array_equal, o, outs[0])
        return outs[0]
    if isinstance(prefix, int):
        return tree.map(lambda *ls: np.stack([np.asarray(v) for v in ls], axis=prefix), *outs)
    if isinstance(prefix, dict):
        return {k: _stack([o[k] for o in outs], prefix[k]) for k in outs[0]}
    return type(outs[0])(_stack([o[i] for o in outs], p) for i, p in enumerate(prefix))


def loop_vmap(f, args, in_axes=0, out_axes=0, size=None):
    """``vmap(f, in_axes, out_axes)(*args)`` as a Python loop over the examples."""
    in_axes = in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
    if size is None:
        sizes = {
            np.shape(leaf)[ax]
            for a, pa in zip(args, in_axes)
            for leaf, ax in _leaves_with_axes(a, pa)
            if ax is not None
        }
        (size,) = sizes
    outs = [f(*(_take(a, pa, b) for a, pa in zip(args, in_axes))) for b in range(size)]
    return _stack(outs, out_axes)


def _leaves_with_axes(t, prefix):
    if prefix is None or isinstance(prefix, int):
        return [(leaf, prefix) for leaf in tree.leaves(t)]
    if isinstance(prefix, dict):
        return [pair for k in t for pair in _leaves_with_axes(t[k], prefix[k])]
    return [pair for ti, pi in zip(t, prefix) for pair in _leaves_with_axes(ti, pi)]


def num_grad(f, x, eps=1e-6):
    """Central finite differences of a scalar ``f`` at the float64 array ``x``."""
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (float(f(x + e)) - float(f(x - e))) / (2 * eps)
    return g


def num_jac(f, x, eps=1e-6):
    """Central finite differences: shape ``f(x).shape + x.shape``."""
    x = np.asarray(x, dtype=np.float64)
    out_shape = np.shape(f(x))
    J = np.zeros(out_shape + x.shape)
    for i in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        J[(Ellipsis,) + i] = (np.asarray(f(x + e)) - np.asarray(f(x - e))) / (2 * eps)
    return J


def assert_tree_allclose(actual, expected, rtol=1e-7, atol=1e-9):
    assert tree.structure(actual) == tree.structure(expected), (tree.structure(actual), tree.structure(expected))
    for a, e in zip(tree.leaves(actual), tree.leaves(expected)):
        assert np.shape(a) == np.shape(e), (np.shape(a), np.shape(e))
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------
# vmap: in_axes, out_axes, axis_size, keyword arguments
# ---------------------------------------------------------------------------------------

R = _rng(0)
A34 = R.standard_normal((3, 4))
B34 = R.standard_normal((3, 4))
A234 = R.standard_normal((2, 3, 4))
V4 = R.standard_normal(4)
M45 = R.standard_normal((4, 5))


def _affine(x, w):
    return cnp.tanh(x @ w)


VMAP_CASES = [
    # (id, f, args, in_axes, out_axes)
    ("int-0", lambda x: cnp.sin(x) * 2.0, (A34,), 0, 0),
    ("int-1", lambda x: x.sum() + x, (A34,), 1, 0),
    ("negative", lambda x: x.max() * x, (A234,), -1, 0),
    ("negative-middle", lambda x: x.T @ x, (A234,), -2, 0),
    ("batch-size-1", lambda x: x * x.mean(), (A34[:1],), 0, 0),
    ("tuple-none", lambda x, v: x * v, (A34, V4), (0, None), 0),
    ("tuple-none-first", lambda v, x: v @ x, (V4, M45), (None, 1), 0),
    ("tuple-mixed-axes", lambda x, y: x @ y.T, (A234, A34), (1, -2), 0),
    ("list-in-axes", lambda x, v: x - v, (A34, V4), [0, None], 0),
    ("matmul-batched-weight", _affine, (A34, np.stack([M45] * 3)), (0, 0), 0),
    ("dict-prefix", lambda d: d["a"] * d["b"], ({"a": A34, "b": V4},), ({"a": 0, "b": None},), 0),
    ("nested-tuple-prefix", lambda t: t[0] + t[1][0] * t[1][1], ((A34, (V4, B34)),), ((0, (None, 0)),), 0),
    ("prefix-none-for-dict", lambda d, x: d["w"] @ x + d["b"], ({"w": M45.T, "b": np.ones(5)}, A34), (None, 0), 0),
    ("out-1", lambda x: x * 3.0, (A34,), 0, 1),
    ("out-negative", lambda x: cnp.outer(x, x), (A34,), 0, -1),
    ("out-tuple", lambda x: (x, x.sum()), (A34,), 0, (1, 0)),
    ("out-dict", lambda x: {"y": x * 2, "s": x.sum()}, (A34,), 0, {"y": -1, "s": 0}),
    ("out-none-unbatched", lambda x, v: (x + v, v * 2), (A34, V4), (0, None), (0, None)),
    ("in-1-out-2", lambda x: cnp.expand_dims(x, 0) * 1.5, (A234,), 1, 2),
]


@pytest.mark.parametrize("f, args, in_axes, out_axes", [c[1:] for c in VMAP_CASES], ids=[c[0] for c in VMAP_CASES])
def test_vmap_matches_loop(f, args, in_axes, out_axes):
    got = vmap(f, in_axes=in_axes, out_axes=out_axes)(*args)
    want = loop_vmap(f, args, tuple(in_axes) if isinstance(in_axes, list) else in_axes, out_axes)
    assert_tree_allclose(got, want, rtol=1e-12)


def test_vmap_results_are_plain_arrays():
    out = vmap(lambda x: (x.sum(), x))(A34)
    assert all(type(o) is np.ndarray for o in out)


def test_vmap_axis_size_when_nothing_is_mapped():
    out = vmap(lambda: np.arange(2.0), axis_size=3)()
    np.testing.assert_array_equal(out, np.tile(np.arange(2.0), (3, 1)))
    out = vmap(lambda v: v * 2.0, in_axes=None, axis_size=4)(V4)
    np.testing.assert_array_equal(out, np.tile(V4 * 2.0, (4, 1)))
    out = vmap(lambda v: v * 2.0, in_axes=None, axis_size=4, out_axes=1)(V4)
    np.testing.assert_array_equal(out, np.tile(V4 * 2.0, (4, 1)).T)
    # an axis_size that agrees with the mapped arguments is accepted
    np.testing.assert_array_equal(vmap(lambda x: x, axis_size=3)(A34), A34)


def test_vmap_keyword_arguments_are_mapped_along_axis_0():
    got = vmap(lambda x, w=None: x @ w, in_axes=(None,))(V4, w=np.stack([M45] * 2))
    np.testing.assert_allclose(got, np.stack([V4 @ M45] * 2))
    got = vmap(lambda x, *, y: x * y)(A34, y=B34)
    np.testing.assert_allclose(got, A34 * B34)


def test_vmap_unbatched_outputs_are_broadcast():
    x, c, s = vmap(lambda x: (x, np.ones(2), 3.0))(A34)
    np.testing.assert_array_equal(c, np.ones((3, 2)))
    np.testing.assert_array_equal(s, np.full(3, 3.0))
    _, c1 = vmap(lambda x: (x, np.arange(2.0)), out_axes=(0, 1))(A34)
    np.testing.assert_array_equal(c1, np.tile(np.arange(2.0), (3, 1)).T)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 7, 10])
@pytest.mark.parametrize(
    "in_axes, out_axes",
    [(0, 0), (1, 0), (0, 1), (1, -1), (0, (0, None)), (-1, (-2, None))],
    ids=["in0-out0", "in1-out0", "in0-out1", "in1-out-1", "unbatched-out", "neg-axes"],
)
def test_vmap_chunk_size_matches_unchunked(chunk_size, in_axes, out_axes):
    rng = _rng(3)
    x = rng.standard_normal((7, 7, 3))
    v = rng.standard_normal(3)

    def f(x):
        y = cnp.tanh(x * 0.5).sum(axis=-1, keepdims=True) * x[:1]
        return y if not isinstance(out_axes, tuple) else (y, v * 2.0)

    want = vmap(f, in_axes=in_axes, out_axes=out_axes)(x)
    got = vmap(f, in_axes=in_axes, out_axes=out_axes, chunk_size=chunk_size)(x)
    assert_tree_allclose(got, want, rtol=0, atol=0)
    assert_tree_allclose(got, loop_vmap(f, (x,), in_axes, out_axes), rtol=1e-12)


def test_vmap_chunk_size_with_kwargs_axis_size_and_grad():
    rng = _rng(4)
    xs, ys = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    np.testing.assert_array_equal(vmap(lambda x, y: x * y, chunk_size=2)(xs, y=ys), xs * ys)
    np.testing.assert_array_equal(vmap(lambda: np.ones(2), axis_size=5, chunk_size=2)(), np.ones((5, 2)))
    w = rng.standard_normal(3)
    g = vmap(grad(lambda w, x: cnp.sin(x @ w)), in_axes=(None, 0), chunk_size=2)(w, xs)
    np.testing.assert_allclose(g, np.cos(xs @ w)[:, None] * xs, rtol=1e-12)


LOGICAL_SHAPES = [(), (2,), (3, 2)]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data())
def test_vmap_random_axes_match_loop(data):
    """Random logical shapes (broadcast-compatible), batch sizes, in_axes (ints, negative ints,
    None) and out_axes (ints, negative ints, None for unbatched outputs) against the loop."""
    size = data.draw(st.integers(1, 3), label="size")
    n_args = data.draw(st.integers(1, 3), label="n_args")
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    args, in_axes = [], []
    for _ in range(n_args):
        shape = data.draw(st.sampled_from(LOGICAL_SHAPES))
        axis = data.draw(st.sampled_from([None] + list(range(-len(shape) - 1, len(shape) + 1))))
        phys = list(shape)
        if axis is not None:
            phys.insert(axis % (len(shape) + 1), size)
        args.append(rng.standard_normal(phys))
        in_axes.append(axis)
    if all(a is None for a in in_axes):
        in_axes[0] = 0
        args[0] = rng.standard_normal((size,) + args[0].shape)
    in_axes = tuple(in_axes)

    def f(*xs):
        out = cnp.sin(xs[0])
        for x in xs[1:]:
            out = out * x + x
        return out, out.sum(), xs[-1] * 2.0

    out_rank = max(a.ndim - (ax is not None) for a, ax in zip(args, in_axes))
    out_axes = (
        data.draw(st.sampled_from(list(range(-out_rank - 1, out_rank + 1)))),
        data.draw(st.sampled_from([0, -1])),
        data.draw(st.sampled_from([0, -1] + ([None] if in_axes[-1] is None else []))),
    )
    chunk_size = data.draw(st.sampled_from([None, 1, 2]))
    got = vmap(f, in_axes=in_axes, out_axes=out_axes, chunk_size=chunk_size)(*args)
    assert_tree_allclose(got, loop_vmap(f, args, in_axes, out_axes, size=size), rtol=1e-12)


def test_chunked_vmap_nested_and_differentiated():
    rng = _rng(14)
    xs = rng.standard_normal((3, 5, 2))
    w = rng.standard_normal(2)
    f = lambda x: cnp.sin(x) * x.sum()  # noqa: E731
    got = vmap(lambda x: vmap(f, chunk_size=2, out_axes=1)(x))(xs)
    np.testing.assert_allclose(got, np.stack([np.stack([f(r) for r in x], 1) for x in xs]), rtol=1e-12)
    g = grad(lambda w: vmap(lambda x: cnp.sin(x @ w), chunk_size=2)(xs[0]).sum())(w)
    np.testing.assert_allclose(g, (np.cos(xs[0] @ w)[:, None] * xs[0]).sum(0), rtol=1e-12)
    J = jacfwd(lambda w: vmap(lambda x: cnp.sin(x @ w), chunk_size=3)(xs[0]))(w)
    np.testing.assert_allclose(J, np.cos(xs[0] @ w)[:, None] * xs[0], rtol=1e-12)


def test_vmap_of_closure_over_outer_batched_value():
    xs, ys = np.arange(4.0), np.arange(3.0) * 10
    got = vmap(lambda x: vmap(lambda y: x + y)(ys))(xs)
    np.testing.assert_array_equal(got, xs[:, None] + ys[None, :])
    # the inner vmap maps a different axis of a batched closure value
    m = np.arange(12.0).reshape(3, 4)
    got = vmap(lambda x: vmap(lambda col: col * x.sum(), in_axes=1)(m))(A34)
    want = np.stack([np.stack([m[:, j] * a.sum() for j in range(4)]) for a in A34])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_vmap_of_vmap_with_different_axes():
    rng = _rng(5)
    x = rng.standard_normal((2, 3, 4))   # outer maps axis 0 (size 2), inner maps axis 2 (size 4)
    b = rng.standard_normal((3, 2))      # outer maps axis 1, inner does not map it

    def f(a, v):                         # a: (3,), v: (3,)
        return a * v + a.sum()

    inner = vmap(f, in_axes=(1, None), out_axes=1)                # (3, 4) per outer example
    got = vmap(inner, in_axes=(0, 1), out_axes=-1)(x, b)          # (3, 4, 2)
    want = np.zeros((3, 4, 2))
    for i in range(2):
        for j in range(4):
            want[:, j, i] = f(x[i, :, j], b[:, i])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_triple_vmap_matches_broadcasting():
    a, b, c = np.arange(2.0), np.arange(3.0), np.arange(4.0)
    got = vmap(lambda x: vmap(lambda y: vmap(lambda z: x * 100 + y * 10 + z)(c))(b))(a)
    np.testing.assert_array_equal(got, a[:, None, None] * 100 + b[None, :, None] * 10 + c)


# ---------------------------------------------------------------------------------------
# Derivatives against finite differences
# ---------------------------------------------------------------------------------------

X3 = np.array([0.3, -1.2, 0.8])
X23 = np.array([[0.3, -1.2, 0.8], [1.1, 0.4, -0.6]])
W32 = _rng(7).standard_normal((3, 2))

SCALAR_FUNS = [
    ("sin-sum", lambda x: cnp.sin(x).sum(), X3),
    ("poly", lambda x: (x ** 3 - 2.0 * x ** 2 + x / 3.0).sum(), X3),
    ("exp-log", lambda x: cnp.log(cnp.exp(x) + 1.0).mean(), X23),
    ("pow-float", lambda x: ((x * x + 1.0) ** 1.5).sum(), X3),
    ("rpow", lambda x: (2.0 ** x).sum(), X3),
    ("division", lambda x: (1.0 / (x * x + 2.0)).sum() + (x / 3).sum(), X23),
    ("matmul-tanh", lambda x: cnp.tanh(x @ W32).sum(), X23),
    ("logsumexp", lambda x: cnp.logsumexp(x, axis=1).sum(), X23),
    ("max-reduce", lambda x: x.max(axis=0).sum() + x.min(), X23),
    ("where", lambda x: cnp.where(x > 0, x ** 2, -x).sum(), X23),
    ("abs-sqrt", lambda x: cnp.sqrt(cnp.abs(x) + 1.0).sum(), X3),
    ("broadcast", lambda x: (x[:, None] * x[None, :] + x).sum(), X3),
    ("indexing", lambda x: ((x[1] * x[0, ::2].sum()).sum() + x[:, -1] @ x[:, 0]) * x[-1, 1:].sum(), X23),
    ("int-array-index", lambda x: (x[np.array([0, 2, 2])] ** 2).sum(), X3),
    ("reshape-transpose", lambda x: (x.reshape(3, 2).T @ x.reshape(2, 3).T).sum() ** 2, X23),
    ("var-std", lambda x: cnp.var(x) + cnp.std(x, axis=1).sum(), X23),
    ("sigmoid-clip", lambda x: cnp.sigmoid(cnp.clip(x, -1.0, 1.0)).sum(), X3 * 0.9),
    ("concat-stack", lambda x: (cnp.concatenate([x, x * 2]) * cnp.stack([x, x]).ravel()).sum(), X3),
]


@pytest.mark.parametrize("f, x", [c[1:] for c in SCALAR_FUNS], ids=[c[0] for c in SCALAR_FUNS])
def test_grad_value_and_grad_vjp_jvp_against_finite_differences(f, x):
    want = num_grad(f, x)
    g = grad(f)(x)
    assert g.shape == x.shape and g.dtype == np.float64
    np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-8)
    v, g2 = value_and_grad(f)(x)
    np.testing.assert_allclose(v, f(x), rtol=1e-14)
    np.testing.assert_allclose(g2, g, rtol=1e-14)
    out, pullback = vjp(f, x)
    (g3,) = pullback(np.array(2.0))
    np.testing.assert_allclose(g3, 2 * want, rtol=1e-6, atol=1e-8)
    t = _rng(8).standard_normal(x.shape)
    y, y_dot = jvp(f, (x,), (t,))
    np.testing.assert_allclose(y, f(x), rtol=1e-14)
    np.testing.assert_allclose(y_dot, np.sum(want * t), rtol=1e-6, atol=1e-8)


VECTOR_FUNS = [
    ("sin", lambda x: cnp.sin(x) * x[0], X3),
    ("outer", lambda x: cnp.outer(x, x ** 2), X3),
    ("matmul", lambda x: x.T @ x, X23),
    ("softmax", lambda x: cnp.exp(x - cnp.logsumexp(x, axis=-1, keepdims=True)), X23),
    ("cumulative", lambda x: cnp.stack([x[0], x[0] + x[1], x[0] * x[1] * x[2]]), X3),
]


@pytest.mark.parametrize("f, x", [c[1:] for c in VECTOR_FUNS], ids=[c[0] for c in VECTOR_FUNS])
def test_jacfwd_jacrev_against_finite_differences(f, x):
    want = num_jac(f, x)
    Jf, Jr = jacfwd(f)(x), jacrev(f)(x)
    assert Jf.shape == Jr.shape == want.shape == np.shape(f(x)) + x.shape
    np.testing.assert_allclose(Jf, want, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(Jr, want, rtol=1e-6, atol=1e-8)


def test_argnums_tuple_and_negative():
    f = lambda x, y, z: (cnp.sin(x) * y).sum() + z  # noqa: E731
    x, y = X3, X3[::-1].copy()
    gx, gy = grad(f, argnums=(0, 1))(x, y, 1.0)
    np.testing.assert_allclose(gx, np.cos(x) * y)
    np.testing.assert_allclose(gy, np.sin(x))
    np.testing.assert_allclose(grad(f, argnums=-1)(x, y, 1.0), 1.0)
    J = jacrev(lambda a, b: a * b, argnums=(0, 1))(x, y)
    assert isinstance(J, tuple)
    np.testing.assert_allclose(J[0], np.diag(y))
    np.testing.assert_allclose(J[1], np.diag(x))
    J = jacfwd(lambda a, b: a * b, argnums=(1,))(x, y)
    assert isinstance(J, tuple) and len(J) == 1
    np.testing.assert_allclose(J[0], np.diag(x))


def test_keyword_arguments_are_not_differentiated():
    g = grad(lambda x, scale=1.0: (x * scale).sum())(X3, scale=3.0)
    np.testing.assert_allclose(g, 3.0)


def test_has_aux_everywhere():
    def f(x):
        return (x ** 2).sum(), {"mean": x.mean(), "n": 3}

    (v, aux), g = value_and_grad(f, has_aux=True)(X3)
    np.testing.assert_allclose(v, (X3 ** 2).sum())
    np.testing.assert_allclose(aux["mean"], X3.mean())
    assert aux["n"] == 3
    g2, aux2 = grad(f, has_aux=True)(X3)
    np.testing.assert_allclose(g2, 2 * X3)
    np.testing.assert_allclose(aux2["mean"], X3.mean())
    out, pullback, aux3 = vjp(lambda x: (x * 2, x.sum()), X3, has_aux=True)
    np.testing.assert_allclose(pullback(np.ones(3))[0], 2.0)
    np.testing.assert_allclose(aux3, X3.sum())
    y, y_dot, aux4 = jvp(lambda x: (x * 2, x.sum()), (X3,), (np.ones(3),), has_aux=True)
    np.testing.assert_allclose(y_dot, 2.0)
    np.testing.assert_allclose(aux4, X3.sum())
    for jac in (jacfwd, jacrev):
        J, aux5 = jac(lambda x: (x ** 2, {"s": x.sum(), "x": x, "tag": "sq"}), has_aux=True)(X3)
        np.testing.assert_allclose(J, np.diag(2 * X3))
        np.testing.assert_allclose(aux5["s"], X3.sum())
        np.testing.assert_allclose(aux5["x"], X3)
        assert aux5["tag"] == "sq" and aux5["s"].shape == () and aux5["x"].shape == (3,)


def test_vjp_of_multiple_outputs_and_integer_input():
    out, pullback = vjp(lambda x, n: (x * n, cnp.sin(x)), X3, 3)
    ct_x, ct_n = pullback((np.ones(3), np.full(3, 2.0)))
    np.testing.assert_allclose(ct_x, 3 + 2 * np.cos(X3))
    assert ct_n.dtype == cuvmap.dtypes.float0 and ct_n.shape == ()  # an integer input: JAX's float0 zero
    # the pullback can be called again with another cotangent
    np.testing.assert_allclose(pullback((np.zeros(3), np.ones(3)))[0], np.cos(X3))


def test_stop_gradient():
    x = X3
    np.testing.assert_allclose(grad(lambda x: (x * stop_gradient(x)).sum())(x), x)
    np.testing.assert_allclose(jvp(lambda x: x * stop_gradient(x), (x,), (np.ones(3),))[1], x)
    np.testing.assert_allclose(grad(lambda x: stop_gradient(x ** 2).sum() + x.sum())(x), 1.0)
    np.testing.assert_allclose(vmap(stop_gradient)(X23), X23)
    tree_out = stop_gradient({"a": x, "b": (x, None)})
    assert tree.structure(tree_out) == tree.structure({"a": x, "b": (x, None)})
    g = grad(lambda d: (d["a"] * stop_gradient(d)["b"]).sum())({"a": x, "b": 2 * x})
    np.testing.assert_allclose(g["a"], 2 * x)
    np.testing.assert_allclose(g["b"], 0.0)


# ---------------------------------------------------------------------------------------
# Higher order and closed forms
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("x0", [0.7, -2.1])
def test_third_derivative_of_sin(x0):
    d1, d2, d3 = grad(cnp.sin), grad(grad(cnp.sin)), grad(grad(grad(cnp.sin)))
    np.testing.assert_allclose(d1(x0), np.cos(x0), rtol=1e-14)
    np.testing.assert_allclose(d2(x0), -np.sin(x0), rtol=1e-14)
    np.testing.assert_allclose(d3(x0), -np.cos(x0), rtol=1e-14)
    np.testing.assert_allclose(grad(grad(grad(grad(lambda x: x ** 5))))(x0), 120 * x0, rtol=1e-12)


def test_hessian_of_quadratic_form_is_a_plus_a_transpose():
    A = _rng(9).standard_normal((4, 4))
    x = _rng(10).standard_normal(4)
    H = hessian(lambda x: x @ A @ x)(x)
    np.testing.assert_allclose(H, A + A.T, rtol=1e-12, atol=1e-12)
    for h in (jacfwd(jacfwd(lambda x: x @ A @ x)), jacrev(jacrev(lambda x: x @ A @ x)), jacrev(jacfwd(lambda x: x @ A @ x))):
        np.testing.assert_allclose(h(x), A + A.T, rtol=1e-12, atol=1e-12)


def test_hessian_closed_forms():
    x = X23
    np.testing.assert_allclose(
        hessian(lambda x: cnp.sin(x).sum())(x), np.diag(-np.sin(x).ravel()).reshape(2, 3, 2, 3), atol=1e-14
    )
    # log-sum-exp: H = diag(p) - p p^T
    v = X3
    p = np.exp(v) / np.exp(v).sum()
    np.testing.assert_allclose(hessian(cnp.logsumexp)(v), np.diag(p) - np.outer(p, p), rtol=1e-10, atol=1e-12)
    # Python scalar input: f(x) = x^3 -> 6x
    np.testing.assert_allclose(hessian(lambda s: s ** 3)(2.0), 12.0)


def test_hessian_of_pytree_input():
    def f(d):
        return (d["a"] ** 2).sum() * d["b"]

    d = {"a": np.array([1.0, 2.0]), "b": np.array(3.0)}
    H = hessian(f)(d)
    np.testing.assert_allclose(H["a"]["a"], 2 * 3.0 * np.eye(2))
    np.testing.assert_allclose(H["a"]["b"], 2 * d["a"])
    np.testing.assert_allclose(H["b"]["a"], 2 * d["a"])
    np.testing.assert_allclose(H["b"]["b"], 0.0)
    assert H["a"]["b"].shape == (2,) and H["b"]["b"].shape == ()


def test_jacobian_of_pytree_inputs_and_outputs():
    def f(d):
        return {"s": (d["a"] * d["b"][0]).sum(), "v": d["a"] * 2.0}

    d = {"a": np.array([1.0, 2.0, 3.0]), "b": (np.array([4.0, 5.0, 6.0]),)}
    for jac in (jacfwd, jacrev):
        J = jac(f)(d)
        assert J["s"]["a"].shape == (3,) and J["s"]["b"][0].shape == (3,)
        assert J["v"]["a"].shape == (3, 3) and J["v"]["b"][0].shape == (3, 3)
        np.testing.assert_allclose(J["s"]["a"], d["b"][0])
        np.testing.assert_allclose(J["s"]["b"][0], d["a"])
        np.testing.assert_allclose(J["v"]["a"], 2 * np.eye(3))
        np.testing.assert_allclose(J["v"]["b"][0], 0.0)


def test_forward_over_reverse_is_hessian_vector_product():
    A = _rng(11).standard_normal((3, 3))
    f = lambda x: cnp.sin(x @ A @ x)  # noqa: E731
    x, v = X3, np.array([1.0, -2.0, 0.5])
    _, hvp = jvp(grad(f), (x,), (v,))
    H = num_jac(lambda x: (np.cos(x @ A @ x) * (A + A.T) @ x), x)
    np.testing.assert_allclose(hvp, H @ v, rtol=1e-5)
    # reverse-over-forward
    rof = grad(lambda x: jvp(f, (x,), (v,))[1])(x)
    np.testing.assert_allclose(rof, H @ v, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Nesting with vmap
# ---------------------------------------------------------------------------------------


def _mlp(params, x, y):
    h = cnp.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return ((logits - y) ** 2).mean()


def _mlp_data(dtype=np.float64, n=5):
    rng = _rng(12)
    params = {
        "w1": rng.standard_normal((3, 4)).astype(dtype),
        "b1": rng.standard_normal(4).astype(dtype),
        "w2": rng.standard_normal((4, 2)).astype(dtype),
        "b2": rng.standard_normal(2).astype(dtype),
    }
    return params, rng.standard_normal((n, 3)).astype(dtype), rng.standard_normal((n, 2)).astype(dtype)


def test_vmap_grad_of_mlp_matches_loop_of_grad_and_finite_differences():
    params, xs, ys = _mlp_data()
    per_example = vmap(grad(_mlp), in_axes=(None, 0, 0))(params, xs, ys)
    loop = loop_vmap(grad(_mlp), (params, xs, ys), (None, 0, 0))
    assert_tree_allclose(per_example, loop, rtol=1e-12)
    # and the single-example gradient itself against finite differences, leaf by leaf
    for k in params:
        def f_k(v, k=k):
            return _mlp({**params, k: v}, xs[0], ys[0])

        np.testing.assert_allclose(per_example[k][0], num_grad(f_k, params[k]), rtol=1e-6, atol=1e-8)


def test_grad_of_vmap_is_sum_of_per_example_grads():
    params, xs, ys = _mlp_data()
    g = grad(lambda p: vmap(_mlp, in_axes=(None, 0, 0))(p, xs, ys).sum())(params)
    per_example = loop_vmap(grad(_mlp), (params, xs, ys), (None, 0, 0))
    assert_tree_allclose(g, tree.map(lambda v: v.sum(0), per_example), rtol=1e-12)


def test_vmap_of_value_and_grad_and_of_vmap_of_grad():
    params, xs, ys = _mlp_data(n=6)
    vals, grads = vmap(value_and_grad(_mlp), in_axes=(None, 0, 0))(params, xs, ys)
    np.testing.assert_allclose(vals, [_mlp(params, x, y) for x, y in zip(xs, ys)], rtol=1e-12)
    nested = vmap(vmap(grad(_mlp), in_axes=(None, 0, 0)), in_axes=(None, 0, 0))(
        params, xs.reshape(2, 3, 3), ys.reshape(2, 3, 2)
    )
    assert_tree_allclose(tree.map(lambda v: v.reshape((6,) + v.shape[2:]), nested), grads, rtol=1e-12)


def test_vmap_of_jvp_and_of_vjp():
    xs = X23
    ts = np.array([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0]])
    y_dot = vmap(lambda x, t: jvp(lambda z: cnp.sin(z) * z, (x,), (t,))[1])(xs, ts)
    np.testing.assert_allclose(y_dot, (np.cos(xs) * xs + np.sin(xs)) * ts, rtol=1e-12)
    cts = vmap(lambda x, c: vjp(lambda z: cnp.exp(z).sum() * z, x)[1](c)[0])(xs, ts)
    want = loop_vmap(lambda x, c: (np.exp(x) * (c @ x) + np.exp(x).sum() * c), (xs, ts))
    np.testing.assert_allclose(cts, want, rtol=1e-12)


def test_vmap_of_jacobians_and_hessian():
    xs = X23
    f = lambda x: cnp.sin(x) * x.sum()  # noqa: E731
    for jac in (jacfwd, jacrev):
        got = vmap(jac(f))(xs)
        np.testing.assert_allclose(got, np.stack([num_jac(f, x) for x in xs]), rtol=1e-6, atol=1e-8)
    H = vmap(hessian(lambda x: (x ** 3).sum() * x[0]))(xs)
    want = np.stack([np.diag(6 * x * x[0]) + np.outer(np.eye(3)[0], 3 * x ** 2) + np.outer(3 * x ** 2, np.eye(3)[0]) for x in xs])
    np.testing.assert_allclose(H, want, rtol=1e-12)


def test_grad_of_function_closing_over_a_vmap_batched_value():
    # vmap outside, grad inside: the closure x is batched, the differentiated w is not
    xs = X23
    g = vmap(lambda x: grad(lambda w: cnp.sin(w * x).sum())(0.5))(xs)
    np.testing.assert_allclose(g, (np.cos(0.5 * xs) * xs).sum(1), rtol=1e-12)
    # grad outside, vmap inside: the closure w is being differentiated
    g = grad(lambda w: vmap(lambda x: cnp.sin(x @ w))(xs).sum())(X3)
    np.testing.assert_allclose(g, (np.cos(xs @ X3)[:, None] * xs).sum(0), rtol=1e-12)


def test_second_derivative_through_vmap():
    x = _rng(15).standard_normal(4)

    def inner(s):
        return grad(lambda w: vmap(lambda v: cnp.sin(v * w * s))(x).sum())(1.0)

    # inner(s) = Σ x s cos(x s); its derivative is Σ x cos(x s) - x² s sin(x s)
    np.testing.assert_allclose(grad(inner)(0.7), (x * np.cos(0.7 * x) - x ** 2 * 0.7 * np.sin(0.7 * x)).sum(), rtol=1e-12)


def test_jacfwd_of_jacrev_of_vector_function():
    f = lambda x: cnp.sin(x) * x[0]  # noqa: E731
    T = jacfwd(jacrev(f))(X3)
    assert T.shape == (3, 3, 3)
    want = num_jac(lambda x: num_jac(f, x, eps=1e-5), X3, eps=1e-5)
    np.testing.assert_allclose(T, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Perturbation confusion: nested transforms keep their tracers apart
# ---------------------------------------------------------------------------------------


def test_nested_grad_does_not_confuse_perturbations():
    assert grad(lambda x: grad(lambda y: x * y)(1.0))(1.0) == 1.0
    # d/dx [x * d/dy (x + y)] = d/dx [x] = 1  (a confused implementation gives 2)
    assert grad(lambda x: x * grad(lambda y: x + y)(1.0))(1.0) == 1.0
    # d/dx [d/dy (x * y^2) at y = x] = d/dx [2 x^2] = 4x
    np.testing.assert_allclose(grad(lambda x: grad(lambda y: x * y ** 2)(x))(3.0), 12.0)


def test_nested_jvp_does_not_confuse_perturbations():
    def outer(x):
        return x * jvp(lambda y: x + y, (1.0,), (1.0,))[1]

    _, t = jvp(outer, (1.0,), (1.0,))
    assert t == 1.0
    _, t = jvp(lambda x: jvp(lambda y: x * y, (2.0,), (1.0,))[1], (5.0,), (1.0,))
    assert t == 1.0


def test_nested_vmap_does_not_confuse_batch_dims():
    xs, ys = np.arange(4.0), np.arange(3.0) * 10
    np.testing.assert_array_equal(vmap(lambda x: vmap(lambda y: x + y)(ys))(xs), xs[:, None] + ys)
    # the same array mapped by both levels
    zs = np.arange(3.0)
    np.testing.assert_array_equal(vmap(lambda a: vmap(lambda b: a * 10 + b)(zs))(zs), zs[:, None] * 10 + zs)
    # inner result that does not depend on the inner value is still broadcast per inner example
    np.testing.assert_array_equal(vmap(lambda x: vmap(lambda y: x * 2.0)(ys))(xs), np.tile(xs[:, None] * 2, (1, 3)))


# ---------------------------------------------------------------------------------------
# dtypes: weak Python scalars, float32 stays float32
# ---------------------------------------------------------------------------------------

WEAK_FUNS = [
    ("scale", lambda x: (x * 2.0).sum()),
    ("pow", lambda x: (x ** 2.5 + x ** 2).sum()),
    ("rpow", lambda x: (2.0 ** x).sum()),
    ("div", lambda x: (1.0 / (x + 3.0)).sum()),
    ("mean-var", lambda x: cnp.mean(x) + cnp.var(x)),
    ("where", lambda x: cnp.where(x > 0.5, x, 0.0).sum()),
    ("maximum", lambda x: cnp.maximum(x, 0.5).sum()),
    ("logsumexp", lambda x: cnp.logsumexp(x * 0.5)),
    ("sqrt-tanh", lambda x: (cnp.sqrt(x + 1.0) * cnp.tanh(x)).sum()),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("f", [c[1] for c in WEAK_FUNS], ids=[c[0] for c in WEAK_FUNS])
def test_python_scalars_are_weakly_typed(f, dtype):
    x = np.array([0.25, 1.0, 2.0], dtype=dtype)
    v, g = value_and_grad(f)(x)
    assert v.dtype == dtype and g.dtype == dtype
    np.testing.assert_allclose(g, num_grad(lambda z: f(z), x.astype(np.float64)), rtol=1e-3 if dtype == np.float32 else 1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_transform_keeps_the_input_dtype(dtype):
    x = np.array([0.5, -1.0, 2.0], dtype=dtype)
    f = lambda x: cnp.sin(x) * 3.0  # noqa: E731
    assert vmap(f)(x).dtype == dtype
    assert jvp(f, (x,), (np.ones(3, dtype),))[1].dtype == dtype
    assert vjp(f, x)[1](np.ones(3, dtype))[0].dtype == dtype
    assert jacfwd(f)(x).dtype == dtype
    assert jacrev(f)(x).dtype == dtype
    assert hessian(lambda x: (f(x) ** 2).sum())(x).dtype == dtype
    params, xs, ys = _mlp_data(dtype)
    per_example = vmap(grad(_mlp), in_axes=(None, 0, 0))(params, xs, ys)
    assert all(v.dtype == dtype for v in tree.leaves(per_example))


def test_python_float_arguments():
    # a Python float argument gives a float64 (0-d array) gradient; with a float32 array it
    # adopts float32, as in JAX
    g = grad(lambda a: a * 3.0)(2.0)
    assert isinstance(g, np.ndarray) and g.shape == () and g == 3.0
    g = grad(lambda a, x: (a * x).sum())(2.0, np.ones(3, np.float32))
    assert g.dtype == np.float32 and g == 3.0


# ---------------------------------------------------------------------------------------
# Integer and boolean values inside grad and vmap
# ---------------------------------------------------------------------------------------


def test_integer_values_flow_through_grad():
    x = np.array([1.0, 3.0, 2.0, -1.0])
    np.testing.assert_array_equal(grad(lambda x: x[cnp.argmax(x)] * 2.0)(x), [0, 2, 0, 0])
    np.testing.assert_array_equal(grad(lambda x: (x * (x > 1.5)).sum())(x), [0, 1, 1, 0])
    np.testing.assert_array_equal(grad(lambda x: x[np.array([0, 0, 3])].sum())(x), [2, 0, 0, 1])
    np.testing.assert_array_equal(grad(lambda x, i: x[i] ** 2)(x, 2), [0, 0, 4, 0])
    np.testing.assert_array_equal(grad(lambda x: (x > 0).sum() * x.sum())(x), [3, 3, 3, 3])
    np.testing.assert_array_equal(grad(lambda x: x.astype(np.int64).sum() + x.sum())(x), [1, 1, 1, 1])
    np.testing.assert_allclose(grad(lambda x: cnp.take_along_axis(x, cnp.argmax(x, axis=0)[None], 0).sum())(x[:, None]), [[0], [1], [0], [0]])


def test_integer_values_flow_through_vmap():
    xs = np.array([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]])
    idx = np.array([2, 0])
    np.testing.assert_array_equal(vmap(cnp.argmax)(xs), [1, 0])
    assert vmap(cnp.argmax)(xs).dtype.kind == "i"
    np.testing.assert_array_equal(vmap(lambda x, i: x[i])(xs, idx), [2.0, 5.0])
    np.testing.assert_array_equal(vmap(lambda x: x[cnp.argmax(x)])(xs), [3.0, 5.0])
    np.testing.assert_array_equal(vmap(lambda x: (x > 1.5))(xs), xs > 1.5)
    np.testing.assert_array_equal(vmap(lambda x: (x > 1.5).sum())(xs), [2, 1])
    np.testing.assert_array_equal(vmap(lambda i: i * 2 + 1)(np.arange(3)), [1, 3, 5])
    np.testing.assert_array_equal(vmap(lambda x, i: cnp.take(x, i), in_axes=(None, 0))(xs[0], idx), [2.0, 1.0])
    np.testing.assert_array_equal(vmap(lambda x: (x > 0) & (x < 3))(xs), (xs > 0) & (xs < 3))
    np.testing.assert_array_equal(vmap(lambda x: ~(x > 1) | (x == 5))(xs), ~(xs > 1) | (xs == 5))


def test_vmap_of_grad_with_batched_integer_indices():
    xs = np.array([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]])
    idx = np.array([[2, 2], [0, 1]])
    g = vmap(grad(lambda x, i: (x[i] ** 2).sum()))(xs, idx)
    want = loop_vmap(lambda x, i: np.bincount(i, weights=2 * x[i], minlength=3), (xs, idx))
    np.testing.assert_allclose(g, want)
    g = vmap(grad(lambda x: x[cnp.argmax(x)] * x.sum()))(xs)
    np.testing.assert_allclose(g, [[3, 3 + 6, 3], [5 + 6, 5, 5]])


# ---------------------------------------------------------------------------------------
# Tracer operators and methods under vmap and grad
# ---------------------------------------------------------------------------------------

C34 = np.arange(12.0).reshape(3, 4) / 7.0 - 0.8

TRACER_OPS = [
    ("add", lambda x: x + x[0] + 1.5),
    ("radd-array", lambda x: C34[0] + x),
    ("sub", lambda x: x - 2.0 - x[:, :1]),
    ("rsub", lambda x: 1.0 - x),
    ("mul", lambda x: x * x * 3),
    ("rmul-array", lambda x: C34 * x),
    ("truediv", lambda x: x / (x * x + 1.0)),
    ("rtruediv", lambda x: 2.0 / (x * x + 1.0)),
    ("pow-int", lambda x: x ** 3),
    ("pow-float", lambda x: (x * x + 0.5) ** 0.75),
    ("matmul", lambda x: x @ x.T),
    ("rmatmul-array", lambda x: C34.T @ x),
    ("matmul-vector", lambda x: x @ C34[0]),
    ("neg", lambda x: -x),
    ("pos-abs", lambda x: abs(+x)),
    ("getitem-int", lambda x: x[1]),
    ("getitem-neg-slice", lambda x: x[-1, ::-2]),
    ("getitem-ellipsis-none", lambda x: x[..., None, 1:3]),
    ("getitem-int-array", lambda x: x[np.array([2, 0, 2])]),
    ("getitem-two-arrays", lambda x: x[np.array([0, 2]), np.array([1, 3])]),
    ("T", lambda x: x.T * 2),
    ("reshape", lambda x: x.reshape(2, 6) * x.reshape(-1)[:6]),
    ("reshape-tuple", lambda x: x.reshape((4, 3))),
    ("transpose", lambda x: x.transpose() + x.transpose((1, 0))),
    ("sum", lambda x: x.sum() + x.sum(axis=0) * x.sum(axis=1, keepdims=True) + x.sum(axis=(0, 1))),
    ("mean", lambda x: x.mean(axis=-1) * x.mean()),
    ("max-min", lambda x: x.max(axis=0) - x.min(axis=1, keepdims=True)),
    ("astype", lambda x: x.astype(np.float32).astype(np.float64) * 2),
    ("shape-ndim-size-dtype", lambda x: x * (x.shape[0] + x.ndim + x.size) if x.dtype == np.float64 else x),
    ("len-iter", lambda x: sum(row * i for i, row in enumerate(x)) * len(x)),
    ("numpy-functions", lambda x: np.sum(x, axis=0) * np.mean(x) + np.max(x)),
]


@pytest.mark.parametrize("f", [c[1] for c in TRACER_OPS], ids=[c[0] for c in TRACER_OPS])
def test_tracer_operators_under_vmap(f):
    xs = np.stack([C34, C34 * -0.5 + 0.1])
    np.testing.assert_allclose(vmap(f)(xs), loop_vmap(f, (xs,)), rtol=1e-6)
    # mapped along another axis
    np.testing.assert_allclose(vmap(f, in_axes=2)(np.stack([C34] * 2, axis=2)), loop_vmap(f, (np.stack([C34] * 2, axis=2),), 2), rtol=1e-6)


@pytest.mark.parametrize(
    "f", [c[1] for c in TRACER_OPS if c[0] != "astype"], ids=[c[0] for c in TRACER_OPS if c[0] != "astype"]
)
def test_tracer_operators_under_grad(f):
    x = C34 + 0.05  # away from ties and kinks
    w = _rng(13).standard_normal(np.shape(f(x)))

    def scalar(x):
        return (f(x) * w).sum()

    np.testing.assert_allclose(grad(scalar)(x), num_grad(scalar, x), rtol=1e-5, atol=1e-7)


COMPARISONS = [
    ("lt", lambda x: x < 0.1), ("le", lambda x: x <= C34[0]), ("gt", lambda x: x > x[0]),
    ("ge", lambda x: 0.2 >= x), ("eq", lambda x: x == x.max()), ("ne", lambda x: C34 != x),
]


@pytest.mark.parametrize("f", [c[1] for c in COMPARISONS], ids=[c[0] for c in COMPARISONS])
def test_tracer_comparisons(f):
    xs = np.stack([C34, -C34])
    got = vmap(f)(xs)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, loop_vmap(f, (xs,)))
    # inside grad they carry no derivative but select values
    g = grad(lambda x: cnp.where(f(x), x, 0.0).sum())(C34)
    np.testing.assert_array_equal(g, f(C34).astype(np.float64))


def test_astype_under_grad_casts_the_gradient_back():
    x = C34
    g = grad(lambda x: (x.astype(np.float32) * 2.0).sum())(x)
    assert g.dtype == np.float64
    np.testing.assert_array_equal(g, 2.0)
    g32 = grad(lambda x: (x.astype(np.float64) ** 2).sum())(x.astype(np.float32))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, 2 * x.astype(np.float32), rtol=1e-6)


def test_tracer_attributes_inside_transforms():
    seen = {}

    def f(x):
        seen[type(x).__name__] = (x.shape, x.ndim, x.size, x.dtype, x.T.shape)
        return x.sum()

    vmap(f)(np.zeros((5, 3, 2), np.float32))
    grad(f)(np.zeros((3, 2)))
    assert seen["BatchTracer"] == ((3, 2), 2, 6, np.dtype(np.float32), (2, 3))
    assert seen["VJPTracer"] == ((3, 2), 2, 6, np.dtype(np.float64), (2, 3))


def test_python_control_flow_on_concrete_values_inside_grad():
    def f(x):
        return x ** 2 if x > 0 else -x

    assert grad(f)(3.0) == 6.0
    assert grad(f)(-3.0) == -1.0


# ---------------------------------------------------------------------------------------
# Backends: the same programs on the GPU (skipped without CuPy and a CUDA device)
# ---------------------------------------------------------------------------------------


def _to_host(t):
    return cuvmap.device_put(t, "cpu")


def test_transforms_on_each_backend(backend):
    params, xs, ys = _mlp_data(n=4)
    p_dev, xs_dev, ys_dev = cuvmap.device_put((params, xs, ys), backend)
    per_example = vmap(grad(_mlp), in_axes=(None, 0, 0))(p_dev, xs_dev, ys_dev)
    assert all(cuvmap.backend.backend_name(v) == backend for v in tree.leaves(per_example))
    assert_tree_allclose(_to_host(per_example), loop_vmap(grad(_mlp), (params, xs, ys), (None, 0, 0)), rtol=1e-10)
    x = cuvmap.device_put(X3, backend)
    A = _rng(16).standard_normal((3, 3))
    H = hessian(lambda x: x @ cuvmap.device_put(A, backend) @ x)(x)
    assert cuvmap.backend.backend_name(H) == backend
    np.testing.assert_allclose(_to_host(H), A + A.T, rtol=1e-12, atol=1e-12)
    J = jacfwd(lambda x: cnp.sin(x) * x[0])(x)
    np.testing.assert_allclose(_to_host(J), num_jac(lambda x: np.sin(x) * x[0], X3), rtol=1e-6, atol=1e-8)
    out = vmap(lambda x: x * 2.0, chunk_size=2, out_axes=1)(cuvmap.device_put(X23, backend))
    np.testing.assert_allclose(_to_host(out), X23.T * 2)


# A Python complex number is a value as np.complex128 is (core.is_value, one test for every
# transform); the reference is the closed form of f(z) = z * z: f'(z) = 2z.
_Z = 1.0 + 2.0j
_COMPLEX_SCALAR_CASES = {
    # a complex output needs holomorphic=True (JAX's rule: NOTE [complex convention])
    "grad": (lambda z: grad(lambda x: x * x, holomorphic=True)(z), 2 * _Z),
    "vjp": (lambda z: vjp(lambda x: x * x, z)[1](1.0 + 0.0j)[0], 2 * _Z),
    "jvp": (lambda z: jvp(lambda x: x * x, (z,), (1.0j,))[1], 2 * _Z * 1.0j),
    "linearize": (lambda z: cuvmap.linearize(lambda x: x * x, z)[1](1.0j), 2 * _Z * 1.0j),
    "jit": (lambda z: cuvmap.jit(lambda x: x * x)(z), _Z * _Z),
    "vmap": (lambda z: vmap(lambda x, c: x * c, in_axes=(0, None))(np.ones(2), z), np.array([_Z, _Z])),
}


@pytest.mark.parametrize("name", sorted(_COMPLEX_SCALAR_CASES))
def test_a_python_complex_scalar_is_a_value_like_complex128(name):
    run, want = _COMPLEX_SCALAR_CASES[name]
    np.testing.assert_allclose(np.asarray(run(_Z)), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(run(np.complex128(_Z))), want, rtol=1e-12)


@pytest.mark.parametrize("x, is_value", [
    (1, True), (1.5, True), (True, True), (1j, True), (np.float32(2.0), True), (np.zeros((2, 3)), True),
    ("1.0", False), (None, False), (len, False), ([1.0], False),
])
def test_is_value(x, is_value):
    assert cuvmap.core.is_value(x) is is_value
