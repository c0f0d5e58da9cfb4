"""BandMF's pieces (cuvmap/dp/bandmf/): the strategy, its sensitivity and error, the
optimised coefficients, the streamed noise, the cyclic sampler and the accountant.

Independent references: dense matrices built entry by entry (the strategy, its inverse,
the workload) and NumPy's ``inv``; the sensitivity by brute force over every
min-separated participation pattern; finite differences for the gradient of the
coefficients' objective (and SciPy's L-BFGS-B where SciPy is installed: not a
dependency); ``math.comb`` sums for the truncation's binomial tail; for the accountant,
``dp_accounting``'s ε of jax_privacy's ``amplified_bandmf_event``, stored as data."""
import functools
import itertools
import math

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import dp, lax, random
from cuvmap.dp import bandmf
from cuvmap.dp.bandmf import lbfgs


def toeplitz(coefficients, n):
    """The lower-triangular Toeplitz matrix of ``coefficients`` (entry by entry)."""
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            if i - j < len(coefficients):
                out[i, j] = coefficients[i - j]
    return out


def coefficients_for_test(b):
    return np.array([1.0, -0.4, 0.3, 0.2, 0.5, 0.1, 0.25, 0.15][:b]) if b > 1 else np.array([2.0])


# ---------------------------------------------------------------------------------------
# The strategy
# ---------------------------------------------------------------------------------------

def test_sqrt_coefficients_square_to_the_prefix_sums():
    r = bandmf.sqrt_coefficients(6) * np.sqrt(sum((math.comb(2 * k, k) / 4 ** k) ** 2 for k in range(6)))
    np.testing.assert_allclose(r, [math.comb(2 * k, k) / 4 ** k for k in range(6)], rtol=1e-14)
    np.testing.assert_allclose(np.convolve(r, r)[:6], np.ones(6), rtol=1e-14)   # C·C = A (prefix sums)
    assert np.linalg.norm(bandmf.sqrt_coefficients(6)) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("b", [1, 2, 4, 8])
@pytest.mark.parametrize("normalize", [True, False])
def test_strategy_matrix_and_its_inverse(b, normalize):
    n = 11
    s = bandmf.BandedStrategy(coefficients_for_test(b), n, column_normalize=normalize)
    c = coefficients_for_test(b) / np.linalg.norm(coefficients_for_test(b))
    dense = toeplitz(c, n)
    norms = np.linalg.norm(dense, axis=0)
    expect = dense / norms if normalize else dense
    np.testing.assert_allclose(s.matrix(), expect, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(s.noise_matrix(), np.linalg.inv(expect), rtol=1e-10, atol=1e-12)
    col = np.linalg.norm(s.matrix(), axis=0)
    np.testing.assert_allclose(col, 1.0 if normalize else norms, rtol=1e-14)
    assert np.max(col) == pytest.approx(1.0, abs=1e-14)            # one participation: sensitivity 1
    np.testing.assert_allclose(s.column_norms, norms if normalize else 1.0, rtol=1e-14)


def _patterns(n, min_sep, most):
    """Every set of steps in range(n), two at least min_sep apart, of 1 to ``most`` steps."""
    def extend(start, left):
        for j in range(start, n):
            yield (j,)
            if left > 1:
                for rest in extend(j + min_sep, left - 1):
                    yield (j,) + rest
    return list(extend(0, most))


def _brute_sensitivity(matrix, min_sep, most):
    """max over patterns π and signs of ‖Σ_{j∈π} ±C e_j‖ (unit scalar gradients)."""
    best = 0.0
    for pattern in _patterns(matrix.shape[1], min_sep, most):
        cols = matrix[:, list(pattern)]
        for signs in itertools.product((1.0, -1.0), repeat=min(len(pattern), 3)):
            s = np.ones(len(pattern))
            s[:len(signs)] = signs
            best = max(best, float(np.linalg.norm(cols @ s)))
    return best


@pytest.mark.slow
@pytest.mark.parametrize("b", [1, 2, 4, 8])
@pytest.mark.parametrize("normalize", [True, False])
def test_sensitivity_equals_brute_force_over_separated_patterns(b, normalize):
    n = 12 if b < 8 else 19
    s = bandmf.BandedStrategy(coefficients_for_test(b), n, column_normalize=normalize)
    dense = s.matrix()
    for min_sep in (b, b + 1):
        for most in (1, 2, 3, None):
            k = math.ceil(n / min_sep) if most is None else most
            want = _brute_sensitivity(dense, min_sep, k)
            assert s.sensitivity(min_sep, most) == pytest.approx(want, rel=1e-12), (min_sep, most)
    # normalised: √k exactly (every column has norm 1), and 1 per participation
    if normalize:
        assert s.sensitivity(b, None) == pytest.approx(math.sqrt(math.ceil(n / b)), rel=1e-14)
    assert s.sensitivity() == pytest.approx(1.0, rel=1e-14)


def test_sensitivity_refuses_overlapping_participations():
    s = bandmf.BandedStrategy(bandmf.sqrt_coefficients(4), 10)
    with pytest.raises(ValueError, match="min_sep=2 < bands=4"):
        s.sensitivity(2)


@pytest.mark.parametrize("bad, match", [
    ([0.0, 1.0], "c_0 != 0"), ([1.0, np.nan], "finite"), ([], "non-empty"), ("sqrt", "vector"),
])
def test_strategy_refuses_bad_coefficients(bad, match):
    with pytest.raises(ValueError, match=match):
        bandmf.BandedStrategy(bad, 5)


def test_strategy_refuses_more_bands_than_steps():
    with pytest.raises(ValueError, match="at most as many bands as steps"):
        bandmf.BandedStrategy(bandmf.sqrt_coefficients(4), 3)


def test_a_negative_leading_coefficient_is_the_same_mechanism():
    a = bandmf.BandedStrategy([-1.0, -0.5], 6)
    b = bandmf.BandedStrategy([2.0, 1.0], 6)
    np.testing.assert_array_equal(a.coefficients, b.coefficients)


@pytest.mark.parametrize("b", [1, 3, 4])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_per_step_error_against_dense_matrices(b, momentum):
    n = 13
    s = bandmf.BandedStrategy(bandmf.sqrt_coefficients(b), n)
    work = toeplitz([(1 - momentum ** (k + 1)) / (1 - momentum) if momentum else 1.0 for k in range(n)], n)
    dense = np.sum((work @ np.linalg.inv(s.matrix())) ** 2, axis=1)
    np.testing.assert_allclose(s.per_step_error(momentum), dense, rtol=1e-12)
    assert s.expected_error(momentum) == pytest.approx(dense.mean(), rel=1e-12)


def test_dpsgd_error_is_the_number_of_summed_steps():
    np.testing.assert_allclose(bandmf.BandedStrategy.dpsgd(7).per_step_error(), np.arange(1, 8))


def test_the_objective_gradient_by_cuvmap_grad_equals_finite_differences():
    a = bandmf.momentum_workload(40, 0.5)
    c = np.array([0.8, 0.4, 0.3, 0.2])
    value, grad = bandmf.strategy._toeplitz_loss_and_grad(c, a)
    # the objective by dense matrices: ‖c‖² · mean_t ‖row_t(A C⁻¹)‖²
    def dense(x):
        return np.sum(x ** 2) * np.mean(np.sum((toeplitz(a, 40) @ np.linalg.inv(toeplitz(x, 40))) ** 2, axis=1))
    assert float(value) == pytest.approx(dense(c), rel=1e-12)
    h = 1e-6
    fd = [(dense(c + h * e) - dense(c - h * e)) / (2 * h) for e in np.eye(4)]
    np.testing.assert_allclose(np.asarray(grad), fd, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("b, n, momentum", [(2, 64, 0.0), (4, 200, 0.0), (4, 200, 0.9), (8, 300, 0.0)])
def test_optimal_coefficients_are_a_minimum(b, n, momentum):
    c = bandmf.optimal_coefficients(b, n, momentum)
    assert np.linalg.norm(c) == pytest.approx(1.0, abs=1e-12) and c[0] > 0
    a = bandmf.momentum_workload(n, momentum)
    value, grad = bandmf.strategy._toeplitz_loss_and_grad(c, a)
    assert np.max(np.abs(np.asarray(grad))) < 1e-5 * float(value)   # stationary (scale-free: ∇f ⊥ c)
    value_sqrt, _ = bandmf.strategy._toeplitz_loss_and_grad(bandmf.sqrt_coefficients(b), a)
    assert float(value) <= float(value_sqrt) + 1e-12
    rng = np.random.default_rng(0)
    for _ in range(5):   # no nearby point is better
        other = c + 1e-3 * rng.standard_normal(b)
        assert float(bandmf.strategy._toeplitz_loss_and_grad(other, a)[0]) >= float(value) - 1e-9
    # the expected error of the column-normalised strategy is no larger than the square root's
    assert bandmf.BandedStrategy(c, n).expected_error(momentum) <= \
        bandmf.BandedStrategy(bandmf.sqrt_coefficients(b), n).expected_error(momentum) + 1e-9


@pytest.mark.slow
def test_optimal_coefficients_agree_with_scipy_when_installed():
    optimize = pytest.importorskip("scipy.optimize")   # a cross-check only: SciPy is not a dependency
    a = bandmf.momentum_workload(300, 0.0)

    def f(x):
        v, g = bandmf.strategy._toeplitz_loss_and_grad(x, a)
        return float(v), np.asarray(g)

    ref = optimize.minimize(f, bandmf.sqrt_coefficients(6), jac=True, method="L-BFGS-B",
                            options=dict(gtol=1e-12, ftol=1e-15, maxiter=2000)).x
    np.testing.assert_allclose(bandmf.optimal_coefficients(6, 300), ref / np.linalg.norm(ref), atol=1e-6)


def test_lbfgs_on_rosenbrock():
    def rosen(x):
        value = float(np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))
        g = np.zeros_like(x)
        g[:-1] = -400 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
        g[1:] += 200 * (x[1:] - x[:-1] ** 2)
        return value, g

    result = lbfgs.minimize(rosen, np.array([-1.2, 1.0, -0.5, 0.8]), max_iterations=2000)
    assert result.converged
    np.testing.assert_allclose(result.x, np.ones(4), atol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: bandmf.optimal_coefficients(0, 10), "bands must be a positive int"),
    (lambda: bandmf.optimal_coefficients(11, 10), "at most as many bands as steps"),
    (lambda: bandmf.optimal_coefficients(2, 10, momentum=1.0), "momentum"),
    (lambda: bandmf.momentum_workload(0), "steps must be a positive int"),
])
def test_coefficient_functions_refuse_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------------------
# The streamed noise
# ---------------------------------------------------------------------------------------

def _params(dtype=np.float64):
    return {"w": np.zeros((3, 2), dtype), "b": np.zeros(4, dtype)}


def _flat(tree_):
    return np.concatenate([np.ravel(x) for x in cv.tree.leaves(tree_)])


@pytest.mark.parametrize("b", [1, 2, 4, 8])
def test_streamed_noise_equals_the_materialised_inverse(b):
    n = 17
    s = bandmf.BandedStrategy(bandmf.optimal_coefficients(b, n), n)
    noise = bandmf.BandedNoise(s)
    rng = np.random.default_rng(b)
    zs = [dp.standard_normal_like(_params(), rng) for _ in range(n)]
    state = noise.init(_params())
    assert all(np.shape(x) == (b - 1,) + np.shape(p) for x, p in zip(cv.tree.leaves(state), cv.tree.leaves(_params())))
    ws = []
    for t in range(n):
        w, state = noise.update(state, zs[t], t)
        ws.append(_flat(w))
    want = s.noise_matrix() @ np.stack([_flat(z) for z in zs])     # C'⁻¹ Z, column by column
    np.testing.assert_allclose(np.stack(ws), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.stack(ws), want, rtol=1e-11, atol=1e-12)


def test_streamed_noise_in_float32():
    n, b = 30, 4
    s = bandmf.BandedStrategy(bandmf.optimal_coefficients(b, n), n)
    noise = bandmf.BandedNoise(s)
    rng = np.random.default_rng(0)
    zs = [dp.standard_normal_like(_params(np.float32), rng) for _ in range(n)]
    state = noise.init(_params(np.float32))
    ws = []
    for t in range(n):
        w, state = noise.update(state, zs[t], t)
        assert all(x.dtype == np.float32 for x in cv.tree.leaves(w) + cv.tree.leaves(state))
        ws.append(_flat(w))
    want = s.noise_matrix() @ np.stack([_flat(z).astype(np.float64) for z in zs])
    np.testing.assert_allclose(np.stack(ws), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("b", [1, 3])
def test_keyed_noise_under_jit_equals_eager_and_the_regenerated_noise(b):
    n = 9
    s = bandmf.BandedStrategy(bandmf.sqrt_coefficients(b), n)
    noise, again = bandmf.BandedNoise(s), bandmf.BandedNoise(s, regenerate=True)
    key = random.key(5)
    step = cv.jit(noise.draw)
    regen = cv.jit(again.draw_like)
    eager_state, jit_state = noise.init(_params()), noise.init(_params())
    zs = []
    for t in range(n):
        w_eager, eager_state = noise.draw(eager_state, key, t)
        w_jit, jit_state = step(jit_state, key, np.int64(t))
        np.testing.assert_allclose(_flat(w_jit), _flat(w_eager), rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(_flat(regen(_params(), key, np.int64(t))), _flat(w_eager), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(_flat(again.draw_like(_params(), key, t)), _flat(w_eager), rtol=1e-12, atol=1e-13)
        zs.append(_flat(bandmf.standard_normal_from_key(_params(), key, t)))
    assert step.trace_count == 1 and regen.trace_count == 1
    np.testing.assert_allclose(_flat(w_eager), (s.noise_matrix() @ np.stack(zs))[-1], rtol=1e-12)
    assert again.init(_params()) == ()


def test_the_stream_generator_equals_the_pure_functions():
    n = 6
    noise = bandmf.BandedNoise(bandmf.BandedStrategy(bandmf.sqrt_coefficients(3), n))
    got = [_flat(w) for w in noise.stream(_params(), rng=np.random.default_rng(2))]
    rng, state = np.random.default_rng(2), noise.init(_params())
    for t in range(n):
        w, state = noise.update(state, dp.standard_normal_like(_params(), rng), t)
        np.testing.assert_array_equal(got[t], _flat(w))
    assert len(got) == n


def test_one_band_noise_is_the_draw_itself():
    noise = bandmf.BandedNoise(bandmf.BandedStrategy([1.0], 4))
    z = dp.standard_normal_like(_params(np.float32), np.random.default_rng(0))
    w, _ = noise.update(noise.init(_params(np.float32)), z, 2)
    for a, b in zip(cv.tree.leaves(w), cv.tree.leaves(z)):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("call, match", [
    (lambda n, st: n.update(st, _params(), 9), "outside the strategy's 9 steps"),
    (lambda n, st: n.update(st, {"w": np.zeros((3, 2))}, 0), "pytree structure"),
    (lambda n, st: n.update(st, {"w": np.zeros((3, 3)), "b": np.zeros(4)}, 0), "float64\\[3, 3\\], but its buffers"),
    (lambda n, st: n.update(st, _params(np.float32), 0), "float32\\[4\\], but its buffers are float64"),
    (lambda n, st: n.draw_like(_params(), random.key(0), np.array(2)), "step must be an int"),
    (lambda n, st: n.update(st, _params(), 1.5), "0-d integer"),
    (lambda n, st: bandmf.BandedNoise(n.strategy, regenerate=True).update((), _params(), 0), "use draw"),
    (lambda n, st: n.init({"w": np.zeros(3, np.int32)}), "floating-point"),
])
def test_noise_refuses_misuse(call, match):
    noise = bandmf.BandedNoise(bandmf.BandedStrategy(bandmf.sqrt_coefficients(3), 9))
    with pytest.raises(ValueError, match=match):
        call(noise, noise.init(_params()))


def test_noise_once_over_a_data_parallel_axis():
    """Two members, each with its own state and draws, under vmap(axis_name=): the psum of
    their private gradients carries member 0's correlated noise once (NOTE [noise once over
    a data-parallel axis]), step after step."""
    n_steps, members, sigma, n = 5, 2, 1.3, 8.0
    plan = dp.Plan(100, 0.5, sigma, 1.0, n_steps, expected_batch_size=n, mechanism="bandmf", bands=3,
                   coefficients="sqrt")
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((n_steps, members, 2, 4)) * 0.1   # per-example gradients of each member
    zs = rng.standard_normal((n_steps, members, 4))

    def member(g, z, state, t):
        w, state = plan.correlated_noise(state, t, noise=z)
        return lax.psum(plan.private_gradient(plan.clipped_sum(g), noise=w), "batch"), state

    step = cv.vmap(member, in_axes=(0, 0, 0, None), axis_name="batch")
    state = np.zeros((members, 2, 4))
    ref_state = plan.noise_state(np.zeros(4))
    for t in range(n_steps):
        out, state = step(grads[t], zs[t], state, t)
        w0, ref_state = plan.correlated_noise(ref_state, t, noise=zs[t, 0])
        clipped = sum(np.sum([g * min(1.0, 1.0 / np.linalg.norm(g)) for g in grads[t, m]], axis=0)
                      for m in range(members))
        np.testing.assert_allclose(out[0], (clipped + sigma * w0) / n, rtol=1e-12)
        np.testing.assert_allclose(out[1], out[0], rtol=0)


def test_noise_on_the_gpu_equals_the_cpu(backend):
    n = 8
    noise = bandmf.BandedNoise(bandmf.BandedStrategy(bandmf.sqrt_coefficients(3), n))
    like = cv.device_put(_params(np.float32), backend)
    key = random.key(1)
    state, ref = noise.init(like), noise.init(_params(np.float32))
    step = cv.jit(noise.draw)
    for t in range(n):
        w, state = step(state, key, np.int64(t))
        w_ref, ref = noise.draw(ref, key, t)
        assert all(cv.backend.backend_name(x) == backend for x in cv.tree.leaves(w) + cv.tree.leaves(state))
        np.testing.assert_allclose(_flat(cv.device_put(w, "cpu")), _flat(w_ref), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------
# The cyclic sampler
# ---------------------------------------------------------------------------------------

def test_one_group_samples_as_poisson_sampling():
    a = bandmf.CyclicPoissonSampler(500, 0.1, 1, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    for t in range(5):
        np.testing.assert_array_equal(a.sample(t), dp.poisson_sample(500, 0.1, rng))
    users = np.random.default_rng(0).integers(0, 40, size=300)
    a = bandmf.CyclicPoissonSampler(len(np.unique(users)), 0.3, 1, np.random.default_rng(4), user_of_example=users)
    rng = np.random.default_rng(4)
    for t in range(5):
        for x, y in zip(a.sample(t), dp.sample_users(users, 0.3, rng)):
            np.testing.assert_array_equal(x, y)


def test_cyclic_sampling_keeps_each_unit_to_its_group():
    n, b, q, steps = 2000, 4, 0.3, 400
    s = bandmf.CyclicPoissonSampler(n, q, b, np.random.default_rng(0))
    assert sorted(np.concatenate([s.members(g) for g in range(b)]).tolist()) == list(range(n))
    counts = np.zeros(n)
    for t in range(steps):
        idx = s.sample(t)
        assert np.all(s.groups[idx] == t % b) and np.all(np.diff(idx) > 0)
        counts[idx] += 1
    # each unit: Binomial(steps / b, q) participations; the mean over units near q·steps/b
    assert counts.mean() == pytest.approx(q * steps / b, rel=0.02)
    # the groups: each unit's group uniform over b (a χ² test at a generous level)
    sizes = np.bincount(s.groups, minlength=b)
    assert np.sum((sizes - n / b) ** 2 / (n / b)) < 20


def test_truncation_caps_the_batches():
    s = bandmf.CyclicPoissonSampler(1000, 0.5, 2, np.random.default_rng(0), max_batch_size=200)
    sizes = [len(s.sample(t)) for t in range(20)]
    assert max(sizes) == 200 and all(np.all(s.groups[s.sample(t)] == t % 2) for t in range(4))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_units=10, sample_rate=0.0, bands=2), "sample_rate"),
    (dict(num_units=10, sample_rate=0.5, bands=0), "bands"),
    (dict(num_units=-1, sample_rate=0.5, bands=2), "num_units"),
    (dict(num_units=10, sample_rate=0.5, bands=2, max_batch_size=0), "max_batch_size"),
    (dict(num_units=3, sample_rate=0.5, bands=2, user_of_example=np.array([0, 1, 1, 5, 7])), "4 distinct users"),
])
def test_sampler_refuses_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bandmf.CyclicPoissonSampler(rng=np.random.default_rng(0), **kwargs)


# ---------------------------------------------------------------------------------------
# The accountant
# ---------------------------------------------------------------------------------------

# ε of jax_privacy's amplified_bandmf_event(σ, T, num_bands=b, sampling_prob=q), i.e. the
# Poisson-subsampled Gaussian self-composed ⌈T/b⌉ times, computed once with dp_accounting
# 0.6.0 in a throwaway venv (pip install dp-accounting; not a dependency):
#   event = SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(σ)), math.ceil(T / b))
#   pld.PLDAccountant().compose(event).get_epsilon(δ)    (value_discretization_interval 1e-4)
#   rdp.RdpAccountant().compose(event).get_epsilon(δ)    (its default orders, magnitude-sum series)
# as (σ, q, T, b, δ, ⌈T/b⌉, ε PLD, ε RDP):
AMPLIFIED_BANDMF_REFERENCE = [
    (10.0, 1000 / 2250, 500, 4, 1e-5, 125, 2.001557660437691, 2.1783610435468934),
    (1.1, 0.02, 2000, 8, 1e-5, 250, 1.6572246943774165, 1.9333685552113349),
    (2.0, 0.1, 1001, 2, 1e-6, 501, 6.223544152672372, 6.686498486067549),
]
# dp_accounting's default RDP orders (dp_accounting/rdp/rdp_privacy_accountant.py).
DP_ACCOUNTING_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]


@pytest.mark.slow
@pytest.mark.parametrize("sigma, q, steps, b, delta, rounds, eps_pld, eps_rdp", AMPLIFIED_BANDMF_REFERENCE)
def test_accountant_against_dp_accountings_amplified_bandmf_event(sigma, q, steps, b, delta, rounds, eps_pld,
                                                                    eps_rdp):
    assert bandmf.participations(steps, b) == rounds
    acct = bandmf.BandMFAccountant(b, "pld")
    acct.step(noise_multiplier=sigma, sample_rate=q, num_steps=steps // 2)
    acct.step(noise_multiplier=sigma, sample_rate=q, num_steps=steps - steps // 2)   # ⌈T/b⌉ of the whole run
    assert len(acct) == steps and acct.participations == rounds
    assert acct.get_epsilon(delta) == pytest.approx(eps_pld, rel=1e-8)
    # the RDP accountant with dp_accounting's orders: its fractional orders sum the exact
    # series, dp_accounting's the terms' magnitudes (an upper bound): below, and close
    rdp = bandmf.BandMFAccountant(b, functools.partial(dp.RDPAccountant, orders=DP_ACCOUNTING_ORDERS))
    rdp.step(sigma, q, steps)
    assert eps_rdp * (1 - 1e-3) < rdp.get_epsilon(delta) <= eps_rdp * (1 + 1e-12)
    # with dp_accounting's series the composed RDP is the same number
    rdp_upper = dp.rdp_sampled_gaussian(q, sigma, DP_ACCOUNTING_ORDERS, steps=rounds, fractional="upper_bound")
    assert dp.rdp_to_epsilon(DP_ACCOUNTING_ORDERS, rdp_upper, delta)[0] == pytest.approx(eps_rdp, rel=1e-9)
    assert bandmf.epsilon(sigma, q, steps, b, delta) == acct.get_epsilon(delta)


@pytest.mark.parametrize("name", ["rdp", "pld"])
def test_one_band_accounts_as_dpsgd(name):
    acct = bandmf.BandMFAccountant(1, name)
    acct.step(1.1, 0.01, 1000)
    plain = dp.ACCOUNTANTS[name]()
    plain.step(1.1, 0.01, 1000)
    assert acct.get_epsilon(1e-5) == plain.get_epsilon(1e-5)


def test_accountant_refuses_a_change_of_sigma_or_q():
    acct = bandmf.BandMFAccountant(4)
    acct.step(1.0, 0.1, 10)
    with pytest.raises(ValueError, match="one \\(σ, q\\)"):
        acct.step(1.2, 0.1, 10)


def test_truncation_probability_equals_the_binomial_tail():
    for n, q, b, cap in [(50, 0.3, 2, 10), (200, 0.5, 4, 30), (99, 0.9, 1, 95), (40, 0.2, 4, 39)]:
        p = q / b
        want = sum(math.comb(n + 1, k) * p ** k * (1 - p) ** (n + 1 - k) for k in range(cap + 1, n + 2))
        assert bandmf.truncation_probability(n, q, b, cap) == pytest.approx(want, rel=1e-10, abs=1e-300)
    assert bandmf.truncation_probability(100, 0.5, 2, 101) == 0.0
    tiny = bandmf.truncation_probability(10 ** 6, 0.001, 1, 5000)   # far above the mean: the Chernoff bound
    assert 0.0 <= tiny < 1e-300


@pytest.mark.slow
def test_truncation_costs_delta():
    sigma, q, steps, b, delta = 1.5, 0.2, 100, 4, 1e-5
    plain = bandmf.epsilon(sigma, q, steps, b, delta)
    loose = bandmf.BandMFAccountant(b, truncation=(1000, 80))   # mean q/b·N = 50: truncation happens
    loose.step(sigma, q, steps)
    tight = bandmf.BandMFAccountant(b, truncation=(1000, 200))  # practically never
    tight.step(sigma, q, steps)
    assert tight.get_epsilon(delta) == pytest.approx(plain, rel=1e-6)
    eps = loose.get_epsilon(delta)
    assert eps == math.inf or eps > plain
    moderate = bandmf.BandMFAccountant(b, truncation=(1000, 97))
    moderate.step(sigma, q, steps)
    p = bandmf.truncation_probability(1000, q, b, 97)
    assert 0 < steps * p < delta
    eps = moderate.get_epsilon(delta)
    assert plain < eps < math.inf
    # the definition: the base accountant meets δ − (1 + e^ε)·T·p at that ε
    assert moderate.base().get_epsilon(delta - moderate.truncation_slack(eps)) <= eps * (1 + 1e-8)
    assert moderate.get_delta(eps) <= delta * (1 + 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize("truncation", [None, (5000, 630)])
def test_calibrate_noise_meets_the_target(accountant, truncation):
    q, steps, b, target, delta, rtol = 0.4, 200, 4, 1.0, 1e-5, 1e-3
    sigma = bandmf.calibrate_noise(target, delta, q, steps, b, accountant, truncation=truncation, rtol=rtol)
    acct = bandmf.BandMFAccountant(b, accountant, truncation=truncation)
    acct.step(sigma, q, steps)
    assert acct.get_epsilon(delta) <= target
    acct = bandmf.BandMFAccountant(b, accountant, truncation=truncation)
    acct.step(sigma / (1 + rtol), q, steps)
    assert acct.get_epsilon(delta) > target
    if truncation is None:
        assert sigma == dp.calibrate_noise(target, delta, q, math.ceil(steps / b), accountant, rtol=rtol)


def test_calibration_refuses_a_truncation_that_uses_up_delta():
    with pytest.raises(ValueError, match="raise max_batch_size"):
        bandmf.calibrate_noise(1.0, 1e-5, 0.5, 100, 2, truncation=(1000, 200))
