"""Per-example clipping (cuvmap/dp/clipping.py): the global norms, ``clip_per_example``
and ``clipped_sum``; clipping by group (per-layer bounds: fastDP's param-wise, layer-wise
and block-wise styles) and by user (each user's summed gradient clipped), through
``dp.clipped_sum`` and ``dp.clipped_grad`` (ghost norms, their user form, and the explicit
fallbacks), and the user sampler (NOTE [clipping by group and by user] in
cuvmap/dp/clipping.py, NOTE [user norms from factored gradients] in cuvmap/dp/ghost).

Independent references: per-example Python loops in NumPy (tests/dp_references.py); for
groups and users, NumPy loops over examples, groups and users of ``cv.grad`` of one example
at a time (float64): each group's or user's norm, its clip factor, the sum."""
import math

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import dp, tree
from dp_references import assert_tree_close, loop_clip, loop_norms, per_example_pytree
from test_ghost import NETWORKS

# No fallback (cancellation) warning and no NumPy overflow may go unnoticed.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------
# Per-example norms and clipping
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("b", [1, 7])
def test_global_norms_match_loop(b):
    g = per_example_pytree(_rng(1), b)
    norms = dp.per_example_global_norms(g)
    assert norms.shape == (b,)
    np.testing.assert_allclose(norms, loop_norms(g), rtol=1e-13)


def test_clip_matches_loop_and_bounds_norms():
    rng = _rng(2)
    g = per_example_pytree(rng, 9)
    # Scale examples so that some are far under, some near, some far over the bound.
    scales = np.array([0.01, 0.1, 0.5, 0.999, 1.0, 1.5, 3.0, 10.0, 1e3])
    norms0 = loop_norms(g)
    g = tree.map(lambda x: x * (scales / norms0).reshape((-1,) + (1,) * (x.ndim - 1)), g)
    max_norm = 1.0
    clipped, norms = dp.clip_per_example(g, max_norm, return_norms=True)
    np.testing.assert_allclose(norms, scales, rtol=1e-13)
    assert_tree_close(clipped, loop_clip(g, max_norm), rtol=1e-14, atol=0)
    after = loop_norms(clipped)
    assert np.all(after <= max_norm * (1 + 1e-12))
    over = scales > max_norm
    np.testing.assert_allclose(after[over], max_norm, rtol=1e-5)
    # Examples under the bound come back bit-for-bit unchanged.
    under = np.flatnonzero(scales + 1e-6 <= max_norm)
    for x, y in zip(tree.leaves(g), tree.leaves(clipped)):
        np.testing.assert_array_equal(y[under], x[under])
    # Clipping only rescales: each example keeps its direction.
    for i in np.flatnonzero(over):
        c = max_norm / (scales[i] + 1e-6)
        for x, y in zip(tree.leaves(g), tree.leaves(clipped)):
            np.testing.assert_allclose(y[i], c * x[i], rtol=1e-14)


def test_clip_float32_zero_gradient_and_structure():
    g = per_example_pytree(_rng(3), 5, np.float32)
    g = tree.map(lambda x: np.concatenate([np.zeros_like(x[:1]), x[1:] * 10]), g)
    clipped = dp.clip_per_example(g, 0.5)
    assert tree.structure(clipped) == tree.structure(g)
    for x, y in zip(tree.leaves(g), tree.leaves(clipped)):
        assert y.dtype == np.float32 and y.shape == x.shape
        np.testing.assert_array_equal(y[0], 0.0)  # an all-zero example: no NaN, stays zero
    after = loop_norms(tree.map(lambda x: x.astype(np.float64), clipped))
    assert np.all(after <= 0.5 * (1 + 1e-6))
    assert_tree_close(clipped, loop_clip(tree.map(lambda x: x.astype(np.float64), g), 0.5), rtol=2e-6, atol=1e-7)


def test_clip_of_vmap_grad_matches_per_example_loop():
    rng = _rng(4)
    params = {"w1": rng.standard_normal((3, 4)), "b1": rng.standard_normal(4), "w2": rng.standard_normal(4)}
    xs, ys = rng.standard_normal((6, 3)) * 3, rng.standard_normal(6)

    def loss(p, x, y):
        return cnp.square(cnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] - y)

    per_ex = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    loop = [cv.grad(loss)(params, xs[i], ys[i]) for i in range(6)]
    stacked = tree.map(lambda *ls: np.stack(ls), *loop)
    np.testing.assert_allclose(dp.per_example_global_norms(per_ex), loop_norms(stacked), rtol=1e-12)
    max_norm = float(np.median(loop_norms(stacked)))
    assert_tree_close(dp.clip_per_example(per_ex, max_norm), loop_clip(stacked, max_norm), rtol=1e-12, atol=1e-14)


def test_norms_are_transformable():
    # d/dg Σ_b ‖g_b‖ = g_b / ‖g_b‖, leaf by leaf: the norms are built from cuvmap primitives.
    g = per_example_pytree(_rng(5), 4)
    d = cv.grad(lambda t: cnp.sum(dp.per_example_global_norms(t)))(g)
    norms = loop_norms(g)
    assert_tree_close(d, tree.map(lambda x: x / norms.reshape((-1,) + (1,) * (x.ndim - 1)), g), rtol=1e-12)


def test_clip_errors():
    g = per_example_pytree(_rng(6), 3)
    with pytest.raises(ValueError, match="positive"):
        dp.clip_per_example(g, 0.0)
    bad = dict(g, scale=np.ones(4))
    with pytest.raises(ValueError, match=r"\['scale'\] has batch size 4"):
        dp.per_example_global_norms(bad)
    with pytest.raises(ValueError, match="scalar"):
        dp.clip_per_example({"a": np.ones((3, 2)), "s": np.float64(1.0)}, 1.0)
    with pytest.raises(ValueError, match="no array leaves"):
        dp.per_example_global_norms({})


def test_clipped_sum_errors_and_transformability():
    g = per_example_pytree(_rng(40), 4)
    with pytest.raises(ValueError, match=r"mask has shape \(3,\), but the per-example gradients have batch size 4"):
        dp.clipped_sum(g, 1.0, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="max_norm must be positive"):
        dp.clipped_sum(g, 0.0)
    # made of primitives: vmap over a stack of two batches equals each batch on its own
    two = tree.map(lambda x: np.stack([x, 2 * x]), g)
    mask = np.array([True, True, False, True])
    stacked = cv.vmap(lambda t: dp.clipped_sum(t, 1.0, mask=mask))(two)
    assert isinstance(stacked, dp.ClippedGradient) and stacked.sensitivity == 1.0
    for i, scale in enumerate((1, 2)):
        assert_tree_close(tree.map(lambda s: s[i], stacked.summed),
                           dp.clipped_sum(tree.map(lambda x: scale * x, g), 1.0, mask=mask).summed, rtol=1e-13)


# ---------------------------------------------------------------------------------------
# Clipping by group and by user (NOTE [clipping by group and by user])
# ---------------------------------------------------------------------------------------


TINY = 1e-6


def _example_grads(loss, params, batch):
    """Each example's gradient, by a loop of cv.grad (the independent reference)."""
    size = tree.leaves(batch)[0].shape[0]
    return [tree.map(np.asarray, cv.grad(loss)(params, *(b[i] for b in batch))) for i in range(size)]


def _labels(params, style):
    paths, leaves, _ = tree.flatten_with_path(params)
    if style is None:
        return ["(all)"] * len(leaves)
    if style == "param":
        return [tree.keystr(p) for p in paths]
    if style == "layer":
        return [tree.keystr(p[:-1]) or "(root)" for p in paths]
    return tree.broadcast_prefix(style, params, lambda x: isinstance(x, (str, int)))


def _loop(loss, params, batch, bounds, style, users=None, mask=None):
    """Σ over units (examples, or users: the sum of their examples' gradients weighted by
    the mask) of the unit's gradient clipped group by group; the unit norms and the group
    norms (dicts by label)."""
    grads = _example_grads(loss, params, batch)
    labels = _labels(params, style)
    weights = np.ones(len(grads)) if mask is None else np.asarray(mask, float)
    units = {}
    for b, g in enumerate(grads):
        key = b if users is None else int(users[b])
        flat = [weights[b] * x for x in tree.leaves(g)]
        units[key] = flat if key not in units else [u + x for u, x in zip(units[key], flat)]
    summed = [np.zeros_like(x) for x in tree.leaves(grads[0])] if grads else \
        [np.zeros(np.shape(x)) for x in tree.leaves(params)]
    norms, group_norms = {}, {}
    for key, flat in units.items():
        sq = {}
        for lb, x in zip(labels, flat):
            sq[lb] = sq.get(lb, 0.0) + float(np.sum(x * x))
        norms[key] = math.sqrt(sum(sq.values()))
        group_norms[key] = {lb: math.sqrt(v) for lb, v in sq.items()}
        for i, (lb, x) in enumerate(zip(labels, flat)):
            summed[i] = summed[i] + min(1.0, bounds[lb] / (group_norms[key][lb] + TINY)) * x
    return tree.unflatten(tree.structure(params), summed), norms, group_norms


def _bounds(params, style, given):
    labels = list(dict.fromkeys(_labels(params, style)))
    if isinstance(given, dict):
        return {lb: given[lb] for lb in labels}
    return {lb: given / math.sqrt(len(labels)) if style is not None else given for lb in labels}


def _close(got, want, rtol=1e-9):
    assert tree.structure(got) == tree.structure(want)
    for a, b in zip(tree.leaves(got), tree.leaves(want)):
        scale = max(1.0, float(np.abs(b).max(initial=0)))
        np.testing.assert_allclose(np.asarray(a), b, rtol=rtol, atol=1e-12 * scale)


# (network, groups, max_norm): the styles of fastDP and Opacus' per-layer bounds
GROUP_CASES = [
    ("mlp", None, 0.5),
    ("mlp", "param", 0.5),
    ("mlp", "layer", 0.5),
    ("mlp", {"w1": "first", "b1": "first", "w2": "second"}, {"first": 0.3, "second": 0.2}),   # block-wise
    ("cnn", "param", 1.0),
    ("cnn", "layer", 0.8),
    ("sequence_dense", "param", {"['w']": 0.4, "['heads']": 0.1, "['left']": 0.7}),
    ("embedding", "param", 0.6),
    ("tied_weights", "param", 0.5),
    ("norms", "layer", 0.5),
]


@pytest.mark.parametrize("network, style, given", GROUP_CASES,
                         ids=[f"{c[0]}-{c[1] if isinstance(c[1], str) or c[1] is None else 'blocks'}"
                              for c in GROUP_CASES])
def test_group_clipping_matches_a_loop(network, style, given):
    rng = np.random.default_rng(sum(map(ord, network)) + 3)
    params, loss, make_batch = NETWORKS[network](rng)
    batch = make_batch(rng, 6)
    bounds = _bounds(params, style, given)
    want, want_norms, want_groups = _loop(loss, params, batch, bounds, style)
    total = math.sqrt(sum(c * c for c in bounds.values()))
    per_example = cv.vmap(cv.grad(loss), in_axes=(None,) + (0,) * len(batch))(params, *batch)
    results = {"clipped_sum": dp.clipped_sum(per_example, given, groups=style)}
    for method in ("ghost", "per_example", "auto"):
        results[method] = dp.clipped_grad(loss, given, method=method, groups=style)(params, *batch)
    for how, got in results.items():
        _close(got.summed, want)
        np.testing.assert_allclose(got.norms, [want_norms[b] for b in range(6)], rtol=1e-9, err_msg=how)
        assert got.sensitivity == pytest.approx(total, rel=1e-14) and got.unit == "example"
        if style is None:
            assert got.groups is None and got.group_norms is None
        else:
            assert [lb for lb, _ in got.groups] == list(bounds)
            for (lb, c), gn in zip(got.groups, got.group_norms):
                assert c == pytest.approx(bounds[lb], rel=1e-14)
                np.testing.assert_allclose(gn, [want_groups[b][lb] for b in range(6)], rtol=1e-9, err_msg=how)


# (network, masked)
USER_CASES = [("mlp", False), ("mlp", True), ("sequence_dense", False), ("cnn", True), ("embedding", False),
              ("tied_weights", True), ("biases", False), ("norms", False), ("used_twice_and_scaled", True)]
USERS = np.array([3, 0, 3, 1, 0, 3, 2, 0])      # 4 users of 1 to 3 examples (slot 3 has 3)


@pytest.mark.parametrize("network, masked", USER_CASES, ids=[f"{n}-{'mask' if m else 'all'}" for n, m in USER_CASES])
def test_user_clipping_matches_a_loop_over_users(network, masked):
    rng = np.random.default_rng(sum(map(ord, network)) + 5)
    params, loss, make_batch = NETWORKS[network](rng)
    batch = make_batch(rng, 8)
    mask = np.array([1, 1, 0, 1, 1, 1, 0, 1], bool) if masked else None
    c = 0.4
    want, want_norms, _ = _loop(loss, params, batch, _bounds(params, None, c), None, users=USERS, mask=mask)
    per_example = cv.vmap(cv.grad(loss), in_axes=(None,) + (0,) * len(batch))(params, *batch)
    results = {"clipped_sum": dp.clipped_sum(per_example, c, users=USERS, mask=mask)}
    for method in ("ghost", "per_example", "auto"):
        results[method] = dp.clipped_grad(loss, c, method=method)(params, *batch, users=USERS, mask=mask)
    for how, got in results.items():
        _close(got.summed, want)
        norms = np.asarray(got.norms)
        assert norms.shape == (8,) and got.unit == "user" and got.sensitivity == c
        np.testing.assert_allclose(norms[:4], [want_norms[u] for u in range(4)], rtol=1e-9, err_msg=how)
        np.testing.assert_array_equal(norms[4:], 0)       # empty slots


def test_user_clipping_with_groups_and_under_jit():
    rng = np.random.default_rng(11)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    xs, ys = make_batch(rng, 8)
    bounds = _bounds(params, "layer", 0.5)
    want, want_norms, want_groups = _loop(loss, params, (xs, ys), bounds, "layer", users=USERS)
    clipped = dp.clipped_grad(loss, 0.5, groups="layer")
    jitted = cv.jit(lambda p, x, y, u: clipped(p, x, y, users=u))
    for got in (clipped(params, xs, ys, users=USERS), jitted(params, xs, ys, USERS)):
        _close(got.summed, want)
        np.testing.assert_allclose(np.asarray(got.norms)[:4], [want_norms[u] for u in range(4)], rtol=1e-9)
        assert got.unit == "user" and got.groups is not None and got.sensitivity == pytest.approx(0.5)
    assert clipped.methods(params, xs, ys, users=USERS) == {"w1": "ghost", "b1": "per_example", "w2": "ghost"}


def test_one_user_changes_the_sum_by_at_most_c():
    """Add/remove-one user: the clipped sums of a batch with and without all of one user's
    examples differ by that user's clipped gradient, of norm ≤ C (whatever their number)."""
    rng = np.random.default_rng(12)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    xs, ys = make_batch(rng, 8)
    xs = xs * 20.0   # large gradients: every user is clipped
    clipped = dp.clipped_grad(loss, 0.3)
    full = clipped(params, xs, ys, users=USERS)
    without = USERS != 3
    slots = np.searchsorted(np.unique(USERS[without]), USERS[without])
    less = clipped(params, xs[without], ys[without], users=slots)
    diff = np.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in zip(tree.leaves(full.summed), tree.leaves(less.summed))))
    assert diff <= 0.3 * (1 + 1e-9) and diff > 0.29


def test_nan_safe_drops_a_user():
    rng = np.random.default_rng(13)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    xs, ys = make_batch(rng, 8)
    bad = xs.copy()
    bad[1] = np.nan                     # an example of user 0
    keep = USERS != 0
    slots = np.searchsorted(np.unique(USERS[keep]), USERS[keep])
    want = dp.clipped_grad(loss, 0.5)(params, xs[keep], ys[keep], users=slots)
    for method in ("ghost", "per_example"):
        got = dp.clipped_grad(loss, 0.5, method=method, nan_safe=True)(params, bad, ys, users=USERS)
        _close(got.summed, want.summed)
        assert int(got.num_dropped()) == 1


ERRORS = [
    (lambda g: dp.clipped_sum(g, 1.0, users=np.array([0, 1, 2])), r"users has shape \(3,\), but the batch has 4"),
    (lambda g: dp.clipped_sum(g, 1.0, users=np.array([0, 1, 2, 4])), r"user ids must be slots 0 \.\. 3"),
    (lambda g: dp.clipped_sum(g, 1.0, users=np.array([0.0, 1, 2, 3])), "integer user slots"),
    (lambda g: dp.clipped_sum(g, {"['w']": 1.0}, groups="param"), r"missing \[\"\['b'\]\"\]"),
    (lambda g: dp.clipped_sum(g, {"x": 1.0}, groups=None), "groups is None"),
    (lambda g: dp.clipped_sum(g, 1.0, groups="neuron"), "groups must be None, one of 'param', 'layer'"),
    (lambda g: dp.clipped_sum(g, 1.0, groups={"w": "a"}), "not a prefix"),
    (lambda g: dp.private_gradient(dp.clipped_sum(g, 1.0, users=np.arange(4)), noise_multiplier=1.0,
                                   normalize_by="batch_size", rng=np.random.default_rng(0)),
     "counts examples, but the clipped sum is user-level"),
]


@pytest.mark.parametrize("call, pattern", ERRORS)
def test_group_and_user_errors(call, pattern):
    g = {"w": np.ones((4, 3)), "b": np.ones((4, 2))}
    with pytest.raises(ValueError, match=pattern):
        call(g)


@pytest.mark.parametrize("users", [[0, -1, 1, 2], [0, 1, 4, 2]])
def test_user_slots_out_of_range_fail_under_jit_too(users):
    """An id out of 0..B-1 would merge two users (a negative one wraps around): under jit the
    staged bounds check raises when the program runs, in both entry points."""
    g = {"w": np.ones((4, 3))}
    params = {"w": np.ones(3)}

    def loss(p, x):
        return (p["w"] * x).sum()

    by_sum = cv.jit(lambda g, u: dp.clipped_sum(g, 1.0, users=u).summed)
    by_loss = cv.jit(lambda p, x, u: dp.clipped_grad(loss, 1.0)(p, x, users=u).summed)
    np.testing.assert_allclose(by_sum(g, np.array([0, 1, 1, 2]))["w"], by_loss(params, g["w"], np.array([0, 1, 1, 2]))["w"])
    for run in (lambda: by_sum(g, np.array(users)), lambda: by_loss(params, g["w"], np.array(users))):
        with pytest.raises(IndexError, match=r"user slots u \(as 2·u − 4; u must be in 0 \.\. 3\)"):
            run()


def test_sample_users_is_poisson_over_users():
    """Each user is in a batch with probability q, with all its examples, numbered 0..k-1."""
    rng = np.random.default_rng(14)
    user_of_example = rng.integers(100, 130, 200)       # 30 users, ids 100..129
    q, draws = 0.3, 2000
    counts = np.zeros(130)
    for _ in range(draws):
        idx, slots = dp.sample_users(user_of_example, q, rng)
        chosen = np.unique(user_of_example[idx])
        counts[chosen] += 1
        for u in chosen:     # every example of a chosen user
            assert set(np.flatnonzero(user_of_example == u)) <= set(idx)
        np.testing.assert_array_equal(slots, np.searchsorted(chosen, user_of_example[idx]))
    present = np.unique(user_of_example)
    freq = counts[present] / draws
    assert np.all(np.abs(freq - q) < 5 * math.sqrt(q * (1 - q) / draws))
    with pytest.raises(ValueError, match=r"sample_rate must be in \(0, 1\]"):
        dp.sample_users(user_of_example, 0.0, rng)


def test_groups_users_and_noise_once_on_backend(backend):
    """The same computations on CuPy arrays (gpu; cpu checks the NumPy path): user slots
    checked on the device, the per-user scatter, group clipping, the noise kept on member 0
    of a named vmap, all on the operands' device and equal to the NumPy results."""
    from cuvmap import backend as cv_backend

    rng = np.random.default_rng(15)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    batch = make_batch(rng, 8)
    want = dp.clipped_grad(loss, 0.5, groups="layer")(params, *batch, users=USERS)
    p_dev, b_dev, u_dev = cv.device_put((params, batch, USERS), backend)
    got = dp.clipped_grad(loss, 0.5, groups="layer")(p_dev, *b_dev, users=u_dev)
    assert all(cv_backend.backend_name(x) == backend for x in tree.leaves(got.summed))
    _close(cv.device_put(got.summed, "cpu"), want.summed, rtol=1e-7)
    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(p_dev, *b_dev)
    _close(cv.device_put(dp.clipped_sum(per_example, 0.5, groups="layer", users=u_dev).summed, "cpu"), want.summed,
           rtol=1e-7)
    with pytest.raises((ValueError, IndexError), match="0 .. 7"):
        # on the GPU the bounds check raises at the next synchronisation (NOTE [device-side bounds checks])
        cv.block_until_ready(dp.clipped_sum(per_example, 0.5, users=cv.device_put(np.arange(1, 9), backend)))
    z = cv.device_put({"w": np.ones((3, 5))}, backend)
    out = cv.vmap(lambda zm: dp.private_gradient({"w": zm[None] * 0}, 1.0, 2.0, noise={"w": zm},
                                                 expected_batch_size=4.0), axis_name="batch")(z["w"])
    np.testing.assert_allclose(cv.device_put(out["w"], "cpu"), [[0.5] * 5, [0] * 5, [0] * 5])
