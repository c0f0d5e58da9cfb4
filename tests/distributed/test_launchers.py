"""The launch forms of issue 37 (NOTE [launchers] in cuvmap/distributed/launcher.py): what
each launcher's variables say, a job of 2 processes under srun's variables (inside an
mpiexec job, the way a task of ``srun --mpi=pmix`` sees itself) training to the
one-process parameters, and torchrun's rendezvous on the loopback address (2 processes,
the CuPy stand-in's store); the NCCL job itself needs GPUs (marked gpu)."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from cuvmap import distributed
from cuvmap.distributed import launcher
from tests.distributed.test_distributed import JOBS, ROOT, _load_example, job_env, needs_mpiexec, run_job

STAND_IN = ROOT / "tests" / "strict_cupy"

# environment, (size, rank, local rank, local size, launcher)
DETECTIONS = [
    ({}, (1, 0, 0, 1, None)),
    ({"PMI_SIZE": "4", "PMI_RANK": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
     (4, 2, 0, 2, "PMI (MPICH, Intel MPI, srun --mpi=pmi2)")),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, (2, 1, 1, 2, "Open MPI")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4(x2)",
      "SLURM_NODEID": "1"}, (8, 5, 1, 4, launcher.SLURM)),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "9", "SLURM_STEP_NUM_TASKS": "3", "SLURM_LOCALID": "0",
      "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_NODEID": "1"}, (3, 2, 0, 1, launcher.SLURM)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
      "MASTER_PORT": "29500"}, (2, 1, 1, 2, launcher.TORCHRUN)),
    # mpiexec inside a Slurm allocation: mpiexec's job, not the allocation's
    ({"PMI_SIZE": "2", "PMI_RANK": "0", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "7"},
     (2, 0, 0, 2, "PMI (MPICH, Intel MPI, srun --mpi=pmi2)")),
    # a batch script's own process (sbatch/salloc set no SLURM_PROCID): a job of one
    ({"SLURM_NTASKS": "16", "SLURM_JOB_ID": "7"}, (1, 0, 0, 1, None)),
]


@pytest.mark.parametrize("environ, want", DETECTIONS, ids=[str(want[4]) for _, want in DETECTIONS])
def test_each_launchers_variables(environ, want):
    info = launcher.detect(environ)
    assert (info.size, info.rank, info.local_rank, info.local_size, info.launcher) == want
    assert info.uses_mpi == (want[4] not in (None, launcher.TORCHRUN))
    if want[4] == launcher.TORCHRUN:
        assert info.rendezvous == ("10.0.0.1", 29500)


@pytest.mark.parametrize("text, counts", [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3])])
def test_slurms_tasks_per_node(text, counts):
    assert launcher.slurm_tasks_per_node(text) == counts


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "needs MASTER_ADDR and MASTER_PORT"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "not a place in a job"),
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "is not an integer"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "two"}, "not in Slurm's form"),
])
def test_bad_launcher_variables_are_named(environ, message):
    with pytest.raises(RuntimeError, match=message):
        launcher.detect(environ)


@pytest.mark.slow
@needs_mpiexec
def test_the_dp_step_on_two_srun_tasks_equals_one_process(tmp_path, capsys):
    """srun's form: 2 tasks take their places from SLURM_* (MPI joined through the launcher),
    train the main job with their halves of the data and end with the one-process parameters."""
    args = ["--device", "cpu", "--limit", "192", "--batch", "48", "--epochs", "1", "--progress", "off"]
    one = tmp_path / "one.npz"
    _load_example().main(args + ["--save", str(one)])
    capsys.readouterr()
    two = tmp_path / "two.npz"
    result = run_job(2, JOBS / "as_srun.py", ROOT / "examples" / "dp_sgd_digits.py", *args, "--save", two)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("launcher='Slurm (srun)'") == 2, result.stdout
    assert "on 2 processes (this is process 0)" in result.stdout, result.stdout
    a, b = np.load(one), np.load(two)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_env(rank, size, port, **extra):
    env = job_env(**extra)
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


@pytest.mark.slow
def test_torchruns_rendezvous_on_the_loopback_address():
    """2 processes with torchrun's variables meet at MASTER_ADDR:MASTER_PORT through the
    (stand-in) cupyx.distributed store and agree on process 0's values: the path NCCL's
    unique id takes."""
    port = _free_port()
    path = os.pathsep.join([str(STAND_IN), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    procs = [subprocess.Popen([sys.executable, str(JOBS / "rendezvous.py")], cwd=str(ROOT), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=_torchrun_env(rank, 2, port, PYTHONPATH=path)) for rank in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(f"rank {r} of 2: rendezvous ok" in out for r, out in enumerate(outs)), outs


@pytest.mark.slow
def test_a_torchrun_job_without_gpus_is_told_to_use_mpi():
    """The CPU engine is MPI's: a torchrun-style job of 2 on a machine without CuPy or a GPU
    gets an error naming mpiexec and srun, not a hang at the rendezvous."""
    code = "from cuvmap import distributed; distributed.initialize()"
    result = subprocess.run([sys.executable, "-c", code], env=_torchrun_env(0, 2, _free_port()), cwd=str(ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "talks through NCCL" in result.stderr and "mpiexec -n P" in result.stderr and "srun" in result.stderr


@pytest.mark.gpu
def test_a_torchrun_job_on_two_gpus_equals_one_process(tmp_path):
    """torchrun's form on 2 GPUs (NCCL through the TCP rendezvous) trains the main job to the
    one-process parameters."""
    import cuvmap as cv

    if not cv.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    cp = pytest.importorskip("cupy")
    pytest.importorskip("cupy.cuda.nccl", reason="CuPy without NCCL")
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs (NCCL refuses two ranks on one device)")
    args = ["--device", "gpu", "--limit", "192", "--batch", "48", "--epochs", "1", "--progress", "off"]
    one = tmp_path / "one.npz"
    _load_example().main(args + ["--save", str(one)])
    two = tmp_path / "two.npz"
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "examples" / "dp_sgd_digits.py"), *args, "--save", str(two)],
                              cwd=str(ROOT), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=_torchrun_env(rank, 2, port)) for rank in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    a, b = np.load(one), np.load(two)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
