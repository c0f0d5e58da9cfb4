"""Weak scaling of the data-parallel DP-SGD step: ``E(P) = throughput(P) / (P · throughput(1))``
with its interval (issue 37), a part of ``python -m benchmarks distributed``.

Each process holds a fixed batch of ``b`` examples (weak scaling: the work per process
stays, the job grows), computes its share of the private gradient (``dp.clipped_grad``:
ghost clipping and book-keeping, C = 0.1), adds the noise on process 0 alone, all-reduces
the gradient (``lax.psum`` over the axis of processes, ``distributed.data_parallel``) and
takes an SGD step with momentum, under ``jit``. With ``P`` processes a step handles ``P·b``
examples in ``t(P)``, so ``E(P) = t(1) / t(P)``: 1 when the all-reduce and everything else
the processes share cost nothing.

Fairness on a small machine: every process runs ONE BLAS/OpenMP thread, so that 2
processes on 2 cores compare with 1 process on 1 of them (otherwise the job of one would
use both cores and E would measure the thread scaling of the GEMMs instead); the
1-process and P-process runs alternate, round after round (the order swapping each
round), so that a slow minute of the machine hits both. A round's ``E`` is the ratio of
its two runs' median step times; the interval is the one the other suites give a paired
ratio (``benchmarks/rounds/stats.py``: the Hodges–Lehmann estimate of the paired log
ratios with its signed-rank interval).

The model of ``E(P)`` (NOTE [weak scaling]) and this machine's figures are on the docs'
performance page (docs/performance/distributed.md).

NOTE [weak scaling]
A data-parallel step costs ``t(P) = t_compute + t_allreduce(P) + t_other`` where the
compute on ``b`` examples does not depend on ``P`` and a ring all-reduce of ``n`` bytes
moves ``2 (P − 1) / P · n`` bytes through each process's link at bandwidth ``B``, plus
``2 (P − 1)`` latencies ``α``: ``t_allreduce ≈ 2 (P−1)/P · n / B + 2 (P−1) α``. So
``E(P) = t_compute / (t_compute + t_allreduce(P))`` falls as ``n / (B · t_compute)``
grows and tends, for large ``P``, to ``1 / (1 + 2n / (B t_compute) + 2Pα / t_compute)``.
The Fashion-MNIST CNN's gradient is 26,010 float32 = 104 kB; the MLP's (784-1024-1024-10)
is 7.3 MB: with the same link, the MLP's E depends on the batch per process far more. What
the model gives on shared memory, a network and NVLink is worked out on
docs/scaling.md and evaluated on each run's measured step time
(:func:`predictions`, over the stated links of :data:`LINKS`).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETWORKS = ("tanh_cnn", "mlp")
MAX_NORM, NOISE, LR, MOMENTUM = 0.1, 1.0, 0.5, 0.9


def _network(name):
    from benchmarks import models

    if name == "tanh_cnn":
        return models.tanh_cnn_params(), models.cuvmap_tanh_cnn_per_example_loss, models.tanh_cnn_data
    return models.mlp_params(), models.cuvmap_mlp_per_example_loss, models.mlp_data


def worker(network, batch, steps, warmup, out_path):
    """One process of a job (or a job of one): times ``steps`` data-parallel DP steps on its
    own ``batch`` examples after ``warmup``; process 0 writes the step times."""
    import cuvmap as cv
    from cuvmap import distributed, dp, lax, nn

    group = distributed.initialize()
    params, loss, data = _network(network)
    xs, ys = data(batch, seed=1 + group.rank)
    clipped_grad = dp.clipped_grad(loss, MAX_NORM)
    opt = nn.optim.sgd(LR, momentum=MOMENTUM)
    state = opt.init(params)
    scale = 1.0 / (batch * group.size)

    def step(params, state, x, y, noise):
        clipped = clipped_grad(params, x, y)
        grad = cv.tree.map(lambda g, z: (g + (NOISE * MAX_NORM) * z * (group.rank == 0)) * scale, clipped.summed, noise)
        if group.size > 1:
            grad = lax.psum(grad, "batch")
        return opt.update(grad, state, params)

    step = cv.jit(step)
    if group.size > 1:
        step = distributed.data_parallel(step, axis_name="batch", group=group)
    rng = np.random.default_rng(0)
    times = []
    for i in range(warmup + steps):
        noise = cv.tree.map(lambda p: rng.standard_normal(p.shape).astype(p.dtype), params)
        if group.size > 1:
            group.barrier()
        t0 = time.perf_counter()
        params, state = step(params, state, xs, ys, noise)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if group.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(dict(seconds=times, processes=group.size, parameters=int(sum(np.size(p) for p in
                                                                                    cv.tree.leaves(params)))), fh)


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL"))}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env["CUVMAP_CPU_THREADS"] = "fixed"   # one thread, not fewer when the machine is busy
    return env


def one_run(processes, network, batch, steps, warmup, tmp):
    """The median step time (s) of one run of ``processes`` processes."""
    from cuvmap import distributed

    path = os.path.join(tmp, f"scaling-{network}-{batch}-{processes}.json")
    argv = ["-m", "benchmarks.suites.weak_scaling", "--network", network, "--batch", str(batch), "--steps",
            str(steps), "--warmup", str(warmup), "--out", path]
    if processes == 1:
        result = subprocess.run([sys.executable, *argv], env=_env(), cwd=ROOT, capture_output=True, text=True,
                                timeout=1800)
    else:
        result = distributed.launch(processes, argv, env=_env(), cwd=ROOT, capture_output=True, text=True,
                                    timeout=1800)
    if result.returncode:
        raise RuntimeError(f"the weak-scaling run ({network}, batch {batch}, {processes} processes) failed:\n"
                           f"{result.stdout}{result.stderr}")
    with open(path) as fh:
        data = json.load(fh)
    return statistics.median(data["seconds"]), data["parameters"]


def measure(network, batch, processes, rounds, steps, warmup, tmp, progress=None):
    """``rounds`` alternating pairs of runs (1 process, ``processes`` processes): the row of
    ``E`` with its interval."""
    from benchmarks.rounds import stats as bstats

    t1, tp, params = [], [], 0
    for r in range(rounds):
        order = (1, processes) if r % 2 == 0 else (processes, 1)
        for p in order:
            if progress is not None:
                progress.set(f"weak scaling: {network}, batch {batch} per process, {p} process(es), round {r + 1}")
            seconds, params = one_run(p, network, batch, steps, warmup, tmp)
            (t1 if p == 1 else tp).append(seconds)
            if progress is not None:
                progress.step(f"{network} {p}")
    # E = t(1) / t(P): the paired comparison of t(1) against t(P)
    comparison = bstats.compare_paired(t1, tp)
    efficiency = statistics.median(a / b for a, b in zip(t1, tp))
    return dict(network=network, batch=batch, processes=processes, rounds=rounds, steps=steps, parameters=params,
                ms_1=[1e3 * t for t in t1], ms_p=[1e3 * t for t in tp], efficiency=efficiency,
                efficiency_estimate=comparison.ratio, low=comparison.low, high=comparison.high,
                gradient_bytes=4 * params)


# the links the model is evaluated on: (name, bandwidth B in bytes/s, latency α in s), stated assumptions
LINKS = (("NCCL over NVLink (B 100 GB/s, α 5 µs)", 100e9, 5e-6),
         ("MPI over 10 GbE (B 1.2 GB/s, α 20 µs)", 1.2e9, 20e-6),
         ("MPI over 100 Gb InfiniBand (B 12 GB/s, α 2 µs)", 12e9, 2e-6))


def predicted_efficiency(t_compute, gradient_bytes, processes, bandwidth, latency):
    """NOTE [weak scaling]: ``t_compute / (t_compute + 2 (P−1)/P · n / B + 2 (P−1) α)``."""
    p = processes
    allreduce = 2 * (p - 1) / p * gradient_bytes / bandwidth + 2 * (p - 1) * latency
    return t_compute / (t_compute + allreduce)


def predictions(rows):
    """What the model gives for E(8), E(64), E(512) on each of :data:`LINKS`, from each
    measured row's 1-process step time and gradient size."""
    out = []
    for row in rows:
        t_compute = statistics.median(row["ms_1"]) / 1e3
        for name, bandwidth, latency in LINKS:
            out.append(dict(network=row["network"], batch=row["batch"], link=name,
                            **{f"e{p}": predicted_efficiency(t_compute, row["gradient_bytes"], p, bandwidth, latency)
                               for p in (8, 64, 512)}))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suites.weak_scaling")
    parser.add_argument("--network", choices=NETWORKS, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", required=True)
    a = parser.parse_args(argv)
    worker(a.network, a.batch, a.steps, a.warmup, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
