"""Pytrees: cuvmap.tree's utilities (flatten, map, paths, reduce, all, structure,
transpose, broadcast_prefix), cuvmap.flatten_util.ravel_pytree, containers (tuples, lists,
dicts, namedtuples, None, a registered user class) flowing through every transform, and
device_put over a tree.

References: hand-built expected structures, paths and vectors; per-example loops and
closed-form gradients under the transforms.
"""
import collections

import numpy as np
import pytest

import cuvmap
import cuvmap.numpy as cnp
from cuvmap import grad, jacfwd, jacrev, jvp, tree, vjp, vmap
from cuvmap.flatten_util import ravel_pytree

Pair = collections.namedtuple("Pair", "w b")


class Point:
    """A user container registered as a pytree node (children x, y; static tag)."""

    def __init__(self, x, y, tag="pt"):
        self.x, self.y, self.tag = x, y, tag

    def __repr__(self):
        return f"Point({self.x!r}, {self.y!r}, {self.tag!r})"


tree.register_pytree_node(Point, lambda p: ((p.x, p.y), p.tag), lambda tag, xy: Point(*xy, tag=tag))


def _rng(seed=0):
    return np.random.default_rng(seed)


NESTED = {"b": [1, (2, 3)], "a": Pair(4, None), "c": Point(5, None), "n": None}


# ---------------------------------------------------------------------------------------
# cuvmap.tree: flatten, map, broadcast_prefix
# ---------------------------------------------------------------------------------------


TREES = [
    pytest.param(1.0, [1.0], id="leaf"),
    pytest.param((1, 2, 3), [1, 2, 3], id="tuple"),
    pytest.param([1, (2, 3)], [1, 2, 3], id="list-of-tuple"),
    pytest.param({"b": 2, "a": 1}, [1, 2], id="dict-sorted-keys"),
    pytest.param(Pair(1, 2), [1, 2], id="namedtuple"),
    pytest.param(None, [], id="none"),
    pytest.param((1, None, 2), [1, 2], id="none-inside"),
    pytest.param(Point(1, (2, 3)), [1, 2, 3], id="registered"),
    pytest.param({"p": Point(1, 2), "l": [Pair(3, None)]}, [3, 1, 2], id="nested"),
]


@pytest.mark.parametrize("t, expected", TREES)
def test_flatten_leaves_unflatten(t, expected):
    leaves, treedef = tree.flatten(t)
    assert leaves == expected
    assert tree.leaves(t) == expected
    rebuilt = tree.unflatten(treedef, leaves)
    assert tree.structure(rebuilt) == treedef
    assert tree.leaves(rebuilt) == expected
    assert type(rebuilt) is type(t)


@pytest.mark.parametrize("t, expected", TREES)
def test_map_doubles_every_leaf(t, expected):
    out = tree.map(lambda v: v * 2, t)
    assert tree.structure(out) == tree.structure(t)
    assert tree.leaves(out) == [2 * v for v in expected]


def test_map_several_trees_and_none_is_empty():
    a = {"x": (1, 2), "n": None}
    b = {"x": (10, 20), "n": None}
    assert tree.map(lambda u, v: u + v, a, b) == {"x": (11, 22), "n": None}
    assert tree.leaves([None, None]) == []


def test_registered_class_keeps_aux_data():
    p = tree.map(lambda v: v + 1, Point(1, 2, tag="origin"))
    assert (p.x, p.y, p.tag) == (2, 3, "origin")


def test_unflatten_rejects_wrong_number_of_leaves():
    _, treedef = tree.flatten((1, 2))
    with pytest.raises(ValueError):
        tree.unflatten(treedef, [1])


def test_broadcast_prefix_expands_and_reports_the_path():
    full = {"a": np.zeros(2), "b": (np.zeros(3), np.zeros(4))}
    assert tree.broadcast_prefix({"a": 0, "b": None}, full, lambda v: v is None or isinstance(v, int)) == [0, None, None]
    with pytest.raises(tree.PrefixError, match=r"at \['b'\]: a list of length 2, which is not a prefix of a tuple"):
        tree.broadcast_prefix({"a": 0, "b": [0, 0]}, full, lambda v: v is None or isinstance(v, int))


# ---------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------


def test_flatten_with_path_and_keystr():
    paths, leaves, _ = tree.flatten_with_path({"w": [10, 20], "b": 30})
    assert leaves == [30, 10, 20]
    assert paths == [("b",), ("w", 0), ("w", 1)]
    assert tree.keystr(("w", 0)) == "['w'][0]"


def test_leaves_with_path():
    assert tree.leaves_with_path(NESTED) == [
        (("a", 0), 4), (("b", 0), 1), (("b", 1, 0), 2), (("b", 1, 1), 3), (("c", 0), 5),
    ]
    assert tree.leaves_with_path(7) == [((), 7)]
    assert tree.leaves_with_path(None) == []
    # is_leaf stops the descent
    assert tree.leaves_with_path({"x": (1, 2), "y": [3]}, is_leaf=lambda t: isinstance(t, tuple)) == [
        (("x",), (1, 2)), (("y", 0), 3),
    ]
    assert [tree.keystr(p) for p, _ in tree.leaves_with_path({"w": [0, 0]})] == ["['w'][0]", "['w'][1]"]


def test_map_with_path():
    out = tree.map_with_path(lambda p, x: (tree.keystr(p), x * 10), NESTED)
    assert out["b"] == [("['b'][0]", 10), (("['b'][1][0]", 20), ("['b'][1][1]", 30))]
    assert out["a"] == Pair(("['a'][0]", 40), None)
    assert out["c"].x == ("['c'][0]", 50) and out["c"].y is None and out["c"].tag == "pt"
    assert out["n"] is None
    # several trees, and a typical use: zero the biases
    params = {"dense": {"weight": 2.0, "bias": 3.0}, "out": {"bias": 1.0}}
    grads = {"dense": {"weight": 0.5, "bias": 0.5}, "out": {"bias": 0.25}}
    got = tree.map_with_path(lambda p, x, g: 0.0 if p[-1] == "bias" else x - g, params, grads)
    assert got == {"dense": {"weight": 1.5, "bias": 0.0}, "out": {"bias": 0.0}}
    with pytest.raises(ValueError):
        tree.map_with_path(lambda p, x, y: x, {"a": 1}, {"b": 1})


# ---------------------------------------------------------------------------------------
# reduce, all, structure, transpose
# ---------------------------------------------------------------------------------------


def test_reduce():
    assert tree.reduce(lambda a, b: a + b, NESTED) == 15
    assert tree.reduce(lambda a, b: a + b, NESTED, 100) == 115
    assert tree.reduce(lambda a, b: a + [b], [1, (2,)], []) == [1, 2]
    assert tree.reduce(lambda a, b: a * b, None, 1) == 1
    with pytest.raises(TypeError):
        tree.reduce(lambda a, b: a + b, None)  # no leaves and no initializer, as functools.reduce
    assert tree.reduce(lambda a, b: a + len(b), {"x": (1, 2), "y": (3,)}, 0,
                       is_leaf=lambda t: isinstance(t, tuple)) == 3


def test_all():
    assert tree.all({"a": [True, 1], "b": (2.0,)})
    assert not tree.all({"a": [True, 0], "b": (2.0,)})
    assert tree.all(None) and tree.all([]) and tree.all({"x": None})
    assert tree.all([np.array(True), np.array([1])])
    assert not tree.all([(0, 1)], is_leaf=lambda t: isinstance(t, tuple) and t[0] == 1)


def test_structure():
    s = tree.structure(NESTED)
    assert s == tree.structure({"a": Pair(0, None), "b": [0, (0, 0)], "c": Point(0, None), "n": None})
    assert s != tree.structure({"a": Pair(0, 0), "b": [0, (0, 0)], "c": Point(0, None), "n": None})
    assert s.num_leaves == 5
    assert tree.structure(Point(1, 2, "a")) != tree.structure(Point(1, 2, "b"))  # static data is part of it
    assert tree.unflatten(s, list("pqrst"))["b"] == ["q", ("r", "s")]
    assert tree.structure((1, [2]), is_leaf=lambda t: isinstance(t, list)).num_leaves == 2


def test_transpose():
    outer, inner = tree.structure([0, 0, 0]), tree.structure((0, 0))
    assert tree.transpose(outer, inner, [(1, 2), (3, 4), (5, 6)]) == ([1, 3, 5], [2, 4, 6])
    # dicts inside, and the inner structure inferred
    per_step = [{"loss": 1.0, "acc": 0.5}, {"loss": 0.5, "acc": 0.75}]
    assert tree.transpose(tree.structure([0, 0]), None, per_step) == {"loss": [1.0, 0.5], "acc": [0.5, 0.75]}
    nested_inner = tree.structure({"p": Pair(0, 0)})
    t = tree.transpose(tree.structure((0, 0)), nested_inner, ({"p": Pair(1, 2)}, {"p": Pair(3, 4)}))
    assert t == {"p": Pair((1, 3), (2, 4))}
    with pytest.raises(TypeError, match="mismatch"):
        tree.transpose(outer, inner, [(1, 2), (3, 4), (5,)])
    with pytest.raises(ValueError, match="at least one"):
        tree.transpose(tree.structure([]), None, [])


# ---------------------------------------------------------------------------------------
# ravel_pytree
# ---------------------------------------------------------------------------------------


def _params(dtype=np.float64):
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((2, 3)).astype(dtype), "b": rng.standard_normal(3).astype(dtype),
            "layers": [rng.standard_normal((2, 2)).astype(dtype), None]}


def test_ravel_order_values_and_round_trip():
    p = _params()
    flat, unravel = ravel_pytree(p)
    want = np.concatenate([p["b"], p["layers"][0].ravel(), p["w"].ravel()])  # sorted keys: b, layers, w
    np.testing.assert_array_equal(flat, want)
    assert flat.dtype == np.float64 and flat.shape == (13,)
    back = unravel(flat)
    assert tree.structure(back) == tree.structure(p)
    for a, b in zip(tree.leaves(back), tree.leaves(p)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    # scalars and 0-d leaves
    flat, unravel = ravel_pytree((1.5, np.array(2.0), [np.zeros((0, 4))]))
    np.testing.assert_array_equal(flat, [1.5, 2.0])
    back = unravel(np.array([7.0, 8.0]))
    assert back[0].shape == () and float(back[0]) == 7.0 and back[2][0].shape == (0, 4)


def test_ravel_of_a_tree_without_leaves():
    flat, unravel = ravel_pytree({"a": None, "b": []})
    assert flat.shape == (0,) and flat.dtype == np.float32
    assert unravel(flat) == {"a": None, "b": []}


@pytest.mark.parametrize("dtypes, promoted", [
    ((np.float32, np.float64), np.float64),
    ((np.float32, np.int64), np.float32),  # JAX: an int beside float32 stays float32 (NumPy would say float64)
    ((np.float16, np.int32, np.bool_), np.float16),
    ((np.int32, np.bool_), np.int32),
    ((np.int8, np.uint8), np.int16),
    ((np.complex64, np.float64), np.complex128),
])
def test_ravel_mixed_dtypes_as_jax(dtypes, promoted):
    leaves = [np.arange(1, 4).astype(d) for d in dtypes]
    flat, unravel = ravel_pytree(leaves)
    assert flat.dtype == promoted
    np.testing.assert_array_equal(flat, np.concatenate([x.astype(promoted) for x in leaves]))
    back = unravel(flat)
    assert [b.dtype for b in back] == [np.dtype(d) for d in dtypes]
    for a, b in zip(back, leaves):
        np.testing.assert_array_equal(a, b)
    other = np.complex64 if np.dtype(promoted).kind == "c" else np.float32 if promoted != np.float32 else np.float64
    with pytest.raises(TypeError, match="promoted dtype"):
        unravel(flat.astype(other))


def test_unravel_of_one_dtype_keeps_the_given_dtype_and_checks_the_shape():
    flat, unravel = ravel_pytree(_params(np.float32))
    assert flat.dtype == np.float32
    back = unravel(flat.astype(np.float64))  # JAX's dtype-polymorphic case
    assert all(x.dtype == np.float64 for x in tree.leaves(back))
    with pytest.raises(ValueError, match=r"shape \(13,\)"):
        unravel(np.zeros(12))
    with pytest.raises(ValueError, match=r"shape \(13,\)"):
        unravel(np.zeros((1, 13)))


def test_ravel_results_are_fresh_arrays():
    x = np.arange(4.0)
    flat, unravel = ravel_pytree({"x": x})
    flat[0] = 100.0
    assert x[0] == 0.0
    back = unravel(flat)
    back["x"][1] = -1.0
    assert flat[1] == 1.0


def test_grad_through_ravel_and_unravel():
    p = _params()
    flat, unravel = ravel_pytree(p)
    c = np.linspace(-1, 1, flat.size)
    # d/dp Σ c · ravel(p) = unravel(c)
    g = grad(lambda q: cnp.sum(ravel_pytree(q)[0] * c))(p)
    for a, b in zip(tree.leaves(g), tree.leaves(unravel(c))):
        np.testing.assert_allclose(a, b, rtol=0, atol=0)

    def loss(q):
        return cnp.sum(q["w"] ** 2) + cnp.sum(q["b"] * 3.0) + cnp.sum(cnp.sin(q["layers"][0]))

    # d/dflat loss(unravel(flat)) = ravel(d loss / d p)
    g_flat = grad(lambda f: loss(unravel(f)))(flat)
    want = np.concatenate([np.full(3, 3.0), np.cos(p["layers"][0]).ravel(), 2 * p["w"].ravel()])
    np.testing.assert_allclose(g_flat, want, rtol=1e-12)
    # forward mode, and a mixed-precision tree (float32 pieces get float32 cotangents)
    _, t = jvp(lambda f: unravel(f)["w"], (flat,), (c,))
    np.testing.assert_array_equal(t, c[-6:].reshape(2, 3))
    mixed = {"a": np.ones(2, np.float32), "b": np.ones(3)}
    gm = grad(lambda q: cnp.sum(ravel_pytree(q)[0] ** 2))(mixed)
    assert gm["a"].dtype == np.float32
    np.testing.assert_allclose(gm["a"], 2.0)


def test_vmap_of_ravel_and_unravel_matches_loops():
    p = _params()
    _, unravel = ravel_pytree(p)
    xs = np.random.default_rng(1).standard_normal((5, 3))

    def loss(q, x):
        return cnp.sum(cnp.tanh(q["w"] @ x + q["layers"][0].sum()) * q["b"].sum())

    per_example = vmap(grad(loss), in_axes=(None, 0))(p, xs)
    rows = vmap(lambda g: ravel_pytree(g)[0])(per_example)
    want = np.stack([ravel_pytree(grad(loss)(p, x))[0] for x in xs])
    np.testing.assert_allclose(rows, want, rtol=1e-12, atol=1e-14)
    back = vmap(unravel)(rows)
    for a, b in zip(tree.leaves(back), tree.leaves(per_example)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    # an empty batch
    assert vmap(unravel)(np.zeros((0, 13)))["w"].shape == (0, 2, 3)


# ---------------------------------------------------------------------------------------
# Containers through the transforms
# ---------------------------------------------------------------------------------------


def _loss(params, x):
    """A scalar function of a pytree of parameters."""
    return cnp.sum(cnp.tanh(x @ params["w"] + params["b"]) ** 2)


def _loss_ref_grad(params, x):
    """Closed form of ∇_params of ``_loss``."""
    z = x @ params["w"] + params["b"]
    t = np.tanh(z)
    dz = 2 * t * (1 - t ** 2)
    return {"w": np.outer(x, dz), "b": dz}


@pytest.mark.parametrize(
    "wrap, unwrap",
    [
        pytest.param(lambda p: p, lambda g: g, id="dict"),
        pytest.param(lambda p: Pair(p["w"], p["b"]), lambda g: {"w": g.w, "b": g.b}, id="namedtuple"),
        pytest.param(lambda p: [p["w"], p["b"]], lambda g: {"w": g[0], "b": g[1]}, id="list"),
        pytest.param(lambda p: (p["w"], (p["b"], None)), lambda g: {"w": g[0], "b": g[1][0]}, id="tuple-with-none"),
        pytest.param(lambda p: Point(p["w"], p["b"]), lambda g: {"w": g.x, "b": g.y}, id="registered"),
    ],
)
def test_grad_and_vmap_of_containers(wrap, unwrap):
    rng = _rng(1)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    xs = rng.standard_normal((5, 3))

    def to_dict(p):
        return {"w": unwrap(p)["w"], "b": unwrap(p)["b"]}

    def loss(p, x):
        return _loss(to_dict(p), x)

    p = wrap(params)
    g = grad(loss)(p, xs[0])
    assert tree.structure(g) == tree.structure(p)
    ref = _loss_ref_grad(params, xs[0])
    for k in ("w", "b"):
        np.testing.assert_allclose(unwrap(g)[k], ref[k], rtol=1e-10)

    per_example = vmap(grad(loss), in_axes=(None, 0))(p, xs)
    assert tree.structure(per_example) == tree.structure(p)
    for i in range(xs.shape[0]):
        ref = _loss_ref_grad(params, xs[i])
        for k in ("w", "b"):
            np.testing.assert_allclose(unwrap(per_example)[k][i], ref[k], rtol=1e-10)


def test_vmap_in_axes_prefix_of_registered_class():
    xs, ys = np.arange(6.0).reshape(2, 3), np.arange(3.0)
    out = vmap(lambda p: p.x * p.y, in_axes=(Point(0, None),))(Point(xs, ys))
    np.testing.assert_allclose(out, xs * ys)


def test_vmap_returns_containers_with_out_axes_prefix():
    xs = np.arange(12.0).reshape(4, 3)
    out = vmap(lambda x: Point(x, {"s": x.sum(), "n": None}), out_axes=Point(1, {"s": 0, "n": 0}))(xs)
    assert isinstance(out, Point) and out.y["n"] is None
    np.testing.assert_allclose(out.x, xs.T)
    np.testing.assert_allclose(out.y["s"], xs.sum(1))


def test_jvp_vjp_with_namedtuple_primals():
    rng = _rng(2)
    p = Pair(rng.standard_normal(3), rng.standard_normal(3))
    t = Pair(rng.standard_normal(3), rng.standard_normal(3))

    def f(p):
        return {"prod": p.w * p.b, "sum": (p.w + p.b).sum()}

    out, t_out = jvp(f, (p,), (t,))
    np.testing.assert_allclose(t_out["prod"], t.w * p.b + p.w * t.b)
    np.testing.assert_allclose(t_out["sum"], (t.w + t.b).sum())
    out2, pullback = vjp(f, p)
    np.testing.assert_allclose(out2["prod"], out["prod"])
    (ct_p,) = pullback({"prod": np.ones(3), "sum": np.array(2.0)})
    assert isinstance(ct_p, Pair)
    np.testing.assert_allclose(ct_p.w, p.b + 2.0)
    np.testing.assert_allclose(ct_p.b, p.w + 2.0)


@pytest.mark.parametrize("jac", [jacfwd, jacrev], ids=["jacfwd", "jacrev"])
def test_jacobian_of_registered_class_in_and_out(jac):
    x, y = np.array([1.0, 2.0]), np.array(3.0)

    def f(p):
        return Point(p.x * p.y, (p.x ** 2).sum())

    J = jac(f)(Point(x, y))
    # output Point of input Points; leaves shaped out.shape + in.shape
    assert isinstance(J, Point) and isinstance(J.x, Point) and isinstance(J.y, Point)
    np.testing.assert_allclose(J.x.x, np.eye(2) * 3.0)
    np.testing.assert_allclose(J.x.y, x)
    np.testing.assert_allclose(J.y.x, 2 * x)
    np.testing.assert_allclose(J.y.y, 0.0)
    assert J.y.y.shape == ()


# ---------------------------------------------------------------------------------------
# device_put
# ---------------------------------------------------------------------------------------


def test_device_put_cpu_round_trip():
    t = {"a": np.arange(3.0), "b": (np.ones((2, 2), np.float32), None)}
    out = cuvmap.device_put(t, "cpu")
    assert tree.structure(out) == tree.structure(t)
    for a, b in zip(tree.leaves(out), tree.leaves(t)):
        assert type(a) is np.ndarray and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_device_put_inside_a_transform_keeps_tracers():
    xs = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(vmap(lambda x: cuvmap.device_put(x, "cpu") * 2)(xs), xs * 2)
    np.testing.assert_allclose(grad(lambda x: cnp.sum(cuvmap.device_put({"v": x}, "cpu")["v"] ** 2))(xs[0]), 2 * xs[0])


def test_device_put_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        cuvmap.device_put(np.ones(2), "tpu")


@pytest.mark.gpu
@pytest.mark.skipif(not cuvmap.backend.gpu_available(), reason="needs CuPy and a CUDA device")
def test_device_put_gpu_round_trip_and_grad():
    x = np.arange(4.0)
    xg = cuvmap.device_put(x, "gpu")
    assert cuvmap.backend.is_cupy_array(xg)
    g = grad(lambda v: cnp.sum(cnp.sin(v)))(xg)
    assert cuvmap.backend.is_cupy_array(g)
    np.testing.assert_allclose(cuvmap.device_put(g, "cpu"), np.cos(x), rtol=1e-12)
    back = cuvmap.device_put({"x": xg}, "cpu")
    assert type(back["x"]) is np.ndarray
    np.testing.assert_array_equal(back["x"], x)


def test_device_put_gpu_without_gpu_is_a_clear_error(monkeypatch):
    # as if CuPy saw no device (a GPU, or the strict CuPy stand-in, may be present)
    monkeypatch.setattr(cuvmap.backend, "_cupy", None)
    monkeypatch.setattr(cuvmap.backend, "_cupy_probed", True)
    with pytest.raises(RuntimeError, match="device_put.*'gpu'.*CuPy"):
        cuvmap.device_put(np.ones(2), "gpu")
