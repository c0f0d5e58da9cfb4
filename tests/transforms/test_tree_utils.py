"""``cuvmap.tree``'s JAX-named utilities (``leaves_with_path``, ``map_with_path``,
``reduce``, ``all``, ``transpose``, ``structure``) and ``cuvmap.flatten_util.ravel_pytree``.

References: hand-written expected trees, paths and vectors; for ``ravel_pytree`` under
the transforms, closed-form gradients and per-example loops.
"""
import collections

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import tree
from cuvmap.flatten_util import ravel_pytree

Pair = collections.namedtuple("Pair", "w b")


class Box:
    """A registered container with one child and static data."""

    def __init__(self, v, tag="box"):
        self.v, self.tag = v, tag


tree.register_pytree_node(Box, lambda b: ((b.v,), b.tag), lambda tag, vs: Box(vs[0], tag))

NESTED = {"b": [1, (2, 3)], "a": Pair(4, None), "c": Box(5), "n": None}


# ---------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------


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
    assert out["c"].v == ("['c'][0]", 50) and out["c"].tag == "box"
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
    assert s == tree.structure({"a": Pair(0, None), "b": [0, (0, 0)], "c": Box(0), "n": None})
    assert s != tree.structure({"a": Pair(0, 0), "b": [0, (0, 0)], "c": Box(0), "n": None})
    assert s.num_leaves == 5
    assert tree.structure(Box(1, "a")) != tree.structure(Box(1, "b"))  # static data is part of it
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
    g = cv.grad(lambda q: cnp.sum(ravel_pytree(q)[0] * c))(p)
    for a, b in zip(tree.leaves(g), tree.leaves(unravel(c))):
        np.testing.assert_allclose(a, b, rtol=0, atol=0)

    def loss(q):
        return cnp.sum(q["w"] ** 2) + cnp.sum(q["b"] * 3.0) + cnp.sum(cnp.sin(q["layers"][0]))

    # d/dflat loss(unravel(flat)) = ravel(d loss / d p)
    g_flat = cv.grad(lambda f: loss(unravel(f)))(flat)
    want = np.concatenate([np.full(3, 3.0), np.cos(p["layers"][0]).ravel(), 2 * p["w"].ravel()])
    np.testing.assert_allclose(g_flat, want, rtol=1e-12)
    # forward mode, and a mixed-precision tree (float32 pieces get float32 cotangents)
    _, t = cv.jvp(lambda f: unravel(f)["w"], (flat,), (c,))
    np.testing.assert_array_equal(t, c[-6:].reshape(2, 3))
    mixed = {"a": np.ones(2, np.float32), "b": np.ones(3)}
    gm = cv.grad(lambda q: cnp.sum(ravel_pytree(q)[0] ** 2))(mixed)
    assert gm["a"].dtype == np.float32
    np.testing.assert_allclose(gm["a"], 2.0)


def test_vmap_of_ravel_and_unravel_matches_loops():
    p = _params()
    _, unravel = ravel_pytree(p)
    xs = np.random.default_rng(1).standard_normal((5, 3))

    def loss(q, x):
        return cnp.sum(cnp.tanh(q["w"] @ x + q["layers"][0].sum()) * q["b"].sum())

    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0))(p, xs)
    rows = cv.vmap(lambda g: ravel_pytree(g)[0])(per_example)
    want = np.stack([ravel_pytree(cv.grad(loss)(p, x))[0] for x in xs])
    np.testing.assert_allclose(rows, want, rtol=1e-12, atol=1e-14)
    back = cv.vmap(unravel)(rows)
    for a, b in zip(tree.leaves(back), tree.leaves(per_example)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    # an empty batch
    assert cv.vmap(unravel)(np.zeros((0, 13)))["w"].shape == (0, 2, 3)
