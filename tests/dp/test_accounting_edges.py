"""The accountants and the DP plan at their edges (issue 34, items 5-10): fractional step
counts never under-counted, the calibration where ε reaches 0 or the PLD grid cannot
follow, infinite noise, counts that are not numbers, NumPy integers, infinite batch sizes;
clipped sums that were transformed or reduced over an axis; the plan's warnings.

References: the accountants' own compositions (T·ε_α for RDP; whole steps for PLD), and
closed forms (infinite noise loses nothing: ε = 0, as Opacus reports)."""
import math
import warnings

import numpy as np
import pytest

from cuvmap import dp

SIGMA, Q, DELTA = 1.1, 0.01, 1e-5


# ---------------------------------------------------------------------------------------
# 5. fractional steps
# ---------------------------------------------------------------------------------------


def test_the_rdp_accountant_composes_fractional_steps_exactly():
    acct = dp.RDPAccountant()
    acct.step(SIGMA, Q, num_steps=2.5)
    want = dp.rdp_sampled_gaussian(Q, SIGMA, acct.orders, steps=2.5)
    np.testing.assert_allclose(acct.get_rdp(), want, rtol=1e-14)
    two = dp.RDPAccountant()
    two.step(SIGMA, Q, num_steps=2)
    assert acct.get_epsilon(DELTA) > two.get_epsilon(DELTA)
    assert acct.num_steps == 2.5 and len(acct) == 3      # (len: whole steps, rounded up)
    acct.step(SIGMA, Q, num_steps=0.5)                    # merged: 3 steps exactly
    three = dp.RDPAccountant()
    three.step(SIGMA, Q, num_steps=3)
    assert acct.num_steps == 3 and acct.get_epsilon(DELTA) == pytest.approx(three.get_epsilon(DELTA), rel=1e-12)


def test_the_pld_accountant_rounds_fractional_steps_up_and_says_so():
    acct = dp.PLDAccountant(discretization=1e-3)
    with pytest.warns(RuntimeWarning, match=r"composes whole steps: num_steps=2.5 is counted as 3"):
        acct.step(SIGMA, Q, num_steps=2.5)
    three = dp.PLDAccountant(discretization=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        three.step(SIGMA, Q, num_steps=3.0)               # a whole float: no warning
    assert len(acct) == 3 and acct.get_epsilon(DELTA) == three.get_epsilon(DELTA)


@pytest.mark.slow
@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibrate_noise_meets_the_target_for_fractional_steps(accountant):
    """σ for 10.5 steps meets the target at 10.5 steps (RDP, exactly) or 11 (PLD), and is
    the smallest that does, to rtol; truncating to 10 steps (5% fewer) would not meet it."""
    target, h = 1.0, 1e-3
    if accountant == "pld":
        with pytest.warns(RuntimeWarning, match="counted as 11"):
            sigma = dp.calibrate_noise(target, DELTA, 0.05, 10.5, accountant, discretization=h)
        assert sigma == dp.calibrate_noise(target, DELTA, 0.05, 11, accountant, discretization=h)

        def eps(s):
            acct = dp.PLDAccountant(discretization=h)
            acct.step(s, 0.05, 11)
            return acct.get_epsilon(DELTA)
    else:
        sigma = dp.calibrate_noise(target, DELTA, 0.05, 10.5, accountant)

        def eps(s):  # (the composition itself, not the accountant under test)
            orders = dp.DEFAULT_ORDERS
            return dp.rdp_to_epsilon(orders, dp.rdp_sampled_gaussian(0.05, s, orders, steps=10.5), DELTA)[0]
    assert eps(sigma) <= target < eps(sigma / (1 + 1e-3))


# ---------------------------------------------------------------------------------------
# 6. where ε reaches 0, huge targets, infinite noise, counts that are not numbers
# ---------------------------------------------------------------------------------------


def test_calibrate_noise_where_the_rdp_epsilon_reaches_zero():
    """q = 1, one step, ε = 0.01: the RDP conversion meets it only where ε is exactly 0
    (the total variation below δ); the σ returned meets it and σ / (1 + rtol) does not."""
    sigma = dp.calibrate_noise(0.01, 1e-5, 1.0, 1, accountant="rdp")
    assert math.isfinite(sigma) and sigma > 0

    def eps(s):
        acct = dp.RDPAccountant()
        acct.step(s, 1.0, 1)
        return acct.get_epsilon(1e-5)

    assert eps(sigma) <= 0.01 < eps(sigma / (1 + 1e-3))


def test_a_huge_target_on_the_pld_accountant_names_the_remedy():
    """(Before: an internal grid message after 98 s of NaN-warning evaluations; one step's
    loss past 700 nats overflowed e^loss.)"""
    with pytest.raises(ValueError, match=r"calibrate_noise: the target ε=10000 needs a noise multiplier near .* the PLD "
                                         r"accountant's grid at discretization .* cannot hold the privacy loss .* pass accountant='rdp', or a coarser discretization="):
        dp.calibrate_noise(1e4, DELTA, 0.5, 1)


def test_the_pld_accountant_refuses_losses_its_exponentials_cannot_hold():
    with pytest.raises(ValueError, match=r"privacy losses up to .* nats, beyond the 700 the grid's exponentials hold"):
        acct = dp.PLDAccountant(discretization=1e-2)
        acct.step(0.02, 0.5, 1)
        acct.get_epsilon(DELTA)


@pytest.mark.parametrize("accountant", [dp.RDPAccountant, dp.PLDAccountant])
def test_infinite_noise_loses_nothing(accountant):
    """σ = ∞: ε = 0 at once (Opacus: 0), without a warning; with other steps, their ε."""
    acct = accountant()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acct.step(math.inf, Q, 10)
        assert acct.get_epsilon(DELTA) == 0.0
    acct.step(SIGMA, Q, 10)
    alone = accountant()
    alone.step(SIGMA, Q, 10)
    assert acct.get_epsilon(DELTA) == pytest.approx(alone.get_epsilon(DELTA), rel=1e-12)
    assert dp.rdp_sampled_gaussian(Q, math.inf, [2.0, 1.5]).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1, "3", None, True])
def test_a_step_count_that_is_not_a_number_is_named(bad):
    for acct in (dp.RDPAccountant(), dp.PLDAccountant()):
        with pytest.raises(ValueError, match=rf"{type(acct).__name__}.step: num_steps must be a (finite )?number"):
            acct.step(SIGMA, Q, bad)
    with pytest.raises(ValueError, match="calibrate_noise: num_steps must be a"):
        dp.calibrate_noise(1.0, DELTA, Q, bad, accountant="rdp")
    if bad is not None and not isinstance(bad, str):
        with pytest.raises(ValueError, match="rdp_sampled_gaussian: steps must be a finite number >= 0"):
            dp.rdp_sampled_gaussian(Q, SIGMA, 2.0, steps=bad)


def _plan(**kwargs):
    args = dict(dataset_size=1000, sample_rate=0.05, noise_multiplier=1.0, max_norm=1.0, steps=20,
                expected_batch_size=50)
    args.update(kwargs)
    return dp.Plan(**args)


def test_a_plan_takes_the_numpy_integers_the_accountants_take():
    plan = _plan(dataset_size=np.int64(1000), steps=np.int32(20))
    assert plan.dataset_size == 1000 and type(plan.dataset_size) is int and plan.steps == 20
    assert plan.epsilon(DELTA) == _plan().epsilon(DELTA)
    user = _plan(dataset_size=np.int64(100), unit="user", num_examples=np.int64(1000), expected_batch_size=5)
    assert user.num_examples == 1000
    with pytest.raises(ValueError, match=r"steps must be an int >= 0, got 20.5 \(a fractional count such as epochs / "
                                         r"q: pass math.ceil\(steps\) = 21"):
        _plan(steps=20.5)
    with pytest.raises(ValueError, match="dataset_size must be a positive int, got True"):
        _plan(dataset_size=True)


@pytest.mark.parametrize("n", [math.inf, math.nan, -1.0])
def test_an_infinite_expected_batch_size_is_refused(n):
    """(n = ∞ made every private gradient 0 without a word.)"""
    with pytest.raises(ValueError, match=r"expected_batch_size must be a positive number or 'from_dataset_size' \(a "
                                         r"finite number\)"):
        _plan(expected_batch_size=n)
    g = np.ones((3, 2))
    with pytest.raises(ValueError, match=r"the normalisation must be a positive number \(a finite one\)"):
        dp.private_gradient(g, 1.0, 1.0, np.random.default_rng(0), expected_batch_size=n)


# ---------------------------------------------------------------------------------------
# 7. a function mapped over a clipped sum drops its sensitivity; 9. .summed in the error
# ---------------------------------------------------------------------------------------

import cuvmap as cv  # noqa: E402
from cuvmap import nn, tree  # noqa: E402

PER_EXAMPLE = {"w": np.arange(24.0).reshape(4, 3, 2) / 10, "b": np.ones((4, 2))}
PARAMS = {"w": np.zeros((3, 2)), "b": np.zeros(2)}


def _clipped():
    return dp.clipped_sum(PER_EXAMPLE, 1.0)


@pytest.mark.parametrize("mapper", ["map", "map_with_path"])
def test_a_mapped_clipped_sum_is_a_plain_pytree(mapper):
    """tree.map(2 * x) doubles the sum's sensitivity: the result no longer claims C, so
    noise on it needs a bound said explicitly (before: a ClippedGradient that said C, and
    private_gradient added the noise of C to a sum of sensitivity 2C)."""
    c = _clipped()
    doubled = (tree.map(lambda x: 2 * x, c) if mapper == "map"
               else tree.map_with_path(lambda p, x: 2 * x, c))
    assert not isinstance(doubled, dp.ClippedGradient)
    assert tree.structure(doubled) == tree.structure(c.summed)
    for key in ("w", "b"):
        np.testing.assert_array_equal(doubled[key], 2 * c.summed[key])
    with pytest.raises(ValueError, match="max_norm is needed for a plain pytree"):
        dp.add_noise(doubled, 1.0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="max_norm .* is needed to clip per-example gradients"):
        dp.private_gradient(doubled, noise_multiplier=1.0, rng=np.random.default_rng(0), expected_batch_size=4)
    noisy = dp.add_noise(doubled, 1.0, max_norm=2.0, rng=np.random.default_rng(0))   # the bound, said
    assert tree.structure(noisy) == tree.structure(c.summed)


def test_the_sum_of_microbatches_and_the_transforms_keep_the_sensitivity():
    c = _clipped()
    assert isinstance(c + c, dp.ClippedGradient) and (c + c).sensitivity == 1.0
    assert isinstance(cv.device_put(c, "cpu"), dp.ClippedGradient)
    assert isinstance(cv.stop_gradient(c), dp.ClippedGradient)
    jitted = cv.jit(lambda g: dp.clipped_sum(g, 1.0))(PER_EXAMPLE)
    assert isinstance(jitted, dp.ClippedGradient) and jitted.max_norm == 1.0
    f = lambda s: (cv.numpy.sum(s * PER_EXAMPLE["b"]), dp.clipped_sum({"w": PER_EXAMPLE["w"] * s}, 1.0))  # noqa: E731
    _, aux = cv.grad(f, has_aux=True)(2.0)
    assert isinstance(aux, dp.ClippedGradient)
    batched = cv.vmap(lambda s: dp.clipped_sum({"w": PER_EXAMPLE["w"] * s}, 1.0))(np.ones(2))
    assert isinstance(batched, dp.ClippedGradient)


@pytest.mark.parametrize("where", ["tree.map(params, clipped)", "tree.map(clipped, params)", "sgd", "adam"])
def test_a_clipped_sum_in_place_of_the_parameters_says_summed(where):
    c = _clipped()
    with pytest.raises(ValueError, match=r"holds a ClippedGradient where the others hold another structure: .*pass "
                                         r"its \.summed"):
        if where == "tree.map(params, clipped)":
            tree.map(lambda p, g: p - g, PARAMS, c)
        elif where == "tree.map(clipped, params)":
            tree.map(lambda g, p: p - g, c, PARAMS)
        else:
            opt = nn.optim.sgd(0.1) if where == "sgd" else nn.optim.adam(0.1)
            opt.update(c, opt.init(PARAMS), PARAMS)
    # the fix the message names
    opt = nn.optim.sgd(0.1)
    new, _ = opt.update(c.summed, opt.init(PARAMS), PARAMS)
    np.testing.assert_allclose(new["b"], -0.1 * c.summed["b"])


# ---------------------------------------------------------------------------------------
# 8. noise on a clipped sum reduced over a data-parallel axis: one draw, on every member
# ---------------------------------------------------------------------------------------

from cuvmap import lax  # noqa: E402

C8, SIGMA8, N8 = 0.5, 1.3, 12.0
SHARES = np.random.default_rng(8).standard_normal((3, 4, 5))          # 3 members, 4 examples each, 5 coordinates
DRAWS = np.random.default_rng(9).standard_normal((3, 5))              # each member's own draw


def _total_and_want():
    clipped = [dp.clipped_sum({"w": SHARES[m]}, C8) for m in range(3)]
    total = sum(c.summed["w"] for c in clipped)
    return total, (total + SIGMA8 * C8 * DRAWS[0]) / N8                # member 0's draw, once


@pytest.mark.parametrize("call", ["private_gradient", "add_noise", "plan", "jit"])
def test_noise_after_a_psum_under_a_named_vmap_is_one_draw_on_every_member(call):
    """private_gradient(lax.psum(clipped, "i"), ...): every member gets the total plus
    member 0's draw (before: member 0 alone had noise, the others a noise-free gradient)."""
    plan = dp.Plan(dataset_size=100, sample_rate=0.12, noise_multiplier=SIGMA8, max_norm=C8, steps=1,
                   expected_batch_size=N8)

    def member(share, z):
        total = lax.psum(dp.clipped_sum({"w": share}, C8), "i")
        seen.append(getattr(total, "reduced_over", None))
        if call == "add_noise":  # (its generator gives this member's draw)
            return cv.tree.map(lambda x: x / N8, dp.add_noise(total, SIGMA8, rng=_FixedRng(z)))
        if call == "plan":
            return plan.private_gradient(total, noise={"w": z})
        return dp.private_gradient(total, noise_multiplier=SIGMA8, noise={"w": z}, expected_batch_size=N8)

    seen = []
    f = cv.jit(member) if call == "jit" else member
    out = cv.vmap(f, axis_name="i")(SHARES, DRAWS)["w"]
    total, want = _total_and_want()
    for m in range(3):
        np.testing.assert_allclose(out[m], want, rtol=1e-12, atol=1e-12)
    assert seen == [("i",)]   # (the psum says so: its metadata)
    # its norms stay each member's
    norms = cv.vmap(lambda s: lax.psum(dp.clipped_sum({"w": s}, C8), "i").norms, axis_name="i")(SHARES)
    np.testing.assert_allclose(norms, np.linalg.norm(SHARES, axis=2), rtol=1e-12)


class _FixedRng:
    """A generator whose standard_normal returns a given (traced per member) draw."""

    def __init__(self, z):
        self.z = z

    def standard_normal(self, size=None, dtype=None):
        return self.z


def test_other_collectives_of_a_clipped_sum_are_plain_and_shares_keep_their_rule():
    out = cv.vmap(lambda s: lax.pmean(dp.clipped_sum({"w": s}, C8), "i"), axis_name="i")(SHARES)
    assert not isinstance(out, dp.ClippedGradient)
    # a share (no psum): the noise stays on member 0, and a psum afterwards carries it once
    g = cv.vmap(lambda s, z: lax.psum(dp.private_gradient(dp.clipped_sum({"w": s}, C8), noise_multiplier=SIGMA8,
                                                          noise={"w": z}, expected_batch_size=N8), "i"),
                axis_name="i")(SHARES, DRAWS)["w"]
    _, want = _total_and_want()
    np.testing.assert_allclose(g[1], want, rtol=1e-12, atol=1e-12)


def test_a_reduced_clipped_sum_noised_outside_its_axis_is_refused():
    total = cv.vmap(lambda s: lax.psum(dp.clipped_sum({"w": s}, C8), "i"), axis_name="i")(SHARES)
    one = dp.ClippedGradient({"w": total.summed["w"][0]}, total.norms[0], max_norm=C8, reduced_over=("i",))
    with pytest.raises(ValueError, match=r"summed over 'i' \(a psum\), but no such axis is bound here: add its noise "
                                         r"inside the data_parallel \(or vmap\) function"):
        dp.private_gradient(one, noise_multiplier=1.0, rng=np.random.default_rng(0), expected_batch_size=N8)
    with pytest.raises(ValueError, match="normalize_by='batch_size' counts this member's examples"):
        cv.vmap(lambda s: dp.private_gradient(lax.psum(dp.clipped_sum({"w": s}, C8), "i"), noise_multiplier=1.0,
                                              noise={"w": s[0]}, normalize_by="batch_size"), axis_name="i")(SHARES)


@pytest.mark.slow
def test_noise_after_a_psum_on_two_processes(tmp_path):
    """The same under ``mpiexec -n 2``: both processes release the total plus process 0's
    draw (with noise= eagerly and under jit, and with each process's own generator)."""
    import importlib.util
    import os
    import pathlib

    from cuvmap import distributed

    if distributed.find_mpiexec() is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("no mpiexec or mpi4py: pip install mpi4py mpich (the test extra does on Linux x86-64)")
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL"))}
    env.update(PYTHONPATH=os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    result = distributed.launch(2, [str(root / "tests" / "distributed_jobs" / "noise_after_psum.py"), str(tmp_path)],
                                env=env, timeout=180, capture_output=True, text=True, cwd=str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    runs = [np.load(tmp_path / f"{r}.npz") for r in (0, 1)]
    for key in ("w", "b"):
        total = sum(dp.clipped_sum({"w": run["share_w"], "b": run["share_b"]}, 0.5).summed[key] for run in runs)
        want = (total + 1.3 * 0.5 * runs[0][f"z_{key}"]) / 12.0
        for run in runs:
            for how in ("eager", "jit"):
                np.testing.assert_allclose(run[f"{how}_{key}"], want, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(run[f"rng_{key}"], runs[0][f"rng_{key}"])   # one draw, everywhere



# ---------------------------------------------------------------------------------------
# 10. what a plan warns about
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_plan_warns_when_delta_is_at_least_one_over_n():
    plan = _plan()                                   # N = 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan.epsilon(1e-4)                            # δ < 1/N: no warning
    for call in (lambda: plan.epsilon(1e-3), lambda: plan.epsilons(0.01)):
        with pytest.warns(UserWarning, match=r"delta=0\.0+1 is at least 1/N = 1/1000 .* choose δ well below 1/N") as got:
            call()
        assert len(got) == 1                          # (epsilons: once, not per accountant)


@pytest.mark.parametrize("n, warns", [(50, False), (54, False), (46, False), (60, True), (25, True), (500, True)])
def test_a_plan_warns_when_the_expected_batch_size_is_far_from_q_times_n(n, warns):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        _plan(expected_batch_size=n)                  # q·N = 0.05 · 1000 = 50
    said = [str(w.message) for w in got if "far from q·N" in str(w.message)]
    assert bool(said) is warns, said
    if warns:
        assert f"expected_batch_size={n} is far from q·N = 0.05·1000 = 50" in said[0]
        assert f"the rate is {n / 1000:g}" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _plan(expected_batch_size="from_dataset_size")
