"""Sensitivity as data (NOTE [sensitivity as data]), the normalisation said by name (NOTE
[normalising the private gradient]) and the critical pitfalls of jax_privacy's
``docs/sharp_edges_dp_training_pitfalls.md``, each as a failing example that cuvmap
rejects or handles.

Independent references: per-example NumPy loops for the clipped sums, closed forms for
the sensitivities (C, 2C, √(Σ C_k²)), and sample moments of the noise (variance within a
few standard errors at fixed seeds) for its scale."""
import math

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import dp, tree
from dp_references import assert_tree_close, loop_clipped_sum, tanh_net_loss, tanh_net_problem


def _grads(rng, b, scale=1.0):
    return {"w": scale * rng.standard_normal((b, 3, 4)), "b": scale * rng.standard_normal((b, 4))}


def _std_of(noisy, clean, n=1.0):
    """The sample std of (noisy − clean) · n over every coordinate."""
    d = np.concatenate([np.ravel((np.asarray(a) - np.asarray(b)) * n) for a, b in
                        zip(tree.leaves(noisy), tree.leaves(clean))])
    return float(d.std()), d.size


# ---------------------------------------------------------------------------------------
# The sensitivity a clipped sum carries
# ---------------------------------------------------------------------------------------

SENSITIVITY_CASES = [
    # (how, relation, C, expected Δ)
    ("clipped_sum", "add_remove", 1.0, 1.0),
    ("clipped_sum", "replace", 1.0, 2.0),
    ("clipped_sum", "add_remove", 0.3, 0.3),
    ("clipped_grad", "add_remove", 0.7, 0.7),
    ("clipped_grad", "replace", 0.7, 1.4),
    ("jit(clipped_grad)", "replace", 0.5, 1.0),
    ("jit(clipped_sum)", "add_remove", 2.0, 2.0),
]


@pytest.mark.parametrize("how, relation, c, want", SENSITIVITY_CASES)
def test_the_clipped_sum_carries_its_sensitivity(how, relation, c, want):
    params, xs, ys = tanh_net_problem()
    per_example = cv.vmap(cv.grad(tanh_net_loss), in_axes=(None, 0, 0))(params, xs, ys)
    if how.endswith("clipped_sum)") or how == "clipped_sum":
        fn = lambda g: dp.clipped_sum(g, c, relation=relation)  # noqa: E731
        arg = (per_example,)
    else:
        clipped = dp.clipped_grad(tanh_net_loss, c, relation=relation)
        fn, arg = (lambda p, x, y: clipped(p, x, y)), (params, xs, ys)
    if how.startswith("jit"):
        fn = cv.jit(fn)
    got = fn(*arg)
    assert isinstance(got, dp.ClippedGradient)
    assert got.sensitivity == pytest.approx(want, rel=1e-15) and got.max_norm == c and got.relation == relation
    assert_tree_close(got.summed, loop_clipped_sum(tree.map(np.asarray, per_example), c), rtol=1e-10, atol=1e-12)
    summed, norms = got                       # unpacks as before
    assert norms.shape == (8,) and got[0] is summed
    assert f"L2 sensitivity {want:g}" in repr(got)


def test_a_relation_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match=r"relation must be one of 'add_remove', 'replace'.*'zero_out'"):
        dp.clipped_sum(_grads(np.random.default_rng(0), 2), 1.0, relation="zero_out")
    with pytest.raises(ValueError, match="relation must be one of"):
        dp.clipped_grad(tanh_net_loss, 1.0, relation="replace_one")


@pytest.mark.parametrize("relation, factor", [("add_remove", 1.0), ("replace", 2.0)])
def test_noise_std_is_sigma_times_the_sensitivity(relation, factor):
    """add_noise and private_gradient draw σ·Δ: σC for add/remove-one, 2σC for replace-one."""
    g = {"w": np.zeros((3, 200, 100))}
    c, sigma = 0.5, 1.3
    clipped = dp.clipped_sum(g, c, relation=relation)
    noisy = dp.add_noise(clipped, sigma, rng=np.random.default_rng(1))
    std, size = _std_of(noisy, clipped.summed)
    assert abs(std / (factor * sigma * c) - 1) < 4 / math.sqrt(2 * size)
    out = dp.private_gradient(g, c, sigma, np.random.default_rng(2), expected_batch_size=4.0, relation=relation)
    std, size = _std_of(out, clipped.summed, n=4.0)
    assert abs(std / (factor * sigma * c) - 1) < 4 / math.sqrt(2 * size)


MISMATCHES = [
    # (call, pattern): a max_norm that is not the clipped sum's bound
    (lambda c, z: dp.private_gradient(c, 0.5, 1.1, noise=z, expected_batch_size=8.0),
     r"private_gradient: max_norm=0\.5 differs from the clipped sum's sensitivity bound 1 \(L2 sensitivity 1"),
    (lambda c, z: dp.add_noise(c, 1.1, 2.0),
     r"add_noise: max_norm=2\.0 differs from the clipped sum's sensitivity bound 1 "),
    (lambda c, z: dp.private_gradient(c, 1.0, 1.1, noise=z, expected_batch_size=8.0, relation="replace"),
     r"relation='replace', but the clipped sum's sensitivity is stated for 'add_remove'"),
]


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", range(len(MISMATCHES)))
def test_a_max_norm_other_than_the_sums_is_refused_eagerly_and_under_jit(case, jitted):
    call, pattern = MISMATCHES[case]
    params, xs, ys = tanh_net_problem()
    clipped = dp.clipped_grad(tanh_net_loss, 1.0)
    z = dp.standard_normal_like(params, np.random.default_rng(3))

    def step(p, x, y, z):
        return call(clipped(p, x, y), z)

    with pytest.raises(ValueError, match=pattern):
        (cv.jit(step) if jitted else step)(params, xs, ys, z)
    # the bound itself, or none, is accepted
    g = dp.private_gradient(clipped(params, xs, ys), 1.0, 1.1, noise=z, expected_batch_size=8.0)
    assert tree.structure(g) == tree.structure(params)
    g2 = dp.private_gradient(clipped(params, xs, ys), noise_multiplier=1.1, noise=z, expected_batch_size=8.0)
    assert_tree_close(g, g2, rtol=0, atol=0)


def test_a_plain_pytree_needs_its_bound():
    with pytest.raises(ValueError, match="max_norm is needed for a plain pytree"):
        dp.add_noise({"w": np.zeros(3)}, 1.0)
    with pytest.raises(ValueError, match="max_norm .* is needed to clip per-example"):
        dp.private_gradient({"w": np.zeros((2, 3))}, noise_multiplier=1.0, expected_batch_size=2.0)


NORMALISATIONS = [
    # (kwargs, mask?, expected divisor or an error pattern)
    ({}, False, "say what the noisy sum is divided by"),
    ({}, True, "say what the noisy sum is divided by"),
    ({"normalize_by": "batch_size"}, False, 6),
    ({"normalize_by": "batch_size"}, True, 4),
    ({"expected_batch_size": 5.0}, True, 5.0),
    ({"normalize_by": 5.0}, True, 5.0),
    ({"normalize_by": "expected"}, True, "normalize_by must be a positive number or 'batch_size'"),
    ({"normalize_by": 0.0}, False, "must be a positive number"),
    ({"normalize_by": 3.0, "expected_batch_size": 3.0}, False, "not both"),
]


@pytest.mark.parametrize("kwargs, masked, want", NORMALISATIONS)
def test_the_normalisation_is_said_by_name(kwargs, masked, want):
    g = _grads(np.random.default_rng(4), 6)
    mask = np.array([1, 1, 0, 1, 0, 1], bool) if masked else None
    if isinstance(want, str):
        with pytest.raises(ValueError, match=want):
            dp.private_gradient(g, 1.0, 0.0, mask=mask, noise=tree.map(lambda x: x[0] * 0, g), **kwargs)
        return
    out = dp.private_gradient(g, 1.0, 0.0, mask=mask, noise=tree.map(lambda x: x[0] * 0, g), **kwargs)
    kept = g if mask is None else tree.map(lambda x: x[mask], g)
    assert_tree_close(out, tree.map(lambda s: s / want, loop_clipped_sum(kept, 1.0)), rtol=1e-12, atol=1e-14)


def test_accumulated_clipped_sums():
    """Gradient accumulation: the clipped sums of disjoint microbatches add up to the clipped
    sum of the whole batch (sensitivity unchanged, norms concatenated); sums clipped
    differently are refused."""
    params, xs, ys = tanh_net_problem(n=9)
    clipped = dp.clipped_grad(tanh_net_loss, 0.4)
    whole = clipped(params, xs, ys)
    parts = [clipped(params, xs[i:i + 3], ys[i:i + 3]) for i in (0, 3, 6)]
    total = parts[0] + parts[1] + parts[2]
    assert total.sensitivity == 0.4
    assert_tree_close(total.summed, whole.summed, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(total.norms, whole.norms, rtol=1e-12)
    with pytest.raises(ValueError, match="different sensitivities"):
        parts[0] + dp.clipped_grad(tanh_net_loss, 0.5)(params, xs[:3], ys[:3])
    with pytest.raises(ValueError, match="different sensitivities"):
        parts[0] + dp.clipped_grad(tanh_net_loss, 0.4, relation="replace")(params, xs[:3], ys[:3])


# ---------------------------------------------------------------------------------------
# The critical pitfalls of jax_privacy's docs/sharp_edges_dp_training_pitfalls.md
# ---------------------------------------------------------------------------------------


def pitfall_division_by_batch_size():
    """Noise calibrated to a sum added to a mean (jax_privacy#383: B× too much or too
    little), and dividing by the data-derived batch size (opacus#571). cuvmap: the noise is
    added to the sum before the normalisation, so the gradient's noise std is σΔ/n; the
    batch size of a Poisson batch is never the silent divisor."""
    b, n, c, sigma = 5, 20.0, 1.0, 2.0
    g = {"w": np.zeros((b, 20000))}
    out = dp.private_gradient(g, c, sigma, np.random.default_rng(5), expected_batch_size=n)
    std, size = _std_of(out, {"w": np.zeros(20000)})
    assert abs(std / (sigma * c / n) - 1) < 4 / math.sqrt(2 * size)
    (padded,), mask = dp.pad_batch((g["w"],), 8)
    with pytest.raises(ValueError, match="opacus#571"):
        dp.private_gradient({"w": padded}, c, sigma, mask=mask, rng=np.random.default_rng(5))


def pitfall_sensitivity_alignment():
    """Noise calibrated to an assumed sensitivity that is not the clipping's: refused."""
    params, xs, ys = tanh_net_problem()
    clipped = dp.clipped_grad(tanh_net_loss, 1.0)(params, xs, ys)
    with pytest.raises(ValueError, match=r"max_norm=0\.1 differs from the clipped sum's sensitivity bound 1"):
        dp.private_gradient(clipped, 0.1, 1.0, rng=np.random.default_rng(0), expected_batch_size=8.0)


def pitfall_neighbouring_relation():
    """Clipping stated for replace-one (Δ = 2C) while the noise assumes add/remove-one (C):
    the replace-one clipped sum gets noise 2σC, and an explicit relation that disagrees
    with the sum's is refused."""
    g = {"w": np.zeros((2, 40000))}
    clipped = dp.clipped_sum(g, 1.0, relation="replace")
    assert clipped.sensitivity == 2.0
    std, size = _std_of(dp.add_noise(clipped, 1.0, rng=np.random.default_rng(6)), clipped.summed)
    assert abs(std / 2.0 - 1) < 4 / math.sqrt(2 * size)
    with pytest.raises(ValueError, match="stated for 'replace'"):
        dp.private_gradient(clipped, noise_multiplier=1.0, relation="add_remove", expected_batch_size=2.0,
                            rng=np.random.default_rng(6))


def pitfall_zero_sized_batches_and_non_finite_gradients():
    """A step that fails on an empty batch but not on a batch of one leaks; a NaN in one
    example's gradient must not corrupt the sum. cuvmap: an empty batch (eager, padded,
    under jit) is pure noise; nan_safe drops the example (its sensitivity is 0)."""
    params, xs, ys = tanh_net_problem()
    clipped = dp.clipped_grad(tanh_net_loss, 1.0, nan_safe=True)
    z = dp.standard_normal_like(params, np.random.default_rng(7))
    empty = dp.private_gradient(clipped(params, xs[:0], ys[:0]), noise_multiplier=1.0, noise=z,
                                expected_batch_size=4.0)
    assert_tree_close(empty, tree.map(lambda zl: zl / 4.0, z), rtol=1e-15, atol=0)
    (px, py), mask = dp.pad_batch((xs[:0], ys[:0]), 8)
    step = cv.jit(lambda p, x, y, m, z: dp.private_gradient(clipped(p, x, y, mask=m), noise_multiplier=1.0,
                                                             noise=z, expected_batch_size=4.0))
    assert_tree_close(step(params, px, py, mask, z), empty, rtol=1e-15, atol=0)
    bad = xs.copy()
    bad[2] = np.nan
    got = clipped(params, bad, ys)
    keep = np.arange(8) != 2
    assert_tree_close(got.summed, clipped(params, xs[keep], ys[keep]).summed, rtol=1e-12, atol=1e-14)
    assert int(got.num_dropped()) == 1


def pitfall_gradient_accumulation():
    """Noise added to every microbatch (too much), or accumulation that loses the sensitivity
    bound. cuvmap: the clipped sums of microbatches add (sensitivity unchanged) and the noise
    is added once to the total; user-level sums, where a user could straddle two
    microbatches, are refused."""
    params, xs, ys = tanh_net_problem(n=8)
    clipped = dp.clipped_grad(tanh_net_loss, 1.0)
    total = clipped(params, xs[:4], ys[:4]) + clipped(params, xs[4:], ys[4:])
    z = dp.standard_normal_like(params, np.random.default_rng(8))
    once = dp.private_gradient(total, noise_multiplier=1.5, noise=z, expected_batch_size=8.0)
    whole = dp.private_gradient(clipped(params, xs, ys), noise_multiplier=1.5, noise=z, expected_batch_size=8.0)
    assert_tree_close(once, whole, rtol=1e-12, atol=1e-14)
    users = dp.clipped_sum(_grads(np.random.default_rng(9), 4), 1.0, users=np.array([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="user-level clipped sums cannot be accumulated"):
        users + users


def pitfall_cross_example_operations():
    """A batch statistic (batch norm) couples the examples, so one example's gradient depends
    on the others. cuvmap: clipped_grad stages the loss on ONE example, so every example's
    gradient is its own whatever the others hold: changing example 5 changes no other norm."""
    params, xs, ys = tanh_net_problem()

    def normalised_loss(p, x, y):     # "batch norm" written per example: statistics of x alone
        x = (x - cnp.mean(x)) / cnp.sqrt(cnp.var(x) + 1e-5)
        return tanh_net_loss(p, x, y)

    clipped = dp.clipped_grad(normalised_loss, 1.0)
    before = clipped(params, xs, ys).norms
    changed = xs.copy()
    changed[5] = np.random.default_rng(10).standard_normal(5) * 3.0
    after = clipped(params, changed, ys).norms
    keep = np.arange(8) != 5
    np.testing.assert_array_equal(np.asarray(after)[keep], np.asarray(before)[keep])
    assert not np.allclose(after[5], before[5])


def pitfall_auxiliary_information():
    """Diagnostics aggregated without noise are not private. cuvmap: clipped_grad returns the
    aux values and norms per example (not aggregated), so an exact mean is a visible choice."""
    params, xs, ys = tanh_net_problem()

    def loss_with_aux(p, x, y):
        value = tanh_net_loss(p, x, y)
        return value, {"loss": value}

    clipped, aux = dp.clipped_grad(loss_with_aux, 1.0, has_aux=True)(params, xs, ys)
    assert aux["loss"].shape == (8,) and clipped.norms.shape == (8,)


# Two more critical pitfalls are the plan's to prevent, and tests/dp/test_plan.py checks them:
# accounting and batch selection (the accountant assumes a sampler it is not given) and public
# vs private metadata (a data-dependent batch size used as public): its
# test_the_plan_derives_every_piece_from_the_same_numbers and CONSTRUCTION_ERRORS.
PITFALLS = [
    pitfall_division_by_batch_size,
    pitfall_sensitivity_alignment,
    pitfall_neighbouring_relation,
    pitfall_zero_sized_batches_and_non_finite_gradients,
    pitfall_gradient_accumulation,
    pitfall_cross_example_operations,
    pitfall_auxiliary_information,
]


@pytest.mark.parametrize("pitfall", PITFALLS, ids=[f.__name__[len("pitfall_"):] for f in PITFALLS])
def test_critical_pitfall(pitfall):
    pitfall()
