"""Run under ``mpiexec -n P``: the noise of DP-SGD once over the axis of processes (NOTE
[noise once over a data-parallel axis] in cuvmap/dp/noise.py). Every process holds zero
per-example gradients and runs a recipe users write; the combined update's noise must have
the variance (σC/n)² of one draw, measured over D·REPEATS coordinates (1.2e5 draws: the
variance's relative standard error is 0.4%, the tolerance 2%). With σ = 0 each recipe
gives the global clipped sum / n exactly. Prints ``ratio <recipe> <measured/expected>``
and ``ok R``; a failure raises, which aborts the job."""
import sys

import numpy as np

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import distributed, dp, lax, tree

group = distributed.initialize()
R, P = group.rank, group.size
C, SIGMA, N = 0.5, 1.3, 32.0          # the bound, the noise multiplier, the global expected batch size
D, REPEATS, LOCAL = 60000, 2, 4       # coordinates, draws of each, examples per process
ZEROS = {"w": np.zeros((LOCAL, D // 3, 3)), "b": np.zeros((LOCAL, D - 3 * (D // 3)))}
LIKE = tree.map(lambda x: x[0], ZEROS)
WANT = (SIGMA * C / N) ** 2


def recipe_a(k):      # private_gradient with the global n, each process its own generator; psum
    g = dp.private_gradient(ZEROS, C, SIGMA, np.random.default_rng(1000 * k + R), expected_batch_size=N)
    return lax.psum(g, "batch")


def recipe_b(k):      # each normalises by its own expected batch n / P; pmean
    g = dp.private_gradient(ZEROS, C, SIGMA, np.random.default_rng(2000 * k + R), expected_batch_size=N / P)
    return lax.pmean(g, "batch")


def _jitted_step(noise_of):
    step = cv.jit(lambda g, z: lax.psum(dp.private_gradient(g, C, SIGMA, noise=z, expected_batch_size=N), "batch"))
    return lambda k: step(ZEROS, noise_of(k))


recipe_c = _jitted_step(lambda k: dp.standard_normal_like(LIKE, np.random.default_rng(3000 * k)) if R == 0
                        else tree.map(np.zeros_like, LIKE))     # the README's: noise on process 0, zeros elsewhere
recipe_d = _jitted_step(lambda k: dp.standard_normal_like(LIKE, np.random.default_rng(4000 * k + R)))   # everywhere
recipe_e = _jitted_step(lambda k: dp.standard_normal_like(LIKE, np.random.default_rng(5000 * k)))   # a shared key


def recipe_opt_out(k):     # axis_name=None: each process's noise counts: P times the variance
    g = dp.private_gradient(ZEROS, C, SIGMA, np.random.default_rng(6000 * k + R), expected_batch_size=N,
                            axis_name=None)
    return lax.psum(g, "batch")


RECIPES = {"a": (recipe_a, 1.0), "b": (recipe_b, 1.0), "c": (recipe_c, 1.0), "d": (recipe_d, 1.0),
           "e": (recipe_e, 1.0), "opt_out": (recipe_opt_out, float(P))}
for name, (recipe, factor) in RECIPES.items():
    run = distributed.data_parallel(recipe)
    draws = np.concatenate([np.concatenate([np.ravel(x) for x in tree.leaves(run(k))]) for k in range(REPEATS)])
    ratio = float(np.mean(draws ** 2)) / WANT     # the mean is 0: the gradients are zeros
    print(f"ratio {name} {ratio:.4f} (rank {R})", flush=True)
    assert abs(ratio / factor - 1) < 0.02, (name, ratio, factor)

# σ = 0: the global clipped sum / n, exactly as one process computes it from every shard
rng = np.random.default_rng(7)
every = {"w": rng.standard_normal((LOCAL * P, 3, 2)), "b": rng.standard_normal((LOCAL * P, 2))}
mine = tree.map(lambda x: x[R::P], every)
want = tree.map(lambda s: s / N, dp.clipped_sum(every, 0.8).summed)
noise = tree.map(lambda x: np.ones_like(x[0]), every)
for name, fn in (
    ("psum", lambda g: lax.psum(dp.private_gradient(g, 0.8, 0.0, rng=np.random.default_rng(R),
                                                    expected_batch_size=N), "batch")),
    ("pmean", lambda g: lax.pmean(dp.private_gradient(g, 0.8, 0.0, rng=np.random.default_rng(R),
                                                      expected_batch_size=N / P), "batch")),
    ("jit psum", cv.jit(lambda g: lax.psum(dp.private_gradient(g, 0.8, 0.0, noise=tree.map(cnp.ones_like, noise),
                                                               expected_batch_size=N), "batch"))),
):
    got = distributed.data_parallel(fn)(mine)
    for a, b in zip(tree.leaves(got), tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15, err_msg=name)
print(f"ok {R}", flush=True)
sys.stdout.flush()
