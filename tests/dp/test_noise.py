"""The noise of DP-SGD (cuvmap/dp/noise.py): ``add_noise``, ``standard_normal_like`` and
``private_gradient`` (its normalisation, masks, drawn noise, empty batches, either device),
and the noise once over a data-parallel axis (NOTE [noise once over a data-parallel axis]):
in-process under ``vmap(axis_name=)`` and across 2 processes under ``mpiexec -n 2``
(tests/distributed_jobs/dp_noise.py, under a timeout; skipped without mpiexec or mpi4py).

Independent references: sample moments at fixed seeds, with loose tolerances; per-example
NumPy loops for the clipped sums (tests/dp_references.py); the variance (σC/n)² of one
Gaussian draw, measured over ≥ 1e5 coordinates of zero gradients (the estimate's relative
standard error is ≤ 0.45%, the tolerance 2%); with σ = 0, the clipped sum of all the
members' examples by a NumPy loop."""
import importlib.util
import math
import os
import pathlib
import re

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend as cv_backend
from cuvmap import core, distributed, dp, lax, tree
from dp_references import assert_tree_close, loop_clip, loop_clipped_sum, loop_norms, per_example_pytree

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/<area>/this file

# No fallback (cancellation) warning and no NumPy overflow may go unnoticed.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------
# add_noise, standard_normal_like, private_gradient
# ---------------------------------------------------------------------------------------


def test_add_noise_std_and_reproducibility():
    zeros = {"a": np.zeros((300, 40)), "b": (np.zeros(5000, np.float32),)}
    sigma, c = 1.3, 0.7
    out = dp.add_noise(zeros, sigma, c, np.random.default_rng(123))
    again = dp.add_noise(zeros, sigma, c, np.random.default_rng(123))
    assert_tree_close(out, again, rtol=0, atol=0)
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
    assert_tree_close(dp.add_noise(x, 0.0, 1.0, _rng()), x, rtol=0, atol=0)
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
    g = per_example_pytree(_rng(8), 6)
    ref = tree.map(lambda x: x.sum(0) / 6, loop_clip(g, 0.8))
    out, norms = dp.private_gradient(g, 0.8, 0.0, _rng(), return_norms=True, normalize_by="batch_size")
    assert_tree_close(out, ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(norms, loop_norms(g), rtol=1e-13)
    # Poisson sampling: normalise by the expected batch size instead.
    out = dp.private_gradient(g, 0.8, 0.0, _rng(), expected_batch_size=10.0)
    assert_tree_close(out, tree.map(lambda x: x * 6 / 10, ref), rtol=1e-13, atol=1e-15)


def test_private_gradient_noise_statistics():
    # (g̃ − clipped mean) · n / (σC) must be standard normal, leaf by leaf.
    rng = _rng(9)
    g = {"w": rng.standard_normal((4, 100, 30)), "b": rng.standard_normal((4, 3000))}
    sigma, c, n = 1.1, 0.5, 64.0
    clipped_sum = tree.map(lambda x: x.sum(0), loop_clip(g, c))
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
    g_np = per_example_pytree(_rng(12), 5, np.float32)
    g = cv.device_put(g_np, backend)
    clipped, norms = dp.clip_per_example(g, 1.0, return_norms=True)
    assert cv_backend.backend_name(tree.leaves(clipped)[0]) == backend
    np.testing.assert_allclose(cv.device_put(norms, "cpu"), loop_norms(tree.map(lambda x: x.astype(np.float64), g_np)), rtol=1e-5)
    assert_tree_close(cv.device_put(clipped, "cpu"), loop_clip(tree.map(lambda x: x.astype(np.float64), g_np), 1.0), rtol=1e-5, atol=1e-6)
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
    unpadded batch (to rounding). (normalize_by="batch_size" with a mask: the
    NORMALISATIONS of tests/dp/test_sensitivity.py.)"""
    g = per_example_pytree(_rng(42), 6)
    padded, mask = dp.pad_batch(g, 8)
    sigma, c, n = 1.3, 0.9, 7.5
    z = dp.standard_normal_like(tree.map(lambda x: x[0], g), _rng(43))
    out = dp.private_gradient(padded, c, sigma, mask=mask, noise=z, expected_batch_size=n)
    ref = tree.map(lambda s, zl: (s + sigma * c * zl) / n, loop_clipped_sum(g, c), z)
    assert_tree_close(out, ref, rtol=1e-13, atol=1e-14)
    assert_tree_close(dp.private_gradient(g, c, sigma, _rng(43), expected_batch_size=n), ref, rtol=1e-13, atol=1e-14)
    with pytest.raises(ValueError, match="either rng .* or noise"):
        dp.private_gradient(padded, c, sigma, _rng(), mask=mask, noise=z)
    with pytest.raises(ValueError, match=r"noise leaf \['scale'\] has shape \(2,\)"):
        dp.private_gradient(padded, c, sigma, mask=mask, noise=dict(z, scale=np.zeros(2)), expected_batch_size=n)
    with pytest.raises(ValueError, match="noise has the pytree structure"):
        dp.private_gradient(padded, c, sigma, mask=mask, noise={"w": 1.0}, expected_batch_size=n)


def test_a_padded_batch_without_real_examples_is_noise_over_one():
    """Poisson sampling can draw no example: with every row padding, the private gradient
    is the noise normalised by 1 (not 0/0)."""
    grads = {"w": np.random.default_rng(0).standard_normal((4, 3))}
    noise = {"w": np.full(3, 0.5)}
    g = dp.private_gradient(grads, 1.0, 2.0, mask=np.zeros(4, bool), noise=noise, normalize_by="batch_size")
    np.testing.assert_allclose(g["w"], np.full(3, 0.5 * 2.0 * 1.0))


# ---------------------------------------------------------------------------------------
# Noise once over a data-parallel axis (NOTE [noise once over a data-parallel axis])
# ---------------------------------------------------------------------------------------


C, SIGMA, N = 0.5, 1.3, 32.0


def _per_member(out, members):
    """``(members, coordinates)``: each member's result, flattened."""
    return np.concatenate([np.asarray(x).reshape(members, -1) for x in tree.leaves(out)], axis=1)


def _zeros(members, local, d):
    return {"w": np.zeros((members, local, d // 4, 3)), "b": np.zeros((members, local, d - 3 * (d // 4)))}


def _like(d):
    return {"w": np.zeros((d // 4, 3)), "b": np.zeros(d - 3 * (d // 4))}


# Each recipe: a function of (the member's zero per-example gradients, the member's own
# standard normal draws) run under vmap(axis_name="batch"); in RECIPES with its name and the
# expected variance over (σC/n)²: 1, or P (the number of members) for the opt-out.
def _recipe_a(g, z):      # private_gradient with the global n; rng: one draw (vmap shares it); psum
    return lax.psum(dp.private_gradient(g, C, SIGMA, np.random.default_rng(1), expected_batch_size=N), "batch")


def _recipe_b(g, z):      # each member normalises by n / P; pmean
    p = core.axis_frame("batch").size
    return lax.pmean(dp.private_gradient(g, C, SIGMA, np.random.default_rng(2), expected_batch_size=N / p), "batch")


def _recipe_c(g, z):      # noise drawn per member (independent), passed in; psum
    return lax.psum(dp.private_gradient(g, C, SIGMA, noise=z, expected_batch_size=N), "batch")


def _recipe_add_noise(g, z):    # add_noise on the member's clipped sum, then psum and normalise
    return tree.map(lambda s: s / N, lax.psum(dp.add_noise(dp.clipped_sum(g, C), SIGMA, rng=np.random.default_rng(3)),
                                              "batch"))


def _recipe_opt_out(g, z):    # axis_name=None: every member's noise counts (P times the variance)
    return lax.psum(dp.private_gradient(g, C, SIGMA, noise=z, expected_batch_size=N, axis_name=None), "batch")


RECIPES = [("a: rng, psum", _recipe_a, 1), ("b: n/P, pmean", _recipe_b, 1), ("c: noise=, psum", _recipe_c, 1),
           ("add_noise, psum", _recipe_add_noise, 1), ("axis_name=None", _recipe_opt_out, "P")]
# (a generator cannot draw inside jit: the recipes with rng run eagerly only)
CASES = [(name, recipe, factor, members, jitted) for name, recipe, factor in RECIPES for members in (2, 4)
         for jitted in (False, True) if not (jitted and recipe in (_recipe_a, _recipe_b, _recipe_add_noise))]


@pytest.mark.slow
@pytest.mark.parametrize("name, recipe, factor, members, jitted", CASES,
                         ids=[f"{c[0]}-{c[3]}-{'jit' if c[4] else 'eager'}" for c in CASES])
def test_noise_once_under_a_named_vmap(name, recipe, factor, members, jitted):
    d = 120000
    g = _zeros(members, 2, d)
    z = {k: np.random.default_rng(10 + members).standard_normal((members,) + v.shape) for k, v in _like(d).items()}
    fn = cv.vmap(cv.jit(recipe) if jitted else recipe, axis_name="batch")
    out = fn(g, z)
    per_member = _per_member(out, members)
    assert per_member.shape == (members, d)
    np.testing.assert_array_equal(per_member, np.broadcast_to(per_member[0], per_member.shape))  # one value for all
    ratio = float(np.mean(per_member[0] ** 2)) / (SIGMA * C / N) ** 2
    assert abs(ratio / (members if factor == "P" else factor) - 1) < 0.02, ratio


def test_noise_once_names_the_axis_and_leaves_other_axes_alone():
    """axis_name="batch" picks the data-parallel axis among nested named axes; the other
    (an ensemble of models, each with its own noise) keeps one draw per member."""
    d = 40000
    g = np.zeros((3, 2, 2, d))           # 3 models × 2 data-parallel members × 2 examples
    z = np.random.default_rng(5).standard_normal((3, 2, d))

    def member(gm, zm):
        return lax.psum(dp.private_gradient({"w": gm}, C, SIGMA, noise={"w": zm}, expected_batch_size=N,
                                            axis_name="batch"), "batch")["w"]

    out = cv.vmap(cv.vmap(member, axis_name="batch"), axis_name="model")(g, z)
    np.testing.assert_allclose(out[:, 0], z[:, 0] * SIGMA * C / N, rtol=1e-14)   # each model: its member 0's noise
    np.testing.assert_array_equal(out[:, 1], out[:, 0])
    with pytest.raises(Exception, match="axis name 'nope'"):
        cv.vmap(lambda gm, zm: dp.private_gradient({"w": gm}, C, SIGMA, noise={"w": zm}, expected_batch_size=N,
                                                   axis_name="nope"), axis_name="batch")(g[0], z[0])


def test_sigma_zero_gives_the_global_clipped_sum_exactly():
    rng = np.random.default_rng(6)
    members, local = 4, 3
    every = {"w": rng.standard_normal((members * local, 3, 2)), "b": rng.standard_normal((members * local, 2))}
    shards = tree.map(lambda x: x.reshape((members, local) + x.shape[1:]), every)
    want = tree.map(lambda s: s / N, dp.clipped_sum(every, 0.8).summed)

    def psum_recipe(g):
        return lax.psum(dp.private_gradient(g, 0.8, 0.0, np.random.default_rng(0), expected_batch_size=N), "batch")

    def pmean_recipe(g):
        return lax.pmean(dp.private_gradient(g, 0.8, 0.0, np.random.default_rng(0), expected_batch_size=N / members),
                         "batch")

    for recipe in (psum_recipe, pmean_recipe):
        got = cv.vmap(recipe, axis_name="batch")(shards)
        for a, b in zip(tree.leaves(got), tree.leaves(want)):
            np.testing.assert_allclose(a, np.broadcast_to(b, a.shape), rtol=1e-13, atol=1e-15)


HAVE_MPI = distributed.find_mpiexec() is not None and importlib.util.find_spec("mpi4py") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec or mpi4py: pip install mpi4py mpich (the test extra)")
def test_noise_once_on_two_processes():
    """Under mpiexec -n 2, every recipe's update carries (σC/n)² once (within 2%), the
    opt-out (axis_name=None) twice, and σ = 0 gives the global clipped sum / n exactly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    result = distributed.launch(2, [str(ROOT / "tests" / "distributed_jobs" / "dp_noise.py")], env=env, timeout=240,
                                capture_output=True, text=True, cwd=str(ROOT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"ok (\d)", result.stdout)) == ["0", "1"], result.stdout
    ratios = {name: float(r) for name, r, rank in re.findall(r"ratio (\S+) ([\d.]+) \(rank (\d)\)", result.stdout)
              if rank == "0"}
    assert set(ratios) == {"a", "b", "c", "d", "e", "opt_out"}, result.stdout
    for name, r in ratios.items():
        assert math.isclose(r, 2.0 if name == "opt_out" else 1.0, rel_tol=0.02), (name, r)
