"""Jobs of several processes under ``mpiexec`` (the ``mpich`` wheel's, next to this Python,
or one on PATH): the collectives' MPI engine on NumPy arrays of several dtypes and shapes
(size 0 included), data-parallel gradients against the one-process gradient, the DP-SGD
main job on 2 processes against its one-process run, and faults that must end the job
with a non-zero status within the collective timeout. Skipped, with the reason, where
there is no mpiexec or mpi4py (``pip install -e '.[test]'`` installs both on Linux x86-64).
NCCL on a GPU: one process, marked gpu."""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from cuvmap import backend as cv_backend
from cuvmap import distributed

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/<area>/this file
JOBS = ROOT / "tests" / "distributed_jobs"
MPIEXEC = distributed.find_mpiexec()
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

# every job here starts processes: seconds each (tests/distributed/test_collective_check.py checks the
# same disagreements in one process, with threads for the processes)
pytestmark = pytest.mark.slow

needs_mpiexec = pytest.mark.skipif(
    MPIEXEC is None or not HAVE_MPI4PY,
    reason=("no mpiexec next to this Python or on PATH" if MPIEXEC is None else "mpi4py is not installed")
    + ": pip install mpi4py mpich (the test extra does on Linux x86-64)")


def job_env(**extra):
    """This environment for a job's processes: the checkout on PYTHONPATH, one BLAS and
    OpenMP thread per process (several processes share the machine's cores), no
    launcher variables of an enclosing job."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL", "SLURM_PROCID", "SLURM_STEP_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_job(n, *argv, timeout=240, **env):
    return distributed.launch(n, [str(a) for a in argv], env=job_env(**env), timeout=timeout, capture_output=True,
                              text=True, cwd=str(ROOT))


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_collectives_and_data_parallel_gradients(n):
    result = run_job(n, JOBS / "collectives.py")
    assert result.returncode == 0, result.stdout + result.stderr
    # (the processes' lines may interleave)
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", result.stdout)) == list(range(n)), result.stdout


@needs_mpiexec
def test_the_processes_of_a_job_share_the_cores():
    """Without thread settings, each of n processes gets cores // n BLAS and OpenMP threads
    (n processes of a BLAS each as wide as the machine would oversubscribe it)."""
    env = {k: v for k, v in job_env().items() if k not in distributed.threads.USER_SETTINGS}
    cores = len(os.sched_getaffinity(0))
    result = distributed.launch(2, [str(JOBS / "threads.py")], env=env, timeout=120, capture_output=True, text=True,
                                cwd=str(ROOT))
    assert result.returncode == 0, result.stdout + result.stderr
    want = max(1, cores // 2)
    lines = re.findall(r"rank (\d) blas (\w+) omp (\d+)", result.stdout)
    assert sorted(r for r, _, _ in lines) == ["0", "1"], result.stdout
    for _, blas, omp in lines:
        assert int(omp) == want and blas in (str(want), "None"), result.stdout
    # a user's setting wins
    result = distributed.launch(2, [str(JOBS / "threads.py")], env=dict(env, OPENBLAS_NUM_THREADS="1"), timeout=120,
                                capture_output=True, text=True, cwd=str(ROOT))
    assert result.returncode == 0 and "the user's (OPENBLAS_NUM_THREADS set)" in result.stdout, result.stdout


def _load_example():
    spec = importlib.util.spec_from_file_location("example_dp_sgd_digits", ROOT / "examples" / "dp_sgd_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_mpiexec
@pytest.mark.parametrize("extra", [[], ["--eager"]], ids=["jit", "eager"])
def test_the_dp_step_on_two_processes_equals_one_process(tmp_path, extra, capsys):
    """The main job on 2 processes (each its half of the data, the same Poisson mask, the
    noise once, on process 0) trains to the parameters of the one-process run with the
    same seeds, to float32 rounding, and reports the same ε."""
    args = ["--device", "cpu", "--limit", "192", "--batch", "48", "--epochs", "1", "--progress", "off"] + extra
    one = tmp_path / "one.npz"
    acc, eps = _load_example().main(args + ["--save", str(one)])
    capsys.readouterr()
    two = tmp_path / "two.npz"
    result = run_job(2, ROOT / "examples" / "dp_sgd_digits.py", *args, "--save", two)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "on 2 processes (this is process 0)" in result.stdout and f"ε = {eps:.2f}" in result.stdout, result.stdout
    assert result.stdout.count("test accuracy") == 1  # process 0 reports
    a, b = np.load(one), np.load(two)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
        assert not np.array_equal(a[k], np.zeros_like(a[k]))


@needs_mpiexec
def test_processes_option_starts_the_job(tmp_path):
    """``--processes 2`` without a launcher starts itself under mpiexec."""
    env = job_env()
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "dp_sgd_digits.py"), "--processes", "2",
                             "--limit", "96", "--batch", "32", "--epochs", "0.5", "--progress", "off", "--device", "cpu"],
                            capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "on 2 processes" in result.stdout, result.stdout


@needs_mpiexec
@pytest.mark.parametrize("mode, says, status", [
    ("raise", "process 1 of 2 raised RuntimeError; aborting the job", None),
    ("kill", "", None),  # the launcher's own report
    ("exit3", "process 1 of 2 exited with status 3 (sys.exit); aborting the job", 3),
    ("exit0", "process 0 called psum over 'batch' of float64[3], process 1 reached the end of its program after 1 "
              "collective", None),
    ("return", "process 0 called psum over 'batch' of float64[3], process 1 reached the end of its program after 1 "
               "collective", None),
    # process 1's steps pair with process 0's next ones (they look alike) until it ends
    ("skip", "disagree about collective #6: process 0 called psum over 'batch' of float64[3], process 1 reached the "
             "end of its program after 6 collectives", None),
])
def test_a_failing_process_ends_the_job(mode, says, status):
    """Process 1 raises, is killed, calls sys.exit(3) or sys.exit(0), returns, or skips a
    step's collective, while process 0 goes on to a psum: the job exits non-zero (with
    sys.exit's status), never hangs, and an exit ends it within 2 s of process 1's exit
    (the collective timeout is 60 s here: the check's last exchange, not the watchdog,
    reports it)."""
    result = run_job(2, JOBS / "faults.py", mode, timeout=120, CUVMAP_COLLECTIVE_TIMEOUT="60")
    ended = time.time()
    assert result.returncode != 0, result.stdout + result.stderr
    if status is not None:
        assert result.returncode == status, (result.returncode, result.stderr)
    assert "process 0 was not stopped" not in result.stdout
    assert says in result.stderr, result.stderr
    exited = re.search(r"exit at ([\d.]+)", result.stdout)
    if mode not in ("raise", "kill"):
        assert exited, result.stdout
        late = ended - float(exited.group(1))
        assert late < 2.0, f"the job ended {late:.1f} s after the exit"


@needs_mpiexec
def test_without_the_check_the_watchdog_ends_the_job():
    """With the collective check off, a process that ends while another waits in a
    collective is found by the watchdog, after the collective timeout (3 s here)."""
    start = time.monotonic()
    result = run_job(2, JOBS / "faults.py", "exit0", timeout=120, CUVMAP_COLLECTIVE_TIMEOUT="3",
                     CUVMAP_COLLECTIVE_CHECK="0")
    assert result.returncode != 0, result.stdout + result.stderr
    assert re.search(r"process 0 of 2: all-reduce \(sum\) of float64\[3\] \(collective #1 of the group, psum over "
                     r"'batch' of float64\[3\]\) has waited", result.stderr), result.stderr
    assert time.monotonic() - start < 60


@needs_mpiexec
def test_processes_that_disagree_about_a_collective_all_raise(tmp_path):
    """Issue 24's disagreements on 2 processes (psum against pmax, (2, 3) against (3, 2),
    float64[4] against float32[8] and int64[4], (3,) against (4,)), eagerly and under jit:
    both processes raise CollectiveMismatchError naming both collectives; collectives over
    non-array leaves raise TypeError."""
    result = run_job(2, JOBS / "mismatch.py", tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    # (each process writes its file last; their "ok" lines on stdout may interleave)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["0.json", "1.json"], result.stdout
    wants = {
        "op": "process 0 called psum over 'batch' of float64[3], process 1 called pmax over 'batch' of float64[3]",
        "shape": "process 0 called psum over 'batch' of float64[2, 3], process 1 called psum over 'batch' of "
                 "float64[3, 2]",
        "dtype": "process 0 called psum over 'batch' of float64[4], process 1 called psum over 'batch' of float32[8]",
        "int": "process 0 called psum over 'batch' of float64[4], process 1 called psum over 'batch' of int64[4]",
        "size": "process 0 called psum over 'batch' of float64[3], process 1 called psum over 'batch' of float64[4]",
    }
    for rank in (0, 1):
        messages = json.loads((tmp_path / f"{rank}.json").read_text())
        assert sorted(messages) == sorted(f"{name} {how}" for name in wants for how in ("eager", "jit"))
        for case, message in messages.items():
            assert wants[case.split()[0]] in message and "the 2 processes of the group disagree" in message, \
                (case, rank, message)
            assert f"This is process {rank}" in message


@pytest.mark.gpu
def test_nccl_on_one_gpu():
    """A job of one on a GPU: the collectives of CuPy arrays go through a 1-rank NCCL
    communicator and stay on the device."""
    if not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    pytest.importorskip("cupy.cuda.nccl", reason="CuPy without NCCL")
    import cupy as cp

    import cuvmap as cv
    from cuvmap import lax

    group = distributed.ProcessGroup()
    x = cp.arange(6, dtype=cp.float32).reshape(2, 3)

    def f(x):
        return [lax.psum(x, "batch"), lax.pmax(x, "batch"), lax.all_gather(x, "batch"), lax.psum_scatter(x[:1], "batch"),
                lax.all_to_all(x[:1], "batch", 0, 0), lax.ppermute(x, "batch", [(0, 0)])]

    for fn in (f, cv.jit(f)):
        outs = distributed.data_parallel(fn, group=group)(x)
        for out in outs:
            assert cv_backend.is_cupy_array(out)
        for got, want in zip(outs, [x, x, x[None], x[0], x[:1], x]):
            np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(want))
    assert type(group.engine(x)).__name__ == "NCCLEngine"
