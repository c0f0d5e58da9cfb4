"""cuvmap.dp: per-example clipping, noise, and the RDP accountant of the sampled Gaussian.

Independent references:

* clipping and norms: a per-example Python loop in NumPy;
* noise: sample moments at a fixed seed, with loose tolerances;
* RDP at integer orders: the closed-form binomial sum evaluated in 60-digit ``decimal``
  arithmetic (no mpmath);
* RDP at fractional orders: the defining integral ``A_α = E_{z∼N(0,σ²)}[(μ/μ₀)^α]`` by
  the trapezoid rule on a fine grid (spectrally accurate for these smooth integrands);
* ε: values published by TF Privacy, dp_accounting and Opacus (cited at each table), with
  the conversion the source used, and the optimal Gaussian-mechanism δ (Balle & Wang 2018).
"""
import math
from decimal import Decimal, localcontext

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend as cv_backend
from cuvmap import dp, tree

# No fallback (cancellation) warning and no NumPy overflow may go unnoticed.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def _rng(seed=0):
    return np.random.default_rng(seed)


def _pytree(rng, b, dtype=np.float64):
    """Per-example gradients of several leaves, nested, with mixed ranks."""
    return {
        "conv": {"w": rng.standard_normal((b, 2, 3, 3)).astype(dtype), "b": rng.standard_normal((b, 2)).astype(dtype)},
        "dense": (rng.standard_normal((b, 5, 4)).astype(dtype), rng.standard_normal((b, 4)).astype(dtype)),
        "scale": rng.standard_normal((b,)).astype(dtype),
    }


def _loop_norms(grads):
    leaves = tree.leaves(grads)
    b = leaves[0].shape[0]
    return np.array([np.linalg.norm(np.concatenate([np.ravel(np.asarray(x)[i]) for x in leaves])) for i in range(b)])


def _loop_clip(grads, max_norm, tiny=1e-6):
    leaves, treedef = tree.flatten(grads)
    b = leaves[0].shape[0]
    out = [np.empty_like(np.asarray(x)) for x in leaves]
    for i in range(b):
        n = np.linalg.norm(np.concatenate([np.ravel(np.asarray(x)[i]) for x in leaves]))
        c = min(1.0, max_norm / (n + tiny))
        for o, x in zip(out, leaves):
            o[i] = np.asarray(x)[i] * c
    return tree.unflatten(treedef, out)


def _assert_tree_close(a, b, **kw):
    assert tree.structure(a) == tree.structure(b)
    for x, y in zip(tree.leaves(a), tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


# ---------------------------------------------------------------------------------------
# Norms and clipping
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("b", [1, 7])
def test_global_norms_match_loop(b):
    g = _pytree(_rng(1), b)
    norms = dp.per_example_global_norms(g)
    assert norms.shape == (b,)
    np.testing.assert_allclose(norms, _loop_norms(g), rtol=1e-13)


def test_clip_matches_loop_and_bounds_norms():
    rng = _rng(2)
    g = _pytree(rng, 9)
    # Scale examples so that some are far under, some near, some far over the bound.
    scales = np.array([0.01, 0.1, 0.5, 0.999, 1.0, 1.5, 3.0, 10.0, 1e3])
    norms0 = _loop_norms(g)
    g = tree.map(lambda x: x * (scales / norms0).reshape((-1,) + (1,) * (x.ndim - 1)), g)
    max_norm = 1.0
    clipped, norms = dp.clip_per_example(g, max_norm, return_norms=True)
    np.testing.assert_allclose(norms, scales, rtol=1e-13)
    _assert_tree_close(clipped, _loop_clip(g, max_norm), rtol=1e-14, atol=0)
    after = _loop_norms(clipped)
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
    g = _pytree(_rng(3), 5, np.float32)
    g = tree.map(lambda x: np.concatenate([np.zeros_like(x[:1]), x[1:] * 10]), g)
    clipped = dp.clip_per_example(g, 0.5)
    assert tree.structure(clipped) == tree.structure(g)
    for x, y in zip(tree.leaves(g), tree.leaves(clipped)):
        assert y.dtype == np.float32 and y.shape == x.shape
        np.testing.assert_array_equal(y[0], 0.0)  # an all-zero example: no NaN, stays zero
    after = _loop_norms(tree.map(lambda x: x.astype(np.float64), clipped))
    assert np.all(after <= 0.5 * (1 + 1e-6))
    _assert_tree_close(clipped, _loop_clip(tree.map(lambda x: x.astype(np.float64), g), 0.5), rtol=2e-6, atol=1e-7)


def test_clip_of_vmap_grad_matches_per_example_loop():
    rng = _rng(4)
    params = {"w1": rng.standard_normal((3, 4)), "b1": rng.standard_normal(4), "w2": rng.standard_normal(4)}
    xs, ys = rng.standard_normal((6, 3)) * 3, rng.standard_normal(6)

    def loss(p, x, y):
        return cnp.square(cnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] - y)

    per_ex = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    loop = [cv.grad(loss)(params, xs[i], ys[i]) for i in range(6)]
    stacked = tree.map(lambda *ls: np.stack(ls), *loop)
    np.testing.assert_allclose(dp.per_example_global_norms(per_ex), _loop_norms(stacked), rtol=1e-12)
    max_norm = float(np.median(_loop_norms(stacked)))
    _assert_tree_close(dp.clip_per_example(per_ex, max_norm), _loop_clip(stacked, max_norm), rtol=1e-12, atol=1e-14)


def test_norms_are_transformable():
    # d/dg Σ_b ‖g_b‖ = g_b / ‖g_b‖, leaf by leaf: the norms are built from cuvmap primitives.
    g = _pytree(_rng(5), 4)
    d = cv.grad(lambda t: cnp.sum(dp.per_example_global_norms(t)))(g)
    norms = _loop_norms(g)
    _assert_tree_close(d, tree.map(lambda x: x / norms.reshape((-1,) + (1,) * (x.ndim - 1)), g), rtol=1e-12)


def test_clip_errors():
    g = _pytree(_rng(6), 3)
    with pytest.raises(ValueError, match="positive"):
        dp.clip_per_example(g, 0.0)
    bad = dict(g, scale=np.ones(4))
    with pytest.raises(ValueError, match=r"\['scale'\] has batch size 4"):
        dp.per_example_global_norms(bad)
    with pytest.raises(ValueError, match="scalar"):
        dp.clip_per_example({"a": np.ones((3, 2)), "s": np.float64(1.0)}, 1.0)
    with pytest.raises(ValueError, match="no array leaves"):
        dp.per_example_global_norms({})


# ---------------------------------------------------------------------------------------
# Noise and the private gradient
# ---------------------------------------------------------------------------------------


def test_add_noise_std_and_reproducibility():
    zeros = {"a": np.zeros((300, 40)), "b": (np.zeros(5000, np.float32),)}
    sigma, c = 1.3, 0.7
    out = dp.add_noise(zeros, sigma, c, np.random.default_rng(123))
    again = dp.add_noise(zeros, sigma, c, np.random.default_rng(123))
    _assert_tree_close(out, again, rtol=0, atol=0)
    a, (b,) = out["a"], out["b"]
    assert a.dtype == np.float64 and b.dtype == np.float32 and b.shape == (5000,)
    for x in (a.ravel(), b.astype(np.float64)):
        n = x.size
        assert abs(x.mean()) < 5 * sigma * c / math.sqrt(n)
        assert abs(x.std() / (sigma * c) - 1) < 0.05
    # Leaves get independent noise.
    assert abs(np.corrcoef(a.ravel()[:5000], b.astype(np.float64))[0, 1]) < 0.06
    # The noise is added, not substituted.
    ones = dp.add_noise({"a": np.ones(20000)}, 0.5, 2.0, _rng(7))["a"]
    assert abs(ones.mean() - 1) < 0.03 and abs(ones.std() - 1.0) < 0.03


def test_add_noise_zero_multiplier_and_errors():
    x = {"a": np.arange(6.0)}
    _assert_tree_close(dp.add_noise(x, 0.0, 1.0, _rng()), x, rtol=0, atol=0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        dp.add_noise(x, -1.0, 1.0, _rng())
    with pytest.raises(ValueError, match="max_norm"):
        dp.add_noise(x, 1.0, 0.0, _rng())
    fresh = dp.add_noise({"a": np.zeros(10)}, 1.0, 1.0)  # rng=None: an OS-seeded generator
    assert np.all(fresh["a"] != 0)
    with pytest.raises(ValueError, match="floating-point"):
        dp.add_noise({"a": np.zeros(3, np.int64)}, 1.0, 1.0, _rng())
    # A legacy RandomState (no dtype argument) still gives noise of the leaf's dtype.
    legacy = dp.add_noise({"a": np.zeros(4000, np.float32)}, 1.0, 1.0, np.random.RandomState(0))["a"]
    assert legacy.dtype == np.float32 and abs(legacy.std() - 1) < 0.05


def test_private_gradient_without_noise_is_clipped_mean():
    g = _pytree(_rng(8), 6)
    ref = tree.map(lambda x: x.sum(0) / 6, _loop_clip(g, 0.8))
    out, norms = dp.private_gradient(g, 0.8, 0.0, _rng(), return_norms=True, normalize_by="batch_size")
    _assert_tree_close(out, ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(norms, _loop_norms(g), rtol=1e-13)
    # Poisson sampling: normalise by the expected batch size instead.
    out = dp.private_gradient(g, 0.8, 0.0, _rng(), expected_batch_size=10.0)
    _assert_tree_close(out, tree.map(lambda x: x * 6 / 10, ref), rtol=1e-13, atol=1e-15)


def test_private_gradient_noise_statistics():
    # (g̃ − clipped mean) · n / (σC) must be standard normal, leaf by leaf.
    rng = _rng(9)
    g = {"w": rng.standard_normal((4, 100, 30)), "b": rng.standard_normal((4, 3000))}
    sigma, c, n = 1.1, 0.5, 64.0
    clipped_sum = tree.map(lambda x: x.sum(0), _loop_clip(g, c))
    out = dp.private_gradient(g, c, sigma, np.random.default_rng(10), expected_batch_size=n)
    for y, s in zip(tree.leaves(out), tree.leaves(clipped_sum)):
        z = (y * n - s) / (sigma * c)
        assert abs(z.mean()) < 5 / math.sqrt(z.size)
        assert abs(z.std() - 1) < 0.05


def test_private_gradient_empty_poisson_batch():
    g = {"w": np.zeros((0, 3, 2)), "b": np.zeros((0, 2))}
    out = dp.private_gradient(g, 1.0, 1.0, _rng(11), expected_batch_size=4.0)
    assert out["w"].shape == (3, 2) and out["b"].shape == (2,)
    assert np.all(out["w"] != 0)
    with pytest.raises(ValueError, match="expected_batch_size"):
        dp.private_gradient(g, 1.0, 1.0, _rng(11))


def test_dp_on_backend(backend):
    """The same computations on CuPy arrays (gpu) with a CuPy generator; cpu checks the
    NumPy path of the same test. Skips cleanly without a GPU."""
    xp = cv_backend.xp_for(backend)
    g_np = _pytree(_rng(12), 5, np.float32)
    g = cv.device_put(g_np, backend)
    clipped, norms = dp.clip_per_example(g, 1.0, return_norms=True)
    assert cv_backend.backend_name(tree.leaves(clipped)[0]) == backend
    np.testing.assert_allclose(cv.device_put(norms, "cpu"), _loop_norms(tree.map(lambda x: x.astype(np.float64), g_np)), rtol=1e-5)
    _assert_tree_close(cv.device_put(clipped, "cpu"), _loop_clip(tree.map(lambda x: x.astype(np.float64), g_np), 1.0), rtol=1e-5, atol=1e-6)
    gen = xp.random.default_rng(13)
    noisy = dp.add_noise({"z": xp.zeros(20000, xp.float32)}, 2.0, 0.5, gen)["z"]
    assert cv_backend.backend_name(noisy) == backend and noisy.dtype == np.float32
    assert abs(float(noisy.std()) - 1.0) < 0.03
    out = dp.private_gradient(g, 1.0, 1.0, gen, expected_batch_size=5.0)
    assert cv_backend.backend_name(tree.leaves(out)[0]) == backend
    if backend == "gpu":
        with pytest.raises(ValueError, match="NumPy generator cannot draw noise for a leaf on the gpu"):
            dp.add_noise(g, 1.0, 1.0, np.random.default_rng())
        with pytest.raises(ValueError, match="CuPy generator cannot draw noise for a leaf on the cpu"):
            dp.add_noise(g_np, 1.0, 1.0, gen)


# ---------------------------------------------------------------------------------------
# Padding Poisson batches to a few sizes (NOTE [padding Poisson batches])
# ---------------------------------------------------------------------------------------


def _loop_clipped_sum(grads, max_norm):
    """Σ_b clip(g_b): the per-example loop, summed in float64."""
    return tree.map(lambda x: np.asarray(x).sum(axis=0), _loop_clip(grads, max_norm))


def _loop_clipped_sum_or_zeros(grads, max_norm):
    if tree.leaves(grads)[0].shape[0] == 0:
        return tree.map(lambda x: np.zeros(x.shape[1:]), grads)
    return _loop_clipped_sum(grads, max_norm)


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
    g = _pytree(_rng(22 + b), b)
    size = dp.bucket_for(b, BUCKETS)
    padded, mask = dp.pad_batch(g, size)
    assert tree.leaves(padded)[0].shape[0] == size and int(mask.sum()) == b
    summed, norms = dp.clipped_sum(padded, 1.5, mask=mask, return_norms=True)
    _assert_tree_close(summed, _loop_clipped_sum_or_zeros(g, 1.5), rtol=1e-13, atol=1e-14)
    assert all(s.shape == x.shape[1:] for s, x in zip(tree.leaves(summed), tree.leaves(g)))
    np.testing.assert_allclose(norms[:b], _loop_norms(g) if b else np.zeros(0), rtol=1e-13)
    # unpadded, the same sum
    _assert_tree_close(dp.clipped_sum(g, 1.5).summed, _loop_clipped_sum_or_zeros(g, 1.5), rtol=1e-13, atol=1e-14)
    # other padding (any finite values) gives exactly the same sum
    junk = tree.map(lambda x: np.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, 1e6 * _rng(b).standard_normal(x.shape)),
                    padded)
    again = dp.clipped_sum(junk, 1.5, mask=mask).summed
    for u, v in zip(tree.leaves(summed), tree.leaves(again)):
        np.testing.assert_array_equal(u, v)
    # a float mask of 0/1 weights is the same mask
    _assert_tree_close(dp.clipped_sum(padded, 1.5, mask=mask.astype(np.float64)).summed, summed, rtol=0, atol=0)


def test_padding_keeps_the_sensitivity():
    """Adding one example to a batch changes the padded masked sum by exactly that
    example's clipped gradient (norm ≤ C), whether or not the two batches pad to the same
    bucket: the mechanism is the unpadded one."""
    for b in (7, 8, 11, 12):  # 7 → 8 stays in bucket 8; 8 → 9 moves to 12; 11 → 12 stays; 12 → 13 moves to 20
        g = _pytree(_rng(30 + b), b + 1)
        small = tree.map(lambda x: x[:b], g)
        sums = []
        for batch in (small, g):
            n = tree.leaves(batch)[0].shape[0]
            padded, mask = dp.pad_batch(batch, dp.bucket_for(n, BUCKETS))
            sums.append(dp.clipped_sum(padded, 1.0, mask=mask).summed)
        diff = tree.map(lambda u, v: u - v, sums[1], sums[0])
        added = tree.map(lambda x: x[-1:], g)
        _assert_tree_close(diff, _loop_clipped_sum(added, 1.0), rtol=1e-11, atol=1e-13)
        assert _loop_norms(tree.map(lambda x: x[None], diff))[0] <= 1.0 + 1e-12


def test_clipped_sum_errors_and_transformability():
    g = _pytree(_rng(40), 4)
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
        _assert_tree_close(tree.map(lambda s: s[i], stacked.summed),
                           dp.clipped_sum(tree.map(lambda x: scale * x, g), 1.0, mask=mask).summed, rtol=1e-13)


def test_standard_normal_like_draws_what_add_noise_draws():
    like = {"w": np.zeros((3, 4)), "b": np.zeros(4, np.float32)}
    z = dp.standard_normal_like(like, _rng(41))
    noisy = dp.add_noise(like, 1.0, 1.0, _rng(41))
    for a, b in zip(tree.leaves(z), tree.leaves(noisy)):
        np.testing.assert_array_equal(a, b)
    assert z["b"].dtype == np.float32 and z["w"].shape == (3, 4)
    with pytest.raises(ValueError, match="standard_normal_like: a leaf has dtype int64"):
        dp.standard_normal_like({"i": np.zeros(2, np.int64)}, _rng())


def test_private_gradient_with_mask_and_drawn_noise():
    """private_gradient(padded, mask=m, noise=z) = (Σ_real clip(g_b) + σ C z) / n, and with
    z drawn by standard_normal_like from a generator it equals the rng path on the
    unpadded batch (to rounding)."""
    g = _pytree(_rng(42), 6)
    padded, mask = dp.pad_batch(g, 8)
    sigma, c, n = 1.3, 0.9, 7.5
    z = dp.standard_normal_like(tree.map(lambda x: x[0], g), _rng(43))
    out = dp.private_gradient(padded, c, sigma, mask=mask, noise=z, expected_batch_size=n)
    ref = tree.map(lambda s, zl: (s + sigma * c * zl) / n, _loop_clipped_sum(g, c), z)
    _assert_tree_close(out, ref, rtol=1e-13, atol=1e-14)
    _assert_tree_close(dp.private_gradient(g, c, sigma, _rng(43), expected_batch_size=n), ref, rtol=1e-13, atol=1e-14)
    # normalize_by="batch_size" (asked by name) normalises by the number of real examples
    mean = dp.private_gradient(padded, c, 0.0, mask=mask, noise=z, normalize_by="batch_size")
    _assert_tree_close(mean, tree.map(lambda s: s / 6, _loop_clipped_sum(g, c)), rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="either rng .* or noise"):
        dp.private_gradient(padded, c, sigma, _rng(), mask=mask, noise=z)
    with pytest.raises(ValueError, match=r"noise leaf \['scale'\] has shape \(2,\)"):
        dp.private_gradient(padded, c, sigma, mask=mask, noise=dict(z, scale=np.zeros(2)), expected_batch_size=n)
    with pytest.raises(ValueError, match="noise has the pytree structure"):
        dp.private_gradient(padded, c, sigma, mask=mask, noise={"w": 1.0}, expected_batch_size=n)


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
    _assert_tree_close(jitted, eager, rtol=1e-12, atol=1e-14)
    # the gradient itself against a loop of grad: Adam's first step from m = v = 0
    loop = tree.map(lambda *ls: np.stack(ls), *[cv.grad(loss)(params, xs[i], ys[i]) for i in idx])
    g = tree.map(lambda s, z: (s + sigma * c * z) / expected, _loop_clipped_sum(loop, c), noise)
    new_params, new_state = jitted
    _assert_tree_close(new_state.m, tree.map(lambda gl: 0.1 * gl, g), rtol=1e-12, atol=1e-15)
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
    g_np = _pytree(_rng(56), 5, np.float32)
    g = cv.device_put(g_np, backend)
    padded, mask = dp.pad_batch(g, 8)
    assert cv_backend.backend_name(mask) == backend
    assert all(cv_backend.backend_name(x) == backend for x in tree.leaves(padded))
    summed = cv.jit(lambda t, m: dp.clipped_sum(t, 1.0, mask=m))(padded, mask).summed
    ref = _loop_clipped_sum(tree.map(lambda x: x.astype(np.float64), g_np), 1.0)
    _assert_tree_close(cv.device_put(summed, "cpu"), ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------
# RDP of the sampled Gaussian mechanism: independent references
# ---------------------------------------------------------------------------------------


def _rdp_int_decimal(q, sigma, alpha):
    """Closed form for integer α in 60-digit decimal arithmetic:
    log(Σ_k C(α,k) (1−q)^(α−k) q^k exp((k²−k)/(2σ²))) / (α−1)."""
    with localcontext() as ctx:
        ctx.prec = 60
        qd, s2 = Decimal(q), Decimal(sigma) ** 2
        a = sum(
            Decimal(math.comb(alpha, k)) * (1 - qd) ** (alpha - k) * qd ** k * (Decimal(k * k - k) / (2 * s2)).exp()
            for k in range(alpha + 1)
        )
        return float(a.ln() / (alpha - 1))


def _rdp_quadrature(q, sigma, alpha, n=400001):
    """log(A_α)/(α−1) with A_α = ∫ φ_σ(z) ((1−q) + q·e^{(2z−1)/(2σ²)})^α dz by the trapezoid
    rule; A − 1 = ∫ φ_σ · expm1(α·log(μ/μ₀)) when A is close to 1 (no cancellation)."""
    z, h = np.linspace(-14 * sigma - 1, alpha + 14 * sigma + 1, n, retstep=True)
    t = (2 * z - 1) / (2 * sigma**2)
    tc = np.minimum(t, 700.0)
    log_ratio = np.where(
        t < 700, np.log1p(q * np.expm1(tc)), math.log(q) + t + np.log1p((1 - q) / q * np.exp(-np.maximum(t, 700.0)))
    )
    log_phi = -z * z / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi))
    logf = log_phi + alpha * log_ratio
    top = logf.max()
    log_a = math.log(h) + top + math.log(math.fsum(np.exp(logf - top).tolist()))
    if log_a < 1e-2:
        log_a = math.log1p(h * math.fsum((np.exp(log_phi) * np.expm1(alpha * log_ratio)).tolist()))
    return log_a / (alpha - 1)


@pytest.mark.parametrize("q,sigma,alpha", [
    (0.1, 2.0, 5), (256 / 60000, 1.1, 2), (256 / 60000, 1.1, 9), (256 / 60000, 1.1, 63),
    (0.04, 1.5, 32), (0.5, 0.5, 12), (0.01, 0.3, 128), (0.999, 3.0, 7), (1e-7, 1.0, 2), (1e-6, 1.0, 27),
])
def test_rdp_integer_orders_closed_form(q, sigma, alpha):
    got = dp.rdp_sampled_gaussian(q, sigma, alpha)
    assert isinstance(got, float)
    # Full relative precision even for tiny q, where A − 1 is far below 1 ulp of 1.
    assert got == pytest.approx(_rdp_int_decimal(q, sigma, alpha), rel=1e-12, abs=0)


@pytest.mark.parametrize("q,sigma,alpha", [(0.1, 2.0, 5), (0.01, 0.35, 3), (0.3, 1.0, 2), (0.04, 1.5, 12)])
def test_fractional_series_reduces_to_closed_form(q, sigma, alpha):
    # The series of the fractional path, run at an integer order (where it terminates) ...
    log_a = dp._log_a_frac(q, sigma, float(alpha))
    assert log_a / (alpha - 1) == pytest.approx(_rdp_int_decimal(q, sigma, alpha), rel=1e-11, abs=0)
    # ... and through the public API, just off the integer: continuity.
    for a in (alpha - 1e-7, alpha + 1e-7):
        assert dp.rdp_sampled_gaussian(q, sigma, a) == pytest.approx(dp.rdp_sampled_gaussian(q, sigma, alpha), rel=1e-5, abs=0)


@pytest.mark.parametrize("q,sigma,alpha", [
    (0.01, 2.5, 1.5), (0.01, 2.5, 2.5), (0.01, 0.35, 1.6), (0.01, 0.7, 4.4), (256 / 60000, 1.1, 8.3),
    (0.04, 1.5, 10.9), (0.5, 1.0, 1.1), (0.99, 0.5, 5.5), (1e-4, 1.0, 1.5), (0.01, 10.0, 20.5), (0.2, 0.3, 3.3),
])
def test_rdp_fractional_orders_quadrature(q, sigma, alpha):
    # The signed series sums O(1) terms, so log A_α is accurate to ~1e-16 absolute: a float
    # floor that only shows when q is tiny (here q = 1e-4, RDP ~ 1e-8, relative 1e-8).
    ref = _rdp_quadrature(q, sigma, alpha)
    assert dp.rdp_sampled_gaussian(q, sigma, alpha) == pytest.approx(ref, rel=1e-9, abs=1e-15 / (alpha - 1))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 4.530877117])
def test_rdp_q1_is_gaussian_mechanism(sigma):
    orders = np.array([1.1, 1.5, 2.0, 3.7, 12.0, 63.0])
    np.testing.assert_allclose(dp.rdp_sampled_gaussian(1.0, sigma, orders), orders / (2 * sigma**2), rtol=1e-15)
    # The q → 1 limit of both the closed form and the fractional series.
    np.testing.assert_allclose(dp.rdp_sampled_gaussian(1 - 1e-10, sigma, orders), orders / (2 * sigma**2), rtol=1e-6)


def test_rdp_edge_cases_and_errors():
    assert dp.rdp_sampled_gaussian(0.0, 1.0, 5) == 0.0
    assert dp.rdp_sampled_gaussian(0.1, 0.0, 5) == math.inf
    assert dp.rdp_sampled_gaussian(0.1, 1.0, math.inf) == math.inf
    np.testing.assert_allclose(dp.rdp_sampled_gaussian(0.1, 2.0, [3, 4.5], steps=10),
                               10 * dp.rdp_sampled_gaussian(0.1, 2.0, [3, 4.5]), rtol=1e-15)
    for bad in [dict(q=1.5), dict(noise_multiplier=-1.0), dict(orders=[0.5, 2]), dict(orders=1.0)]:
        kw = dict(q=0.1, noise_multiplier=1.0, orders=[2, 3]) | bad
        with pytest.raises(ValueError):
            dp.rdp_sampled_gaussian(**kw)


@pytest.mark.parametrize("q,sigma", [(256 / 60000, 1.1), (0.04, 1.5), (0.3, 0.6), (1e-3, 5.0)])
def test_rdp_monotone_in_order_and_log_a_convex(q, sigma):
    # Rényi divergence is nondecreasing in α, and (α − 1)·D_α = log A_α is convex in α
    # (van Erven & Harremoës 2014, Theorems 3 and 11).
    orders = np.array(dp.DEFAULT_ORDERS)
    rdp = dp.rdp_sampled_gaussian(q, sigma, orders)
    assert np.all(np.diff(rdp) >= -1e-15 * rdp[1:])
    log_a = (orders - 1) * rdp
    slopes = np.diff(log_a) / np.diff(orders)
    assert np.all(np.diff(slopes) >= -1e-9 * np.abs(slopes[1:]))


# ---------------------------------------------------------------------------------------
# Published reference values
# ---------------------------------------------------------------------------------------

# TF Privacy's compute_dp_sgd_privacy orders:
# tensorflow/privacy tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_lib.py
TF_ORDERS = [1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5] + list(range(5, 64)) + [128, 256, 512]
# dp_accounting's default RDP orders (dp_accounting/rdp/rdp_privacy_accountant.py).
DP_ACCOUNTING_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]


def test_tf_privacy_rdp_accountant_test_values():
    # tensorflow/privacy tensorflow_privacy/privacy/analysis/rdp_accountant_test.py
    # test_compute_rdp_scalar: compute_rdp(0.1, 2, 10, 5) ≈ 0.07737 (5 places).
    assert dp.rdp_sampled_gaussian(0.1, 2, 5, steps=10) == pytest.approx(0.07737, abs=5e-6)
    # test_compute_rdp_sequence (delta=1e-5), fractional orders 1.5 and 2.5 included.
    got = dp.rdp_sampled_gaussian(0.01, 2.5, [1.5, 2.5, 5, 50, 100, np.inf], steps=50)
    np.testing.assert_allclose(got[:-1], [0.00065, 0.001085, 0.00218075, 0.023846, 167.416307], rtol=0, atol=1e-5)
    assert got[-1] == np.inf
    # test_get_privacy_spent_check_target_delta, improved conversion: constant RDP 1.1 over
    # orders 2..32 → ε = 1.32783806176 at order 32; the Gaussian mechanism with σ =
    # 4.530877117 over orders 1.001..99.999 → exactly (1, 1e-6)-DP.
    eps, order = dp.rdp_to_epsilon(range(2, 33), [1.1] * 31, 1e-5)
    assert eps == pytest.approx(1.32783806176, abs=1e-10) and order == 32
    orders = [0.001 * i for i in range(1001, 100000)]
    eps, _ = dp.rdp_to_epsilon(orders, dp.rdp_sampled_gaussian(1, 4.530877117, orders), 1e-6)
    assert eps == pytest.approx(1.0, abs=1e-7)


def test_tf_privacy_composition_classic_and_improved():
    # rdp_accountant_test.py test_check_composition: written for the classic conversion
    # ("These tests use the old RDP -> approx DP conversion": ε = 8.509656 at order 2.5);
    # the improved conversion must stay below it.
    orders = (1.25, 1.5, 1.75, 2., 2.5, 3., 4., 5., 6., 7., 8., 10., 12., 14., 16., 20., 24., 28., 32., 64., 256.)
    rdp = dp.rdp_sampled_gaussian(1e-4, 0.4, orders, steps=40000) + dp.rdp_sampled_gaussian(0.1, 2, orders, steps=100)
    eps, order = dp.rdp_to_epsilon(orders, rdp, 1e-5, conversion="classic")
    assert eps == pytest.approx(8.509656, abs=5e-7) and order == 2.5
    assert dp.rdp_to_epsilon(orders, rdp, 1e-5)[0] <= 8.509656


@pytest.mark.parametrize("n,batch,sigma,epochs,delta,eps_ref,order_ref", [
    (60000, 150, 1.3, 15, 1e-5, 0.7242234026109595, 19.0),
    (100000, 100, 1.0, 30, 1e-7, 1.4154988495444842, 13.0),
    (100000000, 1024, 0.1, 10, 1e-7, 5907982.3113978775, 1.25),
])
def test_tf_privacy_compute_dp_sgd_privacy(n, batch, sigma, epochs, delta, eps_ref, order_ref):
    # tensorflow/privacy tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_test.py
    # (test_compute_dp_sgd_privacy): dp_accounting's RdpAccountant, improved conversion,
    # TF_ORDERS, steps = ceil(epochs·n/batch). The values are quoted to 16 digits; they
    # agree to ~1e-12 relative (the last one differs by 1.6e-5 absolute at ε ≈ 5.9e6).
    eps, order = dp.epsilon(n, batch, epochs, sigma, delta, orders=TF_ORDERS, return_order=True)
    assert eps == pytest.approx(eps_ref, rel=1e-10) and order == order_ref


def test_tf_privacy_mnist_readme_classic_conversion():
    # The MNIST run of TF Privacy's docs: N=60000, batch 256, noise 1.12, 60 epochs,
    # δ=1e-5 "satisfies (2.92, 1e-5)-DP" — compute_dp_sgd_privacy.py's docstring
    # (tensorflow/privacy tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy.py) and
    # tutorials/README.md. Published in 2019 with the classic conversion (rdp − log δ/(α−1)).
    assert round(dp.epsilon(60000, 256, 60, 1.12, 1e-5, orders=TF_ORDERS, conversion="classic"), 2) == 2.92
    # tutorials/README.md "Expected Output": ε after 1, 2 and 60 epochs is 1.00, 1.04, 2.92, from
    # tutorials/mnist_dpsgd_tutorial.py's compute_epsilon (orders 1.1..10.9 and 12..63,
    # 234 steps per epoch, classic conversion).
    tutorial_orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    for epochs, ref in [(1, 1.00), (2, 1.04), (60, 2.92)]:
        rdp = dp.rdp_sampled_gaussian(256 / 60000, 1.12, tutorial_orders, steps=epochs * (60000 // 256))
        assert round(dp.rdp_to_epsilon(tutorial_orders, rdp, 1e-5, conversion="classic")[0], 2) == ref
    # The improved conversion is tighter on the same RDP.
    assert dp.epsilon(60000, 256, 60, 1.12, 1e-5, orders=TF_ORDERS) < 2.9


def _dp_sgd_example_eps(num_epochs, sigma, delta, microbatching, q, fractional="exact"):
    # compute_dp_sgd_privacy_lib._compute_dp_sgd_example_privacy: microbatching halves σ,
    # count = ceil(epochs/q) Poisson steps (or ceil(epochs) full passes without sampling).
    if microbatching:
        sigma /= 2
    count = int(math.ceil(num_epochs / q)) if q else int(math.ceil(num_epochs))
    rdp = dp.rdp_sampled_gaussian(q or 1.0, sigma, DP_ACCOUNTING_ORDERS, steps=count, fractional=fractional)
    return dp.rdp_to_epsilon(DP_ACCOUNTING_ORDERS, rdp, delta)[0]


def test_tf_privacy_example_privacy_and_statement():
    # compute_dp_sgd_privacy_test.py, test_compute_dp_sgd_example_privacy (RDP rows;
    # num_epochs=1.2, noise 0.7, δ=1e-5; improved conversion, dp_accounting orders).
    assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, False, None) == pytest.approx(10.8602036, abs=1e-7)
    assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, True, None) == pytest.approx(26.2880374, abs=1e-7)
    # The Poisson rows (q=1e-2) were produced by dp_accounting >= 0.4.4, whose fractional
    # series sums the terms' magnitudes (an upper bound): reproduced with
    # fractional="upper_bound". The exact series (checked against quadrature above) is tighter.
    for micro, ref in [(False, 3.2392676), (True, 22.6248601)]:
        assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, micro, 1e-2, "upper_bound") == pytest.approx(ref, abs=1e-7)
        assert _dp_sgd_example_eps(1.2, 0.7, 1e-5, micro, 1e-2) < ref
    # test_dp_sgd_privacy_statement_*_with_rdp: 10000 examples, batch 64, 5 epochs, noise 2.0
    # with microbatching, δ=1e-6 → 13.376 (once per epoch) and 1.616 (Poisson), 3 decimals.
    assert round(_dp_sgd_example_eps(5.0, 2.0, 1e-6, True, None), 3) == 13.376
    assert round(_dp_sgd_example_eps(5.0, 2.0, 1e-6, True, 64 / 10000), 3) == 1.616


def test_dp_accounting_upper_bound_series():
    # dp_accounting 0.4.4 rdp_privacy_accountant_test.py test_compute_rdp_poisson_sampled_gaussian
    # (rtol 1e-4): the magnitude-sum series; integer orders are unchanged from the exact values.
    got = dp.rdp_sampled_gaussian(0.01, 2.5, [1.5, 2.5, 5, 50, 100, np.inf], steps=50, fractional="upper_bound")
    np.testing.assert_allclose(got, [6.70579741e-04, 1.08548710e-03, 2.18075656e-03, 2.38460375e-02, 1.67416308e02, np.inf],
                               rtol=1e-8)


def test_opacus_rdp_accountant():
    # pytorch/opacus opacus/tests/accountants_test.py test_rdp_accountant: noise 1.5, sample
    # rate 0.04, int(90/0.04) steps, δ=1e-5 → 7.32911117143 (7 places), default orders,
    # improved conversion (Balle et al. 2020, Thm 21, opacus/accountants/analysis/rdp.py).
    acct = dp.RDPAccountant()
    for _ in range(int(90 / 0.04)):
        acct.step(noise_multiplier=1.5, sample_rate=0.04)
    assert len(acct) == 2250 and len(acct.history) == 1
    assert acct.get_epsilon(delta=1e-5) == pytest.approx(7.32911117143, abs=1e-9)
    # The classic conversion is looser.
    assert acct.get_epsilon(delta=1e-5, conversion="classic") > 7.5


def test_opacus_heterogeneous_composition():
    # opacus/accountants/analysis/rdp.py module docstring: steps (q, σ, T) = (1e-5, 1.0, 10)
    # then (1e-4, 3.0, 4), orders 2..32, δ=1e-5 → (0.336, 23) (doctest +NUMBER: 3 decimals).
    acct = dp.RDPAccountant(orders=range(2, 33))
    acct.step(1.0, 1e-5, num_steps=10)
    acct.step(3.0, 1e-4, num_steps=4)
    eps, order = acct.get_privacy_spent(1e-5)
    assert round(eps, 3) == 0.336 and order == 23
    rdp = dp.rdp_sampled_gaussian(1e-5, 1.0, range(2, 33), steps=10) + dp.rdp_sampled_gaussian(1e-4, 3.0, range(2, 33), steps=4)
    np.testing.assert_allclose(acct.get_rdp(), rdp, rtol=1e-15)


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0])
def test_improved_conversion_respects_exact_gaussian_delta(sigma):
    # For the plain Gaussian mechanism the optimal δ(ε) is known (Balle & Wang 2018, Thm 8):
    # δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ). An RDP-derived (ε, δ) must satisfy
    # δ(ε) ≤ δ, and must not be absurdly loose.
    orders = [1 + 0.01 * i for i in range(1, 5000)]
    rdp = dp.rdp_sampled_gaussian(1.0, sigma, orders)
    for delta in (1e-3, 1e-5, 1e-9):
        eps, _ = dp.rdp_to_epsilon(orders, rdp, delta)
        exact = 0.5 * math.erfc((eps * sigma - 0.5 / sigma) / math.sqrt(2)) \
            - math.exp(eps) * 0.5 * math.erfc((eps * sigma + 0.5 / sigma) / math.sqrt(2))
        assert exact <= delta
        assert exact >= delta * 1e-3
        assert eps <= dp.rdp_to_epsilon(orders, rdp, delta, conversion="classic")[0]


# ---------------------------------------------------------------------------------------
# Conversion and accountant API
# ---------------------------------------------------------------------------------------


def test_rdp_to_epsilon_edge_cases():
    # Tiny RDP: δ ≥ sqrt(1 − e^{−rdp}) gives ε = 0.
    assert dp.rdp_to_epsilon([2, 3], [1e-12, 2e-12], 1e-5) == (0.0, 2.0)
    assert dp.rdp_to_epsilon([2, 3], [math.inf, math.inf], 1e-5)[0] == math.inf
    eps, order = dp.rdp_to_epsilon([2, 3], [math.inf, 0.5], 1e-5, conversion="classic")
    assert order == 3 and eps == pytest.approx(0.5 + math.log(1e5) / 2)
    for args in [([2, 3], [1.0], 1e-5), ([2, 3], [1.0, 1.0], 0.0), ([1.0, 3], [1.0, 1.0], 1e-5), ([2, 3], [-1.0, 1.0], 1e-5)]:
        with pytest.raises(ValueError):
            dp.rdp_to_epsilon(*args)
    with pytest.raises(ValueError, match="conversion"):
        dp.rdp_to_epsilon([2], [1.0], 1e-5, conversion="best")


def test_accountant_history_merging_and_epsilon_helper():
    acct = dp.RDPAccountant()
    acct.step(1.1, 256 / 60000, num_steps=100)
    acct.step(1.1, 256 / 60000, num_steps=134)
    acct.step(2.0, 0.01)
    acct.step(1.1, 256 / 60000)
    assert [h[2] for h in acct.history] == [234, 1, 1] and len(acct) == 236
    rdp = (dp.rdp_sampled_gaussian(256 / 60000, 1.1, dp.DEFAULT_ORDERS, steps=235)
           + dp.rdp_sampled_gaussian(0.01, 2.0, dp.DEFAULT_ORDERS))
    np.testing.assert_allclose(acct.get_rdp(), rdp, rtol=1e-13)
    assert acct.get_epsilon(1e-5) == pytest.approx(dp.rdp_to_epsilon(dp.DEFAULT_ORDERS, rdp, 1e-5)[0], rel=1e-13)
    assert dp.RDPAccountant().get_epsilon(1e-5) == 0.0  # no steps, no privacy loss
    # The helper: q = batch/N and ceil(epochs·N/batch) steps (here 60·60000/256 = 14062.5 → 14063).
    one = dp.RDPAccountant()
    one.step(1.1, 256 / 60000, num_steps=14063)
    assert dp.epsilon(60000, 256, 60, 1.1, 1e-5) == pytest.approx(one.get_epsilon(1e-5), rel=1e-14)
    with pytest.raises(ValueError):
        acct.step(1.0, 1.5)
    with pytest.raises(ValueError):
        dp.epsilon(100, 200, 1, 1.0, 1e-5)
    assert len(dp.DEFAULT_ORDERS) == 99 + 52 and dp.DEFAULT_ORDERS[0] == 1.1 and dp.DEFAULT_ORDERS[-1] == 63


def test_a_padded_batch_without_real_examples_is_noise_over_one():
    """Poisson sampling can draw no example: with every row padding, the private gradient
    is the noise normalised by 1 (not 0/0)."""
    grads = {"w": np.random.default_rng(0).standard_normal((4, 3))}
    noise = {"w": np.full(3, 0.5)}
    g = dp.private_gradient(grads, 1.0, 2.0, mask=np.zeros(4, bool), noise=noise, normalize_by="batch_size")
    np.testing.assert_allclose(g["w"], np.full(3, 0.5 * 2.0 * 1.0))
