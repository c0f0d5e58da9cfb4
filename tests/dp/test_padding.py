"""Poisson batches padded to a few sizes for jit (cuvmap/dp/padding.py, NOTE [padding
Poisson batches]): the bucket ladder, ``pad_batch`` and its mask, masked clipped sums equal
to the unpadded ones with the same sensitivity, and jitted DP-SGD steps that trace once per
bucket.

Independent references: per-example NumPy loops over the real examples
(tests/dp_references.py), and a loop of ``grad`` for one DP-Adam step."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend as cv_backend
from cuvmap import dp, tree
from dp_references import assert_tree_close, loop_clipped_sum, loop_norms, per_example_pytree

# No fallback (cancellation) warning and no NumPy overflow may go unnoticed.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def _rng(seed=0):
    return np.random.default_rng(seed)


def _loop_clipped_sum_or_zeros(grads, max_norm):
    if tree.leaves(grads)[0].shape[0] == 0:
        return tree.map(lambda x: np.zeros(x.shape[1:]), grads)
    return loop_clipped_sum(grads, max_norm)


BUCKETS = dp.batch_buckets(8, 20, growth=1.5, multiple=4)  # (8, 12, 20)


def test_batch_buckets_ladder():
    assert BUCKETS == (8, 12, 20)
    assert dp.batch_buckets(256, 1438) == (256, 288, 328, 376, 424, 480, 544, 616, 696, 784, 888, 1000,
                                          1128, 1272, 1432, 1438)
    assert dp.batch_buckets(4, 64, growth=2, multiple=1) == (4, 8, 16, 32, 64)   # powers of two
    assert dp.batch_buckets(3.2, 100, growth=2, multiple=1) == (4, 8, 16, 32, 64, 100)
    assert dp.batch_buckets(300, 256) == (256,)          # the expected size above N: N alone
    assert dp.batch_buckets(0.3, 1) == (1,)
    for expected, n, growth, multiple in [(256, 1438, 1.125, 8), (20.5, 200, 1.1, 1), (7, 1000, 3.0, 5)]:
        rungs = dp.batch_buckets(expected, n, growth=growth, multiple=multiple)
        assert rungs[0] >= expected and rungs[-1] == n
        assert all(b > a for a, b in zip(rungs, rungs[1:]))
        assert all(r % multiple == 0 for r in rungs[:-1])
        # geometric: each rung at most growth × the previous one, plus the rounding
        assert all(b <= a * growth + multiple for a, b in zip(rungs, rungs[1:]))
    for b, want in [(0, 8), (1, 8), (8, 8), (9, 12), (12, 12), (13, 20), (20, 20)]:
        assert dp.bucket_for(b, BUCKETS) == want
    with pytest.raises(ValueError, match="larger than the largest bucket 20"):
        dp.bucket_for(21, BUCKETS)
    for bad in [dict(expected_batch_size=0, max_batch_size=10), dict(expected_batch_size=5, max_batch_size=0),
                dict(expected_batch_size=5, max_batch_size=10, growth=1.0),
                dict(expected_batch_size=5, max_batch_size=10, multiple=0)]:
        with pytest.raises(ValueError, match="batch_buckets"):
            dp.batch_buckets(**bad)


def test_poisson_batches_meet_few_buckets():
    """The ladder above q·N holds the Poisson batches of a long run in a few sizes, with
    little padding (NOTE [padding Poisson batches])."""
    n, q = 1438, 256 / 1438
    buckets = dp.batch_buckets(q * n, n)
    sizes = _rng(20).binomial(n, q, size=2000)
    padded = np.array([dp.bucket_for(b, buckets) for b in sizes])
    assert np.all(padded >= sizes)
    assert len(set(padded.tolist())) <= 4
    assert padded.sum() / sizes.sum() < 1.1  # under a tenth of the work is padding


def test_pad_batch_repeats_the_first_example_and_masks():
    rng = _rng(21)
    x, y = rng.standard_normal((3, 2, 2)), np.array([4, 5, 6])
    (px, py), mask = dp.pad_batch((x, y), 5)
    assert px.shape == (5, 2, 2) and py.tolist() == [4, 5, 6, 4, 4]
    np.testing.assert_array_equal(px[:3], x)
    np.testing.assert_array_equal(px[3:], np.stack([x[0], x[0]]))
    assert mask.dtype == np.bool_ and mask.tolist() == [True, True, True, False, False]
    same, full = dp.pad_batch({"x": x, "y": y}, 3)  # no padding needed: the leaves themselves
    assert same["x"] is x and same["y"] is y and full.tolist() == [True] * 3
    (ex, ey), emask = dp.pad_batch((x[:0], y[:0]), 4)  # an empty batch: zeros
    assert ex.shape == (4, 2, 2) and not ex.any() and ey.dtype == y.dtype and not emask.any()
    with pytest.raises(ValueError, match="size must be an integer >= the batch size 3"):
        dp.pad_batch((x, y), 2)
    with pytest.raises(ValueError, match="same leading batch dim"):
        dp.pad_batch((x, y[:2]), 5)
    with pytest.raises(ValueError, match="no array leaves"):
        dp.pad_batch((), 5)


@pytest.mark.parametrize("b", [0, 1, 5, 8, 12, 17])
def test_padded_masked_clipped_sum_equals_unpadded(b):
    """Σ_b m_b clip(g_b) over the padded batch equals the loop's Σ_b clip(g_b) over the real
    examples (float64, to rounding) for batch sizes 0, 1, bucket sizes (8, 12) and between
    them; the padding rows' contents do not matter at all (bitwise)."""
    g = per_example_pytree(_rng(22 + b), b)
    size = dp.bucket_for(b, BUCKETS)
    padded, mask = dp.pad_batch(g, size)
    assert tree.leaves(padded)[0].shape[0] == size and int(mask.sum()) == b
    summed, norms = dp.clipped_sum(padded, 1.5, mask=mask, return_norms=True)
    assert_tree_close(summed, _loop_clipped_sum_or_zeros(g, 1.5), rtol=1e-13, atol=1e-14)
    assert all(s.shape == x.shape[1:] for s, x in zip(tree.leaves(summed), tree.leaves(g)))
    np.testing.assert_allclose(norms[:b], loop_norms(g) if b else np.zeros(0), rtol=1e-13)
    # unpadded, the same sum
    assert_tree_close(dp.clipped_sum(g, 1.5).summed, _loop_clipped_sum_or_zeros(g, 1.5), rtol=1e-13, atol=1e-14)
    # other padding (any finite values) gives exactly the same sum
    junk = tree.map(lambda x: np.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, 1e6 * _rng(b).standard_normal(x.shape)),
                    padded)
    again = dp.clipped_sum(junk, 1.5, mask=mask).summed
    for u, v in zip(tree.leaves(summed), tree.leaves(again)):
        np.testing.assert_array_equal(u, v)
    # a float mask of 0/1 weights is the same mask
    assert_tree_close(dp.clipped_sum(padded, 1.5, mask=mask.astype(np.float64)).summed, summed, rtol=0, atol=0)


def test_padding_keeps_the_sensitivity():
    """Adding one example to a batch changes the padded masked sum by exactly that
    example's clipped gradient (norm ≤ C), whether or not the two batches pad to the same
    bucket: the mechanism is the unpadded one."""
    for b in (7, 8, 11, 12):  # 7 → 8 stays in bucket 8; 8 → 9 moves to 12; 11 → 12 stays; 12 → 13 moves to 20
        g = per_example_pytree(_rng(30 + b), b + 1)
        small = tree.map(lambda x: x[:b], g)
        sums = []
        for batch in (small, g):
            n = tree.leaves(batch)[0].shape[0]
            padded, mask = dp.pad_batch(batch, dp.bucket_for(n, BUCKETS))
            sums.append(dp.clipped_sum(padded, 1.0, mask=mask).summed)
        diff = tree.map(lambda u, v: u - v, sums[1], sums[0])
        added = tree.map(lambda x: x[-1:], g)
        assert_tree_close(diff, loop_clipped_sum(added, 1.0), rtol=1e-11, atol=1e-13)
        assert loop_norms(tree.map(lambda x: x[None], diff))[0] <= 1.0 + 1e-12


def _mlp_problem(seed=50, n=120):
    rng = _rng(seed)
    params = {"w1": rng.standard_normal((5, 8)) * 0.5, "b1": np.zeros(8), "w2": rng.standard_normal((8, 3)) * 0.5,
              "b2": np.zeros(3)}
    xs, ys = rng.standard_normal((n, 5)), rng.integers(0, 3, n)

    def loss(p, x, y):
        logits = cnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return cv.nn.cross_entropy(logits[None], y[None])

    return params, xs, ys, loss


def _dp_adam_step(loss, c, sigma, expected):
    opt = cv.nn.optim.adam(0.05)
    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))

    def step(params, state, x, y, mask, noise):
        grads = dp.private_gradient(per_example(params, x, y), c, sigma, mask=mask, noise=noise,
                                    expected_batch_size=expected)
        return opt.update(grads, state, params)

    return opt, step


def test_jitted_padded_step_equals_eager_unpadded_step_and_a_loop():
    """One DP-SGD step (per-example gradients, clipping, masked sum, noise, Adam) under jit
    on a padded batch equals the eager step on the unpadded batch, and a per-example loop
    (float64)."""
    params, xs, ys, loss = _mlp_problem()
    c, sigma, expected = 0.7, 1.1, 10.0
    opt, step = _dp_adam_step(loss, c, sigma, expected)
    state = opt.init(params)
    idx = np.flatnonzero(_rng(51).random(len(ys)) < expected / len(ys))
    noise = dp.standard_normal_like(params, _rng(52))
    (x, y), mask = dp.pad_batch((xs[idx], ys[idx]), dp.bucket_for(len(idx), dp.batch_buckets(expected, len(ys))))
    assert len(mask) > len(idx)  # the case of interest: some padding
    jitted = cv.jit(step)(params, state, x, y, mask, noise)
    eager = step(params, state, xs[idx], ys[idx], np.ones(len(idx), bool), noise)
    assert_tree_close(jitted, eager, rtol=1e-12, atol=1e-14)
    # the gradient itself against a loop of grad: Adam's first step from m = v = 0
    loop = tree.map(lambda *ls: np.stack(ls), *[cv.grad(loss)(params, xs[i], ys[i]) for i in idx])
    g = tree.map(lambda s, z: (s + sigma * c * z) / expected, loop_clipped_sum(loop, c), noise)
    new_params, new_state = jitted
    assert_tree_close(new_state.m, tree.map(lambda gl: 0.1 * gl, g), rtol=1e-12, atol=1e-15)
    assert int(new_state.step) == 1


def test_jitted_poisson_steps_trace_once_per_bucket():
    """Over many Poisson-sampled steps the jitted step traces once per distinct padded
    size, never per batch size, and keeps the parameters' dtype."""
    params, xs, ys, loss = _mlp_problem(seed=53, n=160)
    params = tree.map(lambda p: p.astype(np.float32), params)
    xs = xs.astype(np.float32)
    n, expected = len(ys), 12.0
    opt, step = _dp_adam_step(loss, 1.0, 1.0, expected)
    state = opt.init(params)
    buckets = dp.batch_buckets(expected, n)
    jitted = cv.jit(step)
    rng, noise_rng = _rng(54), _rng(55)
    batch_sizes, padded_sizes = set(), set()
    for _ in range(60):
        idx = np.flatnonzero(rng.random(n) < expected / n)
        size = dp.bucket_for(len(idx), buckets)
        batch_sizes.add(len(idx))
        padded_sizes.add(size)
        (x, y), mask = dp.pad_batch((xs[idx], ys[idx]), size)
        params, state = jitted(params, state, x, y, mask, dp.standard_normal_like(params, noise_rng))
    assert len(batch_sizes) > 2 * len(padded_sizes)  # the batch size did change
    assert jitted.trace_count == len(padded_sizes)
    assert all(p.dtype == np.float32 for p in tree.leaves(params)) and int(state.step) == 60


def test_padding_on_backend(backend):
    """pad_batch keeps the arrays (and the mask) on their device; the masked clipped sum
    under jit matches the loop. Skips cleanly without a GPU."""
    g_np = per_example_pytree(_rng(56), 5, np.float32)
    g = cv.device_put(g_np, backend)
    padded, mask = dp.pad_batch(g, 8)
    assert cv_backend.backend_name(mask) == backend
    assert all(cv_backend.backend_name(x) == backend for x in tree.leaves(padded))
    summed = cv.jit(lambda t, m: dp.clipped_sum(t, 1.0, mask=m))(padded, mask).summed
    ref = loop_clipped_sum(tree.map(lambda x: x.astype(np.float64), g_np), 1.0)
    assert_tree_close(cv.device_put(summed, "cpu"), ref, rtol=1e-5, atol=1e-6)
