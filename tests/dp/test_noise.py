"""The noise of DP-SGD once over a data-parallel axis (NOTE [noise once over a
data-parallel axis] in cuvmap/dp/noise.py): in-process under ``vmap(axis_name=)`` and
across 2 processes under ``mpiexec -n 2`` (tests/distributed_jobs/dp_noise.py, under a
timeout; skipped without mpiexec or mpi4py).

Independent references: the variance (σC/n)² of one Gaussian draw, measured over ≥ 1e5
coordinates of zero gradients (the estimate's relative standard error is ≤ 0.45%, the
tolerance 2%); with σ = 0, the clipped sum of all the members' examples by a NumPy loop."""
import importlib.util
import math
import os
import pathlib
import re

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import core, distributed, dp, lax, tree

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/<area>/this file
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
