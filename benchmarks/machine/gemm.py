"""The machine's float32 GEMM rate, measured in the run it serves (the compute floor of the
per-example suite, the ceiling of the conv suite's kernels)."""
import numpy as np

from benchmarks.rounds import runner
from benchmarks.rounds.timers import timer_for


def gemm_rate(xp, m=1024, k=None, n=None, repeats=5, warmup=1, dtype=np.float32, policy=None):
    """The rate of ``xp.matmul`` of an ``m × k`` by a ``k × n`` matrix (square when ``k`` and
    ``n`` are not given), in FLOP/s (median), with the :class:`~benchmarks.rounds.runner.Stats`."""
    k = m if k is None else k
    n = m if n is None else n
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((m, k)).astype(dtype))
    b = xp.asarray(rng.standard_normal((k, n)).astype(dtype))
    stats = runner.measure(lambda: xp.matmul(a, b), repeats=repeats, warmup=warmup, timer=timer_for(xp),
                           policy=policy)
    return 2.0 * m * k * n / stats.median, stats
