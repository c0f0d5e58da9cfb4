"""Run under ``mpiexec -n 2`` (tests/test_accounting_edges.py): noise added after a psum of
the clipped sums (``private_gradient(lax.psum(clipped, "batch"), ...)``; NOTE [a clipped
sum reduced over an axis] in cuvmap/dp/clipping.py). Each process holds its own share and
draws its own noise; the released gradient must be the same on every process: the total
plus process 0's draw, once. Eagerly and under jit, with ``rng`` and with ``noise=``.
Writes ``DIR/R.npz`` (``sys.argv[1]``): the share, the draws and the results; prints ``ok R``."""
import os
import sys

import numpy as np

import cuvmap as cv
from cuvmap import distributed, dp, lax

group = distributed.initialize()
R = group.rank
C, SIGMA, N = 0.5, 1.3, 12.0
share = {"w": np.random.default_rng(100 + R).standard_normal((4, 3, 2)), "b": np.random.default_rng(200 + R)
         .standard_normal((4, 5))}
z = dp.standard_normal_like({"w": share["w"][0], "b": share["b"][0]}, np.random.default_rng(300 + R))


def with_noise(share, z):
    return dp.private_gradient(lax.psum(dp.clipped_sum(share, C), "batch"), noise_multiplier=SIGMA, noise=z,
                               expected_batch_size=N)


def with_rng(share):
    return dp.private_gradient(lax.psum(dp.clipped_sum(share, C), "batch"), noise_multiplier=SIGMA,
                               rng=np.random.default_rng(300 + R), expected_batch_size=N)


out = {"share_w": share["w"], "share_b": share["b"], "z_w": z["w"], "z_b": z["b"]}
for name, run in (("eager", distributed.data_parallel(with_noise)), ("jit", distributed.data_parallel(cv.jit(
        with_noise)))):
    g = run(share, z)
    out[f"{name}_w"], out[f"{name}_b"] = g["w"], g["b"]
g = distributed.data_parallel(with_rng)(share)
out["rng_w"], out["rng_b"] = g["w"], g["b"]
np.savez(os.path.join(sys.argv[1], f"{R}.npz"), **out)
print(f"ok {R}", flush=True)
