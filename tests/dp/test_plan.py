"""dp.Plan: the sampler, padding buckets, clipping, noise, normalisation and accountant of
DP-SGD built once from (N, q, σ, C, steps) (NOTE [one plan] in cuvmap/dp/plan.py).

Independent references: the RDP accountant composed by hand with the plan's (q, σ, T); the
Binomial(N, q) moments of the batch sizes; a per-example NumPy loop for the private
gradient."""
import math

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import dp, tree
from dp_references import tanh_net_loss, tanh_net_problem


def _plan(**kw):
    args = dict(dataset_size=40, sample_rate=0.25, noise_multiplier=1.2, max_norm=0.7, steps=30,
                expected_batch_size=10)
    args.update(kw)
    return dp.Plan(**args)


CONSTRUCTION_ERRORS = [
    (dict(expected_batch_size=None), "expected_batch_size is needed.*opacus#571"),
    (dict(expected_batch_size="q*N"), "expected_batch_size must be a positive number or 'from_dataset_size'"),
    (dict(relation="replace"), "stated for add/remove-one"),
    (dict(sample_rate=0.0), r"sample_rate must be in \(0, 1\]"),
    (dict(dataset_size=0), "dataset_size must be a positive int"),
    (dict(steps=-1), "steps must be an int >= 0"),
    (dict(noise_multiplier=-1.0), "noise_multiplier must be >= 0"),
    (dict(max_norm=0.0), "max_norm must be positive"),
    (dict(unit="user"), "unit='user' needs num_examples"),
    (dict(accountant="moments"), "accountant must be one of"),
]


@pytest.mark.parametrize("kwargs, pattern", CONSTRUCTION_ERRORS)
def test_plan_construction_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        _plan(**kwargs)


@pytest.mark.slow
def test_the_plan_derives_every_piece_from_the_same_numbers():
    """The sampler, buckets and accountant all come from (N, q, σ, C, T), and the expected
    batch size is the public one given (or asked for by name): two of jax_privacy's critical
    pitfalls (accounting and batch selection; public vs private metadata, with the
    expected_batch_size rows of CONSTRUCTION_ERRORS), as tests/dp/test_sensitivity.py lists
    them."""
    plan = _plan()
    assert plan.buckets == dp.batch_buckets(10.0, 40) and plan.expected_batch_size == 10.0
    assert _plan(expected_batch_size="from_dataset_size").expected_batch_size == 10.0
    # the sampler: Poisson with rate q (the batch size is Binomial(N, q))
    sizes = np.array([len(plan.sample(np.random.default_rng(s))) for s in range(2000)])
    assert abs(sizes.mean() - 10) < 4 * math.sqrt(40 * 0.25 * 0.75 / 2000)
    assert abs(sizes.var() - 40 * 0.25 * 0.75) < 0.15 * 40 * 0.25 * 0.75
    # the accountant: T steps of the subsampled Gaussian with (q, σ)
    acct = dp.RDPAccountant()
    acct.step(noise_multiplier=1.2, sample_rate=0.25, num_steps=30)
    assert plan.epsilon(1e-5) == pytest.approx(acct.get_epsilon(1e-5), rel=1e-13)
    half = dp.RDPAccountant()
    half.step(noise_multiplier=1.2, sample_rate=0.25, num_steps=15)
    assert plan.epsilon(1e-5, steps=15) == pytest.approx(half.get_epsilon(1e-5), rel=1e-13)
    assert plan.epsilons(1e-5)["rdp"] == plan.epsilon(1e-5)
    assert "q=0.25" in repr(plan) and "n=10" in repr(plan)


@pytest.mark.slow
def test_registered_accountants_are_reported():
    class Half(dp.RDPAccountant):
        def get_epsilon(self, delta, **kw):
            return super().get_epsilon(delta, **kw) / 2

    dp.register_accountant("half", Half)
    try:
        plan = _plan(accountant="half")
        assert plan.epsilon(1e-5) == pytest.approx(plan.epsilon(1e-5, accountant="rdp") / 2, rel=1e-13)
        assert set(plan.epsilons(1e-5)) == {"rdp", "pld", "half"}
    finally:
        del dp.ACCOUNTANTS["half"]


def test_a_plan_step_equals_the_pieces_and_a_loop():
    """plan.private_gradient(plan.clipped_grad(loss)(...)) on a padded batch, eagerly and
    under jit, is (Σ_b clip(g_b) + σCz) / n by a per-example loop."""
    params, xs, ys = tanh_net_problem(n=40)
    plan = _plan()
    idx = plan.sample(np.random.default_rng(3))
    (x, y), mask = plan.pad((xs[idx], ys[idx]))
    assert len(mask) in plan.buckets and int(mask.sum()) == len(idx)
    z = plan.noise(params, np.random.default_rng(4))
    clipped_grad = plan.clipped_grad(tanh_net_loss)

    def step(p, x, y, m, z):
        return plan.private_gradient(clipped_grad(p, x, y, mask=m), noise=z)

    want = {k: 1.2 * 0.7 * z[k] for k in params}
    for i in idx:
        g = cv.grad(tanh_net_loss)(params, xs[i], ys[i])
        norm = math.sqrt(sum(float(np.sum(v ** 2)) for v in g.values()))
        for k in params:
            want[k] = want[k] + g[k] * min(1.0, 0.7 / (norm + 1e-6))
    want = {k: v / 10.0 for k, v in want.items()}
    for got in (step(params, x, y, mask, z), cv.jit(step)(params, x, y, mask, z)):
        for k in params:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-14)


MISMATCHED = [
    # a clipped sum made otherwise than the plan says
    (lambda p, g: dp.clipped_sum(g, 0.5), "clipped to C=0.5.*the plan's is each example clipped to a total bound 0.7"),
    (lambda p, g: dp.clipped_sum(g, 0.7, relation="replace"), "replace-one"),
    (lambda p, g: dp.clipped_sum(g, 0.7, users=np.arange(4)), "each user clipped"),
    (lambda p, g: dp.clipped_sum(g, 0.7, groups="param"), "over 3 groups"),
    (lambda p, g: tree.map(lambda x: x.sum(0), g), "takes what plan.clipped_grad or plan.clipped_sum returns"),
]


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("make, pattern", MISMATCHED)
def test_the_plan_refuses_a_clipped_sum_it_did_not_make(make, pattern, jitted):
    params, xs, ys = tanh_net_problem(n=40)
    plan = _plan()
    z = plan.noise(params, np.random.default_rng(5))
    per_example = cv.vmap(cv.grad(tanh_net_loss), in_axes=(None, 0, 0))

    def step(p, x, y, z):
        return plan.private_gradient(make(p, per_example(p, x, y)), noise=z)

    with pytest.raises(ValueError, match=pattern):
        (cv.jit(step) if jitted else step)(params, xs[:4], ys[:4], z)


def test_a_grouped_plan_and_a_user_plan():
    params, xs, ys = tanh_net_problem(n=40)
    grouped = _plan(groups="param", max_norm={"['b']": 0.1, "['v']": 0.4, "['w']": 0.3})
    clipped = grouped.clipped_grad(tanh_net_loss)(params, xs[:6], ys[:6])
    assert clipped.sensitivity == pytest.approx(math.sqrt(0.01 + 0.16 + 0.09))
    z = grouped.noise(params, np.random.default_rng(6))
    g = grouped.private_gradient(clipped, noise=z)
    want = tree.map(lambda s, zl: (s + 1.2 * clipped.sensitivity * zl) / 10.0, clipped.summed, z)
    for k in params:
        np.testing.assert_allclose(g[k], want[k], rtol=1e-12)
    with pytest.raises(ValueError, match="by group"):
        grouped.private_gradient(dp.clipped_grad(tanh_net_loss, clipped.sensitivity)(params, xs[:6], ys[:6]), noise=z)
    # user level: 10 users of 4 examples; the sampler samples users
    users = np.repeat(np.arange(10), 4)
    plan = _plan(dataset_size=10, unit="user", num_examples=40, expected_batch_size=2.5)
    idx, slots = plan.sample(np.random.default_rng(7), users)
    assert len(idx) % 4 == 0 and np.all(np.diff(slots) >= 0)
    (x, y, u), mask = plan.pad((xs[idx], ys[idx], slots))
    clipped = plan.clipped_grad(tanh_net_loss)(params, x, y, mask=mask, users=u)
    assert clipped.unit == "user"
    g = plan.private_gradient(clipped, noise=z)
    assert tree.structure(g) == tree.structure(params)
    with pytest.raises(ValueError, match="samples users: pass user_of_example"):
        plan.sample(np.random.default_rng(7))
    with pytest.raises(ValueError, match="each example clipped"):
        plan.private_gradient(plan.clipped_grad(tanh_net_loss)(params, x, y, mask=mask), noise=z)
    with pytest.raises(ValueError, match="max_norm is the plan's"):
        plan.clipped_grad(tanh_net_loss, max_norm=2.0)
