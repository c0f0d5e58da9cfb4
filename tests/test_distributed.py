"""Jobs of several processes under ``mpiexec`` (the ``mpich`` wheel's, next to this Python,
or one on PATH): the collectives' MPI engine on NumPy arrays of several dtypes and shapes
(size 0 included), data-parallel gradients against the one-process gradient, the DP-SGD
main job on 2 processes against its one-process run, and faults that must end the job
with a non-zero status within the collective timeout. Skipped, with the reason, where
there is no mpiexec or mpi4py (``pip install -e '.[test]'`` installs both on Linux x86-64).
NCCL on a GPU: one process, marked gpu."""
import importlib.util
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOBS = ROOT / "tests" / "distributed_jobs"
MPIEXEC = distributed.find_mpiexec()
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

needs_mpiexec = pytest.mark.skipif(
    MPIEXEC is None or not HAVE_MPI4PY,
    reason=("no mpiexec next to this Python or on PATH" if MPIEXEC is None else "mpi4py is not installed")
    + ": pip install mpi4py mpich (the test extra does on Linux x86-64)")


def job_env(**extra):
    """This environment for a job's processes: the checkout on PYTHONPATH, one BLAS and
    OpenMP thread per process (several processes share the machine's cores), no
    launcher variables of an enclosing job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_LOCAL"))}
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
@pytest.mark.parametrize("mode, says", [
    ("raise", "process 1 of 2 raised RuntimeError; aborting the job"),
    ("kill", ""),  # the launcher's own report
    ("leave", "process 0 of 2: all-reduce (sum) of float64[3] has waited"),
])
def test_a_failing_process_ends_the_job(mode, says):
    """Process 1 raises, is killed, or exits early while process 0 waits in a psum: the
    job exits non-zero within the collective timeout (3 s here), never hangs."""
    start = time.monotonic()
    result = run_job(2, JOBS / "faults.py", mode, timeout=120, CUVMAP_COLLECTIVE_TIMEOUT="3")
    elapsed = time.monotonic() - start
    assert result.returncode != 0, result.stdout + result.stderr
    assert "process 0 was not stopped" not in result.stdout
    assert says in result.stderr, result.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


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
