"""Pytrees: cuvmap.tree's utilities, and containers (tuples, lists, dicts, namedtuples, None,
a registered user class) flowing through every transform.

References: hand-built expected structures, per-example loops and closed-form gradients.
"""
import collections

import numpy as np
import pytest

import cuvmap
import cuvmap.numpy as cnp
from cuvmap import grad, jacfwd, jacrev, jvp, tree, vjp, vmap

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


# ---------------------------------------------------------------------------------------
# cuvmap.tree utilities
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


def test_flatten_with_path_and_keystr():
    paths, leaves, _ = tree.flatten_with_path({"w": [10, 20], "b": 30})
    assert leaves == [30, 10, 20]
    assert paths == [("b",), ("w", 0), ("w", 1)]
    assert tree.keystr(("w", 0)) == "['w'][0]"


def test_broadcast_prefix_expands_and_reports_the_path():
    full = {"a": np.zeros(2), "b": (np.zeros(3), np.zeros(4))}
    assert tree.broadcast_prefix({"a": 0, "b": None}, full, lambda v: v is None or isinstance(v, int)) == [0, None, None]
    with pytest.raises(tree.PrefixError, match=r"at \['b'\]: a list of length 2, which is not a prefix of a tuple"):
        tree.broadcast_prefix({"a": 0, "b": [0, 0]}, full, lambda v: v is None or isinstance(v, int))


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
