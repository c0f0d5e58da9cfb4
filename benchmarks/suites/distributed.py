"""More than one process: all-reduce bandwidth of cuvmap's collectives against mpi4py's own
``Allreduce``, the DP-SGD step of the main job on 1 and 2 processes, and the cost of the
collective check.

    python -m benchmarks distributed [--processes 2] [--sizes 4096 65536 1048576 4194304 16777216]
                                     [--repeats 15] [--dp-epochs 2] [--threads-per-process keep|split]
                                     [--check-steps 400] [--check-runs 4]

All-reduce: a job of ``--processes`` processes under ``mpiexec`` (``cuvmap.distributed.launch``)
sums a float32 vector of each size, round after round, each round timing every method
once, in an order that rotates from round to round (``k`` calls between two barriers, ``k`` chosen so that a call of mpi4py takes about
10 ms of the round): mpi4py's ``comm.Allreduce(x, out)`` into a preallocated ``out`` (the
ceiling), the same with a fresh ``out`` each call (what a function that returns a new
array pays), and cuvmap's ``psum`` over the axis of processes (``data_parallel``), eagerly
and under ``jit``, each with the collective check on (the default) and off. Reported: the
median over rounds of process 0's time per call,
the algorithm bandwidth (bytes / time) and the ratio to the ceiling, of the medians and
of the fastest rounds (the latter steadier on a busy machine).

DP step: ``examples/dp_sgd_digits.py`` (jit, Poisson batches of 256 expected examples of
the 1437 digits) run as one process and as a job of 2, alternately ``--dp-repeats``
times, each run's median time per step as it prints it; the scaling is their ratio. On a
machine with fewer cores than threads the processes share cores:
``--threads-per-process split`` gives each process of a job ``cores / processes``
BLAS/OpenMP threads (otherwise the environment stays as given, as everywhere in the
benchmarks). The step of a job of 2 does half the examples' work per process plus one
all-reduce of the gradient.

The collective check (NOTE [the collective check] in cuvmap/distributed/check.py), with
``--check-steps N``: a job of ``--processes`` processes runs the main job's data-parallel
step (``dp_step`` of ``examples/dp_sgd_digits.py``: ghost clipping, the noised sum, a
``psum`` of the gradient's leaves, Adam, under ``jit``) on its Poisson batches, each batch
four times in a row (the order rotating from batch to batch, a barrier before each): with
the check on (the default) and off, and both again without buckets (one psum per leaf,
as before either existed: NOTE [buckets] in cuvmap/lax/parallel.py), ``N`` batches after
the warm-up. The cost is the median of the paired differences (on − off, with the same
buckets) over the median step with the check off; the per-leaf pair shows how it grows
with the number of collectives. Per collective, the
all-reduce table's psum rows with the check on and off give it by message size. With
``--check-runs R`` the whole example also runs ``R`` times with ``CUVMAP_COLLECTIVE_CHECK``
1 and 0 alternately (``--check-epochs`` each), each run's median ms per step.
"""
import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import cuvmap as cv
from cuvmap import config, distributed, dp, lax, nn
from cuvmap.lax import parallel

from benchmarks.report.progress import Progress
from benchmarks.suites import weak_scaling
from benchmarks.report.tables import DocTable, markdown_table, settings_table

SUMMARY = "all-reduce bandwidth against mpi4py's Allreduce, and the DP-SGD step on 1 and 2 processes (mpiexec)"
DEFAULTS = dict(repeats=15, warmup=2)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = (4096, 65536, 1 << 20, 4 << 20, 16 << 20)
METHODS = ("mpi4py Allreduce (preallocated out, the ceiling)", "mpi4py Allreduce (fresh out)",
           "cuvmap psum (data_parallel)", "cuvmap psum (data_parallel of jit)",
           "cuvmap psum (data_parallel), check off", "cuvmap psum (data_parallel of jit), check off")
CHECKED = (None, None, True, True, False, False)  # the collective check of each method (None: no cuvmap)


DOC_TABLES = [
    DocTable("All-reduce (sum) of float32, process 0's time per call", "allreduce", [
        ("size", lambda row, run: _fmt_bytes(row["bytes"]), "l"), ("method", "method", "l"),
        ("µs per call", "median_us", "r"), ("GB/s", "gb_per_s", "r"), ("× ceiling", "x_ceiling", "r"),
        ("× ceiling (mins)", "x_ceiling_min", "r")]),
    DocTable("Weak scaling of the data-parallel DP-SGD step: E(P) = t(1) / t(P), one thread per process",
             lambda run: run.get("weak_scaling") or [], [
                 ("network", "network", "l"), ("examples per process", "batch", "r"), ("P", "processes", "r"),
                 ("gradient kB", lambda row, run: row["gradient_bytes"] / 1e3, "r"),
                 ("ms per step, 1 process", lambda row, run: statistics.median(row["ms_1"]), "r"),
                 ("ms per step, P processes", lambda row, run: statistics.median(row["ms_p"]), "r"),
                 ("E(P)", "efficiency_estimate", "r"), ("95% CI", lambda row, run: _interval(row), "l"),
                 ("rounds", "rounds", "r")],
             note="E(P): the Hodges–Lehmann estimate of t(1)/t(P) over the alternated pairs of runs; the model of "
                  "how it falls with P (NOTE [weak scaling] in benchmarks/suites/weak_scaling.py) is on the "
                  "[scaling page](../scaling.md)."),
    DocTable("What the model predicts for E(P) from this run's compute time (ring all-reduce)",
             lambda run: weak_scaling.predictions(run.get("weak_scaling") or []), [
                 ("network", "network", "l"), ("examples per process", "batch", "r"), ("link", "link", "l"),
                 ("E(8)", "e8", "r"), ("E(64)", "e64", "r"), ("E(512)", "e512", "r")],
             note="t_compute: this run's 1-process step time; the links' bandwidth B and latency α are the stated "
                  "assumptions of weak_scaling.LINKS, not measurements."),
    DocTable("The DP-SGD step of the main job on 1 and 2 processes",
             lambda run: [run["dp_step"]] if run.get("dp_step") else [], [
                 ("ms per step, 1 process", "median_1", "r"), ("ms per step, 2 processes", "median_2", "r"),
                 ("speedup (medians)", "speedup", "r"), ("speedup (best runs)", "speedup_best", "r")]),
]


def add_arguments(parser):
    parser.add_argument("--processes", type=int, default=2, help="processes of the all-reduce job")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="message sizes in bytes (float32)")
    parser.add_argument("--dp-epochs", type=float, default=2.0, help="epochs of each DP-SGD run (0: no DP step)")
    parser.add_argument("--dp-repeats", type=int, default=2, help="runs of each process count, alternately")
    parser.add_argument("--threads-per-process", choices=["keep", "split"], default="keep",
                        help="BLAS/OpenMP threads of each process: the environment's, or the cores split evenly")
    parser.add_argument("--check-steps", type=int, default=0,
                        help="batches of the main job's data-parallel step, each run with the collective check on "
                             "and off (0: no such job)")
    parser.add_argument("--check-runs", type=int, default=0,
                        help="runs of the whole example on --processes processes with the check on and off, "
                             "alternately (0: none)")
    parser.add_argument("--check-epochs", type=float, default=10.0, help="epochs of each --check-runs run")
    parser.add_argument("--scaling-rounds", type=int, default=7,
                        help="weak scaling: pairs of runs (1 process, --scaling-processes), alternately (0: none; a 95%% interval needs 6 at least)")
    parser.add_argument("--scaling-processes", type=int, default=2, help="weak scaling: processes of the larger job")
    parser.add_argument("--scaling-networks", nargs="+", choices=weak_scaling.NETWORKS,
                        default=list(weak_scaling.NETWORKS), help="weak scaling: the networks")
    parser.add_argument("--scaling-batch", type=int, nargs="+", default=[128, 1024],
                        help="weak scaling: examples per process")
    parser.add_argument("--scaling-steps", type=int, default=20, help="weak scaling: timed steps per run")


def _job_env(processes, split):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL"))}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if split:
        threads = str(max(1, (os.cpu_count() or 1) // processes))
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = threads
    return env


# ---------------------------------------------------------------------------------------
# The all-reduce job (runs under mpiexec)
# ---------------------------------------------------------------------------------------


def worker(out_path, sizes, rounds, warmup):
    """Every process times every method; process 0 writes its figures to ``out_path``."""
    from mpi4py import MPI  # optional: the distributed extra, under mpiexec only

    group = distributed.initialize()
    comm = group.comm

    def one(x):
        return lax.psum(x, "batch")

    eager = distributed.data_parallel(one)
    staged = distributed.data_parallel(cv.jit(one))
    results = []
    for nbytes in sizes:
        x = np.full(nbytes // 4, group.rank + 1.0, np.float32)
        out = np.empty_like(x)
        calls = [lambda: comm.Allreduce(x, out), lambda: comm.Allreduce(x, np.empty_like(x)),
                 lambda: eager(x), lambda: staged(x), lambda: eager(x), lambda: staged(x)]
        for call, checked in zip(calls, CHECKED):
            config.update("collective_check", checked is not False)
            for _ in range(warmup):
                call()
        config.update("collective_check", True)
        assert np.all(eager(x) == sum(range(1, group.size + 1)))
        comm.Barrier()
        t0 = time.perf_counter()
        calls[0]()
        k = comm.bcast(max(1, min(200, int(0.01 / max(time.perf_counter() - t0, 1e-6)))), root=0)
        times = [[] for _ in calls]
        for r in range(rounds):
            # each round starts with another method, so that none always runs first after
            # the round's first barrier
            for m in [(r + j) % len(calls) for j in range(len(calls))]:
                call = calls[m]
                config.update("collective_check", CHECKED[m] is not False)
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(k):
                    call()
                times[m].append((time.perf_counter() - t0) / k)
        results.append(dict(bytes=nbytes, calls_per_round=k, seconds=times))
    config.update("collective_check", True)
    if group.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(dict(results=results, processes=group.size, mpi=MPI.Get_library_version().strip()), fh)


def _job(args, what, job_argv, timeout):
    """Runs one of this module's jobs (:func:`job_main`) on ``--processes`` processes under
    mpiexec; returns what its process 0 wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "job.json")
        result = distributed.launch(
            args.processes, ["-m", "benchmarks.suites.distributed", *job_argv, "--out", path],
            env=_job_env(args.processes, args.threads_per_process == "split"), cwd=ROOT, capture_output=True,
            text=True, timeout=timeout)
        if result.returncode:
            raise RuntimeError(f"the {what} job failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        with open(path) as fh:
            return json.load(fh)


def _allreduce(args, progress):
    progress.set(f"all-reduce job of {args.processes} processes")
    data = _job(args, "all-reduce", ["allreduce", "--sizes", *map(str, args.sizes), "--rounds",
                                     str(max(1, args.repeats)), "--warmup", str(max(1, args.warmup))], 1800)
    progress.step("all-reduce")
    rows, table = [], []
    for r in data["results"]:
        medians = [statistics.median(ts) for ts in r["seconds"]]
        for method, ts, med in zip(METHODS, r["seconds"], medians):
            floor = min(r["seconds"][0])
            rows.append(dict(bytes=r["bytes"], method=method, median_us=med * 1e6, min_us=min(ts) * 1e6,
                             max_us=max(ts) * 1e6, gb_per_s=r["bytes"] / med / 1e9, x_ceiling=med / medians[0],
                             x_ceiling_min=min(ts) / floor, calls_per_round=r["calls_per_round"], rounds=len(ts)))
            table.append((_fmt_bytes(r["bytes"]), method, med * 1e6, min(ts) * 1e6, r["bytes"] / med / 1e9,
                          med / medians[0], min(ts) / floor))
    return data, rows, table


def _check_per_collective(data):
    """The check's cost per psum by size: the median over rounds of the paired difference
    (check on − off, timed in the same round), eagerly and under jit."""
    rows, table = [], []
    for r in data["results"]:
        t = r["seconds"]
        for how, on, off in (("eager", 2, 4), ("jit", 3, 5)):
            diffs = [a - b for a, b in zip(t[on], t[off])]
            cost, base = statistics.median(diffs), statistics.median(t[off])
            rows.append(dict(bytes=r["bytes"], how=how, check_us=cost * 1e6, psum_off_us=base * 1e6,
                             ratio=cost / base))
            table.append((_fmt_bytes(r["bytes"]), how, base * 1e6, statistics.median(t[on]) * 1e6, cost * 1e6,
                          f"{100 * cost / base:+.1f}%"))
    return rows, table


# ---------------------------------------------------------------------------------------
# The collective check on the main job's data-parallel step (runs under mpiexec)
# ---------------------------------------------------------------------------------------


def check_worker(out_path, steps, warmup):
    """Every process runs the main job's data-parallel step on its Poisson batches, each
    batch with the collective check on and off; process 0 writes the times."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    spec = importlib.util.spec_from_file_location("dp_sgd_digits", os.path.join(ROOT, "examples", "dp_sgd_digits.py"))
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    group = distributed.initialize()
    x_train, y_train, _, _ = ex.load_digits("cpu")
    n = len(y_train)
    x_train, y_train = x_train[group.rank::group.size], y_train[group.rank::group.size]
    q = min(1.0, 256 / n)
    rng, noise_rng = np.random.default_rng(0), np.random.default_rng(1)
    _, params = ex.MODEL.init(rng, (-1, 1, 8, 8))
    opt = nn.optim.adam(3e-2)
    state = opt.init(params)
    clipped_grad = dp.clipped_grad(ex.loss, 1.0)

    def dp_step(params, state, x, y, mask, noise):  # examples/dp_sgd_digits.py's, with its defaults
        clipped = clipped_grad(params, x, y, mask=mask)
        grads = dp.private_gradient(clipped, 1.0, 2.0, mask=mask, noise=noise, expected_batch_size=q * n)
        return opt.update(lax.psum(grads, "batch"), state, params)

    # the step as cuvmap runs it (its gradient's small leaves reduced in one bucket, NOTE
    # [buckets] in cuvmap/lax/parallel.py), and as it ran before buckets: one psum per leaf
    steps_of = {True: distributed.data_parallel(cv.jit(dp_step), group=group),
                False: distributed.data_parallel(cv.jit(dp_step), group=group)}
    bucket_bytes = parallel._BUCKET_LEAF_BYTES
    buckets = dp.batch_buckets(q * len(y_train), len(y_train))
    comm = group.comm
    times = {name: [] for name, _, _ in VARIANTS}
    collectives = {}
    for k in range(warmup + steps):
        idx = np.flatnonzero((rng.random(n) < q)[group.rank::group.size])
        (xb, yb), mask = dp.pad_batch((x_train[idx], y_train[idx]), dp.bucket_for(len(idx), buckets))
        # every process draws; private_gradient keeps the noise of member 0 of the axis
        # (NOTE [noise once over a data-parallel axis] in cuvmap/dp/noise.py)
        noise = dp.standard_normal_like(params, noise_rng)
        for j in range(len(VARIANTS)):  # each batch in every variant, the order rotating
            name, checked, bucketed = VARIANTS[(k + j) % len(VARIANTS)]
            config.update("collective_check", checked)
            parallel._BUCKET_LEAF_BYTES = bucket_bytes if bucketed else -1
            before = group.check.count
            comm.Barrier()
            t0 = time.perf_counter()
            out = steps_of[bucketed](params, state, xb, yb, mask, noise)
            elapsed = time.perf_counter() - t0
            parallel._BUCKET_LEAF_BYTES = bucket_bytes
            collectives[name] = group.check.count - before
            if k >= warmup:
                times[name].append(elapsed)
            if name == "on":
                new_params, new_state = out
        params, state = new_params, new_state
    config.update("collective_check", True)
    if group.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(dict(times=times, collectives=collectives, processes=group.size,
                           leaves=len(cv.tree.leaves(params))), fh)


# (name, collective check, buckets) of the check job's variants of the step
VARIANTS = (("on", True, True), ("off", False, True), ("on, per leaf", True, False), ("before", False, False))


def _check_steps(args, progress):
    progress.set(f"check on the DP step, {args.processes} processes")
    data = _job(args, "check", ["check", "--steps", str(args.check_steps), "--warmup", str(max(10, args.warmup))],
                3600)
    progress.step("check on the DP step")
    t = data["times"]

    def paired(a, b):
        """The median paired difference a − b (ms) and those of the two halves of the steps."""
        diffs = [x - y for x, y in zip(t[a], t[b])]
        half = len(diffs) // 2
        return (statistics.median(diffs) * 1e3,
                [statistics.median(diffs[:half]) * 1e3, statistics.median(diffs[half:]) * 1e3] if half else [])

    rows = []
    for name, label, against in (
            ("off", "check off (buckets)", "off"), ("on", "check on (buckets): the default", "off"),
            ("before", "check off, one psum per leaf: before the check and buckets", "before"),
            ("on, per leaf", "check on, one psum per leaf", "before")):
        diff, halves = paired(name, against)
        rows.append(dict(variant=label, collectives=data["collectives"][name], against=against,
                         median_ms=statistics.median(t[name]) * 1e3, diff_ms=diff, diff_halves_ms=halves,
                         ratio=diff / 1e3 / statistics.median(t[against])))
    diff, halves = paired("on", "before")
    return dict(steps=len(t["off"]), processes=data["processes"], leaves=data["leaves"], variants=rows,
                on_vs_before_ms=diff, on_vs_before_halves_ms=halves,
                on_vs_before=diff / 1e3 / statistics.median(t["before"]))


def _check_runs(args, progress):
    times = {True: [], False: []}
    for _ in range(args.check_runs):
        for checked in (True, False):
            progress.set(f"the example on {args.processes} processes, check {'on' if checked else 'off'}")
            times[checked].append(_dp_run(args.processes, args.check_epochs, args.threads_per_process == "split",
                                          check=checked))
            progress.step("example run")
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return dict(ms_per_step_on=times[True], ms_per_step_off=times[False], median_on=on, median_off=off,
                ratio=on / off - 1, epochs=args.check_epochs)


def _interval(row):
    low, high = row.get("low"), row.get("high")
    if low is None or high is None or not (abs(low) < float("inf") and abs(high) < float("inf")):
        return "–"
    return f"[{low:.3g}, {high:.3g}]"


def _fmt_bytes(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------
# The DP step on 1 and 2 processes
# ---------------------------------------------------------------------------------------


def _dp_run(processes, epochs, split, check=True):
    argv = [os.path.join(ROOT, "examples", "dp_sgd_digits.py"), "--device", "cpu", "--epochs", str(epochs),
            "--progress", "off"]
    env = _job_env(processes, split)
    env["CUVMAP_COLLECTIVE_CHECK"] = "1" if check else "0"
    if processes == 1:
        result = subprocess.run([sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    else:
        result = distributed.launch(processes, argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    match = re.search(r"ms per step, median ([\d.]+)", result.stdout)
    if result.returncode or not match:
        raise RuntimeError(f"the DP-SGD run on {processes} process(es) failed:\n{result.stdout}{result.stderr}")
    return float(match.group(1))


def run(args, settings):
    if distributed.find_mpiexec() is None:
        raise SystemExit("python -m benchmarks distributed: no mpiexec next to this Python or on PATH "
                         "(pip install mpi4py mpich)")
    print(f"# more than one process: all-reduce of float32 vectors on {args.processes} processes, and the DP-SGD "
          "step of examples/dp_sgd_digits.py on 1 and 2")
    print()
    print(settings_table(dict(settings, threads_per_process=args.threads_per_process)))
    print()
    scaling_cases = [(n, b) for n in args.scaling_networks for b in args.scaling_batch] if args.scaling_rounds > 0 else []
    steps = (1 + (2 * args.dp_repeats if args.dp_epochs > 0 else 0) + (args.check_steps > 0) + 2 * args.check_runs
             + 2 * args.scaling_rounds * len(scaling_cases))
    out = {}
    with Progress(steps, args.progress) as progress:
        data, rows, table = _allreduce(args, progress)
        out.update(allreduce=rows, mpi=data["mpi"])
        print(f"MPI: {data['mpi'].splitlines()[0]}")
        print()
        print(f"All-reduce (sum) of float32 on {data['processes']} processes: median of {max(1, args.repeats)} rounds, "
              "process 0's time per call")
        print()
        print(markdown_table(["size", "method", "µs per call", "µs (min)", "GB/s", "× ceiling",
                                      "× ceiling (mins)"], table))
        check_rows, check_table = _check_per_collective(data)
        out["check_per_collective"] = check_rows
        print()
        print("The collective check per psum (median over rounds of the paired difference, on − off)")
        print()
        print(markdown_table(["size", "psum", "µs, check off", "µs, check on", "check µs", "cost"],
                                     check_table))
        if args.check_steps > 0:
            c = out["check_steps"] = _check_steps(args, progress)
            print()
            print(f"The collective check on the main job's data-parallel step (jit, ghost clipping, {c['leaves']} "
                  f"parameter leaves) on {c['processes']} processes: {c['steps']} Poisson batches, each run in every "
                  "variant (order rotating, a barrier before each); the paired difference to the same step with "
                  "the check off is the median over batches (and over each half of them)")
            print()
            print(markdown_table(
                ["variant", "collectives per step", "ms per step (median)", "against", "paired difference (ms)",
                 "halves (ms)", "cost"],
                [(v["variant"], v["collectives"], v["median_ms"], v["against"], v["diff_ms"],
                  ", ".join(f"{h:.3f}" for h in v["diff_halves_ms"]), f"{100 * v['ratio']:+.2f}%")
                 for v in c["variants"]]))
            print()
            print(f"check on (the default) against before (no check, no buckets): {c['on_vs_before_ms']:+.3f} ms per "
                  f"step (halves {', '.join(f'{h:+.3f}' for h in c['on_vs_before_halves_ms'])}), "
                  f"{100 * c['on_vs_before']:+.2f}%")
        if args.check_runs > 0:
            c = out["check_runs"] = _check_runs(args, progress)
            print()
            print(f"The whole example on {args.processes} processes ({args.check_epochs:g} epochs per run), "
                  f"CUVMAP_COLLECTIVE_CHECK=1 and 0 alternately, {args.check_runs} runs each: each run's median ms "
                  "per step")
            print()
            print(markdown_table(
                ["check", "runs (ms per step)", "median of runs", "cost"],
                [("on", ", ".join(f"{t:.2f}" for t in c["ms_per_step_on"]), c["median_on"],
                  f"{100 * c['ratio']:+.1f}%"),
                 ("off", ", ".join(f"{t:.2f}" for t in c["ms_per_step_off"]), c["median_off"], "")]))
        if scaling_cases:
            rows = out["weak_scaling"] = []
            with tempfile.TemporaryDirectory() as tmp:
                for network, batch in scaling_cases:
                    rows.append(weak_scaling.measure(network, batch, args.scaling_processes, args.scaling_rounds,
                                                     args.scaling_steps, max(1, args.warmup), tmp, progress))
            print()
            print(f"Weak scaling of the data-parallel DP-SGD step (jit, dp.clipped_grad, the noise, psum, SGD): "
                  f"E({args.scaling_processes}) = t(1) / t({args.scaling_processes}), one thread per process, "
                  f"{args.scaling_rounds} alternated pairs of runs of {args.scaling_steps} steps each")
            print()
            print(markdown_table(
                ["network", "examples per process", "gradient kB", "ms per step, 1 process",
                 f"ms per step, {args.scaling_processes} processes", f"E({args.scaling_processes})", "95% CI"],
                [(r["network"], r["batch"], r["gradient_bytes"] / 1e3, statistics.median(r["ms_1"]),
                  statistics.median(r["ms_p"]), r["efficiency_estimate"], _interval(r)) for r in rows]))
            print()
            print(markdown_table(["network", "examples per process", "link", "E(8)", "E(64)", "E(512)"],
                                 [(p["network"], p["batch"], p["link"], p["e8"], p["e64"], p["e512"])
                                  for p in weak_scaling.predictions(rows)]))
        if args.dp_epochs > 0:
            times = {1: [], 2: []}
            for _ in range(args.dp_repeats):
                for processes in (1, 2):
                    progress.set(f"DP-SGD on {processes} process(es)")
                    times[processes].append(_dp_run(processes, args.dp_epochs, args.threads_per_process == "split"))
                    progress.step(f"DP-SGD on {processes}")
            one, two = statistics.median(times[1]), statistics.median(times[2])
            out["dp_step"] = dict(ms_per_step={str(k): v for k, v in times.items()}, median_1=one, median_2=two,
                                  speedup=one / two, epochs=args.dp_epochs)
            print()
            print(f"DP-SGD step of the main job (jit; Poisson batches of 256 expected examples), each run's median "
                  f"ms per step, {args.dp_repeats} runs each, alternately")
            print()
            best1, best2 = min(times[1]), min(times[2])
            out["dp_step"].update(best_1=best1, best_2=best2, speedup_best=best1 / best2)
            print(markdown_table(
                ["processes", "ms per step (median of runs)", "best run", "runs", "speedup (medians)",
                 "speedup (best runs)"],
                [(1, one, best1, ", ".join(f"{t:.1f}" for t in times[1]), 1.0, 1.0),
                 (2, two, best2, ", ".join(f"{t:.1f}" for t in times[2]), one / two, best1 / best2)]))
    return out


def job_main(argv):
    """One process of the suite's jobs under mpiexec: ``allreduce`` (:func:`worker`) or
    ``check`` (:func:`check_worker`), process 0 writing to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suites.distributed")
    parser.add_argument("job", choices=["allreduce", "check"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", type=int, nargs="+")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int)
    a = parser.parse_args(argv)
    if a.job == "allreduce":
        worker(a.out, a.sizes, a.rounds, a.warmup)
    else:
        check_worker(a.out, a.steps, a.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1:]))
