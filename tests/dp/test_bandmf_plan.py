"""``dp.Plan(..., mechanism="bandmf")`` (NOTE [bandmf in a plan] in
cuvmap/dp/bandmf/mechanism.py): the refusals, ``bands=1`` equal to the DP-SGD plan bit for
bit, calibration, a jitted training step carrying the noise state, and a canary audit of
the mechanism whose ε lower bound stays below the accounted ε (and exceeds it for a
mechanism that releases half the noise).

Independent references: the DP-SGD plan's own sampler, noise and accountant (for
``bands=1``); NumPy clipping loops and ``C'⁻¹ Z`` from the dense strategy; the audit's
likelihood-ratio test (examples/dp_logistic_regression_bandmf.py, NOTE [auditing BandMF
with a canary]) against both accountants."""
import importlib.util
import math
import pathlib

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import dp, random
from cuvmap.dp import bandmf

ROOT = pathlib.Path(__file__).resolve().parents[2]
N, T = 600, 40


def plan_of(bands=4, **kwargs):
    args = dict(dataset_size=N, sample_rate=0.2, noise_multiplier=1.3, max_norm=0.5, steps=T, expected_batch_size=30,
                mechanism="bandmf", bands=bands)
    args.update(kwargs)
    return dp.Plan(**args)


# ---------------------------------------------------------------------------------------
# What a plan refuses
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(sampler="poisson"), "with a banded strategy"),
    (dict(sampler="shuffle"), "shuffled or fixed-size batches"),
    (dict(sampler="fixed_size"), "shuffled or fixed-size batches"),
    (dict(sampler="balls_in_bins"), "sampler must be one of"),
    (dict(bands=T + 1), f"bands={T + 1} > steps={T}"),
    (dict(bands=0), "bands, a positive int"),
    (dict(bands=None), "bands, a positive int"),
    (dict(bands=2.0), "bands, a positive int"),
    (dict(coefficients=[1.0, 0.5, 0.2]), "3 coefficients for bands=4"),
    (dict(coefficients="cosine"), "coefficients must be 'optimal', 'sqrt'"),
    (dict(coefficients=[0.0, 1.0, 0.5, 0.2]), "c_0 != 0"),
    (dict(max_batch_size=0), "max_batch_size must be a positive int"),
    (dict(mechanism="dpftrl"), "mechanism must be 'dpsgd' or 'bandmf'"),
    (dict(mechanism="dpsgd", bands=4), "bands is for mechanism='bandmf'"),
    (dict(mechanism="dpsgd", bands=None, coefficients="sqrt"), "coefficients is for mechanism='bandmf'"),
    (dict(mechanism="dpsgd", bands=None, max_batch_size=10), "max_batch_size is for mechanism='bandmf'"),
    (dict(mechanism="dpsgd", bands=None, sampler="cyclic_poisson"), "mechanism='dpsgd' samples by plain Poisson"),
    (dict(mechanism="dpsgd", bands=None, sampler="shuffle"), "shuffled or fixed-size batches"),
])
def test_plan_refuses_combinations_whose_accounting_would_be_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_of(**kwargs)


def test_a_bandmf_plan_samples_cyclically_only():
    plan = plan_of()
    with pytest.raises(ValueError, match="samples cyclically"):
        plan.sample(np.random.default_rng(0))
    with pytest.raises(ValueError, match="pass either noise"):
        plan.correlated_noise(plan.noise_state(np.zeros(3)), 0)
    with pytest.raises(ValueError, match="'pld' or 'rdp'"):
        plan.calibrated(1.0, 1e-5, accountant="gdp")


def test_the_plans_pieces_fit_together():
    plan = plan_of(sampler="cyclic_poisson", accountant="pld")
    assert plan.bands == 4 and plan.mechanism == "bandmf" and "bandmf with 4 bands" in repr(plan)
    assert isinstance(plan.bandmf.strategy, bandmf.BandedStrategy) and plan.bandmf.strategy.steps == T
    np.testing.assert_allclose(plan.bandmf.strategy.coefficients, bandmf.optimal_coefficients(4, T))
    assert plan.buckets[0] == 32 and plan.buckets[-1] == N    # from q·N/b = 30
    sampler = plan.sampler(np.random.default_rng(0))
    assert sampler.bands == 4 and all(np.all(sampler.groups[sampler.sample(t)] == t % 4) for t in range(8))
    # the accountant: ⌈T/b⌉ steps of (σ, q) by the plan's accountant
    plain = dp.PLDAccountant()
    plain.step(1.3, 0.2, math.ceil(T / 4))
    assert plan.epsilon(1e-5) == plain.get_epsilon(1e-5)
    assert isinstance(plan.accountant(), bandmf.BandMFAccountant)
    assert plan_of(expected_batch_size="from_dataset_size").expected_batch_size == pytest.approx(0.2 * N / 4)
    assert plan_of(coefficients="sqrt").bandmf.strategy.coefficients[1] == pytest.approx(0.5 * plan_of(
        coefficients="sqrt").bandmf.strategy.coefficients[0])


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("max_batch_size", [None, 110])
def test_calibrated_meets_the_target(accountant, max_batch_size):
    plan = plan_of(noise_multiplier=0.0, max_batch_size=max_batch_size).calibrated(2.0, 1e-5, accountant)
    sigma = plan.noise_multiplier
    assert plan.epsilon(1e-5, accountant=accountant) <= 2.0
    assert plan_of(noise_multiplier=sigma / 1.001, max_batch_size=max_batch_size).epsilon(
        1e-5, accountant=accountant) > 2.0
    dpsgd = dp.Plan(N, 0.05, 0.0, 0.5, T, expected_batch_size=30).calibrated(2.0, 1e-5, accountant)
    assert dpsgd.noise_multiplier == dp.calibrate_noise(2.0, 1e-5, 0.05, T, accountant)


# ---------------------------------------------------------------------------------------
# bands=1 is DP-SGD, bit for bit
# ---------------------------------------------------------------------------------------

def _loss(params, x, y):
    return (x @ params["w"] + params["b"] - y) ** 2


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_band_equals_the_dpsgd_plan_bit_for_bit(dtype):
    dpsgd = plan_of(mechanism="dpsgd", bands=None)
    one = plan_of(bands=1)
    assert one.bandmf.strategy.coefficients.tolist() == [1.0]
    rng_data = np.random.default_rng(0)
    xs, ys = rng_data.standard_normal((N, 3)).astype(dtype), rng_data.standard_normal(N).astype(dtype)
    params = {"w": np.full(3, 0.1, dtype), "b": np.zeros((), dtype)}
    state_dpsgd, state_one = dpsgd.noise_state(params), one.noise_state(params)
    sampler_dpsgd, sampler_one = dpsgd.sampler(np.random.default_rng(1)), one.sampler(np.random.default_rng(1))
    rng_sample = np.random.default_rng(1)
    noise_a, noise_b = np.random.default_rng(2), np.random.default_rng(2)
    key = random.key(3)
    for t in range(6):
        idx = sampler_one.sample(t)
        np.testing.assert_array_equal(idx, sampler_dpsgd.sample(t))
        np.testing.assert_array_equal(idx, dpsgd.sample(rng_sample))        # the plain plan's own sampler
        (x, y), mask = one.pad((xs[idx], ys[idx]))
        clipped = one.clipped_grad(_loss)(params, x, y, mask=mask)
        # the plain plan's noise z, and the one-band plan's w from the same generator state
        g_plain = dpsgd.private_gradient(clipped, noise=dpsgd.noise(params, noise_a))
        w, state_one = one.correlated_noise(state_one, t, noise=one.noise(params, noise_b))
        g_one = one.private_gradient(clipped, noise=w)
        for a, b in zip(cv.tree.leaves(g_plain), cv.tree.leaves(g_one)):
            assert a.dtype == b.dtype == dtype
            np.testing.assert_array_equal(a, b)
        # and from a key: both plans' correlated_noise give the same w
        w_plain, state_dpsgd = dpsgd.correlated_noise(state_dpsgd, t, key=key)
        w_one, _ = one.correlated_noise(one.noise_state(params), t, key=key)
        for a, b, z in zip(cv.tree.leaves(w_plain), cv.tree.leaves(w_one),
                           cv.tree.leaves(bandmf.standard_normal_from_key(params, key, t))):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, z)
    for name in ("rdp", "pld"):
        assert one.epsilon(1e-5, accountant=name) == dpsgd.epsilon(1e-5, accountant=name)
    assert one.calibrated(1.5, 1e-5).noise_multiplier == dpsgd.calibrated(1.5, 1e-5).noise_multiplier


def test_one_band_user_level_sampler_equals_sample_users():
    users = np.random.default_rng(0).integers(0, 50, size=400)
    u = len(np.unique(users))
    args = dict(dataset_size=u, sample_rate=0.3, noise_multiplier=1.0, max_norm=1.0, steps=5, expected_batch_size=15,
                unit="user", num_examples=400)
    one = dp.Plan(**args, mechanism="bandmf", bands=1).sampler(np.random.default_rng(4), users)
    plain = dp.Plan(**args)
    rng = np.random.default_rng(4)
    for t in range(5):
        for a, b in zip(one.sample(t), plain.sample(rng, users)):
            np.testing.assert_array_equal(a, b)
    four = dp.Plan(**args, mechanism="bandmf", bands=4).sampler(np.random.default_rng(4), users)
    _, inverse = np.unique(users, return_inverse=True)
    for t in range(8):
        idx, slots = four.sample(t)
        assert np.all(four.groups[inverse[idx]] == t % 4)            # each user's examples come with it
        assert slots.max(initial=-1) + 1 == len(np.unique(inverse[idx]))


# ---------------------------------------------------------------------------------------
# A jitted step carries the state
# ---------------------------------------------------------------------------------------

def test_a_jitted_training_step_carries_the_noise_state():
    plan = plan_of(bands=3, coefficients="sqrt")
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((N, 3)), rng.standard_normal(N)
    params0 = {"w": np.zeros(3), "b": np.zeros(())}
    clipped_grad = plan.clipped_grad(_loss)

    def step(params, state, key, t, x, y, mask):
        w, state = plan.correlated_noise(state, t, key=key)
        g = plan.private_gradient(clipped_grad(params, x, y, mask=mask), noise=w)
        return cv.tree.map(lambda p, gi: p - 0.1 * gi, params, g), state, w

    jitted = cv.jit(step)
    key = random.key(7)
    runs = {}
    for name, fn in (("eager", step), ("jit", jitted)):
        params, state = params0, plan.noise_state(params0)
        sampler = plan.sampler(np.random.default_rng(5))
        ws, history = [], []
        for t in range(12):
            idx = sampler.sample(t)
            (x, y), mask = dp.pad_batch((xs[idx], ys[idx]), 48)     # one padded size: one trace
            params, state, w = fn(params, state, key, np.int64(t), x, y, mask)
            ws.append(np.concatenate([np.ravel(v) for v in cv.tree.leaves(w)]))
            history.append(params)
        runs[name] = (np.stack(ws), history)
    assert jitted.trace_count == 1
    np.testing.assert_allclose(runs["jit"][0], runs["eager"][0], rtol=1e-12, atol=1e-13)
    for a, b in zip(runs["jit"][1], runs["eager"][1]):
        for u, v in zip(cv.tree.leaves(a), cv.tree.leaves(b)):
            np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-13)
    # the noise the steps added is C'⁻¹ Z of the keys' draws (the first 12 rows: causal)
    zs = np.stack([np.concatenate([np.ravel(v) for v in cv.tree.leaves(bandmf.standard_normal_from_key(params0, key, t))])
                   for t in range(T)])
    np.testing.assert_allclose(runs["jit"][0], (plan.bandmf.strategy.noise_matrix() @ zs)[:12], rtol=1e-10,
                               atol=1e-12)


# ---------------------------------------------------------------------------------------
# The canary audit
# ---------------------------------------------------------------------------------------

def _example():
    spec = importlib.util.spec_from_file_location("example_dp_logistic_regression_bandmf",
                                                  ROOT / "examples" / "dp_logistic_regression_bandmf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_clopper_pearson_against_the_binomial_tail():
    cp = _example().clopper_pearson_upper
    for k, n, alpha in [(0, 100, 0.05), (3, 50, 0.025), (40, 60, 0.05)]:
        p = cp(k, n, alpha)
        cdf = sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k + 1))
        assert cdf == pytest.approx(alpha, rel=1e-6)
    assert cp(0, 100, 0.05) == pytest.approx(1 - 0.05 ** (1 / 100), rel=1e-9)


@pytest.mark.slow
def test_a_canary_audit_stays_below_the_accounted_epsilon():
    """The plan's mechanism, 20000 runs with the canary and 20000 without: the ε lower bound
    is below the accounted ε (both accountants); the same attack on a mechanism that releases
    half the noise it accounts for finds an ε above it (the audit has the power to fail)."""
    example = _example()
    plan = dp.Plan(dataset_size=1000, sample_rate=0.5, noise_multiplier=0.0, max_norm=1.0, steps=T,
                   expected_batch_size=125, mechanism="bandmf", bands=4, accountant="pld").calibrated(4.0, 1e-5)
    lower, eps_pld, eps_rdp = example.audit(plan, 20000, 1e-5, seed=0)
    assert eps_pld <= 4.0 <= eps_rdp
    assert 0.3 * eps_pld < lower < eps_pld
    broken, _, _ = example.audit(plan, 20000, 1e-5, seed=1, noise_scale=0.5)
    assert broken > eps_rdp
